package engine_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/loader"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/providers/builtin"
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
name = "nodlq"
[[chains.steps]]
name = "first"
provider = "faulty"
payload_template = { record = "REC" }
[[chains.steps]]
name = "page"
provider = "faulty"
payload_template = { record = "REC", fail = "<<origin.payload.fail ?? \"\">>" }

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
	run, err := h.eng.Replay(ctx, entries[0].ID, engine.ReplayOptions{Mode: engine.ReplayResume})
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
	run, err := h.eng.Replay(ctx, entries[0].ID, engine.ReplayOptions{Mode: engine.ReplayResume})
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
	run, err := h.eng.Replay(ctx, entries[0].ID, engine.ReplayOptions{Mode: engine.ReplayRestart})
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
	if _, err := h.eng.Replay(ctx, entries[0].ID, engine.ReplayOptions{Mode: engine.ReplayRestart}); err == nil {
		t.Error("replaying a removed entry worked")
	}
	if _, err := h.eng.Wait(ctx, run.ID); err != nil {
		t.Fatal(err)
	}
}

// TestReplayRun replays runs by their id: one whose failure was not
// dead-lettered resumes from the step it stopped at, one whose failure was
// is that entry's replay, and a succeeded run can only be restarted.
func TestReplayRun(t *testing.T) {
	for _, tc := range []struct {
		name, chain, payload string
		opts                 engine.ReplayOptions
		newRun               bool
		// calls counts the provider calls per step after the replay has run.
		calls   map[string]int
		message string
		refused string
	}{
		{name: "resume without an entry", chain: "nodlq", payload: `{"fail":"down"}`, opts: engine.ReplayOptions{Mode: engine.ReplayResume},
			calls: map[string]int{"first": 1, "page": 2}, message: `replaying from step "page" by alice`},
		{name: "resume of a dead-lettered failure", chain: "seq", payload: `{"fail":"down"}`, opts: engine.ReplayOptions{Mode: engine.ReplayResume},
			calls: map[string]int{"first": 1, "page": 2}, message: `replaying from step "page" (dead-letter entry `},
		{name: "restart without an entry", chain: "nodlq", payload: `{"fail":"down"}`, opts: engine.ReplayOptions{Mode: engine.ReplayRestart},
			newRun: true, calls: map[string]int{"first": 2, "page": 2}},
		{name: "restart of a succeeded run", chain: "nodlq", payload: `{}`, opts: engine.ReplayOptions{Mode: engine.ReplayRestart},
			newRun: true, calls: map[string]int{"first": 2, "page": 2}},
		{name: "resume of a succeeded run", chain: "nodlq", payload: `{}`, opts: engine.ReplayOptions{Mode: engine.ReplayResume},
			refused: "it succeeded; replay it with mode restart"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, rec := replayHarness(t)
			ctx := engine.WithActor(context.Background(), "alice")
			first := h.run(tc.chain, tc.payload)
			run, err := h.eng.ReplayRun(ctx, first.ID, tc.opts)
			if tc.refused != "" {
				if !errors.Is(err, engine.ErrNotReplayable) || !strings.Contains(err.Error(), tc.refused) {
					t.Fatalf("replay: %v, want refused with %q", err, tc.refused)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (run.ID != first.ID) != tc.newRun {
				t.Fatalf("replay carried on in run %s (first was %s), new run wanted: %t", run.ID, first.ID, tc.newRun)
			}
			if _, err := h.eng.Wait(ctx, run.ID); err != nil {
				t.Fatal(err)
			}
			calls := readFileString(t, rec)
			for step, want := range tc.calls {
				if n := strings.Count(calls, "/"+step); n != want {
					t.Errorf("%s was called %d times, want %d", step, n, want)
				}
			}
			if tc.newRun {
				stored := h.storedRun(run.ID)
				if meta := string(stored.Origin.Metadata); !strings.Contains(meta, `"replay_of":"`+first.ID+`"`) || strings.Contains(meta, "dead_letter_entry") {
					t.Errorf("restarted run's metadata: %s", meta)
				}
				return
			}
			events, _ := h.store.Events(ctx, first.ID, 0, 0)
			var msg string
			for _, ev := range events {
				if ev.Type == store.EventRunReplayed {
					msg = ev.Message
				}
			}
			if !strings.Contains(msg, tc.message) {
				t.Errorf("run_replayed says %q, want %q in it", msg, tc.message)
			}
			// A replayed entry is gone; the replay's own failure may park one.
			entries, _ := h.store.ListDLQ(ctx, store.DLQFilter{})
			for _, e := range entries {
				if strings.Contains(msg, e.ID) {
					t.Errorf("entry %s is still there after its replay", e.ID)
				}
			}
		})
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
	if _, err := h.eng.Replay(ctx, entries[0].ID, engine.ReplayOptions{Mode: engine.ReplayResume}); err == nil || !strings.Contains(err.Error(), "is succeeded") {
		t.Errorf("resuming a succeeded run: %v", err)
	}
	if _, err := h.eng.Replay(ctx, entries[0].ID, engine.ReplayOptions{Mode: "sideways"}); err == nil || !strings.Contains(err.Error(), "unknown mode") {
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
	const runs = 40
	cfg, db, rec, _ := unfinishedRuns(t, runs)
	ctx := context.Background()
	h2 := newHarness(t, cfg, atStore(db))
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

// unfinishedRuns leaves n runs of a one-step chain stopped mid-call in a
// store file, as a killed gateway would, and returns the chain's config,
// the store file, the call record and the runs' ids.
func unfinishedRuns(t *testing.T, n int) (cfg, db, rec string, ids []string) {
	t.Helper()
	dir := t.TempDir()
	rec = filepath.Join(dir, "calls.jsonl")
	cfg = fmt.Sprintf(`
[[chains]]
name = "c"
[[chains.steps]]
name = "slow"
provider = "faulty"
payload_template = { record = %q, sleep_ms = 3000 }
`, rec)
	db = filepath.Join(dir, "gw.db")
	h := newHarness(t, cfg, atStore(db))
	for range n {
		run, err := h.eng.Start(context.Background(), "c", engine.Input{})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, run.ID)
	}
	waitLines(t, rec, n)
	h.close()
	return cfg, db, rec, ids
}

// fixChain is a chain whose "page" step fails until its payload is fixed;
// the variants below change it as an operator's edit would.
const fixChain = `
[[chains]]
name = "fix"
[[chains.steps]]
name = "first"
provider = "faulty"
payload_template = { record = "REC" }
[[chains.steps]]
name = "page"
provider = "faulty"
payload_template = { record = "REC", fail = "wrong routing key" }
on_failure = "dlq"
[[chains.steps]]
name = "after"
provider = "faulty"
payload_template = { record = "REC" }
`

// TestReplayOnCurrentDefinition replays a dead-lettered run after its
// chain was changed and reloaded: a compatible change applies to the step
// that failed and what follows, with the recorded results and dedup keys
// kept; an incompatible one is refused, naming the difference, and leaves
// the entry for another try.
func TestReplayOnCurrentDefinition(t *testing.T) {
	fixed := strings.Replace(fixChain, `, fail = "wrong routing key"`, ``, 1)
	tests := []struct {
		name    string
		config  string
		def     engine.ReplayDefinition
		want    store.RunStatus
		refused string
	}{
		{name: "fixed payload", config: fixed, def: engine.ReplayCurrent, want: store.RunSucceeded},
		{name: "fixed payload, default definition", config: fixed, def: "", want: store.RunSucceeded},
		{name: "fixed payload, pinned", config: fixed, def: engine.ReplayPinned, want: store.RunFailed},
		{name: "unchanged", config: fixChain, want: store.RunFailed},
		{name: "a later step added", config: fixed + `
[[chains.steps]]
name = "later"
provider = "echo"
`, want: store.RunSucceeded},
		{name: "taken step became a group", config: strings.Replace(fixed, `name = "first"
provider = "faulty"
payload_template = { record = "REC" }`, `name = "first"
[chains.steps.parallel]
[[chains.steps.parallel.steps]]
name = "one"
provider = "echo"`, 1), refused: `step "first" was a provider step and is now a parallel step`},
		{name: "failed step removed", config: strings.Replace(fixed, `name = "page"`, `name = "pager"`, 1), refused: `step "page", which the run has taken, is no longer in chain "fix"`},
		{name: "chain removed", config: strings.Replace(fixed, `name = "fix"`, `name = "other"`, 1), refused: `chain "fix" is no longer in the config`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := filepath.Join(t.TempDir(), "calls.jsonl")
			h := newHarness(t, strings.ReplaceAll(fixChain, "REC", rec))
			ctx := context.Background()
			res := h.run("fix", `{}`)
			entries, _ := h.store.ListDLQ(ctx, store.DLQFilter{})
			if res.Status != store.RunFailed || len(entries) != 1 {
				t.Fatalf("first run %s with %d entries", res.Status, len(entries))
			}
			pinned := h.storedRun(res.ID).ChainHash
			cfg := h.reload(strings.ReplaceAll(tt.config, "REC", rec))

			run, err := h.eng.Replay(ctx, entries[0].ID, engine.ReplayOptions{Definition: tt.def})
			if tt.refused != "" {
				if err == nil || !errors.Is(err, engine.ErrNotReplayable) || !strings.Contains(err.Error(), tt.refused) {
					t.Fatalf("replay: %v, want it refused with %q", err, tt.refused)
				}
				if _, err := h.store.DLQ(ctx, entries[0].ID); err != nil {
					t.Errorf("a refused replay removed the entry: %v", err)
				}
				if got := h.storedRun(res.ID); got.Status != store.RunFailed || got.ChainHash != pinned {
					t.Errorf("a refused replay changed the run: %s on %.12s", got.Status, got.ChainHash)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			final, err := h.eng.Wait(ctx, run.ID)
			if err != nil || final.Status != tt.want {
				t.Fatalf("after the replay: %v %v, want %s", final.Status, err, tt.want)
			}
			wantHash := pinned
			if tt.def != engine.ReplayPinned {
				wantHash = cfg.Chains["fix"].Hash
			}
			if final.ChainHash != wantHash {
				t.Errorf("the run is on definition %.12s, want %.12s", final.ChainHash, wantHash)
			}
			calls := readRecords(t, rec)
			if calls[res.ID+"/first"] != 1 || calls[res.ID+"/page"] != 2 {
				t.Errorf("calls by dedup key: %v; want first once and page twice under its own key", calls)
			}
			if tt.want == store.RunSucceeded && calls[res.ID+"/after"] != 1 {
				t.Errorf("after was called %d times", calls[res.ID+"/after"])
			}
			// The run resumes on the switched definition after a restart too.
			if _, err := h.eng.Definition(ctx, "fix", final.ChainHash); err != nil {
				t.Errorf("the definition the run now holds is not stored: %v", err)
			}
		})
	}
}

// reload loads config as the gateway's new config, as SIGHUP would.
func (h *harness) reload(config string) *chain.Config {
	h.t.Helper()
	cfg, err := loader.LoadBytes("test.toml", []byte(testProviders+config), loader.Options{ProviderTypes: builtin.Types()})
	if err != nil {
		h.t.Fatalf("loading config:\n%v", err)
	}
	h.eng.SetConfig(cfg)
	return cfg
}

func (h *harness) storedRun(id string) *store.Run {
	h.t.Helper()
	run, err := h.store.Run(context.Background(), id)
	if err != nil {
		h.t.Fatal(err)
	}
	return run
}
