package redis

import (
	"context"
	"fmt"
	"slices"

	goredis "github.com/redis/go-redis/v9"

	"github.com/chaingate/gateway/chain/store"
)

// Concurrency slots (store.Slots), under the prefix P:
//
//	P slot:h:KEY  sorted set of a key's holders, scored by grant order
//	P slot:q:KEY  sorted set of a key's queue, scored by enqueue order
//	P slotkeys    set of the keys held or queued for, for listing
//	P slotseq     counter that orders grants and enqueues

var _ store.Slots = (*Store)(nil)

func (s *Store) slotHoldersKey(key string) string { return s.p + "slot:h:" + key }
func (s *Store) slotQueueKey(key string) string   { return s.p + "slot:q:" + key }
func (s *Store) slotKeysKey() string              { return s.p + "slotkeys" }
func (s *Store) slotSeqKey() string               { return s.p + "slotseq" }

// acquireSlotScript is store.SlotState.Acquire in one script. Holders and
// queued holders whose run is not in the unfinished index are dropped
// first: a slot is a run's until that run ends.
//
// KEYS: holders, queue, unfinished, slot keys, seq.
// ARGV: key, holder, limit, queue ("1" or "0"), queue limit.
// It returns {granted (1/0), position, full (1/0), holders...}.
var acquireSlotScript = goredis.NewScript(`
local holder, limit, queue, qlimit = ARGV[2], tonumber(ARGV[3]), ARGV[4] == '1', tonumber(ARGV[5])
local function runOf(h)
  local i = string.find(h, '/', 1, true)
  if i then return string.sub(h, 1, i - 1) end
  return h
end
for _, k in ipairs({KEYS[1], KEYS[2]}) do
  for _, h in ipairs(redis.call('ZRANGE', k, 0, -1)) do
    if not redis.call('ZSCORE', KEYS[3], runOf(h)) then
      redis.call('ZREM', k, h)
    end
  end
end
local function answer(granted, pos, full)
  local out = {granted, pos, full}
  for _, h in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do table.insert(out, h) end
  if redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[2]) == 0 then
    redis.call('SREM', KEYS[4], ARGV[1])
  else
    redis.call('SADD', KEYS[4], ARGV[1])
  end
  return out
end
if redis.call('ZSCORE', KEYS[1], holder) then
  return answer(1, 0, 0)
end
local rank = redis.call('ZRANK', KEYS[2], holder)
if redis.call('ZCARD', KEYS[1]) < limit and (redis.call('ZCARD', KEYS[2]) == 0 or rank == 0) then
  redis.call('ZREM', KEYS[2], holder)
  redis.call('ZADD', KEYS[1], redis.call('INCR', KEYS[5]), holder)
  return answer(1, 0, 0)
end
if not rank then
  if not queue then return answer(0, 0, 0) end
  if qlimit > 0 and redis.call('ZCARD', KEYS[2]) >= qlimit then return answer(0, 0, 1) end
  redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[5]), holder)
  rank = redis.call('ZCARD', KEYS[2]) - 1
elseif not queue then
  redis.call('ZREM', KEYS[2], holder)
  return answer(0, 0, 0)
end
return answer(0, rank + 1, 0)
`)

// AcquireSlot implements store.Slots in one script.
func (s *Store) AcquireSlot(ctx context.Context, req store.SlotRequest) (store.SlotGrant, error) {
	if req.Key == "" || req.Holder == "" {
		return store.SlotGrant{}, fmt.Errorf("acquiring a slot: key and holder are required: %w", store.ErrInvalid)
	}
	if err := s.begin(); err != nil {
		return store.SlotGrant{}, err
	}
	defer s.end()
	keys := []string{s.slotHoldersKey(req.Key), s.slotQueueKey(req.Key), s.unfinishedKey(), s.slotKeysKey(), s.slotSeqKey()}
	res, err := acquireSlotScript.Run(ctx, s.client, keys, req.Key, req.Holder, max(req.Limit, 1), flag(req.Queue), max(req.QueueLimit, 0)).Slice()
	if err != nil {
		return store.SlotGrant{}, fmt.Errorf("acquiring a slot of %q: %w", req.Key, err)
	}
	if len(res) < 3 {
		return store.SlotGrant{}, fmt.Errorf("acquiring a slot of %q: the script answered %v", req.Key, res)
	}
	g := store.SlotGrant{Granted: res[0].(int64) == 1, Position: int(res[1].(int64)), Full: res[2].(int64) == 1}
	for _, h := range res[3:] {
		g.Holders = append(g.Holders, h.(string))
	}
	return g, nil
}

// releaseSlotScript takes a holder out of a key's holders and queue.
//
// KEYS: holders, queue, slot keys. ARGV: key, holder.
var releaseSlotScript = goredis.NewScript(`
redis.call('ZREM', KEYS[1], ARGV[2])
redis.call('ZREM', KEYS[2], ARGV[2])
if redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[2]) == 0 then
  redis.call('SREM', KEYS[3], ARGV[1])
end
return 0
`)

// ReleaseSlot implements store.Slots.
func (s *Store) ReleaseSlot(ctx context.Context, key, holder string) error {
	if err := s.begin(); err != nil {
		return err
	}
	defer s.end()
	keys := []string{s.slotHoldersKey(key), s.slotQueueKey(key), s.slotKeysKey()}
	if err := releaseSlotScript.Run(ctx, s.client, keys, key, holder).Err(); err != nil {
		return fmt.Errorf("releasing a slot of %q: %w", key, err)
	}
	return nil
}

// ListSlots implements store.Slots.
func (s *Store) ListSlots(ctx context.Context) ([]store.SlotState, error) {
	if err := s.begin(); err != nil {
		return nil, err
	}
	defer s.end()
	keys, err := s.client.SMembers(ctx, s.slotKeysKey()).Result()
	if err != nil {
		return nil, fmt.Errorf("listing slots: %w", err)
	}
	slices.Sort(keys)
	var out []store.SlotState
	for _, k := range keys {
		var h, q *goredis.StringSliceCmd
		_, err := s.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
			h = p.ZRange(ctx, s.slotHoldersKey(k), 0, -1)
			q = p.ZRange(ctx, s.slotQueueKey(k), 0, -1)
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("listing slots: %w", err)
		}
		st := store.SlotState{Key: k, Holders: h.Val(), Queue: q.Val()}
		ids := make([]string, 0, len(st.Holders)+len(st.Queue))
		for _, x := range append(slices.Clone(st.Holders), st.Queue...) {
			ids = append(ids, store.SlotRun(x))
		}
		alive := map[string]bool{}
		scores := make([]*goredis.FloatCmd, len(ids))
		_, err = s.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
			for i, id := range ids {
				scores[i] = p.ZScore(ctx, s.unfinishedKey(), id)
			}
			return nil
		})
		if err != nil && err != goredis.Nil {
			return nil, fmt.Errorf("listing slots: %w", err)
		}
		for i, id := range ids {
			if scores[i].Err() == nil {
				alive[id] = true
			}
		}
		st.Prune(func(id string) bool { return alive[id] })
		if !st.Empty() {
			out = append(out, st)
		}
	}
	return out, nil
}
