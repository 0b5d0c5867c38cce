package engine_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
)

// failureChain is a runbook whose verify step fails as the payload's
// controls say: a catch routes some failures to page, on_failure tells,
// finally unlocks; every call is recorded in rec.
func failureChain(rec, catch, extra string) string {
	return fmt.Sprintf(`
[[chains]]
name = "runbook"
%[3]s
[[chains.steps]]
name = "clean"
provider = "faulty"
payload_template = { record = %[1]q }
[[chains.steps]]
name = "verify"
provider = "faulty"
timeout_seconds = 1
retry = { max_retries = 1, backoff_ms = 1 }
payload_template = { record = %[1]q, fail = "<<origin.payload.fail ?? \"\">>", fail_retryable = "<<origin.payload.retryable ?? \"\">>", sleep_ms = "<<origin.payload.sleep ?? 0>>" }
catch = %[2]s
[[chains.steps]]
name = "post"
provider = "faulty"
payload_template = { record = %[1]q }
default_next = "end"
[[chains.steps]]
name = "page"
provider = "faulty"
payload_template = { record = %[1]q, step = "<<failure.step>>", class = "<<failure.class>>", code = "<<failure.code>>", attempts = "<<failure.attempts>>", own = "<<steps.verify.error.class>>" }
[[chains.on_failure]]
name = "tell"
provider = "faulty"
payload_template = { record = %[1]q, text = "<<failure.step>> <<failure.class>>: <<failure.message>>", ending = "<<failure.ending>>", fail = "<<origin.payload.tell_fails ?? \"\">>" }
[[chains.finally]]
name = "unlock"
provider = "faulty"
payload_template = { record = %[1]q, ending = "<<failure.ending>>", class = "<<failure.class>>" }
`, rec, catch, extra)
}

// calls counts a record file's calls by step.
func calls(t *testing.T, path string) map[string]int {
	t.Helper()
	out := map[string]int{}
	if _, err := os.Stat(path); err != nil {
		return out
	}
	for k, n := range readRecords(t, path) {
		out[k[strings.IndexByte(k, '/')+1:]] += n
	}
	return out
}

func TestCatchRoutesByClass(t *testing.T) {
	catch := `[
  { errors = ["timeout"], target = "page" },
  { errors = ["code:DISK_FULL"], target = "post" },
  { errors = ["exhausted"], target = "page" },
  { errors = ["permanent"], target = "page" },
]`
	tests := []struct {
		name, payload, class string
	}{
		{"permanent", `{"fail":"disk check failed"}`, "permanent"},
		{"exhausted", `{"retryable":"still busy"}`, "exhausted"},
		{"timeout", `{"sleep":5000}`, "timeout"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := filepath.Join(t.TempDir(), "calls.jsonl")
			h := newHarness(t, failureChain(rec, catch, ""))
			res := h.run("runbook", tc.payload)
			if res.Status != store.RunFailed {
				t.Fatalf("status %s, want failed: a caught failure that is not recovered still fails the run", res.Status)
			}
			if want := []string{"clean", "verify", "page", "tell", "unlock"}; !slices.Equal(res.Path, want) {
				t.Errorf("path %v, want %v", res.Path, want)
			}
			run := h.storedRun(res.ID)
			f := run.Failure
			if f == nil || f.Step != "verify" || f.Class != tc.class || f.Route != "page" || f.Recovered {
				t.Fatalf("failure %+v, want verify's %s failure routed to page", f, tc.class)
			}
			if want := []string{"on_failure:tell", "finally:unlock"}; !slices.Equal(f.Handlers, want) {
				t.Errorf("handlers %v, want %v", f.Handlers, want)
			}
			if run.Phase != "" || run.Ending != store.RunFailed {
				t.Errorf("phase %q ending %q after the end", run.Phase, run.Ending)
			}
			page := body(t, res, "page")
			if page["step"] != "verify" || page["class"] != tc.class || page["own"] != tc.class {
				t.Errorf("page read the failure as %v", page)
			}
			tell := body(t, res, "tell")
			if !strings.HasPrefix(tell["text"].(string), "verify "+tc.class+": ") || tell["ending"] != "failed" {
				t.Errorf("tell read %v", tell)
			}
			if c := calls(t, rec); c["tell"] != 1 || c["unlock"] != 1 || c["post"] != 0 {
				t.Errorf("calls %v: want tell and unlock once, post never", c)
			}
			evs := h.eventTypes(res.ID)
			i, j := slices.Index(evs, "failure_routed verify"), slices.Index(evs, "run_failed")
			if i < 0 || j != len(evs)-1 || slices.Index(evs, "handlers_started") < i {
				t.Errorf("events %v", evs)
			}
		})
	}
}

func TestCatchByCodeAndRecover(t *testing.T) {
	rec := filepath.Join(t.TempDir(), "calls.jsonl")
	// faulty's errors carry the code "faulty".
	h := newHarness(t, failureChain(rec, `[{ errors = ["code:faulty"], target = "post", recover = true }, { target = "page" }]`, ""))
	res := h.run("runbook", `{"fail":"nope"}`)
	if res.Status != store.RunSucceeded {
		t.Fatalf("status %s (%+v), want succeeded: the route recovers the run", res.Status, res.Error)
	}
	if want := []string{"clean", "verify", "post", "unlock"}; !slices.Equal(res.Path, want) {
		t.Errorf("path %v, want %v", res.Path, want)
	}
	f := h.storedRun(res.ID).Failure
	if f == nil || f.Code != "faulty" || f.Route != "post" || !f.Recovered {
		t.Errorf("failure %+v", f)
	}
	if u := body(t, res, "unlock"); u["ending"] != "succeeded" || u["class"] != "permanent" {
		t.Errorf("unlock read %v", u)
	}
	if c := calls(t, rec); c["tell"] != 0 {
		t.Errorf("on_failure ran for a recovered run: %v", c)
	}
}

func TestUncaughtFailureRunsHandlersOnce(t *testing.T) {
	rec := filepath.Join(t.TempDir(), "calls.jsonl")
	h := newHarness(t, failureChain(rec, `[{ errors = ["timeout"], target = "page" }]`, ""))
	res := h.run("runbook", `{"fail":"bad disk"}`)
	if res.Status != store.RunFailed || res.Error == nil || !strings.Contains(res.Error.Message, "bad disk") {
		t.Fatalf("status %s error %+v", res.Status, res.Error)
	}
	if want := []string{"clean", "verify", "tell", "unlock"}; !slices.Equal(res.Path, want) {
		t.Errorf("path %v, want %v", res.Path, want)
	}
	if f := h.storedRun(res.ID).Failure; f == nil || f.Route != "" || f.Class != "permanent" {
		t.Errorf("failure %+v", f)
	}
	if c := calls(t, rec); c["verify"] != 1 || c["tell"] != 1 || c["unlock"] != 1 {
		t.Errorf("calls %v", c)
	}
}

func TestSucceededRunRunsOnlyFinally(t *testing.T) {
	rec := filepath.Join(t.TempDir(), "calls.jsonl")
	h := newHarness(t, failureChain(rec, `[{ target = "page" }]`, ""))
	res := h.run("runbook", `{}`)
	if res.Status != store.RunSucceeded {
		t.Fatalf("status %s %+v", res.Status, res.Error)
	}
	if want := []string{"clean", "verify", "post", "unlock"}; !slices.Equal(res.Path, want) {
		t.Errorf("path %v, want %v", res.Path, want)
	}
	run := h.storedRun(res.ID)
	if run.Failure != nil {
		t.Errorf("failure %+v on a run that succeeded", run.Failure)
	}
	// The run's result is its own steps', not its finally step's.
	if !strings.Contains(string(run.Body), `"attempt"`) || strings.Contains(string(run.Body), "ending") {
		t.Errorf("body %s", run.Body)
	}
}

func TestHandlerFailureIsParkedNotLooped(t *testing.T) {
	rec := filepath.Join(t.TempDir(), "calls.jsonl")
	h := newHarness(t, failureChain(rec, `[{ errors = ["timeout"], target = "page" }]`, ""))
	res := h.run("runbook", `{"fail":"bad disk","tell_fails":"slack is down"}`)
	if res.Status != store.RunFailed {
		t.Fatalf("status %s", res.Status)
	}
	if c := calls(t, rec); c["tell"] != 1 || c["unlock"] != 1 {
		t.Errorf("calls %v: the failed handler runs once, and finally still runs", c)
	}
	run := h.storedRun(res.ID)
	if f := run.Failure; f == nil || f.Step != "verify" || !slices.Equal(f.HandlerFailures, []string{"on_failure:tell"}) {
		t.Errorf("failure %+v", f)
	}
	entries, err := h.store.ListDLQ(context.Background(), store.DLQFilter{Chain: "runbook"})
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Step != "tell" || entries[0].Handler != "on_failure" || !strings.Contains(entries[0].Error.Message, "slack is down") {
		t.Fatalf("dead-letter entries %+v", entries)
	}
}

func TestCancelRunsFinallyNotOnFailure(t *testing.T) {
	for _, onCancel := range []bool{true, false} {
		t.Run(fmt.Sprint("finally_on_cancel=", onCancel), func(t *testing.T) {
			rec := filepath.Join(t.TempDir(), "calls.jsonl")
			h := newHarness(t, failureChain(rec, `[{ target = "page" }]`, fmt.Sprintf("finally_on_cancel = %v", onCancel)))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			run, err := h.eng.Start(ctx, "runbook", engine.Input{Payload: []byte(`{"sleep":60000}`)})
			if err != nil {
				t.Fatal(err)
			}
			waitForStep(t, rec, "verify")
			if err := h.eng.Cancel(ctx, run.ID); err != nil {
				t.Fatal(err)
			}
			final, err := h.eng.Wait(ctx, run.ID)
			if err != nil || final.Status != store.RunCancelled {
				t.Fatalf("after cancel: %+v %v", final, err)
			}
			c := calls(t, rec)
			if c["tell"] != 0 || c["page"] != 0 {
				t.Errorf("a cancel ran the failure routes: %v", c)
			}
			want := 0
			if onCancel {
				want = 1
			}
			if c["unlock"] != want {
				t.Errorf("unlock called %d times, want %d", c["unlock"], want)
			}
		})
	}
}

// waitForStep waits until a record file holds a call of step.
func waitForStep(t *testing.T, rec, step string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if data, err := os.ReadFile(rec); err == nil && strings.Contains(string(data), "/"+step+`"`) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("step %s was never called", step)
}

func TestHandlersTimeoutEndsTheRun(t *testing.T) {
	rec := filepath.Join(t.TempDir(), "calls.jsonl")
	h := newHarness(t, fmt.Sprintf(`
[[chains]]
name = "c"
handlers_timeout_seconds = 1
[[chains.steps]]
name = "work"
provider = "faulty"
payload_template = { fail = "broken" }
[[chains.on_failure]]
name = "stuck"
provider = "faulty"
timeout_seconds = 60
payload_template = { record = %[1]q, hang = true }
[[chains.on_failure]]
name = "never"
provider = "faulty"
payload_template = { record = %[1]q }
`, rec))
	res := h.run("c", `{}`)
	if res.Status != store.RunFailed || res.Error == nil || !strings.Contains(res.Error.Message, "broken") {
		t.Fatalf("status %s error %+v: the run ends as it was ending", res.Status, res.Error)
	}
	if c := calls(t, rec); c["stuck"] != 1 || c["never"] != 0 {
		t.Errorf("calls %v", c)
	}
	entries, _ := h.store.ListDLQ(context.Background(), store.DLQFilter{Chain: "c"})
	if len(entries) != 1 || entries[0].Step != "stuck" || entries[0].Handler != "on_failure" {
		t.Errorf("dead-letter entries %+v", entries)
	}
}

func TestGroupSubChainAndApprovalFailuresRouted(t *testing.T) {
	rec := filepath.Join(t.TempDir(), "calls.jsonl")
	h := newHarness(t, fmt.Sprintf(`
[[chains]]
name = "child"
[[chains.steps]]
name = "inner"
provider = "faulty"
payload_template = { fail = "child broke" }

[[chains]]
name = "group"
[[chains.steps]]
name = "both"
catch = [{ target = "page" }]
[[chains.steps.parallel.steps]]
name = "a"
provider = "faulty"
payload_template = { fail = "a broke" }
[[chains.steps.parallel.steps]]
name = "b"
provider = "echo"
[[chains.steps]]
name = "skipped"
provider = "echo"
[[chains.steps]]
name = "page"
provider = "faulty"
payload_template = { record = %[1]q, step = "<<failure.step>>", message = "<<failure.message>>" }

[[chains]]
name = "sub"
[[chains.steps]]
name = "call"
sub_chain = "child"
catch = [{ target = "page2", recover = true }]
[[chains.steps]]
name = "page2"
provider = "faulty"
payload_template = { record = %[1]q, step = "<<failure.step>>" }

[[chains]]
name = "ask"
[[chains.steps]]
name = "approve"
timeout_seconds = 1
approval = { message = "go?", on_timeout = "fail" }
catch = [{ errors = ["timeout"], target = "page3" }]
[[chains.steps]]
name = "page3"
provider = "faulty"
payload_template = { record = %[1]q, class = "<<failure.class>>" }
`, rec))
	res := h.run("group", `{}`)
	if res.Status != store.RunFailed || !slices.Equal(res.Path, []string{"both", "page"}) {
		t.Errorf("group: %s %v", res.Status, res.Path)
	}
	if p := body(t, res, "page"); p["step"] != "both" {
		t.Errorf("page read %v", p)
	}
	res = h.run("sub", `{}`)
	if res.Status != store.RunSucceeded || !slices.Equal(res.Path, []string{"call", "page2"}) {
		t.Errorf("sub_chain: %s %v %+v", res.Status, res.Path, res.Error)
	}
	res = h.run("ask", `{}`)
	if res.Status != store.RunFailed || !slices.Equal(res.Path, []string{"approve", "page3"}) {
		t.Errorf("approval: %s %v", res.Status, res.Path)
	}
	if p := body(t, res, "page3"); p["class"] != "timeout" {
		t.Errorf("page3 read %v", p)
	}
}

// TestHandlerResumesAfterStop stops the gateway while an on_failure step's
// call is out: the gateway that resumes the run finishes the handler list
// without calling the handler step that had answered again.
func TestHandlerResumesAfterStop(t *testing.T) {
	dir := t.TempDir()
	rec := filepath.Join(dir, "calls.jsonl")
	db := filepath.Join(dir, "gw.db")
	cfg := fmt.Sprintf(`
[[chains]]
name = "c"
[[chains.steps]]
name = "work"
provider = "faulty"
payload_template = { record = %[1]q, fail = "broken" }
[[chains.on_failure]]
name = "first"
provider = "faulty"
payload_template = { record = %[1]q }
[[chains.on_failure]]
name = "slow"
provider = "faulty"
payload_template = { record = %[1]q, sleep_ms = 1500 }
[[chains.finally]]
name = "last"
provider = "faulty"
payload_template = { record = %[1]q }
`, rec)
	h1 := newHarness(t, cfg, atStore(db))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	run, err := h1.eng.Start(ctx, "c", engine.Input{})
	if err != nil {
		t.Fatal(err)
	}
	waitForStep(t, rec, "slow")
	h1.close()
	h2 := newHarness(t, cfg, atStore(db))
	mid := h2.storedRun(run.ID)
	if mid.Phase != store.PhaseOnFailure || mid.Status != store.RunRunning || mid.Ending != store.RunFailed {
		t.Fatalf("stopped run: phase %q status %s ending %q", mid.Phase, mid.Status, mid.Ending)
	}
	if _, err := h2.eng.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	final, err := h2.eng.Wait(ctx, run.ID)
	if err != nil || final.Status != store.RunFailed {
		t.Fatalf("after resume: %+v %v", final, err)
	}
	if c := calls(t, rec); c["work"] != 1 || c["first"] != 1 || c["slow"] != 2 || c["last"] != 1 {
		t.Errorf("calls %v: want work and first once, slow again with its dedup key, last once", c)
	}
}

// TestReplayAfterHandlers replays a failed run whose handlers ran: from
// the step that failed, with its handler records gone, so the handlers
// run again only if it fails again; and a parked handler failure replays
// in its own phase.
func TestReplayAfterHandlers(t *testing.T) {
	rec := filepath.Join(t.TempDir(), "calls.jsonl")
	h := newHarness(t, failureChain(rec, `[{ errors = ["timeout"], target = "page" }]`, ""))
	res := h.run("runbook", `{"fail":"bad disk","tell_fails":"slack is down"}`)
	if res.Status != store.RunFailed {
		t.Fatalf("status %s", res.Status)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	entries, err := h.store.ListDLQ(ctx, store.DLQFilter{Chain: "runbook"})
	if err != nil || len(entries) != 1 {
		t.Fatalf("entries %+v %v", entries, err)
	}
	// The handler's entry replays the handler, then finally again.
	if _, err := h.eng.Replay(ctx, entries[0].ID, engine.ReplayOptions{Definition: engine.ReplayPinned}); err != nil {
		t.Fatal(err)
	}
	final, err := h.eng.Wait(ctx, res.ID)
	if err != nil || final.Status != store.RunFailed {
		t.Fatalf("after replaying the handler: %+v %v", final, err)
	}
	if c := calls(t, rec); c["verify"] != 1 || c["tell"] != 2 || c["unlock"] != 2 {
		t.Errorf("calls %v", c)
	}
	if !slices.Equal(final.Path, []string{"clean", "verify", "tell", "unlock"}) {
		t.Errorf("path %v", final.Path)
	}
	// The run replays from verify, fixed: its handlers' records go, and
	// only finally runs.
	fixed := strings.Replace(failureChain(rec, `[{ errors = ["timeout"], target = "page" }]`, ""), `fail = "<<origin.payload.fail ?? \"\">>", `, "", 1)
	h.reload(fixed)
	if _, err := h.eng.ReplayRun(ctx, res.ID, engine.ReplayOptions{}); err != nil {
		t.Fatal(err)
	}
	final, err = h.eng.Wait(ctx, res.ID)
	if err != nil || final.Status != store.RunSucceeded {
		t.Fatalf("after replaying the run: %+v %v", final, err)
	}
	if !slices.Equal(final.Path, []string{"clean", "verify", "post", "unlock"}) {
		t.Errorf("path %v", final.Path)
	}
	if final.Failure != nil || final.Phase != "" {
		t.Errorf("failure %+v phase %q after a replay that succeeded", final.Failure, final.Phase)
	}
	if c := calls(t, rec); c["verify"] != 2 || c["tell"] != 2 || c["unlock"] != 3 {
		t.Errorf("calls %v", c)
	}
}

func TestSplitFailureRoutedAndTimeoutRunsHandlers(t *testing.T) {
	rec := filepath.Join(t.TempDir(), "calls.jsonl")
	h := newHarness(t, fmt.Sprintf(`
[[chains]]
name = "fleet"
[[chains.steps]]
name = "each"
catch = [{ errors = ["permanent"], target = "page" }]
[chains.steps.split]
items = "<<origin.payload.hosts>>"
[[chains.steps.split.steps]]
name = "check"
provider = "faulty"
payload_template = { fail = "<<item.fail ?? \"\">>" }
[[chains.steps]]
name = "page"
provider = "faulty"
payload_template = { record = %[1]q, step = "<<failure.step>>", class = "<<failure.class>>" }

[[chains]]
name = "slow"
timeout_seconds = 1
[[chains.steps]]
name = "stuck"
provider = "faulty"
timeout_seconds = 60
payload_template = { hang = true }
[[chains.on_failure]]
name = "tell"
provider = "faulty"
payload_template = { record = %[1]q, class = "<<failure.class>>", ending = "<<failure.ending>>" }
`, rec))
	res := h.run("fleet", `{"hosts":[{"fail":""},{"fail":"down"}]}`)
	if res.Status != store.RunFailed || !slices.Equal(res.Path, []string{"each", "page"}) {
		t.Errorf("split: %s %v", res.Status, res.Path)
	}
	if p := body(t, res, "page"); p["step"] != "each" || p["class"] != "permanent" {
		t.Errorf("page read %v", p)
	}
	res = h.run("slow", `{}`)
	if res.Status != store.RunTimedOut {
		t.Fatalf("status %s, want timed_out: the handlers do not change how the run ends", res.Status)
	}
	if !slices.Equal(res.Path, []string{"stuck", "tell"}) {
		t.Errorf("path %v", res.Path)
	}
	if b := body(t, res, "tell"); b["class"] != "timeout" || b["ending"] != "timed_out" {
		t.Errorf("tell read %v", b)
	}
}
