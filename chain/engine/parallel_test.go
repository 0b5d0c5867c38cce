package engine_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/bolt"
)

// countLines returns how many lines a record file holds (0 if absent).
func countLines(t *testing.T, path string) int {
	t.Helper()
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(data), "\n")
}

func TestParallelJoinAll(t *testing.T) {
	h := newHarness(t, `
[[chains]]
name = "c"
[[chains.steps]]
name = "check"
provider = "echo"
payload_template = { severity = "critical" }
[[chains.steps]]
name = "notify-all"
default_next = "log"
[chains.steps.parallel]
[[chains.steps.parallel.steps]]
name = "slack-alert"
provider = "echo"
payload_template = { ok = true, text = "<<steps.check.body.severity>>" }
[[chains.steps.parallel.steps]]
name = "page"
provider = "faulty"
payload_template = { id = "P1", sleep_ms = 50 }
[[chains.steps.branches]]
field = "body.page.id"
operator = "eq"
value = "P1"
target = "resolve"
[[chains.steps]]
name = "log"
provider = "echo"
[[chains.steps]]
name = "resolve"
provider = "echo"
payload_template = { slack = "<<steps.slack-alert.body.ok>>", page = "<<prev.body.page.id>>", all = "<<steps.notify-all.body>>" }
`)
	res := h.run("c", `{}`)
	if res.Status != store.RunSucceeded || !slices.Equal(res.Path, []string{"check", "notify-all", "resolve"}) {
		t.Fatalf("got %s path %v: %+v", res.Status, res.Path, res.Error)
	}
	group := body(t, res, "notify-all")
	if group["slack-alert"].(map[string]any)["text"] != "critical" || group["page"].(map[string]any)["id"] != "P1" {
		t.Errorf("group body: %v", group)
	}
	r := body(t, res, "resolve")
	if r["slack"] != true || r["page"] != "P1" || len(r["all"].(map[string]any)) != 2 {
		t.Errorf("resolve read %v", r)
	}
	for _, k := range []string{"notify-all/slack-alert", "notify-all/page"} {
		if res.Steps[k].Status != store.StepSucceeded {
			t.Errorf("%s: %+v", k, res.Steps[k])
		}
	}
}

func TestParallelFailFastCancelsTheRest(t *testing.T) {
	cancelled := filepath.Join(t.TempDir(), "cancelled.jsonl")
	h := newHarness(t, fmt.Sprintf(`
[[chains]]
name = "c"
[[chains.steps]]
name = "group"
[chains.steps.parallel]
[[chains.steps.parallel.steps]]
name = "boom"
provider = "faulty"
payload_template = { fail = "down", sleep_ms = 100 }
[[chains.steps.parallel.steps]]
name = "slow-1"
provider = "faulty"
payload_template = { sleep_ms = 60000, record_cancel = %[1]q }
[[chains.steps.parallel.steps]]
name = "slow-2"
provider = "faulty"
payload_template = { hang = true, record_cancel = %[1]q }
`, cancelled))
	// The others sleep a minute or hang: only fail_fast ends the group
	// within the harness's 30 s wait.
	res := h.run("c", `{}`)
	if res.Status != store.RunFailed || res.Steps["group"].Status != store.StepFailed || !strings.Contains(res.Error.Message, "1 of 3 sub-steps failed (boom: faulty: down)") {
		t.Fatalf("got %s %+v", res.Status, res.Error)
	}
	for _, k := range []string{"group/slow-1", "group/slow-2"} {
		if res.Steps[k].Status != store.StepCancelled {
			t.Errorf("%s: %+v", k, res.Steps[k])
		}
	}
	waitLines(t, cancelled, 2)
}

// waitLines waits until path holds n lines: cancellation reaches the plugin
// a moment after the engine has moved on.
func waitLines(t *testing.T, path string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for countLines(t, path) < n && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := countLines(t, path); got != n {
		t.Errorf("%s: %d lines, want %d", filepath.Base(path), got, n)
	}
}

func TestParallelBestEffort(t *testing.T) {
	h := newHarness(t, `
[[chains]]
name = "c"
[[chains.steps]]
name = "group"
on_failure = "skip"
[chains.steps.parallel]
on_failure = "best_effort"
[[chains.steps.parallel.steps]]
name = "boom"
provider = "faulty"
payload_template = { fail = "down" }
[[chains.steps.parallel.steps]]
name = "slow"
provider = "faulty"
payload_template = { sleep_ms = 200 }
[[chains.steps]]
name = "after"
provider = "echo"
payload_template = { group = "<<prev.status>>", slow = "<<steps.slow.status>>" }
`)
	res := h.run("c", `{}`)
	if res.Status != store.RunSucceeded || res.Steps["group/slow"].Status != store.StepSucceeded || res.Steps["group/boom"].Status != store.StepFailed {
		t.Fatalf("got %s: %+v", res.Status, res.Steps)
	}
	if b := body(t, res, "after"); b["group"] != "skipped" || b["slow"] != "succeeded" {
		t.Errorf("after: %v", b)
	}
}

func TestParallelJoinAny(t *testing.T) {
	cancelled := filepath.Join(t.TempDir(), "cancelled.jsonl")
	h := newHarness(t, fmt.Sprintf(`
[[chains]]
name = "first-wins"
[[chains.steps]]
name = "race"
[chains.steps.parallel]
join = "any"
[[chains.steps.parallel.steps]]
name = "broken"
provider = "faulty"
payload_template = { fail = "nope" }
[[chains.steps.parallel.steps]]
name = "fast"
provider = "faulty"
payload_template = { sleep_ms = 100, who = "fast" }
[[chains.steps.parallel.steps]]
name = "stuck"
provider = "faulty"
payload_template = { hang = true, record_cancel = %q }

[[chains]]
name = "all-fail"
[[chains.steps]]
name = "race"
[chains.steps.parallel]
join = "any"
[[chains.steps.parallel.steps]]
name = "a"
provider = "faulty"
payload_template = { fail = "a down" }
[[chains.steps.parallel.steps]]
name = "b"
provider = "faulty"
payload_template = { fail = "b down", sleep_ms = 50 }
`, cancelled))
	res := h.run("first-wins", `{}`)
	if res.Status != store.RunSucceeded || res.Steps["race/stuck"].Status != store.StepCancelled || res.Steps["race/broken"].Status != store.StepFailed {
		t.Fatalf("got %s %+v", res.Status, res.Steps)
	}
	if b := body(t, res, "race"); b["fast"].(map[string]any)["who"] != "fast" || b["stuck"] != nil {
		t.Errorf("race body: %v", b)
	}
	waitLines(t, cancelled, 1)

	res = h.run("all-fail", `{}`)
	if res.Status != store.RunFailed || !strings.Contains(res.Error.Message, "2 of 2 sub-steps failed") {
		t.Fatalf("all-fail: %s %+v", res.Status, res.Error)
	}
}

func TestParallelMaxConcurrency(t *testing.T) {
	var subs strings.Builder
	for i := range 6 {
		fmt.Fprintf(&subs, "[[chains.steps.parallel.steps]]\nname = \"s%d\"\nprovider = \"faulty\"\npayload_template = { sleep_ms = 150 }\n", i)
	}
	h := newHarness(t, `
[[chains]]
name = "c"
[[chains.steps]]
name = "group"
[chains.steps.parallel]
max_concurrency = 2
`+subs.String())
	start := time.Now()
	res := h.run("c", `{}`)
	if res.Status != store.RunSucceeded {
		t.Fatalf("got %s %+v", res.Status, res.Error)
	}
	if d := time.Since(start); d < 450*time.Millisecond {
		t.Errorf("6 × 150 ms two at a time took only %v", d)
	}
	evs, _ := h.store.Events(context.Background(), res.ID, 0, 0)
	inFlight, peak := 0, 0
	for _, ev := range evs {
		if !strings.HasPrefix(ev.Step, "group/") {
			continue
		}
		switch ev.Type {
		case store.EventStepStarted:
			inFlight++
		case store.EventStepSucceeded:
			inFlight--
		}
		peak = max(peak, inFlight)
	}
	if peak != 2 {
		t.Errorf("peak concurrency %d, want 2", peak)
	}
}

func TestParallelTimeout(t *testing.T) {
	cancelled := filepath.Join(t.TempDir(), "cancelled.jsonl")
	h := newHarness(t, fmt.Sprintf(`
[[chains]]
name = "c"
[[chains.steps]]
name = "group"
on_failure = "dlq"
[chains.steps.parallel]
timeout_seconds = 1
[[chains.steps.parallel.steps]]
name = "quick"
provider = "echo"
[[chains.steps.parallel.steps]]
name = "stuck"
provider = "faulty"
payload_template = { hang = true, record_cancel = %q }

[[chains]]
name = "warm-up"
[[chains.steps]]
name = "both"
[chains.steps.parallel]
[[chains.steps.parallel.steps]]
name = "echo"
provider = "echo"
[[chains.steps.parallel.steps]]
name = "faulty"
provider = "faulty"
`, cancelled))
	// Start the plugin processes first: on a loaded machine their start
	// alone can take the group's one second.
	if res := h.run("warm-up", `{}`); res.Status != store.RunSucceeded {
		t.Fatalf("warm-up: %s %+v", res.Status, res.Error)
	}
	res := h.run("c", `{}`)
	// The stuck call shares the group's deadline, so it may end as timed
	// out on its own a moment before the group cancels it.
	stuck := res.Steps["group/stuck"].Status
	if res.Steps["group"].Status != store.StepTimedOut || (stuck != store.StepCancelled && stuck != store.StepTimedOut) || res.Steps["group/quick"].Status != store.StepSucceeded {
		t.Fatalf("got %+v", res.Steps)
	}
	if res.Status != store.RunFailed || !strings.Contains(res.Error.Message, "timed out") {
		t.Errorf("run: %s %+v", res.Status, res.Error)
	}
	waitLines(t, cancelled, 1)
	entries, _ := h.store.ListDLQ(context.Background(), store.DLQFilter{})
	if len(entries) != 1 || entries[0].Step != "group" {
		t.Errorf("dlq: %+v", entries)
	}
}

func TestParallelSubStepPolicies(t *testing.T) {
	h := newHarness(t, `
[[chains]]
name = "c"
[[chains.steps]]
name = "group"
[chains.steps.parallel]
[[chains.steps.parallel.steps]]
name = "flaky"
provider = "faulty"
payload_template = { fail_times = 2 }
retry = { max_retries = 2, backoff_ms = 20, strategy = "fixed" }
[[chains.steps.parallel.steps]]
name = "optional"
provider = "faulty"
payload_template = { fail = "not today" }
on_failure = "skip"
[[chains.steps.parallel.steps]]
name = "off"
provider = "echo"
when = 'origin.payload.mode == "full"'
`)
	res := h.run("c", `{"mode":"lite"}`)
	if res.Status != store.RunSucceeded {
		t.Fatalf("got %s %+v", res.Status, res.Error)
	}
	st := res.Steps
	if st["group/flaky"].Attempts != 3 || st["group/flaky"].Status != store.StepSucceeded ||
		st["group/optional"].Status != store.StepSkipped || st["group/off"].Status != store.StepSkipped {
		t.Errorf("steps: %+v", st)
	}
}

func TestParallelBoundedByChainTimeout(t *testing.T) {
	h := newHarness(t, `
[[chains]]
name = "c"
timeout_seconds = 1
[[chains.steps]]
name = "group"
[chains.steps.parallel]
timeout_seconds = 300
[[chains.steps.parallel.steps]]
name = "stuck"
provider = "faulty"
payload_template = { hang = true }
`)
	// The call hangs and the group allows 300 s: only the chain's 1 s
	// timeout ends the run within the harness's 30 s wait.
	res := h.run("c", `{}`)
	if res.Status != store.RunTimedOut {
		t.Fatalf("got %s", res.Status)
	}
	if res.Steps["group/stuck"].Status != store.StepTimedOut {
		t.Errorf("stuck: %+v", res.Steps["group/stuck"])
	}
}

// TestResumeOnStoredDefinition stops an engine mid-run, changes the chain,
// and checks that a new engine resumes the run on the definition it started
// with, without calling the finished step again.
func TestResumeOnStoredDefinition(t *testing.T) {
	dir := t.TempDir()
	rec := filepath.Join(dir, "calls.jsonl")
	started := fmt.Sprintf(`
[[chains]]
name = "c"
[[chains.steps]]
name = "first"
provider = "faulty"
payload_template = { record = %[1]q }
[[chains.steps]]
name = "second"
provider = "faulty"
payload_template = { record = %[1]q, sleep_ms = 1500 }
[[chains.steps]]
name = "third"
provider = "echo"
payload_template = { from = "old definition" }
`, rec)
	changed := `
[[chains]]
name = "c"
[[chains.steps]]
name = "only"
provider = "echo"
payload_template = { from = "new definition" }
`
	db := filepath.Join(dir, "gw.db")
	h1 := newHarness(t, started, atStore(db))
	ctx := context.Background()
	run, err := h1.eng.Start(ctx, "c", engine.Input{})
	if err != nil {
		t.Fatal(err)
	}
	waitLines(t, rec, 2)
	h1.close()

	h2 := newHarness(t, changed, atStore(db))
	ids, err := h2.eng.Resume(ctx)
	if err != nil || len(ids) != 1 || ids[0] != run.ID {
		t.Fatalf("resume: %v %v", ids, err)
	}
	if _, err := h2.eng.Wait(ctx, run.ID); err != nil {
		t.Fatal(err)
	}
	res, _ := h2.eng.Result(ctx, run.ID, true)
	if res.Status != store.RunSucceeded || !slices.Equal(res.Path, []string{"first", "second", "third"}) {
		t.Fatalf("got %s %v %+v", res.Status, res.Path, res.Error)
	}
	if b := body(t, res, "third"); b["from"] != "old definition" {
		t.Errorf("third: %v", b)
	}
	// first had its result before the stop: one call; second was in flight: two.
	calls := strings.Count(readFileString(t, rec), run.ID+"/first")
	if calls != 1 {
		t.Errorf("first called %d times", calls)
	}
	if n := strings.Count(readFileString(t, rec), run.ID+"/second"); n != 2 {
		t.Errorf("second called %d times, want 2", n)
	}
	if types := h2.eventTypes(run.ID); !slices.Contains(types, "run_resumed") {
		t.Errorf("events: %v", types)
	}
}

func readFileString(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// TestTimersSurviveRestart checks that a delay and a chain deadline are
// persisted: a run resumed after its deadline ends timed out at once, and a
// delayed step waits out only what is left of its delay.
func TestTimersSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	cfg := `
[[chains]]
name = "deadline"
timeout_seconds = 1
[[chains.steps]]
name = "stuck"
provider = "faulty"
payload_template = { hang = true }

[[chains]]
name = "delayed"
[[chains.steps]]
name = "later"
provider = "echo"
delay_seconds = 3
`
	db := filepath.Join(dir, "gw.db")
	ctx := context.Background()
	h1 := newHarness(t, cfg, atStore(db))
	timed, err := h1.eng.Start(ctx, "deadline", engine.Input{})
	if err != nil {
		t.Fatal(err)
	}
	delayed, err := h1.eng.Start(ctx, "delayed", engine.Input{})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	h1.close()

	h2 := newHarness(t, cfg, atStore(db))
	recs, err := h2.store.Steps(ctx, delayed.ID, "later")
	if err != nil || len(recs) != 1 || recs[0].NotBefore.IsZero() {
		t.Fatalf("the delay was not persisted: %+v %v", recs, err)
	}
	due := recs[0].NotBefore
	if d := due.Sub(delayed.CreatedAt); d < 3*time.Second || d > 8*time.Second {
		t.Errorf("the delay is due %v after the run started, want its 3 s", d)
	}
	// Stay down past the chain's deadline and the delay's due time: a
	// persisted delay fires on resume, one counted anew waits 3 s again.
	time.Sleep(time.Until(due) + 200*time.Millisecond)
	if _, err := h2.eng.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	run, err := h2.eng.Wait(ctx, timed.ID)
	if err != nil || run.Status != store.RunTimedOut {
		t.Fatalf("deadline run: %+v %v", run, err)
	}
	run, err = h2.eng.Wait(ctx, delayed.ID)
	if err != nil || run.Status != store.RunSucceeded {
		t.Fatalf("delayed run: %+v %v", run, err)
	}
	// Times the engines recorded, not the test's: the step starts no
	// earlier than its due time, and right after the resume rather than a
	// whole delay later.
	evs, err := h2.store.Events(ctx, delayed.ID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var started, resumed time.Time
	for _, ev := range evs {
		switch {
		case ev.Type == store.EventStepStarted && ev.Step == "later":
			started = ev.Time
		case ev.Type == store.EventRunResumed:
			resumed = ev.Time
		}
	}
	if started.IsZero() || resumed.IsZero() {
		t.Fatalf("events: %+v", evs)
	}
	if started.Before(due) {
		t.Errorf("the delayed step started at %v, before its due time %v", started, due)
	}
	if wait := started.Sub(resumed); wait >= 3*time.Second {
		t.Errorf("the delayed step started %v after the resume: its delay was counted anew", wait)
	}
}

// commitLog records which step records each commit writes.
type commitLog struct {
	store.Store
	mu      sync.Mutex
	commits [][]string
}

func (s *commitLog) Commit(ctx context.Context, b *store.Batch) error {
	keys := make([]string, 0, len(b.Steps))
	for _, rec := range b.Steps {
		keys = append(keys, fmt.Sprintf("%s:%s", rec.Key, rec.Status))
	}
	s.mu.Lock()
	s.commits = append(s.commits, keys)
	s.mu.Unlock()
	return s.Store.Commit(ctx, b)
}

// TestGroupResultsCommitTogether: while a group's calls are out and
// nothing waits on them, its results wait for each other and go in one
// commit, however far apart they come back.
func TestGroupResultsCommitTogether(t *testing.T) {
	log := &commitLog{}
	h := newHarness(t, `
[[chains]]
name = "c"
[[chains.steps]]
name = "g"
default_next = "after"
[chains.steps.parallel]
[[chains.steps.parallel.steps]]
name = "a"
provider = "faulty"
payload_template = { sleep_ms = 0 }
[[chains.steps.parallel.steps]]
name = "b"
provider = "faulty"
payload_template = { sleep_ms = 40 }
[[chains.steps.parallel.steps]]
name = "c"
provider = "faulty"
payload_template = { sleep_ms = 80 }
[[chains.steps]]
name = "after"
provider = "echo"
`, withLinger(time.Hour), wrapStore(func(st store.Store) store.Store { log.Store = st; return log }))
	if res := h.run("c", `{}`); res.Status != store.RunSucceeded {
		t.Fatalf("run: %+v", res)
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	var results [][]string
	for _, c := range log.commits {
		var got []string
		for _, k := range c {
			if strings.HasPrefix(k, "g/") && strings.HasSuffix(k, ":succeeded") {
				got = append(got, k)
			}
		}
		if got != nil {
			results = append(results, got)
		}
	}
	if len(results) != 1 || len(results[0]) != 3 {
		t.Errorf("the sub-steps' results went in %d commits, want 1 with all three: %v", len(results), log.commits)
	}
}

// TestRunStopKeepsHeldResults: a run's results waiting for those of the
// calls still out are written as the engine stops, not called again when
// the run resumes.
func TestRunStopKeepsHeldResults(t *testing.T) {
	db := filepath.Join(t.TempDir(), "gw.db")
	h := newHarness(t, `
[[chains]]
name = "c"
[[chains.steps]]
name = "g"
[chains.steps.parallel]
[[chains.steps.parallel.steps]]
name = "quick"
provider = "faulty"
payload_template = { sleep_ms = 0 }
[[chains.steps.parallel.steps]]
name = "slow"
provider = "faulty"
payload_template = { hang = true }
`, atStore(db), withLinger(time.Hour))
	run, err := h.eng.Start(context.Background(), "c", engine.Input{})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for h.eng.Pending(run.ID) < 1 {
		if time.Now().After(deadline) {
			t.Fatal("the quick sub-step's result never came back")
		}
		time.Sleep(10 * time.Millisecond)
	}
	h.close()
	st, err := bolt.Open(db, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	recs, err := st.Steps(context.Background(), run.ID, "g/quick")
	if err != nil || len(recs) != 1 || recs[0].Status != store.StepSucceeded {
		t.Errorf("quick as stored after the stop: %+v, %v; want succeeded", recs, err)
	}
}
