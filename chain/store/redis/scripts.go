package redis

import goredis "github.com/redis/go-redis/v9"

// Every key a script touches is passed in KEYS, so the scripts also run on
// Redis Cluster when the prefix carries a hash tag.

// commitScript applies one batch. Checks come first, so a rejected batch
// writes nothing; once the first write is made Redis runs the script to the
// end, so a batch is all or nothing.
//
// KEYS: run, step keys, steps, events, lease, run index, unfinished, DLQ,
// DLQ ids, the finished indexes of the five final statuses (store.FinalRunStatuses), the
// idempotency key the batch claims when it claims one, and the definition
// when the batch has one.
// ARGV: create, final, lease token ("" for none), run seq, header, origin,
// index member, run id, then the counts of deletions, steps, events and DLQ
// entries, the finished index the run goes in (1 to 5; 0 unless final) and
// its member there, the claim's ttl in ms ("" for no claim), then the
// deleted keys, step key/value pairs, event seq/value pairs, DLQ id/value
// pairs and the definition's source.
//
// A run's member in a finished index is kept in its hash (field f), so
// that a replay, which makes it unfinished again, and a replayed run that
// ends again find the member to remove.
//
// It returns {0} on success, {1} for a lost lease, {2} when the run exists,
// {3} when it does not, {4, seq, last} for an event out of sequence and
// {5, run seq, last} for a run seq that is not its last event's, {6}
// for a batch that the run already ends with, and {7} when the key it
// claims is bound to another run.
var commitScript = goredis.NewScript(`
local create, final, lease = ARGV[1] == '1', ARGV[2] == '1', ARGV[3]
local runSeq = tonumber(ARGV[4])
local nEvents = tonumber(ARGV[11])
local fin = tonumber(ARGV[13])
local claimTTL = ARGV[15]
local claimKey, defKey = nil, KEYS[15]
if claimTTL ~= '' then
  claimKey, defKey = KEYS[15], KEYS[16]
end
local del = 16
local steps = del + tonumber(ARGV[9])
local events = steps + 2 * tonumber(ARGV[10])
local dlq = events + 2 * nEvents
local def = dlq + 2 * tonumber(ARGV[12])

if lease ~= '' and redis.call('GET', KEYS[5]) ~= lease then
  return {1}
end

-- replayed reports whether the run already ends with exactly this batch:
-- a client retrying a commit whose reply was lost must not be told it
-- conflicts with itself.
local function replayed()
  if redis.call('HGET', KEYS[1], 'h') ~= ARGV[5] or redis.call('LLEN', KEYS[4]) ~= runSeq then
    return false
  end
  if nEvents == 0 then
    return true
  end
  local stored = redis.call('LRANGE', KEYS[4], -nEvents, -1)
  for j = 0, nEvents - 1 do
    if tonumber(ARGV[events + 2 * j]) ~= runSeq - nEvents + 1 + j or stored[j + 1] ~= ARGV[events + 2 * j + 1] then
      return false
    end
  end
  return true
end

local exists = redis.call('EXISTS', KEYS[1]) == 1
if create and exists then
  if replayed() then return {6} end
  return {2}
end
if not create and not exists then
  return {3}
end
local last = redis.call('LLEN', KEYS[4])
for j = events, dlq - 1, 2 do
  local seq = tonumber(ARGV[j])
  if seq ~= last + 1 then
    if replayed() then return {6} end
    return {4, seq, last}
  end
  last = seq
end
if runSeq ~= last then
  return {5, runSeq, last}
end
if claimKey then
  local cur = redis.call('GET', claimKey)
  if cur and cur ~= ARGV[8] then
    return {7}
  end
end

redis.call('HSET', KEYS[1], 'h', ARGV[5])
if create then
  redis.call('HSET', KEYS[1], 'o', ARGV[6])
  redis.call('ZADD', KEYS[6], 0, ARGV[7])
end
-- Not only on create: a replayed run is unfinished again.
if final then
  redis.call('ZREM', KEYS[7], ARGV[8])
  local old = redis.call('HGET', KEYS[1], 'f')
  if old ~= ARGV[14] then
    if old then
      for i = 10, 14 do redis.call('ZREM', KEYS[i], old) end
    end
    redis.call('ZADD', KEYS[9 + fin], 0, ARGV[14])
    redis.call('HSET', KEYS[1], 'f', ARGV[14])
  end
elseif redis.call('ZADD', KEYS[7], 0, ARGV[8]) == 1 and not create then
  local old = redis.call('HGET', KEYS[1], 'f')
  if old then
    for i = 10, 14 do redis.call('ZREM', KEYS[i], old) end
    redis.call('HDEL', KEYS[1], 'f')
  end
end
for j = del, steps - 1 do
  redis.call('ZREM', KEYS[2], ARGV[j])
  redis.call('HDEL', KEYS[3], ARGV[j])
end
for j = steps, events - 1, 2 do
  redis.call('ZADD', KEYS[2], 0, ARGV[j])
  redis.call('HSET', KEYS[3], ARGV[j], ARGV[j + 1])
end
for j = events, dlq - 1, 2 do
  redis.call('RPUSH', KEYS[4], ARGV[j + 1])
end
for j = dlq, def - 1, 2 do
  redis.call('HSET', KEYS[8], ARGV[j], ARGV[j + 1])
  redis.call('ZADD', KEYS[9], 0, ARGV[j])
end
if defKey then
  redis.call('SET', defKey, ARGV[def], 'NX')
end
if claimKey then
  redis.call('SET', claimKey, ARGV[8], 'PX', claimTTL)
end
return {0}
`)

// stepPageScript goes through up to ARGV[3] step keys in the key range
// ARGV[1]..ARGV[2] and returns how many it went through, the last of them,
// then key/value pairs; with ARGV[4] = "1" split items' keys (holding '[')
// are passed over without reading their records. One script keeps a
// page's keys and values consistent with each other.
//
// KEYS: step keys, steps.
var stepPageScript = goredis.NewScript(`
local ks = redis.call('ZRANGEBYLEX', KEYS[1], ARGV[1], ARGV[2], 'LIMIT', 0, ARGV[3])
local out = {#ks, ks[#ks] or ''}
if ARGV[4] == '1' then
  local kept = {}
  for _, k in ipairs(ks) do
    if not string.find(k, '[', 1, true) then
      kept[#kept + 1] = k
    end
  end
  ks = kept
end
if #ks == 0 then
  return out
end
local vs = redis.call('HMGET', KEYS[2], unpack(ks))
for i = 1, #ks do
  out[#out + 1] = ks[i]
  out[#out + 1] = vs[i]
end
return out
`)

// acquireScript leases a run: it returns the lease's fence, 0 when another
// owner holds it, or -1 when the stored lease is malformed. The fence
// counter has no TTL, so fences keep growing across expiries.
//
// KEYS: lease, fence counter. ARGV: owner, ttl in ms.
var acquireScript = goredis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur then
  local owner, fence = string.match(cur, '^(.*)|(%d+)$')
  if not owner then
    return -1
  end
  if owner ~= ARGV[1] then
    return 0
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(fence)
end
local fence = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. fence, 'PX', ARGV[2])
return fence
`)

// renewScript extends a lease if it is still the current one: 1 if so.
//
// KEYS: lease. ARGV: token, ttl in ms.
var renewScript = goredis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
`)

// releaseScript deletes a key if it still holds the value given: a lease
// that is still the current one, an idempotency key still bound to a run.
//
// KEYS: key. ARGV: value.
var releaseScript = goredis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
end
return 0
`)

// claimScript binds an idempotency key unless it is bound to another run,
// whose id it returns. A key already bound to the same run counts as
// claimed, and is bound anew for the ttl, so a claim that the client
// retries after a lost reply succeeds, and a holder keeps a claim by
// claiming it again.
//
// KEYS: key. ARGV: run id, ttl in ms.
var claimScript = goredis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then
  return cur
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
`)
