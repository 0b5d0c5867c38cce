package fanout

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/internal/jsonx"
)

// The barrier is one hand-off's state in Redis. Every key of a hand-off
// shares the run's id as a hash tag, so a Redis Cluster keeps them on one
// node and a script may touch them together:
//
//	P{RUN}:SPLIT#GEN:meta      hash: total, tolerated, done, succeeded, failed, skipped,
//	                           state, message, published, trimmed, notified, fence,
//	                           and held while the run's decision is not durable
//	P{RUN}:SPLIT#GEN:ctx       what a worker needs to run an item (engine.WorkSplit, JSON)
//	P{RUN}:SPLIT#GEN:done      bitmap: bit i is set once item i has a result
//	P{RUN}:SPLIT#GEN:res       hash: item i's result, by i
//	P{RUN}:SPLIT#GEN:log       list: the DLQ entries and events items produced, in order
//	P{RUN}:SPLIT#GEN:recs      hash: "I|KEY", item I's step record KEY, until the item has a result
//	P{RUN}:SPLIT#GEN:partial   hash: by I, the KEYs of item I's records in recs, newline-separated
//	P{RUN}:SPLIT#GEN:claims    hash: item I's claim, OWNER|FENCE|EXPIRES_MS, while a worker runs it
//
// An item's result counts once, however often it is committed: the first
// commit sets its bit, later ones find it set and change nothing. So the
// done count is the number of distinct items, and the barrier opens (state
// complete) exactly once. The owning gateway follows the counts, takes the
// log into its store from where its store says it stopped and trims what
// it has made durable, and reads the results in item order once all are in.
//
// A worker claims an item before it runs it, and renews the claim while
// it does: a second delivery of the item (its first worker's broker
// connection broke, say) waits while the claim is live instead of running
// beside it, and takes the item over once the claim lapses. Each claim has
// a fence, a number no earlier claim has; a commit carries its items'
// OWNER|FENCE and writes nothing for an item claimed since by another, so
// a worker that lost its claim cannot overwrite what the next one records.

// Hand-off states beyond engine.FanoutState: set when the run ended the
// split before every item was done, so workers drop what is left.
const (
	stateCancelled = "cancelled"
	stateTimedOut  = "timed_out"
	// stateSeeding: a replay's earlier results are going in; nothing is
	// out yet.
	stateSeeding = "seeding"
)

// ref names one hand-off.
type ref struct {
	Run   string `json:"run"`
	Split string `json:"split"`
	Gen   int    `json:"gen"`
}

func (r ref) String() string { return fmt.Sprintf("%s/%s#%d", r.Run, r.Split, r.Gen) }

// keys are a hand-off's Redis keys.
type keys struct {
	meta, ctx, done, res, log, claims, partial, recs string
}

func (r ref) keys(prefix string) keys {
	b := prefix + "{" + r.Run + "}:" + r.Split + "#" + strconv.Itoa(r.Gen)
	return keys{meta: b + ":meta", ctx: b + ":ctx", done: b + ":done", res: b + ":res", log: b + ":log",
		claims: b + ":claims", partial: b + ":partial", recs: b + ":recs"}
}

// all are every key of the hand-off.
func (k keys) all() []string {
	return []string{k.meta, k.ctx, k.done, k.res, k.log, k.claims, k.partial, k.recs}
}

// logEntry is one entry of a hand-off's log: a DLQ entry or an event.
type logEntry struct {
	DLQ   *store.DLQEntry `json:"d,omitempty"`
	Event *store.Event    `json:"e,omitempty"`
}

// result is an item's result as the barrier keeps it: what its slot
// record holds, in few bytes, since a split may have a million.
type result struct {
	Status store.StepStatus `json:"s"`
	Body   json.RawMessage  `json:"b,omitempty"`
	Error  *store.ErrorInfo `json:"e,omitempty"`
}

// encodeResult writes the result a slot record holds as the barrier keeps
// it. A commit writes one per item, so the common case, a result with a
// body and no error, is written by hand; it is byte for byte what
// jsonx.Marshal writes.
func encodeResult(rec *store.StepRecord) ([]byte, error) {
	if rec.Error != nil || !plainWord(string(rec.Status)) {
		return jsonx.Marshal(result{Status: rec.Status, Body: rec.Body, Error: rec.Error})
	}
	buf := bytes.NewBuffer(make([]byte, 0, len(rec.Body)+len(rec.Status)+16))
	buf.WriteString(`{"s":"`)
	buf.WriteString(string(rec.Status))
	buf.WriteByte('"')
	if len(rec.Body) > 0 {
		buf.WriteString(`,"b":`)
		if err := json.Compact(buf, rec.Body); err != nil {
			return nil, fmt.Errorf("encoding a result body: %w", err)
		}
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// decodeResult reads what encodeResult wrote. The common shape, a status
// and a body that is one JSON value, is taken apart by hand; anything
// else goes through the decoder.
func decodeResult(s string) (*result, error) {
	if rest, ok := strings.CutPrefix(s, `{"s":"`); ok {
		if end := strings.IndexByte(rest, '"'); end >= 0 && plainWord(rest[:end]) {
			r := &result{Status: store.StepStatus(rest[:end])}
			switch tail := rest[end+1:]; {
			case tail == "}":
				return r, nil
			case strings.HasPrefix(tail, `,"b":`) && strings.HasSuffix(tail, "}"):
				body := tail[len(`,"b":`) : len(tail)-1]
				// One value, or the body is followed by more fields; the
				// decoder keeps no space around it.
				if body != "" && !isSpace(body[0]) && !isSpace(body[len(body)-1]) && json.Valid([]byte(body)) {
					r.Body = json.RawMessage(body)
					return r, nil
				}
			}
		}
	}
	var r result
	if err := jsonx.Unmarshal([]byte(s), &r); err != nil {
		return nil, err
	}
	return &r, nil
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// plainWord reports whether s is written in JSON as it is, between quotes.
func plainWord(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c == '_') {
			return false
		}
	}
	return true
}

// record is the slot record of item i of the split a work context names.
func (res *result) record(ws *engine.WorkSplit, i int) *store.StepRecord {
	return &store.StepRecord{Key: engine.ItemKey(ws.Key, i, ws.Total), Name: ws.Step, Status: res.Status, Body: res.Body, Error: res.Error}
}

// initScript creates a hand-off unless it exists, and returns its state,
// how far publishing got, and 1 if it created it. One that takes over
// results from an earlier hand-off starts "seeding", and opens once they
// are in (seededScript).
//
// A hand-off the run has just decided on is created held, before that
// decision is durable: its items go out at once, so that the broker's
// delivery and the run's commit take their time together, but no worker
// claims one until the owner releases the hand-off (releaseScript) once
// the decision is durable. What is found under its name is left from a
// decision that never became durable, by a gateway that stopped or lost
// the run, and is replaced; the messages it sent are taken as the new
// hand-off's, whose items they name too. The run's lease fence keeps a
// gateway that lost the run from replacing what the one that took it over
// created: its older fence finds the hand-off "superseded". A hand-off
// taken up again unheld (a run resumed) is released.
//
// KEYS: meta, ctx, then the hand-off's other keys. ARGV: total,
// tolerated, ctx JSON, ttl ms, seeding flag, lease fence, replace flag,
// held flag.
var initScript = goredis.NewScript(`
local created = 0
local exists = redis.call('EXISTS', KEYS[1]) == 1
if exists and ARGV[7] == '1' then
  if tonumber(redis.call('HGET', KEYS[1], 'fence') or '0') > tonumber(ARGV[6]) then
    return {'superseded', 0, 0}
  end
  redis.call('DEL', unpack(KEYS))
  exists = false
end
if not exists then
  created = 1
  local state = 'open'
  if ARGV[5] == '1' then state = 'seeding' elseif tonumber(ARGV[1]) == 0 then state = 'complete' end
  redis.call('HSET', KEYS[1], 'total', ARGV[1], 'tolerated', ARGV[2], 'done', 0,
    'succeeded', 0, 'failed', 0, 'skipped', 0, 'state', state, 'message', '',
    'published', 0, 'trimmed', 0, 'notified', 0, 'fence', ARGV[6])
  redis.call('SET', KEYS[2], ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
end
if ARGV[8] == '1' then
  redis.call('HSET', KEYS[1], 'held', 1)
else
  redis.call('HDEL', KEYS[1], 'held')
end
local m = redis.call('HMGET', KEYS[1], 'state', 'published')
return {m[1], m[2], created}
`)

// stateSuperseded is what init finds when a gateway holding a later lease
// on the run has created the hand-off.
const stateSuperseded = "superseded"

// seedScript takes in results from an earlier hand-off.
//
// KEYS: meta, done, res. ARGV: (index, result JSON) * n.
var seedScript = goredis.NewScript(`
local ttl = redis.call('PTTL', KEYS[1])
for a = 1, #ARGV, 2 do
  redis.call('SETBIT', KEYS[2], ARGV[a], 1)
  redis.call('HSET', KEYS[3], ARGV[a], ARGV[a+1])
end
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[2], ttl)
  redis.call('PEXPIRE', KEYS[3], ttl)
end
return 1
`)

// seededScript opens a hand-off once its seed is in, with its counts.
//
// KEYS: meta. ARGV: done, succeeded, skipped.
var seededScript = goredis.NewScript(`
if redis.call('HGET', KEYS[1], 'state') ~= 'seeding' then return 0 end
local state = 'open'
if tonumber(ARGV[1]) >= tonumber(redis.call('HGET', KEYS[1], 'total')) then state = 'complete' end
redis.call('HSET', KEYS[1], 'done', ARGV[1], 'succeeded', ARGV[2], 'skipped', ARGV[3], 'state', state)
return 1
`)

// luaHelpers are the pieces the item scripts share. A script touches a
// message's items with a few commands over all of them, not a few per
// item: Redis spends its time per command, and a split has a million.
//
// window reads the bytes of a bitmap that hold the given indexes' bits;
// isset and setbit work on it, and putWindow writes it back when changed.
// hmget and hcall run one command over many fields, in chunks, since Lua
// unpacks only so many values at once.
const luaHelpers = `
local function window(key, idxs)
  local lo, hi
  for _, i in ipairs(idxs) do
    local b = math.floor(i / 8)
    if not lo or b < lo then lo = b end
    if not hi or b > hi then hi = b end
  end
  local w = {lo = lo or 0, bytes = {}, dirty = false}
  if lo then
    local s = redis.call('GETRANGE', key, lo, hi)
    for j = 1, hi - lo + 1 do w.bytes[j] = string.byte(s, j) or 0 end
  end
  return w
end
local function isset(w, i)
  return bit.band(w.bytes[math.floor(i / 8) - w.lo + 1], bit.rshift(128, i % 8)) ~= 0
end
local function setbit(w, i)
  local j = math.floor(i / 8) - w.lo + 1
  w.bytes[j] = bit.bor(w.bytes[j], bit.rshift(128, i % 8))
  w.dirty = true
end
local function putWindow(key, w)
  if not w.dirty then return end
  local parts = {}
  for s = 1, #w.bytes, 4000 do
    parts[#parts + 1] = string.char(unpack(w.bytes, s, math.min(s + 3999, #w.bytes)))
  end
  redis.call('SETRANGE', key, w.lo, table.concat(parts))
end
local function hmget(key, fields)
  local out = {}
  for s = 1, #fields, 1000 do
    local part = redis.call('HMGET', key, unpack(fields, s, math.min(s + 999, #fields)))
    for j = 1, #part do out[s + j - 1] = part[j] end
  end
  return out
end
local function hcall(cmd, key, args)
  for s = 1, #args, 1000 do
    redis.call(cmd, key, unpack(args, s, math.min(s + 999, #args)))
  end
end
local function recordKeys(list)
  local out = {}
  if list then for k in string.gmatch(list, '[^\n]+') do out[#out + 1] = k end end
  return out
end
`

// commitScript commits what a worker did: item step records, items'
// results, DLQ entries and events. It returns the hand-off's state, then
// the items it wrote nothing for because another worker has claimed them
// since; a hand-off that is gone or over takes nothing.
//
// The commit that completes a split of at most inline items, with no log
// entry left for its owner to take in, sends the owner the news on the
// hand-off's own channel, results included (pushedNews): the owner need
// not come and read it.
//
// KEYS: meta, done, res, log, claims, partial, recs.
// ARGV: channel, ref, then
//
//	n records: (item index, field, JSON, claim) * n
//	n results: (item index, result JSON, status field, claim) * n
//	n log entries: JSON * n
//	the hand-off's own channel, inline
//
// A claim is OWNER|FENCE, or "" for a write that needs none (a poison item
// parked by whichever worker took its dead message).
var commitScript = goredis.NewScript(luaHelpers + `
local meta = KEYS[1]
local state = redis.call('HGET', meta, 'state')
if not state then return {'gone'} end
if state ~= 'open' then return {state} end
local ttl = redis.call('PTTL', meta)
local nr = tonumber(ARGV[3])
local recAt = 4
local ns = tonumber(ARGV[recAt + 4 * nr])
local slotAt = recAt + 4 * nr + 1
local nl = tonumber(ARGV[slotAt + 4 * ns])
local logAt = slotAt + 4 * ns + 1
local nums, named, seen = {}, {}, {}
local function note(p)
  nums[#nums + 1] = tonumber(ARGV[p])
  if ARGV[p + 3] ~= '' and not seen[ARGV[p]] then
    seen[ARGV[p]] = true
    named[#named + 1] = ARGV[p]
  end
end
for r = 0, nr - 1 do note(recAt + 4 * r) end
for s = 0, ns - 1 do note(slotAt + 4 * s) end
local w = window(KEYS[2], nums)
local claimNow = {}
local cur = hmget(KEYS[5], named)
for j, idx in ipairs(named) do claimNow[idx] = cur[j] end
local lost, lostSeen, matches = {}, {}, {}
local function holds(idx, claim)
  if claim == '' then return true end
  local c = claimNow[idx]
  if c then
    -- A message's items share their claim: compare each pair once.
    local m = matches[claim]
    if not m then
      m = {}
      matches[claim] = m
    end
    local ok = m[c]
    if ok == nil then
      ok = string.sub(c, 1, #claim + 1) == claim .. '|'
      m[c] = ok
    end
    if ok then return true end
  end
  if not lostSeen[idx] then
    lostSeen[idx] = true
    lost[#lost + 1] = tonumber(idx)
  end
  return false
end
local recSets, added, addedOrder = {}, {}, {}
for r = 0, nr - 1 do
  local p = recAt + 4 * r
  local idx = ARGV[p]
  if not isset(w, nums[r + 1]) and holds(idx, ARGV[p + 3]) then
    recSets[#recSets + 1] = idx .. '|' .. ARGV[p + 1]
    recSets[#recSets + 1] = ARGV[p + 2]
    if not added[idx] then
      added[idx] = {}
      addedOrder[#addedOrder + 1] = idx
    end
    added[idx][#added[idx] + 1] = ARGV[p + 1]
  end
end
if #recSets > 0 then
  hcall('HSET', KEYS[7], recSets)
  local lists = hmget(KEYS[6], addedOrder)
  local sets = {}
  for j, idx in ipairs(addedOrder) do
    local have, list = {}, recordKeys(lists[j])
    for _, k in ipairs(list) do have[k] = true end
    for _, k in ipairs(added[idx]) do
      if not have[k] then
        have[k] = true
        list[#list + 1] = k
      end
    end
    sets[#sets + 1] = idx
    sets[#sets + 1] = table.concat(list, '\n')
  end
  hcall('HSET', KEYS[6], sets)
end
local news = false
local counts, done = {}, 0
local resSets, finished = {}, {}
for s = 0, ns - 1 do
  local p = slotAt + 4 * s
  local idx, i = ARGV[p], nums[nr + s + 1]
  if not isset(w, i) and holds(idx, ARGV[p + 3]) then
    setbit(w, i)
    resSets[#resSets + 1] = idx
    resSets[#resSets + 1] = ARGV[p + 1]
    finished[#finished + 1] = idx
    counts[ARGV[p + 2]] = (counts[ARGV[p + 2]] or 0) + 1
    done = done + 1
  end
end
if done > 0 then
  putWindow(KEYS[2], w)
  hcall('HSET', KEYS[3], resSets)
  if redis.call('EXISTS', KEYS[6]) == 1 then
    local lists = hmget(KEYS[6], finished)
    local recDels, had = {}, {}
    for j, idx in ipairs(finished) do
      if lists[j] then
        had[#had + 1] = idx
        for _, k in ipairs(recordKeys(lists[j])) do recDels[#recDels + 1] = idx .. '|' .. k end
      end
    end
    hcall('HDEL', KEYS[7], recDels)
    hcall('HDEL', KEYS[6], had)
  end
  hcall('HDEL', KEYS[5], finished)
  for field, c in pairs(counts) do redis.call('HINCRBY', meta, field, c) end
  redis.call('HINCRBY', meta, 'done', done)
  news = true
end
if nl > 0 then
  local entries = {}
  for p = logAt, logAt + nl - 1 do entries[#entries + 1] = ARGV[p] end
  hcall('RPUSH', KEYS[4], entries)
  news = true
end
if ttl > 0 then
  for _, k in ipairs({2, 3, 4, 6, 7}) do redis.call('PEXPIRE', KEYS[k], ttl) end
end
local m = redis.call('HMGET', meta, 'done', 'total', 'failed', 'tolerated', 'notified')
local out = 'open'
if tonumber(m[3]) > tonumber(m[4]) then
  redis.call('HSET', meta, 'state', 'failed', 'message', m[3] .. ' items failed, more than the ' .. m[4] .. ' tolerated')
  redis.call('PUBLISH', ARGV[1], ARGV[2] .. ' failed')
  out = 'failed'
elseif tonumber(m[1]) >= tonumber(m[2]) then
  redis.call('HSET', meta, 'state', 'complete')
  local total = tonumber(m[2])
  if total <= tonumber(ARGV[logAt + nl + 1]) and redis.call('LLEN', KEYS[4]) == 0 then
    local fields = {}
    for i = 0, total - 1 do fields[#fields + 1] = tostring(i) end
    local c = redis.call('HMGET', meta, 'published', 'succeeded', 'failed', 'skipped')
    redis.call('PUBLISH', ARGV[logAt + nl], cjson.encode({p = c[1], d = m[1], s = c[2], f = c[3], k = c[4], r = hmget(KEYS[3], fields)}))
  end
  redis.call('PUBLISH', ARGV[1], ARGV[2] .. ' complete')
  out = 'complete'
elseif news and m[5] ~= '1' then
  redis.call('HSET', meta, 'notified', 1)
  redis.call('PUBLISH', ARGV[1], ARGV[2] .. ' open')
end
return {out, lost}
`)

// claimScript reads, for a worker about to run items, the hand-off's state
// and, per item, whether it is done, held by another worker's live claim,
// or now claimed by this one, with what it recorded so far. A claim this
// worker holds already is renewed and keeps its fence; a lapsed one is
// taken over with a new fence. With take unset nothing is claimed.
//
// A worker that would take items of a held hand-off gets "held" alone.
//
// KEYS: meta, done, claims, partial, recs.
// ARGV: owner, claim ttl ms, take (1 or 0), then the indexes.
// It returns the state, the claim it gave items it took afresh (OWNER|FENCE,
// or ""), then a row for each item that is done, held, or has records or
// another claim: {index, 0 claimed | 1 done | 2 held, records, OWNER|FENCE
// or the holder}. Items with no row are claimed with the common claim.
var claimScript = goredis.NewScript(luaHelpers + `
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return {'gone'} end
if ARGV[3] == '1' and redis.call('HEXISTS', KEYS[1], 'held') == 1 then return {'held'} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local owner, ttl, take = ARGV[1], tonumber(ARGV[2]), ARGV[3] == '1' and state == 'open'
local nums = {}
for i = 4, #ARGV do nums[#nums + 1] = tonumber(ARGV[i]) end
local w = window(KEYS[2], nums)
local open = {}
for j, i in ipairs(nums) do
  if not isset(w, i) then open[#open + 1] = ARGV[j + 3] end
end
local claimOf, held = {}, {}
local fence
if take and #open > 0 then
  local cur = hmget(KEYS[3], open)
  local sets, expires, values = {}, '|' .. (now + ttl), {}
  for j, idx in ipairs(open) do
    local claim, h = '', nil
    if cur[j] then
      local o, f, exp = string.match(cur[j], '^(.*)|(%d+)|(%d+)$')
      if o == owner then
        claim = o .. '|' .. f
      elseif o and tonumber(exp) > now then
        h = o
      end
    end
    if h then
      held[idx] = h
    else
      if claim == '' then
        if not fence then fence = redis.call('HINCRBY', KEYS[1], 'fence', 1) end
        claim = owner .. '|' .. fence
      end
      claimOf[idx] = claim
      local v = values[claim]
      if not v then
        v = claim .. expires
        values[claim] = v
      end
      sets[#sets + 1] = idx
      sets[#sets + 1] = v
    end
  end
  hcall('HSET', KEYS[3], sets)
end
local want = {}
for _, idx in ipairs(open) do
  if not held[idx] then want[#want + 1] = idx end
end
local recs, lists = {}, {}
if redis.call('EXISTS', KEYS[4]) == 1 then lists = hmget(KEYS[4], want) end
local fields, whose = {}, {}
for j, idx in ipairs(want) do
  for _, k in ipairs(recordKeys(lists[j])) do
    fields[#fields + 1] = idx .. '|' .. k
    whose[#whose + 1] = idx
  end
end
local vals = hmget(KEYS[5], fields)
for j, idx in ipairs(whose) do
  if vals[j] then
    recs[idx] = recs[idx] or {}
    recs[idx][#recs[idx] + 1] = vals[j]
  end
end
local common = ''
if fence then common = owner .. '|' .. fence end
local out = {state, common}
for j, i in ipairs(nums) do
  local idx = ARGV[j + 3]
  if isset(w, i) then
    out[#out + 1] = {i, 1, {}, ''}
  elseif held[idx] then
    out[#out + 1] = {i, 2, {}, held[idx]}
  elseif recs[idx] or (claimOf[idx] or '') ~= common then
    out[#out + 1] = {i, 0, recs[idx] or {}, claimOf[idx] or ''}
  end
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl > 0 and fence then redis.call('PEXPIRE', KEYS[3], pttl) end
return out
`)

// renewScript extends the claims a worker still holds, and returns the
// indexes of those it has lost (another took them over, or the item is
// done and its claim gone); with ttl 0 it releases them instead.
//
// KEYS: claims. ARGV: ttl ms, then (index, OWNER|FENCE) * n.
var renewScript = goredis.NewScript(luaHelpers + `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
local idxs = {}
for a = 2, #ARGV, 2 do idxs[#idxs + 1] = ARGV[a] end
local cur = hmget(KEYS[1], idxs)
local sets, dels, lost = {}, {}, {}
for j, idx in ipairs(idxs) do
  local claim = ARGV[2 * j + 1]
  if cur[j] and string.sub(cur[j], 1, #claim + 1) == claim .. '|' then
    if ttl > 0 then
      sets[#sets + 1] = idx
      sets[#sets + 1] = claim .. '|' .. (now + ttl)
    else
      dels[#dels + 1] = idx
    end
  else
    lost[#lost + 1] = tonumber(idx)
  end
end
hcall('HSET', KEYS[1], sets)
hcall('HDEL', KEYS[1], dels)
return lost
`)

// newsScript reads what the log holds from position pos on, and the
// hand-off's state, for the owning gateway; it clears the flag that keeps
// workers from notifying it more than once between two reads. Once a split
// of at most inline items is complete and its log read to the end, it
// returns their results too, sparing the join a round trip.
//
// KEYS: meta, log, res. ARGV: pos, max entries, inline.
var newsScript = goredis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return {'gone'} end
redis.call('HSET', KEYS[1], 'notified', 0)
local m = redis.call('HMGET', KEYS[1], 'state', 'message', 'published', 'done', 'trimmed', 'succeeded', 'failed', 'skipped', 'total')
local from = tonumber(ARGV[1]) - tonumber(m[5])
if from < 0 then from = 0 end
local entries = redis.call('LRANGE', KEYS[2], from, from + tonumber(ARGV[2]) - 1)
local results = {}
local total = tonumber(m[9])
if m[1] == 'complete' and #entries < tonumber(ARGV[2]) and total > 0 and total <= tonumber(ARGV[3]) then
  local fields = {}
  for i = 0, total - 1 do fields[#fields + 1] = tostring(i) end
  results = redis.call('HMGET', KEYS[3], unpack(fields))
end
return {m[1], m[2], m[3], m[4], m[6], m[7], m[8], entries, results}
`)

// trimScript drops the log entries before pos, which the owning gateway
// has made durable.
//
// KEYS: meta, log. ARGV: pos.
var trimScript = goredis.NewScript(`
local trimmed = tonumber(redis.call('HGET', KEYS[1], 'trimmed') or '-1')
if trimmed < 0 then return 0 end
local k = tonumber(ARGV[1]) - trimmed
if k > 0 then
  redis.call('LTRIM', KEYS[2], k, -1)
  redis.call('HSET', KEYS[1], 'trimmed', ARGV[1])
end
return k
`)

// publishedScript raises the publish cursor, never lowering it.
//
// KEYS: meta. ARGV: cursor.
// releaseScript lets workers claim the items of a held hand-off, telling
// those waiting. The notice says "open", which workers of every version
// take as nothing ending.
//
// KEYS: meta. ARGV: channel, ref.
var releaseScript = goredis.NewScript(`
if redis.call('HDEL', KEYS[1], 'held') == 1 then
  redis.call('PUBLISH', ARGV[1], ARGV[2] .. ' open')
end
return 1
`)

// stateHeld is what a worker's claim finds while the hand-off is held.
const stateHeld = "held"

var publishedScript = goredis.NewScript(`
local cur = tonumber(redis.call('HGET', KEYS[1], 'published') or '-1')
if cur < 0 then return 0 end
if tonumber(ARGV[1]) > cur then redis.call('HSET', KEYS[1], 'published', ARGV[1]) end
return 1
`)

// endScript ends an open hand-off the run gave up on, telling workers.
//
// KEYS: meta. ARGV: channel, ref, state.
var endScript = goredis.NewScript(`
local state = redis.call('HGET', KEYS[1], 'state')
if state == 'open' then
  redis.call('HSET', KEYS[1], 'state', ARGV[3])
  redis.call('PUBLISH', ARGV[1], ARGV[2] .. ' ' .. ARGV[3])
end
return 1
`)

// barrier is a hand-off's state as one gateway sees it.
type barrier struct {
	rdb     goredis.UniversalClient
	prefix  string
	channel string
	ref     ref
	k       keys
}

func newBarrier(rdb goredis.UniversalClient, prefix string, r ref) *barrier {
	return &barrier{rdb: rdb, prefix: prefix, channel: prefix + "fanout", ref: r, k: r.keys(prefix)}
}

// newsChannel is the hand-off's own channel, on which its owner hears the
// news of a small split that completed.
func (b *barrier) newsChannel() string { return b.channel + ":news:" + b.ref.String() }

// notice is how a hand-off's state change travels on the channel:
// "REF STATE".
func (b *barrier) notice() string { return b.ref.String() }

func parseNotice(s string) (string, string) {
	i := strings.LastIndexByte(s, ' ')
	if i < 0 {
		return s, ""
	}
	return s[:i], s[i+1:]
}

// init creates the hand-off unless it exists, or replaces what a decision
// that never became durable left (replace); it returns its state, its
// publish cursor, and whether this call created it. seeding says results
// of an earlier hand-off come first; fence is the run's lease fence; held
// keeps workers from its items until release.
func (b *barrier) init(ctx context.Context, ws *engine.WorkSplit, tolerated int, seeding bool, ttl time.Duration, fence uint64, replace, held bool) (string, int, bool, error) {
	wsJSON, err := jsonx.Marshal(ws)
	if err != nil {
		return "", 0, false, fmt.Errorf("encoding split context: %w", err)
	}
	res, err := initScript.Run(ctx, b.rdb, b.k.all(), ws.Total, tolerated, wsJSON, ttl.Milliseconds(), flag(seeding), fence, flag(replace), flag(held)).Slice()
	if err != nil {
		return "", 0, false, fmt.Errorf("creating split %s in Redis: %w", b.ref, err)
	}
	state, _ := res[0].(string)
	published, _ := strconv.Atoi(fmt.Sprint(res[1]))
	return state, published, asInt(res[2]) == 1, nil
}

// flag is a script's argument for b.
func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// seedChunk is how many results go to Redis in one script.
const seedChunk = 1000

// seed takes in the results an earlier hand-off left in the run's store,
// then opens the hand-off. Seeding again after a restart writes the same.
func (b *barrier) seed(ctx context.Context, scan func(fn func(*store.StepRecord) error) error) error {
	var args []any
	done, succeeded, skipped := 0, 0, 0
	flush := func() error {
		if len(args) == 0 {
			return nil
		}
		err := seedScript.Run(ctx, b.rdb, []string{b.k.meta, b.k.done, b.k.res}, args...).Err()
		args = args[:0]
		return err
	}
	err := scan(func(rec *store.StepRecord) error {
		_, i, ok := slotOf(rec.Key, b.ref.Split)
		if !ok {
			return nil
		}
		data, err := encodeResult(rec)
		if err != nil {
			return err
		}
		done++
		switch rec.Status {
		case store.StepSucceeded:
			succeeded++
		case store.StepSkipped:
			skipped++
		}
		args = append(args, i, data)
		if len(args) >= 2*seedChunk {
			return flush()
		}
		return nil
	})
	if err == nil {
		err = flush()
	}
	if err == nil {
		err = seededScript.Run(ctx, b.rdb, []string{b.k.meta}, done, succeeded, skipped).Err()
	}
	if err != nil {
		return fmt.Errorf("taking earlier results into split %s in Redis: %w", b.ref, err)
	}
	return nil
}

// work reads the context workers run the items with.
func (b *barrier) work(ctx context.Context) (*engine.WorkSplit, error) {
	data, err := b.rdb.Get(ctx, b.k.ctx).Bytes()
	return b.decodeWork(data, err)
}

// decodeWork decodes the context a GET of it answered; nil when it is gone.
func (b *barrier) decodeWork(data []byte, err error) (*engine.WorkSplit, error) {
	if errors.Is(err, goredis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading split %s from Redis: %w", b.ref, err)
	}
	var ws engine.WorkSplit
	if err := jsonx.Unmarshal(data, &ws); err != nil {
		return nil, fmt.Errorf("decoding split %s: %w", b.ref, err)
	}
	return &ws, nil
}

// workAndClaim reads the work context and claims items, as claim does, in
// one round trip: a worker's first message of a split needs both. The work
// is nil when the split is gone.
func (b *barrier) workAndClaim(ctx context.Context, owner string, ttl time.Duration, indexes []int) (*engine.WorkSplit, string, []claimed, error) {
	pipe := b.rdb.Pipeline()
	get := pipe.Get(ctx, b.k.ctx)
	ev := claimScript.EvalSha(ctx, pipe, b.claimKeys(), b.claimArgs(owner, ttl, true, indexes)...)
	_, _ = pipe.Exec(ctx)
	if err := ev.Err(); err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") {
		// The script is not in this Redis yet: one round trip each.
		ws, err := b.work(ctx)
		if err != nil || ws == nil {
			return ws, "", nil, err
		}
		state, claims, err := b.claim(ctx, owner, ttl, true, indexes)
		return ws, state, claims, err
	}
	ws, err := b.decodeWork(get.Bytes())
	if err != nil || ws == nil {
		return ws, "", nil, err
	}
	res, err := ev.Slice()
	if err != nil {
		return nil, "", nil, fmt.Errorf("claiming items of split %s in Redis: %w", b.ref, err)
	}
	state, claims := parseClaims(res, indexes)
	return ws, state, claims, nil
}

// release lets workers claim the hand-off's items.
func (b *barrier) release(ctx context.Context) error {
	if err := releaseScript.Run(ctx, b.rdb, []string{b.k.meta}, b.channel, b.notice()).Err(); err != nil {
		return fmt.Errorf("releasing split %s in Redis: %w", b.ref, err)
	}
	return nil
}

// doneBits reads the bitmap of finished items.
func (b *barrier) doneBits(ctx context.Context) ([]byte, error) {
	data, err := b.rdb.Get(ctx, b.k.done).Bytes()
	if errors.Is(err, goredis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading split %s's finished items: %w", b.ref, err)
	}
	return data, nil
}

// bitSet reports bit i of a Redis bitmap (most significant bit first).
func bitSet(bits []byte, i int) bool {
	return i/8 < len(bits) && bits[i/8]&(0x80>>(i%8)) != 0
}

// claimed is one item as claimScript found it.
type claimed struct {
	index   int
	done    bool
	held    bool   // another worker's claim on it is live
	claim   string // this worker's OWNER|FENCE; the holder's name when held
	records []*store.StepRecord
}

// claim reads the state of items a worker was handed and, with take,
// claims those not done nor held by another worker for ttl.
func (b *barrier) claim(ctx context.Context, owner string, ttl time.Duration, take bool, indexes []int) (string, []claimed, error) {
	res, err := claimScript.Run(ctx, b.rdb, b.claimKeys(), b.claimArgs(owner, ttl, take, indexes)...).Slice()
	if err != nil {
		return "", nil, fmt.Errorf("claiming items of split %s in Redis: %w", b.ref, err)
	}
	state, claims := parseClaims(res, indexes)
	return state, claims, nil
}

func (b *barrier) claimKeys() []string {
	return []string{b.k.meta, b.k.done, b.k.claims, b.k.partial, b.k.recs}
}

func (b *barrier) claimArgs(owner string, ttl time.Duration, take bool, indexes []int) []any {
	args := make([]any, 0, len(indexes)+3)
	args = append(args, owner, ttl.Milliseconds(), flag(take))
	for _, idx := range indexes {
		args = append(args, idx)
	}
	return args
}

// parseClaims reads claimScript's answer for the indexes it was asked.
func parseClaims(res []any, indexes []int) (string, []claimed) {
	if len(res) == 0 {
		return "", nil
	}
	state, _ := res[0].(string)
	if len(res) < 2 {
		return state, nil
	}
	common, _ := res[1].(string)
	rows := make(map[int]claimed, len(res)-2)
	for _, e := range res[2:] {
		row, _ := e.([]any)
		if len(row) != 4 {
			continue
		}
		kind := asInt(row[1])
		c := claimed{index: int(asInt(row[0])), done: kind == 1, held: kind == 2}
		c.claim, _ = row[3].(string)
		vals, _ := row[2].([]any)
		for _, v := range vals {
			var rec store.StepRecord
			if s, ok := v.(string); ok && jsonx.Unmarshal([]byte(s), &rec) == nil {
				c.records = append(c.records, &rec)
			}
		}
		rows[c.index] = c
	}
	out := make([]claimed, len(indexes))
	for j, i := range indexes {
		c, ok := rows[i]
		if !ok {
			c = claimed{index: i, claim: common}
		}
		out[j] = c
	}
	return state, out
}

// itemRecords reads the step records item i holds under prefix, in key
// order: their keys, and their JSON.
func (b *barrier) itemRecords(ctx context.Context, i int, prefix string) ([]string, []string, error) {
	idx := strconv.Itoa(i)
	list, err := b.rdb.HGet(ctx, b.k.partial, idx).Result()
	if errors.Is(err, goredis.Nil) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("reading item %d of split %s from Redis: %w", i, b.ref, err)
	}
	var keys, fields []string
	for _, k := range strings.Split(list, "\n") {
		if strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		fields = append(fields, idx+"|"+k)
	}
	if len(fields) == 0 {
		return nil, nil, nil
	}
	vals, err := b.rdb.HMGet(ctx, b.k.recs, fields...).Result()
	if err != nil {
		return nil, nil, fmt.Errorf("reading item %d of split %s from Redis: %w", i, b.ref, err)
	}
	outKeys, outVals := keys[:0], make([]string, 0, len(vals))
	for j, v := range vals {
		if s, ok := v.(string); ok {
			outKeys = append(outKeys, keys[j])
			outVals = append(outVals, s)
		}
	}
	return outKeys, outVals, nil
}

// renew extends a worker's claims on items by ttl, or releases them with
// ttl 0; it returns the items whose claim the worker no longer holds.
func (b *barrier) renew(ctx context.Context, ttl time.Duration, claims map[int]string) ([]int, error) {
	if len(claims) == 0 {
		return nil, nil
	}
	args := make([]any, 0, 1+2*len(claims))
	args = append(args, ttl.Milliseconds())
	for i, c := range claims {
		args = append(args, i, c)
	}
	res, err := renewScript.Run(ctx, b.rdb, []string{b.k.claims}, args...).Slice()
	if err != nil {
		return nil, fmt.Errorf("renewing claims on items of split %s in Redis: %w", b.ref, err)
	}
	lost := make([]int, 0, len(res))
	for _, v := range res {
		lost = append(lost, int(asInt(v)))
	}
	return lost, nil
}

func asInt(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}

// commit writes a worker's batch; it returns the hand-off's state, and the
// items it wrote nothing for because the worker's claim on them, as claim
// gives it, has been taken over.
func (b *barrier) commit(ctx context.Context, batch *store.Batch, claim func(item int) string) (string, []int, error) {
	var recArgs, slotArgs []any
	nRecs, nSlots := 0, 0
	for _, rec := range batch.Steps {
		split, i, ok := slotOf(rec.Key, b.ref.Split)
		if !ok {
			continue // the split's own record, which is the run's to write
		}
		if split {
			entry, err := encodeResult(rec)
			if err != nil {
				return "", nil, fmt.Errorf("encoding the result of item %d: %w", i, err)
			}
			slotArgs = append(slotArgs, i, entry, statusField(rec.Status), claim(i))
			nSlots++
			continue
		}
		data, err := jsonx.Marshal(rec)
		if err != nil {
			return "", nil, fmt.Errorf("encoding step record %s: %w", rec.Key, err)
		}
		recArgs = append(recArgs, i, rec.Key, data, claim(i))
		nRecs++
	}
	var other []any
	for _, d := range batch.DLQ {
		entry, err := jsonx.Marshal(logEntry{DLQ: d})
		if err != nil {
			return "", nil, fmt.Errorf("encoding a dead-letter entry: %w", err)
		}
		other = append(other, entry)
	}
	for i := range batch.Events {
		ev := batch.Events[i]
		entry, err := jsonx.Marshal(logEntry{Event: &ev})
		if err != nil {
			return "", nil, fmt.Errorf("encoding an event: %w", err)
		}
		other = append(other, entry)
	}
	args := make([]any, 0, 7+len(recArgs)+len(slotArgs)+len(other))
	args = append(args, b.channel, b.notice(), nRecs)
	args = append(args, recArgs...)
	args = append(args, nSlots)
	args = append(args, slotArgs...)
	args = append(args, len(other))
	args = append(args, other...)
	args = append(args, b.newsChannel(), resultsPage)
	res, err := commitScript.Run(ctx, b.rdb, []string{b.k.meta, b.k.done, b.k.res, b.k.log, b.k.claims, b.k.partial, b.k.recs}, args...).Slice()
	if err != nil {
		return "", nil, fmt.Errorf("committing results of split %s to Redis: %w", b.ref, err)
	}
	state, _ := res[0].(string)
	var lost []int
	if len(res) > 1 {
		raw, _ := res[1].([]any)
		for _, v := range raw {
			lost = append(lost, int(asInt(v)))
		}
	}
	return state, lost, nil
}

// slotOf places a step record key within the split: an item's slot
// ("SPLIT[I]", slot set) or a record inside item I ("SPLIT[I]/...").
func slotOf(key, splitKey string) (slot bool, index int, ok bool) {
	rest, found := strings.CutPrefix(key, splitKey+"[")
	if !found {
		return false, 0, false
	}
	end := strings.IndexByte(rest, ']')
	if end < 0 {
		return false, 0, false
	}
	i, err := strconv.Atoi(rest[:end])
	if err != nil {
		return false, 0, false
	}
	switch {
	case end == len(rest)-1:
		return true, i, true
	case rest[end+1] == '/':
		return false, i, true
	}
	return false, 0, false
}

func statusField(s store.StepStatus) string {
	switch s {
	case store.StepSucceeded:
		return "succeeded"
	case store.StepFailed:
		return "failed"
	}
	return "skipped"
}

// newsBatch is what newsScript read.
type newsBatch struct {
	state                      string
	message                    string
	published                  int
	done                       int
	succeeded, failed, skipped int
	entries                    []logEntry
	// results are every item's, in order, when the script gave them.
	results []*result
	gone    bool
}

func (b *barrier) news(ctx context.Context, pos, max, inline int) (*newsBatch, error) {
	res, err := newsScript.Run(ctx, b.rdb, []string{b.k.meta, b.k.log, b.k.res}, pos, max, inline).Slice()
	if err != nil {
		return nil, fmt.Errorf("reading news of split %s from Redis: %w", b.ref, err)
	}
	if len(res) == 1 {
		return &newsBatch{gone: true}, nil
	}
	n := &newsBatch{}
	n.state, _ = res[0].(string)
	n.message, _ = res[1].(string)
	n.published = int(asInt(res[2]))
	n.done = int(asInt(res[3]))
	n.succeeded, n.failed, n.skipped = int(asInt(res[4])), int(asInt(res[5])), int(asInt(res[6]))
	raw, _ := res[7].([]any)
	n.entries = make([]logEntry, 0, len(raw))
	for _, e := range raw {
		s, _ := e.(string)
		var le logEntry
		if err := jsonx.Unmarshal([]byte(s), &le); err != nil {
			return nil, fmt.Errorf("decoding the log of split %s: %w", b.ref, err)
		}
		n.entries = append(n.entries, le)
	}
	if len(res) > 8 {
		raw, _ := res[8].([]any)
		if n.results, err = b.allResults(raw); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// allResults decodes every item's result, in order; nil if one is not in,
// for the join to read them itself.
func (b *barrier) allResults(raw []any) ([]*result, error) {
	out := make([]*result, 0, len(raw))
	for i, v := range raw {
		s, ok := v.(string)
		if !ok {
			return nil, nil
		}
		r, err := decodeResult(s)
		if err != nil {
			return nil, fmt.Errorf("decoding the result of item %d of split %s: %w", i, b.ref, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// pushedNews decodes the news commitScript sent on the hand-off's own
// channel: a small split's, complete, with every result.
func (b *barrier) pushedNews(payload string) (*newsBatch, error) {
	var p struct {
		Published string `json:"p"`
		Done      string `json:"d"`
		Succeeded string `json:"s"`
		Failed    string `json:"f"`
		Skipped   string `json:"k"`
		Results   []any  `json:"r"`
	}
	if err := jsonx.Unmarshal([]byte(payload), &p); err != nil {
		return nil, fmt.Errorf("decoding the news of split %s: %w", b.ref, err)
	}
	n := &newsBatch{state: string(engine.FanoutComplete)}
	for _, f := range []struct {
		to  *int
		val string
	}{{&n.published, p.Published}, {&n.done, p.Done}, {&n.succeeded, p.Succeeded}, {&n.failed, p.Failed}, {&n.skipped, p.Skipped}} {
		v, err := strconv.Atoi(f.val)
		if err != nil {
			return nil, fmt.Errorf("decoding the news of split %s: %q is not a count", b.ref, f.val)
		}
		*f.to = v
	}
	results, err := b.allResults(p.Results)
	if err != nil {
		return nil, err
	}
	if results == nil || len(results) != n.done {
		return nil, fmt.Errorf("the news of split %s holds %d of its %d results", b.ref, len(results), n.done)
	}
	n.results = results
	return n, nil
}

// results reads the results of items from to to-1, in order; a missing one
// is nil.
func (b *barrier) results(ctx context.Context, from, to int) ([]*result, error) {
	fields := make([]string, 0, to-from)
	for i := from; i < to; i++ {
		fields = append(fields, strconv.Itoa(i))
	}
	vals, err := b.rdb.HMGet(ctx, b.k.res, fields...).Result()
	if err != nil {
		return nil, fmt.Errorf("reading results of split %s from Redis: %w", b.ref, err)
	}
	out := make([]*result, len(vals))
	for j, v := range vals {
		s, ok := v.(string)
		if !ok {
			continue
		}
		r, err := decodeResult(s)
		if err != nil {
			return nil, fmt.Errorf("decoding the result of item %d of split %s: %w", from+j, b.ref, err)
		}
		out[j] = r
	}
	return out, nil
}

// scanResults calls fn with every result in, in no order, a page at a time.
func (b *barrier) scanResults(ctx context.Context, fn func(i int, r *result) error) error {
	var cursor uint64
	for {
		kvs, next, err := b.rdb.HScan(ctx, b.k.res, cursor, "", 1000).Result()
		if err != nil {
			return fmt.Errorf("reading results of split %s from Redis: %w", b.ref, err)
		}
		for j := 0; j+1 < len(kvs); j += 2 {
			i, err := strconv.Atoi(kvs[j])
			if err != nil {
				continue
			}
			r, err := decodeResult(kvs[j+1])
			if err != nil {
				return fmt.Errorf("decoding the result of item %d of split %s: %w", i, b.ref, err)
			}
			if err := fn(i, r); err != nil {
				return err
			}
		}
		if next == 0 {
			return nil
		}
		cursor = next
	}
}

func (b *barrier) trim(ctx context.Context, pos int) error {
	if err := trimScript.Run(ctx, b.rdb, []string{b.k.meta, b.k.log}, pos).Err(); err != nil {
		return fmt.Errorf("trimming results of split %s in Redis: %w", b.ref, err)
	}
	return nil
}

func (b *barrier) setPublished(ctx context.Context, cursor int) error {
	if err := publishedScript.Run(ctx, b.rdb, []string{b.k.meta}, cursor).Err(); err != nil {
		return fmt.Errorf("recording published items of split %s in Redis: %w", b.ref, err)
	}
	return nil
}

// end marks an open hand-off over, so workers drop its items.
func (b *barrier) end(ctx context.Context, state string) error {
	if err := endScript.Run(ctx, b.rdb, []string{b.k.meta}, b.channel, b.notice(), state).Err(); err != nil {
		return fmt.Errorf("ending split %s in Redis: %w", b.ref, err)
	}
	return nil
}

// remove deletes every key of the hand-off.
func (b *barrier) remove(ctx context.Context) error {
	if err := b.rdb.Del(ctx, b.k.all()...).Err(); err != nil {
		return fmt.Errorf("deleting split %s from Redis: %w", b.ref, err)
	}
	return nil
}
