package main

import (
	"slices"
	"testing"

	"github.com/chaingate/gateway/chain/store"
)

// failureConfig is the runbook of issue 40: clean, then verify, which
// fails; its failure handler pages, then notifies (slowly, so the test
// kills the gateway during that call), and finally unlocks. Every call is
// recorded by the faulty provider.
const failureConfig = `
[[providers]]
name = "faulty"
type = "faulty"

[[chains]]
name = "runbook"
[[chains.steps]]
name = "clean"
provider = "faulty"
payload_template = { record = "DIR/calls.jsonl" }
[[chains.steps]]
name = "verify"
provider = "faulty"
payload_template = { record = "DIR/calls.jsonl", fail = "disk still 97% full" }
[[chains.steps]]
name = "post"
provider = "faulty"
payload_template = { record = "DIR/calls.jsonl" }

[[chains.on_failure]]
name = "page"
provider = "faulty"
payload_template = { record = "DIR/calls.jsonl", summary = "<<failure.step>> failed: <<failure.message>>" }
[[chains.on_failure]]
name = "notify"
provider = "faulty"
payload_template = { record = "DIR/calls.jsonl", sleep_ms = 1500, text = "<<failure.class>>" }

[[chains.finally]]
name = "unlock"
provider = "faulty"
payload_template = { record = "DIR/calls.jsonl" }
`

// TestFailureHandlersAcrossKill kills the gateway with SIGKILL while an
// on_failure step's call is out: resumed, the run finishes its handlers
// and ends failed, and no step whose outcome was recorded is called again
// (checked from the provider's own call record); the one in flight is
// called again with the same dedup key.
func TestFailureHandlersAcrossKill(t *testing.T) {
	t.Parallel()
	env := newCrashEnv(t, failureConfig)
	cmd, _ := env.start("run", "runbook")
	env.waitFor("the notify handler's call", func() bool {
		for k := range env.calls("calls.jsonl") {
			if len(k) > 7 && k[len(k)-7:] == "/notify" {
				return true
			}
		}
		return false
	})
	env.kill(cmd)
	run, persisted := env.snapshot()
	if run.Phase != store.PhaseOnFailure || run.Status.Final() || run.Ending != store.RunFailed {
		t.Fatalf("killed run: phase %q status %s ending %q", run.Phase, run.Status, run.Ending)
	}
	if !persisted["verify"] || !persisted["page"] || persisted["notify"] {
		t.Fatalf("recorded before the kill: %v", persisted)
	}
	// resume exits 1: the run it finished failed, as the runbook says.
	rcmd, out := env.start("resume")
	if err := rcmd.Wait(); err == nil || rcmd.ProcessState.ExitCode() != 1 {
		t.Fatalf("gateway resume: %v, want exit status 1 for the failed run\n%s", err, out)
	}
	final, steps, evs := env.finalState(run.ID)
	if final.Status != store.RunFailed {
		t.Fatalf("run %s: %+v; want failed, its failure handled", final.Status, final.Error)
	}
	checkNoDuplicateEvents(t, evs)
	calls := env.calls("calls.jsonl")
	for step, want := range map[string]int{"clean": 1, "verify": 1, "post": 0, "page": 1, "notify": 2, "unlock": 1} {
		got := calls[run.ID+"/"+step]
		if len(got) != want {
			t.Errorf("%s called %d times, want %d: %v", step, len(got), want, got)
		}
	}
	if n := calls[run.ID+"/notify"]; len(n) == 2 && n[0].Attempt != n[1].Attempt {
		t.Errorf("notify called again with attempt %d after %d; want the same attempt", n[1].Attempt, n[0].Attempt)
	}
	if steps["notify"].Status != store.StepSucceeded || steps["unlock"].Status != store.StepSucceeded {
		t.Errorf("handlers: notify %s, unlock %s", steps["notify"].Status, steps["unlock"].Status)
	}
	f := final.Failure
	if f == nil || f.Step != "verify" || f.Class != "permanent" {
		t.Fatalf("failure %+v", f)
	}
	if want := []string{"on_failure:page", "on_failure:notify", "finally:unlock"}; !slices.Equal(f.Handlers, want) {
		t.Errorf("handlers %v, want %v", f.Handlers, want)
	}
}
