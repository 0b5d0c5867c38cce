package engine_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
)

// Each chain's run holds its host at an approval step, which the test
// answers: a holder holds for exactly as long as the test says.
const queueChains = `
[[chains]]
name = "fix"
concurrency = { key = "<<origin.payload.host>>" }
[[chains.steps]]
name = "ask"
approval = {}
[[chains.steps]]
name = "do"
provider = "echo"
payload_template = { host = "<<origin.payload.host>>" }

[[chains]]
name = "fix-or-skip"
concurrency = { key = "<<origin.payload.host>>", on_busy = "skip" }
[[chains.steps]]
name = "do"
provider = "echo"

[[chains]]
name = "fix-now"
concurrency = { key = "<<origin.payload.host>>", on_busy = "cancel" }
[[chains.steps]]
name = "ask"
approval = {}

[[chains]]
name = "fix-bounded"
[chains.concurrency]
key = "<<origin.payload.host>>"
queue_limit = 1
queue_timeout_seconds = 1
[[chains.steps]]
name = "do"
provider = "echo"

[[chains]]
name = "fix-number"
concurrency = { key = "<<origin.payload.n>>" }
[[chains.steps]]
name = "do"
provider = "echo"
`

func startRun(t *testing.T, h *harness, chainName, payload string) *store.Run {
	t.Helper()
	run, err := h.eng.Start(context.Background(), chainName, engine.Input{Payload: json.RawMessage(payload)})
	if err != nil {
		t.Fatalf("starting %s: %v", chainName, err)
	}
	return run
}

// waitStatus polls the store until the run has status; the deadline is a
// safety net, not a bound the test asserts.
func waitStatus(t *testing.T, h *harness, id string, status store.RunStatus) *store.Run {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		run, err := h.store.RunHeader(context.Background(), id)
		if err == nil && run.Status == status {
			return run
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s never reached %s: %+v, %v", id, status, run, err)
		}
	}
}

func approve(t *testing.T, h *harness, id string) {
	t.Helper()
	waitWaiting(t, h, id)
	if _, err := h.eng.Signal(context.Background(), id, "ask", "approve", ""); err != nil {
		t.Fatalf("approving run %s: %v", id, err)
	}
}

func TestQueueFIFO(t *testing.T) {
	h := newHarness(t, queueChains)
	a := startRun(t, h, "fix", `{"host":"db-1"}`)
	if a.Status != store.RunRunning || a.Queue != nil {
		t.Fatalf("the first run of a free host: %s %+v", a.Status, a.Queue)
	}
	b := startRun(t, h, "fix", `{"host":"db-1"}`)
	c := startRun(t, h, "fix", `{"host":"db-1"}`)
	other := startRun(t, h, "fix", `{"host":"db-2"}`)
	if b.Status != store.RunQueued || b.Queue == nil || b.Queue.Position != 1 || !slices.Equal(b.Queue.WaitingFor, []string{a.ID}) || b.Queue.Key != "db-1" {
		t.Fatalf("the second run: %s %+v", b.Status, b.Queue)
	}
	if c.Status != store.RunQueued || c.Queue.Position != 2 {
		t.Fatalf("the third run: %s %+v", c.Status, c.Queue)
	}
	if other.Status != store.RunRunning {
		t.Fatalf("a run of another host: %s", other.Status)
	}
	waitEvent(t, h, c.ID, store.EventRunQueued)
	stored := waitStatus(t, h, c.ID, store.RunQueued)
	if stored.Queue == nil || stored.Queue.Position != 2 || stored.Cursor != "" {
		t.Fatalf("the queued run's record: %+v, cursor %q", stored.Queue, stored.Cursor)
	}
	slots, err := h.eng.Slots(context.Background())
	if err != nil || len(slots) != 2 || !slices.Equal(slots[0].Queue, []string{b.ID, c.ID}) {
		t.Fatalf("Slots = %+v, %v", slots, err)
	}

	approve(t, h, a.ID)
	waitStatus(t, h, a.ID, store.RunSucceeded)
	waitWaiting(t, h, b.ID)
	waitRun(t, h, c.ID, "at the head of the queue behind the second run", func(run *store.Run) bool {
		return run.Status == store.RunQueued && run.Queue.Position == 1 && slices.Equal(run.Queue.WaitingFor, []string{b.ID})
	})
	approve(t, h, b.ID)
	approve(t, h, c.ID)
	approve(t, h, other.ID)
	for _, id := range []string{b.ID, c.ID, other.ID} {
		waitStatus(t, h, id, store.RunSucceeded)
	}
	want := []string{"run_started", "run_queued", "run_dequeued", "run_waiting ask", "step_started ask", "step_succeeded ask", "step_started do", "step_succeeded do", "run_succeeded"}
	if got := h.eventTypes(c.ID); !slices.Equal(got, want) {
		t.Errorf("the queued run's events:\n got %v\nwant %v", got, want)
	}
	// Each run took its host only once the one before had ended.
	ended := func(id string) time.Time { return waitStatus(t, h, id, store.RunSucceeded).FinishedAt }
	dequeued := func(id string) time.Time {
		evs, _ := h.store.Events(context.Background(), id, 0, 0)
		for _, ev := range evs {
			if ev.Type == store.EventRunDequeued {
				return ev.Time
			}
		}
		t.Fatalf("run %s has no run_dequeued event", id)
		return time.Time{}
	}
	if dequeued(b.ID).Before(ended(a.ID)) || dequeued(c.ID).Before(ended(b.ID)) {
		t.Errorf("a run took its host before the one holding it ended")
	}
	if slots, err := h.eng.Slots(context.Background()); err != nil || len(slots) != 0 {
		t.Errorf("Slots once every run ended = %+v, %v", slots, err)
	}
}

func TestQueueSkip(t *testing.T) {
	h := newHarness(t, queueChains)
	a := startRun(t, h, "fix", `{"host":"db-1"}`)
	s := startRun(t, h, "fix-or-skip", `{"host":"db-1"}`)
	if s.Status != store.RunSkipped {
		t.Fatalf("a run that skips a taken host: %s", s.Status)
	}
	run := waitStatus(t, h, s.ID, store.RunSkipped)
	if run.Error == nil || run.Error.Code != "concurrency_busy" || !strings.Contains(run.Error.Message, a.ID) || !strings.Contains(run.Error.Message, `"db-1"`) {
		t.Errorf("the skipped run's error: %+v", run.Error)
	}
	if got, want := h.eventTypes(s.ID), []string{"run_started", "run_skipped"}; !slices.Equal(got, want) {
		t.Errorf("events %v, want %v", got, want)
	}
	approve(t, h, a.ID)
	waitStatus(t, h, a.ID, store.RunSucceeded)
	free := startRun(t, h, "fix-or-skip", `{"host":"db-1"}`)
	waitStatus(t, h, free.ID, store.RunSucceeded)
}

func TestQueueCancelsHolder(t *testing.T) {
	h := newHarness(t, queueChains)
	a := startRun(t, h, "fix", `{"host":"db-1"}`)
	waitWaiting(t, h, a.ID)
	b := startRun(t, h, "fix-now", `{"host":"db-1"}`)
	if b.Status != store.RunQueued {
		t.Fatalf("the run that cancels the holder: %s", b.Status)
	}
	held := waitStatus(t, h, a.ID, store.RunCancelled)
	if held.Error == nil || !strings.Contains(held.Error.Message, b.ID) {
		t.Errorf("the cancelled holder's error does not say which run cancelled it: %+v", held.Error)
	}
	approve(t, h, b.ID)
	waitStatus(t, h, b.ID, store.RunSucceeded)
}

func TestQueueLimitAndTimeout(t *testing.T) {
	h := newHarness(t, queueChains)
	a := startRun(t, h, "fix", `{"host":"db-1"}`)
	b := startRun(t, h, "fix-bounded", `{"host":"db-1"}`)
	c := startRun(t, h, "fix-bounded", `{"host":"db-1"}`)
	if b.Status != store.RunQueued || c.Status != store.RunSkipped {
		t.Fatalf("a queue of one: %s, then %s", b.Status, c.Status)
	}
	if run := waitStatus(t, h, c.ID, store.RunSkipped); run.Error == nil || run.Error.Code != "queue_full" {
		t.Errorf("the run over the queue limit: %+v", run.Error)
	}
	run := waitStatus(t, h, b.ID, store.RunFailed)
	if run.Error == nil || run.Error.Code != "queue_timeout" || !strings.Contains(run.Error.Message, a.ID) || !strings.Contains(run.Error.Message, `"db-1"`) {
		t.Errorf("the run that waited too long: %+v", run.Error)
	}
	if run.Queue != nil || len(run.Path) != 0 {
		t.Errorf("a run that never took its slot: queue %+v, path %v", run.Queue, run.Path)
	}
	approve(t, h, a.ID)
	waitStatus(t, h, a.ID, store.RunSucceeded)
}

func TestQueueKeyMustRender(t *testing.T) {
	h := newHarness(t, queueChains)
	if _, err := h.eng.Start(context.Background(), "fix", engine.Input{Payload: json.RawMessage(`{}`)}); err == nil || !strings.Contains(err.Error(), "concurrency key") {
		t.Fatalf("a run whose key reads nothing: %v", err)
	}
	run := startRun(t, h, "fix-number", `{"n":7}`)
	waitStatus(t, h, run.ID, store.RunSucceeded)
}

// TestQueueAcrossRestart stops the gateway while one run holds a host and
// another waits for it: the next gateway resumes both, the waiting one
// keeps waiting, and takes the host once the holder has ended.
func TestQueueAcrossRestart(t *testing.T) {
	db := filepath.Join(t.TempDir(), "gw.db")
	h1 := newHarness(t, queueChains, atStore(db))
	a := startRun(t, h1, "fix", `{"host":"db-1"}`)
	waitWaiting(t, h1, a.ID)
	b := startRun(t, h1, "fix", `{"host":"db-1"}`)
	waitStatus(t, h1, b.ID, store.RunQueued)
	h1.close()

	h2 := newHarness(t, queueChains, atStore(db))
	ids, err := h2.eng.Resume(context.Background())
	if err != nil || len(ids) != 2 {
		t.Fatalf("Resume = %v, %v", ids, err)
	}
	// The holder has not ended: the waiting run asked and still waits.
	waitEvent(t, h2, b.ID, store.EventRunResumed)
	waitRun(t, h2, b.ID, "queued behind the first run", func(run *store.Run) bool {
		return run.Status == store.RunQueued && run.Queue != nil && slices.Equal(run.Queue.WaitingFor, []string{a.ID})
	})
	approve(t, h2, a.ID)
	waitStatus(t, h2, a.ID, store.RunSucceeded)
	approve(t, h2, b.ID)
	waitStatus(t, h2, b.ID, store.RunSucceeded)
}

func waitEvent(t *testing.T, h *harness, id string, typ store.EventType) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		evs, _ := h.store.Events(context.Background(), id, 0, 0)
		for _, ev := range evs {
			if ev.Type == typ {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s never had a %s event", id, typ)
		}
	}
}

// waitRun polls the store until the run is as ok says; the deadline is a
// safety net.
func waitRun(t *testing.T, h *harness, id, what string, ok func(*store.Run) bool) *store.Run {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		run, err := h.store.RunHeader(context.Background(), id)
		if err == nil && ok(run) {
			return run
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s never was %s: %+v, %v", id, what, run, err)
		}
	}
}

// TestQueueReplayWaitsForKey replays runs that had ended while another
// holds their host: a restart (a new run) and a resume (the run itself,
// from the step it failed at) wait for the host, then go on.
func TestQueueReplayWaitsForKey(t *testing.T) {
	h := newHarness(t, queueChains)
	ctx := context.Background()
	failed := startRun(t, h, "fix", `{"host":"db-1"}`)
	waitWaiting(t, h, failed.ID)
	if _, err := h.eng.Signal(ctx, failed.ID, "ask", "reject", "not now"); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, h, failed.ID, store.RunFailed)
	holder := startRun(t, h, "fix", `{"host":"db-1"}`)
	waitWaiting(t, h, holder.ID)

	restarted, err := h.eng.ReplayRun(ctx, failed.ID, engine.ReplayOptions{Mode: engine.ReplayRestart})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.eng.ReplayRun(ctx, failed.ID, engine.ReplayOptions{Mode: engine.ReplayResume}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{restarted.ID, failed.ID} {
		waitRun(t, h, id, "queued behind the holder", func(run *store.Run) bool {
			return run.Status == store.RunQueued && run.Queue != nil && slices.Equal(run.Queue.WaitingFor, []string{holder.ID})
		})
	}
	approve(t, h, holder.ID)
	waitStatus(t, h, holder.ID, store.RunSucceeded)
	// One at a time, whichever asked first.
	for range 2 {
		var next string
		for deadline := time.Now().Add(60 * time.Second); next == ""; time.Sleep(10 * time.Millisecond) {
			for _, id := range []string{restarted.ID, failed.ID} {
				if run, _ := h.store.RunHeader(ctx, id); run != nil && run.Status == store.RunWaiting {
					next = id
				}
			}
			if time.Now().After(deadline) {
				t.Fatal("neither replay took the host")
			}
		}
		approve(t, h, next)
		waitStatus(t, h, next, store.RunSucceeded)
	}
}
