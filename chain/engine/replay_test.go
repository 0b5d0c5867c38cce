package engine_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
)

const replayChains = `
[[chains]]
name = "seq"
[[chains.steps]]
name = "first"
provider = "faulty"
payload_template = { record = "REC" }
[[chains.steps]]
name = "page"
provider = "faulty"
payload_template = { record = "REC", fail = "<<origin.payload.fail ?? \"\">>" }
on_failure = "dlq"
[[chains.steps]]
name = "after"
provider = "echo"

[[chains]]
name = "group"
[[chains.steps]]
name = "notify"
on_failure = "dlq"
[chains.steps.parallel]
on_failure = "best_effort"
[[chains.steps.parallel.steps]]
name = "ok"
provider = "faulty"
payload_template = { record = "REC" }
[[chains.steps.parallel.steps]]
name = "bad"
provider = "faulty"
payload_template = { record = "REC", fail = "<<origin.payload.fail ?? \"\">>" }
`

func replayHarness(t *testing.T) (*harness, string) {
	rec := filepath.Join(t.TempDir(), "calls.jsonl")
	return newHarness(t, strings.ReplaceAll(replayChains, "REC", rec)), rec
}

func TestReplayResume(t *testing.T) {
	h, rec := replayHarness(t)
	ctx := context.Background()
	res := h.run("seq", `{"fail":"pager down"}`)
	if res.Status != store.RunFailed {
		t.Fatalf("first run: %s", res.Status)
	}
	entries, _ := h.store.ListDLQ(ctx, store.DLQFilter{})
	if len(entries) != 1 {
		t.Fatalf("dlq: %+v", entries)
	}
	// The payload renders the same, so the failure repeats; what matters
	// here is what runs again.
	run, err := h.eng.Replay(ctx, entries[0].ID, engine.ReplayResume)
	if err != nil {
		t.Fatal(err)
	}
	if run.ID != res.ID {
		t.Errorf("resume replay gave run %s, want %s", run.ID, res.ID)
	}
	final, err := h.eng.Wait(ctx, run.ID)
	if err != nil || final.Status != store.RunFailed {
		t.Fatalf("after replay: %+v %v", final, err)
	}
	calls := readFileString(t, rec)
	if n := strings.Count(calls, res.ID+"/first"); n != 1 {
		t.Errorf("first, which had succeeded, was called %d times", n)
	}
	if n := strings.Count(calls, res.ID+"/page"); n != 2 {
		t.Errorf("page was called %d times, want 2", n)
	}
	types := h.eventTypes(res.ID)
	if !strings.Contains(strings.Join(types, ","), "run_replayed page") {
		t.Errorf("events: %v", types)
	}
	// The failed replay parked a new entry; the first one is gone.
	entries, _ = h.store.ListDLQ(ctx, store.DLQFilter{})
	if len(entries) != 1 || entries[0].ID == "" {
		t.Errorf("dlq after replay: %+v", entries)
	}
}

func TestReplayResumeGroupKeepsSucceeded(t *testing.T) {
	h, rec := replayHarness(t)
	ctx := context.Background()
	res := h.run("group", `{"fail":"x"}`)
	if res.Status != store.RunFailed {
		t.Fatalf("first run: %s", res.Status)
	}
	entries, _ := h.store.ListDLQ(ctx, store.DLQFilter{})
	run, err := h.eng.Replay(ctx, entries[0].ID, engine.ReplayResume)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.eng.Wait(ctx, run.ID); err != nil {
		t.Fatal(err)
	}
	calls := readFileString(t, rec)
	if n := strings.Count(calls, res.ID+"/notify/ok"); n != 1 {
		t.Errorf("the succeeded sub-step ran %d times", n)
	}
	if n := strings.Count(calls, res.ID+"/notify/bad"); n != 2 {
		t.Errorf("the failed sub-step ran %d times, want 2", n)
	}
}

func TestReplayRestart(t *testing.T) {
	h, _ := replayHarness(t)
	ctx := context.Background()
	res := h.run("seq", `{"fail":"down"}`)
	entries, _ := h.store.ListDLQ(ctx, store.DLQFilter{})
	run, err := h.eng.Replay(ctx, entries[0].ID, engine.ReplayRestart)
	if err != nil {
		t.Fatal(err)
	}
	if run.ID == res.ID {
		t.Fatal("restart reused the run")
	}
	stored, _ := h.store.Run(ctx, run.ID)
	if string(stored.Origin.Payload) != `{"fail":"down"}` || !strings.Contains(string(stored.Origin.Metadata), res.ID) {
		t.Errorf("restarted run origin: %s %s", stored.Origin.Payload, stored.Origin.Metadata)
	}
	if _, err := h.eng.Replay(ctx, entries[0].ID, engine.ReplayRestart); err == nil {
		t.Error("replaying a removed entry worked")
	}
	if _, err := h.eng.Wait(ctx, run.ID); err != nil {
		t.Fatal(err)
	}
}

func TestReplayRefusesSucceededRun(t *testing.T) {
	h := newHarness(t, `
[[chains]]
name = "any"
[[chains.steps]]
name = "race"
[chains.steps.parallel]
join = "any"
[[chains.steps.parallel.steps]]
name = "bad"
provider = "faulty"
payload_template = { fail = "down" }
on_failure = "dlq"
[[chains.steps.parallel.steps]]
name = "good"
provider = "faulty"
payload_template = { sleep_ms = 1500 }
`)
	ctx := context.Background()
	// "good" answers well after "bad" has failed, even on a loaded machine:
	// answering first would end the group and cancel "bad" before its
	// failure is parked.
	res := h.run("any", `{}`)
	entries, _ := h.store.ListDLQ(ctx, store.DLQFilter{})
	if res.Status != store.RunSucceeded || len(entries) != 1 {
		t.Fatalf("run %s, %d entries", res.Status, len(entries))
	}
	if _, err := h.eng.Replay(ctx, entries[0].ID, engine.ReplayResume); err == nil || !strings.Contains(err.Error(), "is succeeded") {
		t.Errorf("resuming a succeeded run: %v", err)
	}
	if _, err := h.eng.Replay(ctx, entries[0].ID, "sideways"); err == nil || !strings.Contains(err.Error(), "unknown mode") {
		t.Errorf("bad mode: %v", err)
	}
	if _, err := h.store.DLQ(ctx, entries[0].ID); err != nil {
		t.Errorf("a refused replay removed the entry: %v", err)
	}
}

// TestConcurrentResumesTakeEachRunOnce resumes the same unfinished runs
// from two goroutines at once, as the adopt loop and an operator's resume
// may: each run is taken up by one of them, and its call made once more.
func TestConcurrentResumesTakeEachRunOnce(t *testing.T) {
	dir := t.TempDir()
	rec := filepath.Join(dir, "calls.jsonl")
	cfg := fmt.Sprintf(`
[[chains]]
name = "c"
[[chains.steps]]
name = "slow"
provider = "faulty"
payload_template = { record = %q, sleep_ms = 3000 }
`, rec)
	db := filepath.Join(dir, "gw.db")
	ctx := context.Background()
	h1 := newHarnessAt(t, cfg, db)
	const runs = 40
	for range runs {
		if _, err := h1.eng.Start(ctx, "c", engine.Input{}); err != nil {
			t.Fatal(err)
		}
	}
	waitLines(t, rec, runs)
	h1.close()

	h2 := newHarnessAt(t, cfg, db)
	var wg sync.WaitGroup
	resumed := make([][]string, 2)
	for i := range resumed {
		wg.Go(func() {
			ids, err := h2.eng.Resume(ctx)
			if err != nil {
				t.Error(err)
			}
			resumed[i] = ids
		})
	}
	wg.Wait()
	if n := len(resumed[0]) + len(resumed[1]); n != runs {
		t.Errorf("%d runs resumed in all, want %d", n, runs)
	}
	waitLines(t, rec, 2*runs)
	time.Sleep(200 * time.Millisecond) // a call made twice would show by now
	for key, n := range readRecords(t, rec) {
		if n != 2 {
			t.Errorf("%s called %d times, want once before the stop and once after", key, n)
		}
	}
}
