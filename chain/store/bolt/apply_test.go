package bolt

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/chaingate/gateway/chain/store"
)

// TestBugWhileApplyingFailsTheWrite: a write that panics inside the
// transaction is answered with an error that says so, and the store goes
// on taking commits.
func TestBugWhileApplyingFailsTheWrite(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "gw.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	err = s.writeShared(ctx, "writing something", func(*bbolt.Tx) error { panic("a bug") })
	if err == nil || !strings.Contains(err.Error(), "writing something: writing to the store hit a bug: a bug") {
		t.Fatalf("the write that hit a bug returned %v", err)
	}
	run := &store.Run{ID: store.NewID(), Chain: "c", Status: store.RunRunning, Seq: 1, CreatedAt: time.Now(), UpdatedAt: time.Now()}
	done := make(chan error, 1)
	go func() {
		done <- s.Commit(ctx, &store.Batch{Run: run, Create: true, Events: []store.Event{{Seq: 1, Type: store.EventRunStarted}}})
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("a commit after the bug: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a commit after the bug is still waiting: the store was left locked")
	}
	if got, err := s.RunHeader(ctx, run.ID); err != nil || got.ID != run.ID {
		t.Fatalf("the run committed after the bug: %v %v", got, err)
	}
}

// TestCollectTakesWhatIsQueued: a transaction takes the commit that opens
// it and every one queued behind it, up to maxGroup, whether or not it
// yields for more; a closed queue ends the collecting.
func TestCollectTakesWhatIsQueued(t *testing.T) {
	for _, tc := range []struct {
		name   string
		queued int
		closed bool
		want   int
	}{
		{"alone", 0, false, 1},
		{"below the yield", yieldFrom - 2, false, yieldFrom - 1},
		{"enough to yield", yieldFrom + 3, false, yieldFrom + 4},
		{"more than a transaction holds", maxGroup + 10, false, maxGroup},
		{"the queue closed", yieldFrom + 1, true, yieldFrom + 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Store{reqs: make(chan *commitReq, maxGroup+10)}
			first := &commitReq{what: "first"}
			for range tc.queued {
				s.reqs <- &commitReq{}
			}
			if tc.closed {
				close(s.reqs)
			}
			group := s.collect(first)
			if len(group) != tc.want || group[0] != first {
				t.Errorf("collected %d commits (the first first: %v), want %d", len(group), group[0] == first, tc.want)
			}
			if left := len(s.reqs); left != tc.queued+1-tc.want {
				t.Errorf("%d commits left queued, want %d", left, tc.queued+1-tc.want)
			}
		})
	}
}
