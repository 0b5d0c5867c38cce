package storetest

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/store"
)

// testAudit appends entries, from many goroutines too, walks them both
// ways between times and past a cursor, reads them back after a reopen,
// and prunes the old ones.
func testAudit(t *testing.T, f Factory) {
	ctx := context.Background()
	s := f.Open(t)
	if err := s.AppendAudit(ctx, &store.AuditEntry{ID: "not-an-id", Subject: "x"}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("an entry with a bad id: %v, want ErrInvalid", err)
	}
	var ids []string
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range 600 {
		wg.Go(func() {
			e := &store.AuditEntry{ID: store.NewID(), Time: time.Now(), Subject: "alice <a@example.com>", SubjectKind: "person", Roles: []string{"oncall"},
				Action: "cancel", TargetKind: "run", Target: "r" + string(rune('a'+i%26)), Chain: "disk-full", EntryPoint: "api", Outcome: store.AuditOK, Status: 202}
			if err := s.AppendAudit(ctx, e); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			ids = append(ids, e.ID)
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.Sort(ids)
	walk := func(scan store.AuditScan, max int) []string {
		t.Helper()
		var got []string
		err := s.WalkAudit(ctx, scan, func(e *store.AuditEntry) (bool, error) {
			got = append(got, e.ID)
			return max == 0 || len(got) < max, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := walk(store.AuditScan{Oldest: true}, 0); !slices.Equal(got, ids) {
		t.Fatalf("oldest first: %d entries, want %d in order", len(got), len(ids))
	}
	newest := walk(store.AuditScan{}, 0)
	if want := slices.Clone(ids); !slices.Equal(newest, func() []string { slices.Reverse(want); return want }()) {
		t.Fatalf("newest first: %d entries, not the %d in reverse", len(newest), len(ids))
	}
	if got := walk(store.AuditScan{}, 10); !slices.Equal(got, newest[:10]) {
		t.Errorf("a walk stopped after 10 gave %d", len(got))
	}
	if got := walk(store.AuditScan{After: newest[299]}, 0); !slices.Equal(got, newest[300:]) {
		t.Errorf("newest first after the 300th: %d entries, want %d", len(got), len(newest)-300)
	}
	if got := walk(store.AuditScan{After: ids[299], Oldest: true}, 0); !slices.Equal(got, ids[300:]) {
		t.Errorf("oldest first after the 300th: %d entries, want %d", len(got), len(ids)-300)
	}

	// Entries a minute apart, read between times.
	base := time.Now().Add(time.Hour).Truncate(time.Minute)
	var timed []string
	for i := range 5 {
		at := base.Add(time.Duration(i) * time.Minute)
		e := &store.AuditEntry{ID: idAt(at), Time: at, Subject: "bob", Action: "start", TargetKind: "chain", Target: "hello", EntryPoint: "console", Outcome: store.AuditDenied, Detail: "no role"}
		if err := s.AppendAudit(ctx, e); err != nil {
			t.Fatal(err)
		}
		timed = append(timed, e.ID)
	}
	if got := walk(store.AuditScan{Since: base.Add(time.Minute), Until: base.Add(3 * time.Minute), Oldest: true}, 0); !slices.Equal(got, timed[1:3]) {
		t.Errorf("between minutes 1 and 3: %v, want %v", got, timed[1:3])
	}
	if got := walk(store.AuditScan{Since: base.Add(time.Minute), Until: base.Add(3 * time.Minute)}, 0); !slices.Equal(got, []string{timed[2], timed[1]}) {
		t.Errorf("between minutes 1 and 3, newest first: %v", got)
	}

	if f.Reopen != nil {
		s = f.Reopen(t, s)
	}
	var back *store.AuditEntry
	_ = s.WalkAudit(ctx, store.AuditScan{Oldest: true}, func(e *store.AuditEntry) (bool, error) { back = e; return false, nil })
	if back == nil || back.ID != ids[0] || back.Subject != "alice <a@example.com>" || !slices.Equal(back.Roles, []string{"oncall"}) || back.Status != 202 {
		t.Errorf("after a reopen the first entry reads %+v", back)
	}
	n, err := s.PruneAudit(ctx, base.Add(2*time.Minute))
	if err != nil || n != len(ids)+2 {
		t.Errorf("pruning before minute 2: %d, %v; want %d", n, err, len(ids)+2)
	}
	if got := walk(store.AuditScan{Oldest: true}, 0); !slices.Equal(got, timed[2:]) {
		t.Errorf("after pruning: %v, want %v", got, timed[2:])
	}
}

// idAt is an id NewID could have made at t.
func idAt(t time.Time) string {
	floor := store.IDFloor(t)
	return floor[:25] + "1"
}
