package engine_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
)

const subChains = `
[[chains]]
name = "parent"
timeout_seconds = 60
[[chains.steps]]
name = "check"
provider = "echo"
payload_template = { severity = "<<origin.payload.severity>>" }
[[chains.steps]]
name = "escalate"
sub_chain = "page-secondary"
input = { incident = "<<steps.check.body>>", who = "<<origin.payload.who ?? \"ops\">>" }
on_failure = "skip"
[[chains.steps]]
name = "after"
provider = "echo"
payload_template = { paged = "<<steps.escalate.body.paged ?? \"nobody\">>", status = "<<steps.escalate.status>>" }

[[chains]]
name = "page-secondary"
timeout_seconds = 3600
[[chains.steps]]
name = "page"
provider = "faulty"
payload_template = "<<origin.payload>>"
[[chains.steps]]
name = "confirm"
provider = "echo"
payload_template = { paged = "<<prev.body.who ?? \"nobody\">>", severity = "<<origin.payload.incident.severity>>" }
`

func TestSubChain(t *testing.T) {
	h := newHarness(t, subChains)
	ctx := context.Background()
	res := h.run("parent", `{"severity":"critical","who":"alice"}`)
	if res.Status != store.RunSucceeded {
		t.Fatalf("got %s %+v", res.Status, res.Error)
	}
	if b := body(t, res, "escalate"); b["paged"] != "alice" || b["severity"] != "critical" {
		t.Errorf("escalate body (the child's last step): %v", b)
	}
	if b := body(t, res, "after"); b["paged"] != "alice" || b["status"] != "succeeded" {
		t.Errorf("after: %v", b)
	}
	page, _ := h.store.ListRuns(ctx, store.RunFilter{Chain: "page-secondary"})
	if len(page.Runs) != 1 {
		t.Fatalf("child runs: %d", len(page.Runs))
	}
	child := page.Runs[0]
	if child.ParentRun != res.ID || child.ParentStep != "escalate" || child.Status != store.RunSucceeded {
		t.Errorf("child: parent %s/%s status %s", child.ParentRun, child.ParentStep, child.Status)
	}
	parent, _ := h.store.Run(ctx, res.ID)
	// The child's deadline is the earlier of its own (1 h) and its parent's (1 min).
	if !child.Deadline.Equal(parent.Deadline) {
		t.Errorf("child deadline %v, parent's %v", child.Deadline, parent.Deadline)
	}
	if string(child.Origin.Payload) != `{"incident":{"severity":"critical"},"who":"alice"}` {
		t.Errorf("child origin payload: %s", child.Origin.Payload)
	}
}

func TestSubChainFailureAppliesStepPolicy(t *testing.T) {
	h := newHarness(t, strings.Replace(subChains, `payload_template = "<<origin.payload>>"`, `payload_template = { fail = "pager down" }`, 1))
	res := h.run("parent", `{"severity":"low"}`)
	st := res.Steps["escalate"]
	if res.Status != store.RunSucceeded || st.Status != store.StepSkipped || !strings.Contains(st.Error.Message, "pager down") || !strings.Contains(st.Error.Message, `sub-chain "page-secondary"`) {
		t.Fatalf("got %s, escalate %+v", res.Status, st)
	}
	if b := body(t, res, "after"); b["status"] != "skipped" {
		t.Errorf("after: %v", b)
	}
}

func TestCancelParentCancelsChild(t *testing.T) {
	dir := t.TempDir()
	started, rec := filepath.Join(dir, "started.jsonl"), filepath.Join(dir, "cancelled.jsonl")
	h := newHarness(t, strings.Replace(subChains, `payload_template = "<<origin.payload>>"`, fmt.Sprintf(`payload_template = { hang = true, record = %q, record_cancel = %q }`, started, rec), 1))
	ctx := context.Background()
	run, err := h.eng.Start(ctx, "parent", engine.Input{Payload: []byte(`{"severity":"low"}`)})
	if err != nil {
		t.Fatal(err)
	}
	var child *store.Run
	deadline := time.Now().Add(10 * time.Second)
	for child == nil && time.Now().Before(deadline) {
		page, _ := h.store.ListRuns(ctx, store.RunFilter{Chain: "page-secondary"})
		if len(page.Runs) == 1 {
			child = page.Runs[0]
		}
		time.Sleep(10 * time.Millisecond)
	}
	if child == nil {
		t.Fatal("no child run")
	}
	// Cancel once the child's call has reached the plugin.
	waitLines(t, started, 1)
	if err := h.eng.Cancel(ctx, run.ID); err != nil {
		t.Fatal(err)
	}
	if final, _ := h.eng.Wait(ctx, run.ID); final.Status != store.RunCancelled {
		t.Fatalf("parent: %s", final.Status)
	}
	waitLines(t, rec, 1)
	deadline = time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if c, _ := h.store.Run(ctx, child.ID); c.Status == store.RunCancelled {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Error("the child run was not cancelled")
}

// TestSubChainResume stops the engine while the child runs; after resume
// the parent picks up the child's result.
func TestSubChainResume(t *testing.T) {
	dir := t.TempDir()
	cfg := strings.Replace(subChains, `payload_template = "<<origin.payload>>"`, `payload_template = { sleep_ms = 1500 }`, 1)
	db := filepath.Join(dir, "gw.db")
	ctx := context.Background()
	h1 := newHarness(t, cfg, atStore(db))
	run, err := h1.eng.Start(ctx, "parent", engine.Input{Payload: []byte(`{"severity":"low"}`)})
	if err != nil {
		t.Fatal(err)
	}
	// Stop once the child's call is under way.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		page, _ := h1.store.ListRuns(ctx, store.RunFilter{Chain: "page-secondary"})
		if len(page.Runs) == 1 {
			if recs, _ := h1.store.Steps(ctx, page.Runs[0].ID, ""); len(recs) > 0 && recs[0].Status == store.StepRunning {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the child's call never started")
		}
	}
	h1.close()
	h2 := newHarness(t, cfg, atStore(db))
	ids, err := h2.eng.Resume(ctx)
	if err != nil || len(ids) != 2 {
		t.Fatalf("resumed %v: %v", ids, err)
	}
	final, err := h2.eng.Wait(ctx, run.ID)
	if err != nil || final.Status != store.RunSucceeded {
		t.Fatalf("parent after resume: %+v %v", final, err)
	}
	res, _ := h2.eng.Result(ctx, run.ID, true)
	if res.Steps["escalate"].Status != store.StepSucceeded {
		t.Errorf("escalate: %+v", res.Steps["escalate"])
	}
}

// hidingStore leaves one run out of the unfinished ones, so that an engine
// resumes only the others.
type hidingStore struct {
	store.Store
	hide string
}

func (s hidingStore) UnfinishedRuns(ctx context.Context) ([]string, error) {
	ids, err := s.Store.UnfinishedRuns(ctx)
	return slices.DeleteFunc(ids, func(id string) bool { return id == s.hide }), err
}

// TestParentLearnsOfChildOnAnotherGateway resumes a parent and its child
// on two engines sharing the store, as after a takeover: the child cannot
// report to the parent directly, and the parent must still go on once the
// child has ended.
func TestParentLearnsOfChildOnAnotherGateway(t *testing.T) {
	dir := t.TempDir()
	cfg := strings.Replace(subChains, `payload_template = "<<origin.payload>>"`, `payload_template = { sleep_ms = 1000, who = "<<origin.payload.who>>" }`, 1)
	h1 := newHarness(t, cfg, atStore(filepath.Join(dir, "gw.db")))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	parent, err := h1.eng.Start(ctx, "parent", engine.Input{Payload: []byte(`{"severity":"high","who":"alice"}`)})
	if err != nil {
		t.Fatal(err)
	}
	var child string
	for child == "" {
		page, _ := h1.store.ListRuns(ctx, store.RunFilter{Chain: "page-secondary"})
		if len(page.Runs) == 1 {
			child = page.Runs[0].ID
		} else if ctx.Err() != nil {
			t.Fatal("no child run")
		}
		time.Sleep(10 * time.Millisecond)
	}
	h1.eng.Close()

	b := newHarness(t, cfg, sharing(h1.store), wrapStore(func(st store.Store) store.Store { return hidingStore{st, parent.ID} }))
	c := newHarness(t, cfg, sharing(h1.store), wrapStore(func(st store.Store) store.Store { return hidingStore{st, child} }))
	if ids, err := b.eng.Resume(ctx); err != nil || len(ids) != 1 || ids[0] != child {
		t.Fatalf("b resumed %v: %v", ids, err)
	}
	if ids, err := c.eng.Resume(ctx); err != nil || len(ids) != 1 || ids[0] != parent.ID {
		t.Fatalf("c resumed %v: %v", ids, err)
	}
	final, err := c.eng.Wait(ctx, parent.ID)
	if err != nil || final.Status != store.RunSucceeded {
		t.Fatalf("parent: %+v %v", final, err)
	}
	res, _ := c.eng.Result(ctx, parent.ID, false)
	if b := body(t, res, "after"); b["paged"] != "alice" {
		t.Errorf("after: %v", b)
	}
}

// TestSubChainInputChecked fails a sub_chain step whose rendered input does
// not match what the called chain declares, before the child run exists.
func TestSubChainInputChecked(t *testing.T) {
	h := newHarness(t, `
[[chains]]
name = "parent"
[[chains.steps]]
name = "escalate"
sub_chain = "page"
input = { host = "<<origin.payload.host ?? null>>" }

[[chains]]
name = "page"
[chains.input]
required = ["host"]
[[chains.steps]]
name = "p"
provider = "echo"
payload_template = { host = "<<origin.payload.host>>" }
`)
	res := h.run("parent", `{}`)
	rec := res.Steps["escalate"]
	if res.Status != store.RunFailed || rec.Status != store.StepFailed || rec.Error == nil || rec.Error.Code != "invalid_input" ||
		!strings.Contains(rec.Error.Message, `the payload does not match the input chain "page" declares: host: required field is missing`) {
		t.Fatalf("run %s, escalate %+v", res.Status, rec)
	}
	if page, _ := h.store.ListRuns(context.Background(), store.RunFilter{Chain: "page"}); len(page.Runs) != 0 {
		t.Errorf("the child was created: %+v", page.Runs)
	}
	if res := h.run("parent", `{"host":"db-1"}`); res.Status != store.RunSucceeded {
		t.Errorf("with the field set: %s %+v", res.Status, res.Error)
	}
}

// TestLargeResultStaysInItsStep keeps a result above MaxInlineRunBody out
// of the run's record, which names the step holding it, and still hands it
// whole to a parent run; RunBody reads it from the step.
func TestLargeResultStaysInItsStep(t *testing.T) {
	h := newHarness(t, `
[[chains]]
name = "wrap"
[[chains.steps]]
name = "call"
sub_chain = "big"
input = { blob = "<<origin.payload.blob>>" }

[[chains]]
name = "big"
[[chains.steps]]
name = "make"
provider = "echo"
payload_template = { blob = "<<origin.payload.blob>>" }
`)
	ctx := context.Background()
	for _, size := range []int{10, engine.MaxInlineRunBody + 1} {
		blob := strings.Repeat("x", size)
		res := h.run("wrap", fmt.Sprintf(`{"blob": %q}`, blob))
		if res.Status != store.RunSucceeded {
			t.Fatalf("size %d: %s %+v", size, res.Status, res.Error)
		}
		want := fmt.Sprintf(`{"blob":%q}`, blob)
		if got := string(res.Steps["call"].Body); got != want {
			t.Errorf("size %d: the parent's step has %.40s…, want the child's result", size, got)
		}
		page, err := h.store.ListRuns(ctx, store.RunFilter{Chain: "big", Limit: 1})
		if err != nil || len(page.Runs) != 1 {
			t.Fatalf("child runs: %v %v", page, err)
		}
		child := page.Runs[0]
		inline := size < engine.MaxInlineRunBody
		if inline != (child.BodyStep == "") || inline != (len(child.Body) > 0) || (!inline && child.BodyStep != "make") {
			t.Errorf("size %d: the child's record has a body of %d bytes and body_step %q", size, len(child.Body), child.BodyStep)
		}
		if body, err := engine.RunBody(ctx, h.store, child); err != nil || string(body) != want {
			t.Errorf("size %d: RunBody gave %.40s… (%v)", size, body, err)
		}
	}
}

// leaseHeldOnce refuses the first lease asked for each run whose id match
// picks, as a store does while another gateway holds it.
type leaseHeldOnce struct {
	store.Store
	match func(id string) bool
	mu    sync.Mutex
	seen  map[string]bool
}

func (s *leaseHeldOnce) AcquireLease(ctx context.Context, runID, owner string, ttl time.Duration) (store.Lease, error) {
	s.mu.Lock()
	first := s.match(runID) && !s.seen[runID]
	s.seen[runID] = true
	s.mu.Unlock()
	if first {
		return store.Lease{}, fmt.Errorf("leasing run %s: %w", runID, store.ErrLeaseHeld)
	}
	return s.Store.AcquireLease(ctx, runID, owner, ttl)
}

// TestSubChainWaitsOutAHeldLease starts a sub-chain whose run another
// gateway holds the lease of before it exists, as a worker killed while
// it created it does until its lease lapses: the parent starts the child
// once the lease is free, rather than failing its step.
func TestSubChainWaitsOutAHeldLease(t *testing.T) {
	var parents sync.Map
	h := newHarness(t, subChains, wrapStore(func(st store.Store) store.Store {
		return &leaseHeldOnce{Store: st, seen: map[string]bool{}, match: func(id string) bool {
			_, parent := parents.Load(id)
			return !parent
		}}
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id := store.NewID()
	parents.Store(id, true)
	if _, err := h.eng.StartWithID(ctx, "parent", engine.Input{Payload: []byte(`{"severity":"critical","who":"alice"}`)}, id); err != nil {
		t.Fatal(err)
	}
	if _, err := h.eng.Wait(ctx, id); err != nil {
		t.Fatal(err)
	}
	res, err := h.eng.Result(ctx, id, true)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != store.RunSucceeded {
		t.Fatalf("parent %s %+v", res.Status, res.Error)
	}
	if b := body(t, res, "after"); b["paged"] != "alice" || b["status"] != "succeeded" {
		t.Errorf("after: %v", b)
	}
}
