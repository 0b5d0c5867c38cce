package gateway

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// TestKeyedStartsMakeOneStart: requests joining a key's start under way
// wait for it and take what it came to; once it is left, the next request
// makes a start of its own.
func TestKeyedStartsMakeOneStart(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"started", nil},
		{"failed", errors.New("the store refused")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var k keyedStarts
			ctx := context.Background()
			ks, first, err := k.join(ctx, "run/hello/alert-1")
			if err != nil || !first {
				t.Fatalf("the first join: first %v, %v", first, err)
			}
			other, first2, _ := k.join(ctx, "run/hello/alert-2")
			if !first2 {
				t.Fatal("a join of another key waited for this one")
			}
			k.leave("run/hello/alert-2", other)

			const waiters = 8
			var wg sync.WaitGroup
			got := make([]*keyedStart, waiters)
			for i := range waiters {
				wg.Go(func() {
					w, first, err := k.join(ctx, "run/hello/alert-1")
					if err != nil || first {
						t.Errorf("a join while a start is under way: first %v, %v", first, err)
					}
					got[i] = w
				})
			}
			for joined := 0; joined < waiters; time.Sleep(time.Millisecond) {
				k.mu.Lock()
				joined = ks.waiting
				k.mu.Unlock()
			}
			ks.id, ks.status, ks.err = "01RUN", "running", tc.err
			k.leave("run/hello/alert-1", ks)
			wg.Wait()
			for i, w := range got {
				if w != ks {
					t.Errorf("waiter %d saw another start: %+v", i, w)
				}
			}
			if again, first, _ := k.join(ctx, "run/hello/alert-1"); !first || again == ks {
				t.Errorf("a join after the start was left: first %v", first)
			}
		})
	}
}

// TestKeyedStartWaitEndsWithItsRequest: a request that gives up while
// another start of its key is under way is told why.
func TestKeyedStartWaitEndsWithItsRequest(t *testing.T) {
	var k keyedStarts
	ks, _, _ := k.join(context.Background(), "run/hello/alert-1")
	defer k.leave("run/hello/alert-1", ks)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, _, err := k.join(ctx, "run/hello/alert-1"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a join whose request ended: %v", err)
	}
}
