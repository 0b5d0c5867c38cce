package bolt

import (
	"context"
	"encoding/json"
	"fmt"

	"go.etcd.io/bbolt"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/internal/jsonx"
)

// bucketSlots holds the concurrency keys held or queued for: key → its
// store.SlotState as JSON. It is made the first time a slot is asked for.
var bucketSlots = []byte("slots")

var _ store.Slots = (*Store)(nil)

// aliveIn reports, inside tx, whether a run is unfinished.
func aliveIn(tx *bbolt.Tx) func(string) bool {
	unfinished := tx.Bucket(bucketUnfinished)
	return func(id string) bool { return unfinished.Get([]byte(id)) != nil }
}

// AcquireSlot implements store.Slots, in one transaction.
func (s *Store) AcquireSlot(ctx context.Context, req store.SlotRequest) (store.SlotGrant, error) {
	if req.Key == "" || req.Holder == "" {
		return store.SlotGrant{}, fmt.Errorf("acquiring a slot: key and holder are required: %w", store.ErrInvalid)
	}
	var g store.SlotGrant
	err := s.updateSlot(req.Key, func(st *store.SlotState, alive func(string) bool) {
		g = st.Acquire(req, alive)
	})
	if err != nil {
		return store.SlotGrant{}, fmt.Errorf("acquiring a slot of %q: %w", req.Key, err)
	}
	return g, nil
}

// ReleaseSlot implements store.Slots.
func (s *Store) ReleaseSlot(ctx context.Context, key, holder string) error {
	err := s.updateSlot(key, func(st *store.SlotState, _ func(string) bool) { st.Release(holder) })
	if err != nil {
		return fmt.Errorf("releasing a slot of %q: %w", key, err)
	}
	return nil
}

// updateSlot changes one key's state in one transaction.
func (s *Store) updateSlot(key string, fn func(st *store.SlotState, alive func(string) bool)) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return store.ErrClosed
	}
	return s.db.Update(func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketSlots)
		if err != nil {
			return err
		}
		st := store.SlotState{Key: key}
		if v := b.Get([]byte(key)); v != nil {
			if err := json.Unmarshal(v, &st); err != nil {
				return fmt.Errorf("reading the slot's state: %w", store.ErrDamaged)
			}
		}
		fn(&st, aliveIn(tx))
		if st.Empty() {
			return b.Delete([]byte(key))
		}
		v, err := jsonx.Marshal(&st)
		if err != nil {
			return err
		}
		return b.Put([]byte(key), v)
	})
}

// ListSlots implements store.Slots.
func (s *Store) ListSlots(ctx context.Context) ([]store.SlotState, error) {
	var out []store.SlotState
	err := s.view(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketSlots)
		if b == nil {
			return nil
		}
		alive := aliveIn(tx)
		return b.ForEach(func(k, v []byte) error {
			var st store.SlotState
			if err := json.Unmarshal(v, &st); err != nil {
				return nil // a damaged entry is passed over
			}
			st.Key = string(k)
			st.Prune(alive)
			if !st.Empty() {
				out = append(out, st)
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("listing slots: %w", err)
	}
	return out, nil
}
