package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
)

// heldStore holds back every commit that matches hold until release: what
// the engine does meanwhile is what it would have done had it crashed
// before the commit became durable.
type heldStore struct {
	store.Store
	mu      sync.Mutex
	hold    func(*store.Batch) bool
	release chan struct{}
	held    chan struct{} // closed when the first matching commit arrives
}

func (s *heldStore) Commit(ctx context.Context, b *store.Batch) error {
	s.mu.Lock()
	hold, release, held := s.hold, s.release, s.held
	s.mu.Unlock()
	if hold != nil && hold(b) {
		select {
		case <-held:
		default:
			close(held)
		}
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return s.Store.Commit(ctx, b)
}

// holdUntil arranges for commits matching hold to wait; the returned func
// lets them through.
func (s *heldStore) holdUntil(hold func(*store.Batch) bool) (held <-chan struct{}, release func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hold, s.release, s.held = hold, make(chan struct{}), make(chan struct{})
	rel := s.release
	return s.held, func() { close(rel) }
}

func holdsStep(key string, status store.StepStatus) func(*store.Batch) bool {
	return func(b *store.Batch) bool {
		for _, rec := range b.Steps {
			if rec.Key == key && rec.Status == status {
				return true
			}
		}
		return false
	}
}

// TestNoCallBeforeItsIntentIsDurable holds back, one at a time, the commit
// of a step's intent and the commit of the previous step's result, and
// checks that no provider call goes out before them: a crash at that moment
// must not leave a call made that the store does not know led to it.
func TestNoCallBeforeItsIntentIsDurable(t *testing.T) {
	tests := []struct {
		name   string
		chain  string
		holdOn func(*store.Batch) bool
	}{
		{"intent of the first call", "top", holdsStep("first", store.StepRunning)},
		{"result before the next call", "top", holdsStep("first", store.StepSucceeded)},
		{"retry attempt", "retry", holdsStep("flaky", store.StepRunning)},
		{"group's record before its first sub-step call", "group", holdsStep("both", store.StepRunning)},
		{"group sub-step result before the next step", "group", holdsStep("both/a", store.StepSucceeded)},
		{"item step result before the item's next call", "split", holdsStep("loop[0]/first", store.StepSucceeded)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			rec := filepath.Join(dir, "calls.jsonl")
			var hs *heldStore
			h := newHarness(t, fmt.Sprintf(`
[[chains]]
name = "top"
[[chains.steps]]
name = "first"
provider = "faulty"
payload_template = { record = %[1]q, sleep_ms = 100 }
[[chains.steps]]
name = "second"
provider = "faulty"
payload_template = { record = %[1]q, after = "<<steps.first.body.sleep_ms>>" }

[[chains]]
name = "retry"
[[chains.steps]]
name = "flaky"
provider = "faulty"
payload_template = { record = %[1]q, fail_times = 1 }
retry = { max_retries = 1, backoff_ms = 10 }

[[chains]]
name = "group"
[[chains.steps]]
name = "both"
[chains.steps.parallel]
[[chains.steps.parallel.steps]]
name = "a"
provider = "faulty"
payload_template = { record = %[1]q }
[[chains.steps]]
name = "second"
provider = "faulty"
payload_template = { record = %[1]q }

[[chains]]
name = "split"
[[chains.steps]]
name = "loop"
[chains.steps.split]
items = "<<origin.payload.items>>"
[[chains.steps.split.steps]]
name = "first"
provider = "faulty"
payload_template = { record = %[1]q, sleep_ms = 100 }
[[chains.steps.split.steps]]
name = "second"
provider = "faulty"
payload_template = { record = %[1]q, after = "<<steps.first.body.sleep_ms>>" }
`, rec), atStore(filepath.Join(dir, "gw.db")), wrapStore(func(st store.Store) store.Store {
				hs = &heldStore{Store: st}
				return hs
			}))
			held, release := hs.holdUntil(tc.holdOn)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			// The first calls' intents go in the run's create commit, which
			// Start waits for.
			started := make(chan *store.Run, 1)
			go func() {
				run, err := h.eng.Start(ctx, tc.chain, engine.Input{Payload: json.RawMessage(`{"items":[1]}`)})
				if err != nil {
					t.Error(err)
				}
				started <- run
			}()
			select {
			case <-held:
			case <-ctx.Done():
				t.Fatal("the commit to hold never came")
			}
			before := countLines(t, rec)
			// Had a call depended on the held commit, it would be out by now.
			time.Sleep(300 * time.Millisecond)
			if n := countLines(t, rec); n != before {
				t.Errorf("%d calls went out while a commit they depend on was held", n-before)
			}
			release()
			run := <-started
			if run == nil {
				t.FailNow()
			}
			final, err := h.eng.Wait(ctx, run.ID)
			if err != nil || final.Status != store.RunSucceeded {
				t.Fatalf("run: %+v %v", final, err)
			}
		})
	}
}

// unreadyStore fails every read of a stored definition, as a store that
// times out would.
type unreadyStore struct{ store.Store }

func (unreadyStore) Definition(context.Context, string) ([]byte, error) {
	return nil, errors.New("i/o timeout")
}

// TestResumeWaitsOutAStoreError checks that a run whose definition cannot
// be read this time stays unfinished for a later resume, instead of
// failing for good.
func TestResumeWaitsOutAStoreError(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "gw.db")
	started := `
[[chains]]
name = "c"
[[chains.steps]]
name = "slow"
provider = "faulty"
payload_template = { sleep_ms = 60000 }
`
	h1 := newHarness(t, started, atStore(db))
	ctx := context.Background()
	run, err := h1.eng.Start(ctx, "c", engine.Input{})
	if err != nil {
		t.Fatal(err)
	}
	h1.close()
	// The chain changed since, so resuming needs the stored definition.
	changed := strings.Replace(started, "60000", "1", 1)
	h2 := newHarness(t, changed, atStore(db), wrapStore(func(st store.Store) store.Store { return unreadyStore{st} }))
	if _, err := h2.eng.Resume(ctx); err == nil || !strings.Contains(err.Error(), "i/o timeout") {
		t.Fatalf("resume with the store failing: %v", err)
	}
	if got, _ := h2.store.Run(ctx, run.ID); got.Status != store.RunRunning {
		t.Fatalf("after a store error the run is %s", got.Status)
	}
	h2.close()
	h3 := newHarness(t, changed, atStore(db))
	if ids, err := h3.eng.Resume(ctx); err != nil || len(ids) != 1 {
		t.Fatalf("resume: %v %v", ids, err)
	}
}

// TestBugFailsOnlyItsRun checks that a panic while one run is advanced
// ends that run failed, with a reason, and leaves the engine serving.
func TestBugFailsOnlyItsRun(t *testing.T) {
	h := newHarness(t, `
[[providers]]
name = "`+panicsOnResolve+`"
type = "echo"

[[chains]]
name = "buggy"
[[chains.steps]]
name = "call"
provider = "`+panicsOnResolve+`"

[[chains]]
name = "fine"
[[chains.steps]]
name = "call"
provider = "echo"
`)
	res := h.run("buggy", `{}`)
	if res.Status != store.RunFailed || res.Error == nil || res.Error.Code != "internal" || !strings.Contains(res.Error.Message, "resolver bug") {
		t.Fatalf("buggy run: %s %+v", res.Status, res.Error)
	}
	if res := h.run("fine", `{}`); res.Status != store.RunSucceeded {
		t.Errorf("the next run: %s %+v", res.Status, res.Error)
	}
}

// unrenewableStore cannot renew leases, as a store out of reach would not.
type unrenewableStore struct{ store.Store }

func (unrenewableStore) RenewLease(context.Context, store.Lease, time.Duration) (store.Lease, error) {
	return store.Lease{}, errors.New("connection refused")
}

// TestNoCallUnderALapsedLease lets a run's lease run out while a call is
// in flight: the next call must not go out, since another gateway may hold
// the run by then (its intent cannot be committed under the lapsed lease);
// a later engine makes it, once. A group's sub-step, whose first call
// otherwise goes out ahead of its own record, waits for it too.
func TestNoCallUnderALapsedLease(t *testing.T) {
	tests := []struct{ chain, next, cursor string }{
		{"c", "next", "next"},
		{"g", "both/next", "both"},
	}
	for _, tc := range tests {
		t.Run(tc.chain, func(t *testing.T) {
			dir := t.TempDir()
			rec := filepath.Join(dir, "calls.jsonl")
			cfg := fmt.Sprintf(`
[[chains]]
name = "c"
[[chains.steps]]
name = "slow"
provider = "faulty"
payload_template = { record = %[1]q, sleep_ms = 900 }
[[chains.steps]]
name = "next"
provider = "faulty"
payload_template = { record = %[1]q }

[[chains]]
name = "g"
[[chains.steps]]
name = "both"
[chains.steps.parallel]
max_concurrency = 1
[[chains.steps.parallel.steps]]
name = "slow"
provider = "faulty"
payload_template = { record = %[1]q, sleep_ms = 900 }
[[chains.steps.parallel.steps]]
name = "next"
provider = "faulty"
payload_template = { record = %[1]q }
`, rec)
			db := filepath.Join(dir, "gw.db")
			var logs logLines
			h1 := newHarness(t, cfg, atStore(db), withLogger(logs.logger()), withLeaseTTL(300*time.Millisecond), wrapStore(func(st store.Store) store.Store { return unrenewableStore{st} }))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			run, err := h1.eng.Start(ctx, tc.chain, engine.Input{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := h1.eng.Wait(ctx, run.ID); !errors.Is(err, engine.ErrNotActive) {
				t.Fatalf("waiting on a run whose lease ran out: %v", err)
			}
			h1.close()
			if n := countLines(t, rec); n != 1 {
				t.Fatalf("%d calls under the lapsed lease, want only the first", n)
			}
			lost := false
			for _, r := range logs.records(t) {
				if strings.HasPrefix(r["msg"].(string), "lost the lease on the run") && r["run"] == run.ID && r["chain"] == tc.chain && r["step"] == tc.cursor && r["level"] == "WARN" {
					lost = true
				}
			}
			if !lost {
				t.Errorf("the lost lease was not logged with run, chain and step:\n%s", logs.buf.String())
			}
			h2 := newHarness(t, cfg, atStore(db))
			if _, err := h2.eng.Resume(ctx); err != nil {
				t.Fatal(err)
			}
			if final, err := h2.eng.Wait(ctx, run.ID); err != nil || final.Status != store.RunSucceeded {
				t.Fatalf("after resume: %+v %v", final, err)
			}
			calls := readRecords(t, rec)
			if calls[run.ID+"/"+tc.next] != 1 {
				t.Errorf("calls: %v", calls)
			}
		})
	}
}

// refusingStore fails, as a store gone away would, the commits refuse
// picks; the engine then stops the run as a crash there would.
type refusingStore struct {
	store.Store
	refuse func(*store.Batch) bool
}

func (s refusingStore) Commit(ctx context.Context, b *store.Batch) error {
	if s.refuse(b) {
		return store.ErrClosed
	}
	return s.Store.Commit(ctx, b)
}

// TestSubStepCallsGoAheadOfTheirRecord lets a group sub-step's running
// record (the second's, once the group's record is durable) be committed
// only once its call is out, and then fails that commit: the call goes out all the same, since the group's record, durable
// before it, holds every sub-step's dedup key, and the resumed engine calls
// it again with the same dedup key and attempt, as after any call left
// unanswered.
func TestSubStepCallsGoAheadOfTheirRecord(t *testing.T) {
	dir := t.TempDir()
	rec := filepath.Join(dir, "calls.jsonl")
	cfg := fmt.Sprintf(`
[[chains]]
name = "group"
[[chains.steps]]
name = "both"
[chains.steps.parallel]
max_concurrency = 1
[[chains.steps.parallel.steps]]
name = "a"
provider = "faulty"
payload_template = { record = %[1]q }
[[chains.steps.parallel.steps]]
name = "b"
provider = "faulty"
payload_template = { record = %[1]q, sleep_ms = 200 }
`, rec)
	db := filepath.Join(dir, "gw.db")
	var callFirst atomic.Bool
	intent := holdsStep("both/b", store.StepRunning)
	h1 := newHarness(t, cfg, atStore(db), wrapStore(func(st store.Store) store.Store {
		return refusingStore{Store: st, refuse: func(b *store.Batch) bool {
			if !intent(b) {
				return false
			}
			for range 1000 {
				if data, _ := os.ReadFile(rec); strings.Contains(string(data), "/both/b") {
					callFirst.Store(true)
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			return true
		}}
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	run, err := h1.eng.Start(ctx, "group", engine.Input{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h1.eng.Wait(ctx, run.ID); err == nil {
		t.Fatal("the run finished although its sub-step's record could not be written")
	}
	h1.close()
	if !callFirst.Load() {
		t.Fatal("the sub-step's call waited for its own record")
	}
	h2 := newHarness(t, cfg, atStore(db))
	if _, err := h2.eng.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	final, err := h2.eng.Wait(ctx, run.ID)
	if err != nil || final.Status != store.RunSucceeded {
		t.Fatalf("after resume: %+v %v", final, err)
	}
	var attempts []int
	for _, l := range strings.Split(strings.TrimSpace(readFileString(t, rec)), "\n") {
		var r struct {
			DedupKey string `json:"dedup_key"`
			Attempt  int    `json:"attempt"`
		}
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("record line %q: %v", l, err)
		}
		if r.DedupKey == run.ID+"/both/b" {
			attempts = append(attempts, r.Attempt)
		}
	}
	if len(attempts) != 2 || attempts[0] != 1 || attempts[1] != 1 {
		t.Errorf("attempts of b's calls: %v, want the first attempt twice", attempts)
	}
}

// readRecords counts a faulty record file's calls by dedup key.
func readRecords(t *testing.T, path string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, l := range strings.Split(strings.TrimSpace(readFileString(t, path)), "\n") {
		var r struct {
			DedupKey string `json:"dedup_key"`
		}
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("record line %q: %v", l, err)
		}
		out[r.DedupKey]++
	}
	return out
}

// TestOneCallPerIntentWhileCommitsQueue holds back the commit of one
// sub-step's result until the other sub-step has answered, so that the group
// joins, and the next step's intent is written, while an earlier commit is
// still under way. That earlier commit's acknowledgement must not make the
// engine take the next step, whose call waits for its own intent, for one
// left unanswered by a crash: the step is called once, and not before its
// intent is durable.
func TestOneCallPerIntentWhileCommitsQueue(t *testing.T) {
	tests := []struct{ name, next string }{
		{"provider step", `
[[chains.steps]]
name = "after"
provider = "faulty"
payload_template = { record = "REC/after.jsonl" }
`},
		{"sub-chain", `
[[chains.steps]]
name = "after"
sub_chain = "child"

[[chains]]
name = "child"
[[chains.steps]]
name = "call"
provider = "faulty"
payload_template = { record = "REC/after.jsonl" }
`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			var hs *heldStore
			cfg := strings.ReplaceAll(`
[[chains]]
name = "c"
[[chains.steps]]
name = "both"
[chains.steps.parallel]
[[chains.steps.parallel.steps]]
name = "a"
provider = "faulty"
payload_template = { record = "REC/subs.jsonl" }
[[chains.steps.parallel.steps]]
name = "b"
provider = "faulty"
payload_template = { record = "REC/subs.jsonl", sleep_ms = 100 }
`+tc.next, "REC", dir)
			h := newHarness(t, cfg, atStore(filepath.Join(dir, "gw.db")), wrapStore(func(st store.Store) store.Store {
				hs = &heldStore{Store: st}
				return hs
			}))
			heldA, releaseA := hs.holdUntil(holdsStep("both/a", store.StepSucceeded))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			run, err := h.eng.Start(ctx, "c", engine.Input{})
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-heldA:
			case <-ctx.Done():
				t.Fatal("the commit of a's result never came")
			}
			waitLines(t, filepath.Join(dir, "subs.jsonl"), 2)
			// Let b's answer reach the run, so the group joins while a's
			// result is still being committed.
			time.Sleep(400 * time.Millisecond)
			heldIntent, releaseIntent := hs.holdUntil(holdsStep("after", store.StepRunning))
			releaseA()
			select {
			case <-heldIntent:
			case <-ctx.Done():
				t.Fatal("the commit of after's intent never came")
			}
			time.Sleep(300 * time.Millisecond)
			if n := countLines(t, filepath.Join(dir, "after.jsonl")); n != 0 {
				t.Errorf("%d calls went out while the intent that led to them was held", n)
			}
			releaseIntent()
			final, err := h.eng.Wait(ctx, run.ID)
			if err != nil || final.Status != store.RunSucceeded {
				t.Fatalf("run: %+v %v", final, err)
			}
			if n := countLines(t, filepath.Join(dir, "after.jsonl")); n != 1 {
				t.Errorf("the step after the group was called %d times, want once", n)
			}
			started := 0
			for _, ev := range h.eventTypes(run.ID) {
				if ev == string(store.EventStepStarted)+" after" {
					started++
				}
			}
			if started != 1 {
				t.Errorf("the step after the group started %d times: %v", started, h.eventTypes(run.ID))
			}
		})
	}
}

// damagedStore cannot read one run back, as a corrupted record would.
type damagedStore struct {
	store.Store
	bad   string
	reads atomic.Int32
}

func (s *damagedStore) Run(ctx context.Context, id string) (*store.Run, error) {
	if id == s.bad {
		s.reads.Add(1)
		return nil, fmt.Errorf("decoding run %s: %w: unexpected end of JSON input", id, store.ErrDamaged)
	}
	return s.Store.Run(ctx, id)
}

// TestDamagedRunDoesNotBlockResume leaves three runs unfinished, one of
// which cannot be read back: the other two resume and finish, the damaged
// one is reported once and passed over by later resumes, not retried.
func TestDamagedRunDoesNotBlockResume(t *testing.T) {
	cfg, db, _, ids := unfinishedRuns(t, 3)
	ctx := context.Background()

	var logs logLines
	var ds *damagedStore
	h2 := newHarness(t, cfg, atStore(db), withLogger(logs.logger()), wrapStore(func(st store.Store) store.Store {
		ds = &damagedStore{Store: st, bad: ids[1]}
		return ds
	}))
	resumed, err := h2.eng.Resume(ctx)
	if err != nil || len(resumed) != 2 {
		t.Fatalf("resume: %v %v; want the two readable runs resumed and no error", resumed, err)
	}
	for _, id := range []string{ids[0], ids[2]} {
		if final, err := h2.eng.Wait(ctx, id); err != nil || final.Status != store.RunSucceeded {
			t.Errorf("run %s: %+v %v", id, final, err)
		}
	}
	if d := h2.eng.Damaged(); len(d) != 1 || d[0].ID != ids[1] || !strings.Contains(d[0].Error, "cannot be read back") {
		t.Errorf("Damaged() = %+v", d)
	}
	reads := ds.reads.Load()
	for range 3 {
		if again, err := h2.eng.Adopt(ctx); err != nil || len(again) != 0 {
			t.Errorf("adopting again: %v %v", again, err)
		}
	}
	if ds.reads.Load() != reads {
		t.Errorf("later adoptions read the damaged run again (%d reads, then %d)", reads, ds.reads.Load())
	}
	if n := strings.Count(logs.buf.String(), "cannot be resumed; it is skipped"); n != 1 {
		t.Errorf("the damaged run was reported %d times, want once:\n%s", n, logs.buf.String())
	}
}
