package storetest

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/store"
)

func slotsOf(t *testing.T, s store.Store) store.Slots {
	t.Helper()
	sl, ok := s.(store.Slots)
	if !ok {
		t.Fatalf("%T does not keep concurrency slots (store.Slots)", s)
	}
	return sl
}

func acquire(t *testing.T, sl store.Slots, req store.SlotRequest) store.SlotGrant {
	t.Helper()
	g, err := sl.AcquireSlot(context.Background(), req)
	if err != nil {
		t.Fatalf("acquiring %+v: %v", req, err)
	}
	return g
}

// testSlots holds a store to what store.Slots promises: at most Limit
// holders, a FIFO queue, idempotent places, and a slot free once its run
// has ended, with no release.
func testSlots(t *testing.T, f Factory) {
	ctx := context.Background()
	s := f.Open(t)
	sl := slotsOf(t, s)
	now := time.Now().UTC()
	runs := make([]*store.Run, 5)
	for i := range runs {
		runs[i] = NewRun("c", now)
		create(t, s, runs[i])
	}
	a, b, c, d, e := runs[0].ID, runs[1].ID, runs[2].ID, runs[3].ID, runs[4].ID
	req := func(holder string) store.SlotRequest {
		return store.SlotRequest{Key: "host-1", Holder: holder, Limit: 1, Queue: true, QueueLimit: 2}
	}
	if g := acquire(t, sl, req(a)); !g.Granted || !slices.Equal(g.Holders, []string{a}) {
		t.Fatalf("the first acquire of a free key: %+v", g)
	}
	if g := acquire(t, sl, req(a)); !g.Granted {
		t.Fatalf("its holder acquiring again: %+v", g)
	}
	if g := acquire(t, sl, req(b)); g.Granted || g.Position != 1 || !slices.Equal(g.Holders, []string{a}) {
		t.Fatalf("a second run: %+v, want queued first behind %s", g, a)
	}
	if g := acquire(t, sl, req(c)); g.Granted || g.Position != 2 {
		t.Fatalf("a third run: %+v, want queued second", g)
	}
	if g := acquire(t, sl, req(b)); g.Granted || g.Position != 1 {
		t.Fatalf("the second run asking again: %+v, want the same place", g)
	}
	if g := acquire(t, sl, req(d)); g.Granted || !g.Full || g.Position != 0 {
		t.Fatalf("a fourth run over the queue limit: %+v, want full", g)
	}
	skip := req(e)
	skip.Queue = false
	if g := acquire(t, sl, skip); g.Granted || g.Position != 0 || g.Full {
		t.Fatalf("a run that does not queue: %+v", g)
	}
	list, err := sl.ListSlots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []store.SlotState{{Key: "host-1", Holders: []string{a}, Queue: []string{b, c}}}
	if !slotStatesEqual(list, want) {
		t.Fatalf("ListSlots = %+v, want %+v", list, want)
	}
	if f.Reopen != nil {
		s = f.Reopen(t, s)
		sl = slotsOf(t, s)
	}
	// The holder's run ends: the slot is free to the head of the queue,
	// and to no one else, without a release.
	finish(t, s, runs[0], store.RunSucceeded, now)
	if g := acquire(t, sl, req(c)); g.Granted || g.Position != 2 {
		t.Fatalf("the second in the queue, once the holder ended: %+v", g)
	}
	if g := acquire(t, sl, req(b)); !g.Granted || !slices.Equal(g.Holders, []string{b}) {
		t.Fatalf("the head of the queue, once the holder ended: %+v", g)
	}
	if g := acquire(t, sl, req(c)); g.Granted || g.Position != 1 {
		t.Fatalf("the queue moved on: %+v", g)
	}
	if err := sl.ReleaseSlot(ctx, "host-1", b); err != nil {
		t.Fatal(err)
	}
	if err := sl.ReleaseSlot(ctx, "host-1", b); err != nil {
		t.Fatalf("releasing twice: %v", err)
	}
	if g := acquire(t, sl, req(c)); !g.Granted {
		t.Fatalf("after a release: %+v", g)
	}
	// A step's key is held as RUN/STEP; a limit above one.
	two := func(holder string) store.SlotRequest {
		return store.SlotRequest{Key: "fleet", Holder: holder, Limit: 2, Queue: true}
	}
	if g := acquire(t, sl, two(d+"/restart[0]")); !g.Granted {
		t.Fatalf("limit 2, first: %+v", g)
	}
	if g := acquire(t, sl, two(e+"/restart[1]")); !g.Granted {
		t.Fatalf("limit 2, second: %+v", g)
	}
	if g := acquire(t, sl, two(c+"/restart[2]")); g.Granted || g.Position != 1 || len(g.Holders) != 2 {
		t.Fatalf("limit 2, third: %+v", g)
	}
	finish(t, s, runs[3], store.RunCancelled, now)
	if g := acquire(t, sl, two(c+"/restart[2]")); !g.Granted {
		t.Fatalf("limit 2, once a holder's run ended: %+v", g)
	}
	for _, r := range []*store.Run{runs[1], runs[2], runs[4]} {
		finish(t, s, r, store.RunSkipped, now)
	}
	if list, err := sl.ListSlots(ctx); err != nil || len(list) != 0 {
		t.Fatalf("ListSlots once every run ended = %+v, %v; want none", list, err)
	}
	if got := finished(t, s, store.RunSkipped); len(got) != 3 {
		t.Fatalf("FinishedRuns(skipped) = %v, want 3 runs", got)
	}
}

func slotStatesEqual(a, b []store.SlotState) bool {
	return slices.EqualFunc(a, b, func(x, y store.SlotState) bool {
		return x.Key == y.Key && slices.Equal(x.Holders, y.Holders) && slices.Equal(x.Queue, y.Queue)
	})
}

// testSlotsConcurrent has many goroutines queue for one key at once:
// never more holders than the limit, and slots granted in the order the
// queue was joined.
func testSlotsConcurrent(t *testing.T, f Factory) {
	for _, limit := range []int{1, 3} {
		ctx := context.Background()
		s := f.Open(t)
		sl := slotsOf(t, s)
		key := "busy"
		blocker := NewRun("c", time.Now().UTC())
		create(t, s, blocker)
		req := func(holder string) store.SlotRequest {
			return store.SlotRequest{Key: key, Holder: holder, Limit: limit, Queue: true}
		}
		// The blocker takes every slot, so that everyone else queues.
		for i := range limit {
			if g := acquire(t, sl, req(blocker.ID+"/b"+string(rune('0'+i)))); !g.Granted {
				t.Fatalf("the blocker: %+v", g)
			}
		}
		const n = 24
		ids := make([]string, n)
		for i := range ids {
			r := NewRun("c", time.Now().UTC())
			create(t, s, r)
			ids[i] = r.ID
		}
		var wg sync.WaitGroup
		for _, id := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if g, err := sl.AcquireSlot(ctx, req(id)); err != nil || g.Granted || g.Position == 0 {
					t.Errorf("queueing %s: %+v, %v", id, g, err)
				}
			}()
		}
		wg.Wait()
		list, err := sl.ListSlots(ctx)
		if err != nil || len(list) != 1 || len(list[0].Queue) != n {
			t.Fatalf("ListSlots = %+v, %v; want %d queued", list, err, n)
		}
		queued := list[0].Queue
		for i := range limit {
			if err := sl.ReleaseSlot(ctx, key, blocker.ID+"/b"+string(rune('0'+i))); err != nil {
				t.Fatal(err)
			}
		}
		var (
			mu      sync.Mutex
			granted []string
			holding atomic.Int32
		)
		for _, id := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					g, err := sl.AcquireSlot(ctx, req(id))
					if err != nil {
						t.Errorf("acquiring for %s: %v", id, err)
						return
					}
					if !g.Granted {
						time.Sleep(time.Millisecond)
						continue
					}
					if h := holding.Add(1); int(h) > limit {
						t.Errorf("%d hold a key of limit %d", h, limit)
					}
					mu.Lock()
					granted = append(granted, id)
					mu.Unlock()
					time.Sleep(time.Millisecond)
					holding.Add(-1)
					if err := sl.ReleaseSlot(ctx, key, id); err != nil {
						t.Errorf("releasing for %s: %v", id, err)
					}
					return
				}
			}()
		}
		wg.Wait()
		if limit == 1 && !slices.Equal(granted, queued) {
			t.Errorf("limit 1: granted in the order\n%v\nqueued in the order\n%v", granted, queued)
		}
		if len(granted) != n {
			t.Errorf("limit %d: %d granted, want %d", limit, len(granted), n)
		}
	}
}
