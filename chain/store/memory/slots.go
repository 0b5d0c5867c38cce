package memory

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/chaingate/gateway/chain/store"
)

var _ store.Slots = (*Store)(nil)

func (s *Store) aliveRun(id string) bool {
	_, ok := s.unfinished[id]
	return ok
}

// AcquireSlot implements store.Slots.
func (s *Store) AcquireSlot(ctx context.Context, req store.SlotRequest) (store.SlotGrant, error) {
	if req.Key == "" || req.Holder == "" {
		return store.SlotGrant{}, fmt.Errorf("acquiring a slot: %w", errors.Join(store.ErrInvalid, errors.New("key and holder are required")))
	}
	if err := s.lock(); err != nil {
		return store.SlotGrant{}, err
	}
	defer s.mu.Unlock()
	if s.slots == nil {
		s.slots = map[string]*store.SlotState{}
	}
	st := s.slots[req.Key]
	if st == nil {
		st = &store.SlotState{Key: req.Key}
		s.slots[req.Key] = st
	}
	g := st.Acquire(req, s.aliveRun)
	if st.Empty() {
		delete(s.slots, req.Key)
	}
	return g, nil
}

// ReleaseSlot implements store.Slots.
func (s *Store) ReleaseSlot(ctx context.Context, key, holder string) error {
	if err := s.lock(); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if st := s.slots[key]; st != nil {
		st.Release(holder)
		if st.Empty() {
			delete(s.slots, key)
		}
	}
	return nil
}

// ListSlots implements store.Slots.
func (s *Store) ListSlots(ctx context.Context) ([]store.SlotState, error) {
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	out := make([]store.SlotState, 0, len(s.slots))
	for _, st := range s.slots {
		c := store.SlotState{Key: st.Key, Holders: slices.Clone(st.Holders), Queue: slices.Clone(st.Queue)}
		c.Prune(s.aliveRun)
		if !c.Empty() {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b store.SlotState) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}
