package main

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/internal/testutil/proctest"
)

// execConfig is a chain of two exec steps. Each command appends its dedup
// key to a file; the second, the first time it runs, records its shell's
// and a background child's process ids and waits for ever; the next time,
// it exits at once.
const execConfig = `
[[providers]]
name = "local"
type = "exec"
[providers.config]
dir = "DIR"
[providers.config.commands.collect]
script = 'echo "$CHAINGATE_DEDUP_KEY" >> collect.calls'
[providers.config.commands.clean]
script = '''
echo "$CHAINGATE_DEDUP_KEY" >> clean.calls
[ -e clean.again ] && exit 0
touch clean.again
sleep 300 & echo $! >> clean.pids
echo $$ >> clean.pids
wait
'''

[[chains]]
name = "remediate"
[[chains.steps]]
name = "collect"
provider = "local"
action_type = "collect"
[[chains.steps]]
name = "clean"
provider = "local"
action_type = "clean"
`

// TestExecAcrossKill kills the gateway while a command runs: the command
// and what it started are gone with it; on resume the step whose outcome
// was recorded is not run again, and the one in flight is, with the same
// dedup key.
func TestExecAcrossKill(t *testing.T) {
	t.Parallel()
	env := newCrashEnv(t, execConfig)
	cmd, _ := env.start("run", "remediate")
	env.waitFor("the second command to start", func() bool { return len(proctest.ReadPIDs(env.path("clean.pids"))) == 2 })
	env.kill(cmd)
	proctest.WaitGone(t, 30*time.Second, proctest.Seen(proctest.ReadPIDs(env.path("clean.pids"))...))
	run, persisted := env.snapshot()
	if !persisted["collect"] || persisted["clean"] {
		t.Fatalf("recorded before the kill: %v", persisted)
	}
	env.resume()
	checkCleanRanAgain(t, env, run.ID)
	proctest.WaitGone(t, 30*time.Second, proctest.Seen(proctest.ReadPIDs(env.path("clean.pids"))...))
}

// checkCleanRanAgain checks a run of the remediate chain resumed after a
// kill during clean: it succeeded, collect ran once, clean twice with the
// same dedup key, and no event was logged twice.
func checkCleanRanAgain(t *testing.T, env *crashEnv, id string) {
	t.Helper()
	final, steps, evs := env.finalState(id)
	if final.Status != store.RunSucceeded {
		t.Fatalf("run %s: %+v", final.Status, final.Error)
	}
	if steps["clean"].Status != store.StepSucceeded {
		t.Errorf("clean: %s", steps["clean"].Status)
	}
	checkNoDuplicateEvents(t, evs)
	if calls := lines(t, env.path("collect.calls")); len(calls) != 1 || calls[0] != id+"/collect" {
		t.Errorf("collect, recorded before the kill, ran with %q", calls)
	}
	if calls := lines(t, env.path("clean.calls")); len(calls) != 2 || calls[0] != id+"/clean" || calls[1] != calls[0] {
		t.Errorf("clean, in flight at the kill, ran with %q; want twice, the same dedup key", calls)
	}
}

// TestExecCancelled cancels a run while its command waits: the command and
// its child are gone, and the run is cancelled.
func TestExecCancelled(t *testing.T) {
	t.Parallel()
	env := newCrashEnv(t, execConfig)
	cmd, out := env.start("run", "remediate")
	env.waitFor("the second command to start", func() bool { return len(proctest.ReadPIDs(env.path("clean.pids"))) == 2 })
	id, _, _ := strings.Cut(lines(t, env.path("collect.calls"))[0], "/")
	if code, stdout, stderr := runCLI(t, "cancel", id, "--state", env.state); code != exitOK {
		t.Fatalf("cancel: exit %d %s %s", code, stdout, stderr)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatalf("the gateway did not finish after cancel:\n%s", out)
	}
	if !strings.Contains(out.String(), `"status": "cancelled"`) {
		t.Errorf("output:\n%s", out)
	}
	proctest.WaitGone(t, 30*time.Second, proctest.Seen(proctest.ReadPIDs(env.path("clean.pids"))...))
}

func lines(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return strings.Fields(string(data))
}
