package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/bolt"
	"github.com/chaingate/gateway/chain/store/crashpoint"
	"github.com/chaingate/gateway/internal/testutil/proctest"
)

// These tests run the gateway as a real process, kill it with SIGKILL at a
// chosen point, start it again on the same store, and check from the faulty
// provider's record files that nothing with a persisted result was called
// twice and that the run finished whole.

type crashEnv struct {
	t      *testing.T
	dir    string
	config string
	state  string
}

func newCrashEnv(t *testing.T, config string) *crashEnv {
	t.Helper()
	dir := t.TempDir()
	env := &crashEnv{t: t, dir: dir, config: filepath.Join(dir, "c.toml"), state: filepath.Join(dir, "gw.db")}
	writeFile(t, env.config, strings.ReplaceAll(config, "DIR", dir))
	return env
}

func (env *crashEnv) path(name string) string { return filepath.Join(env.dir, name) }

// start runs the gateway command in the background.
func (env *crashEnv) start(args ...string) (*exec.Cmd, *bytes.Buffer) {
	env.t.Helper()
	return env.startWith(nil, args...)
}

// startWith is start with extra environment variables.
func (env *crashEnv) startWith(extraEnv []string, args ...string) (*exec.Cmd, *bytes.Buffer) {
	env.t.Helper()
	exe, err := os.Executable()
	if err != nil {
		env.t.Fatal(err)
	}
	cmd := exec.Command(exe, append(args, "--config", env.config, "--state", env.state)...)
	cmd.Env = append(append(os.Environ(), mainEnv+"=1"), extraEnv...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	if err := cmd.Start(); err != nil {
		env.t.Fatal(err)
	}
	env.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_, _ = cmd.Process.Wait()
	})
	return cmd, &out
}

// kill sends SIGKILL and waits until the process and its plugins are gone,
// so the store's lock is free.
func (env *crashEnv) kill(cmd *exec.Cmd) {
	env.t.Helper()
	children := childPIDs(cmd.Process.Pid)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		env.t.Fatal(err)
	}
	_, _ = cmd.Process.Wait()
	proctest.WaitGone(env.t, 3*time.Second, proctest.Seen(children...))
}

// resume runs "gateway resume" to completion.
func (env *crashEnv) resume() string {
	env.t.Helper()
	cmd, out := env.start("resume")
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			env.t.Fatalf("gateway resume: %v\n%s", err, out)
		}
	case <-time.After(60 * time.Second):
		env.t.Fatalf("gateway resume did not finish:\n%s", out)
	}
	return out.String()
}

// waitFor polls until cond holds.
func (env *crashEnv) waitFor(what string, cond func() bool) {
	env.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			env.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type recordLine struct {
	DedupKey string `json:"dedup_key"`
	Attempt  int    `json:"attempt"`
}

// calls counts the record file's lines by dedup key.
func (env *crashEnv) calls(name string) map[string][]recordLine {
	env.t.Helper()
	return readRecords(env.t, env.path(name))
}

// readRecords reads a faulty record file by dedup key. A line is written
// in one write(2), but a reader may catch one that is still being copied
// in: the text after the last newline is left for the next read.
func readRecords(t testing.TB, path string) map[string][]recordLine {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	data = data[:bytes.LastIndexByte(data, '\n')+1]
	out := map[string][]recordLine{}
	for _, l := range strings.Split(string(data), "\n") {
		if l == "" {
			continue
		}
		var r recordLine
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("torn record line %q: %v", l, err)
		}
		out[r.DedupKey] = append(out[r.DedupKey], r)
	}
	return out
}

func (env *crashEnv) lines(name string) int {
	n := 0
	for _, ls := range env.calls(name) {
		n += len(ls)
	}
	return n
}

// snapshot opens the store of the killed gateway and returns its only run
// and the keys of the steps that have a persisted final result.
func (env *crashEnv) snapshot() (*store.Run, map[string]bool) {
	env.t.Helper()
	st, err := bolt.Open(env.state, bolt.Options{})
	if err != nil {
		env.t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	page, err := st.ListRuns(ctx, store.RunFilter{})
	if err != nil || len(page.Runs) != 1 {
		env.t.Fatalf("runs in store: %v %v", page.Runs, err)
	}
	run := page.Runs[0]
	steps, err := st.Steps(ctx, run.ID, "")
	if err != nil {
		env.t.Fatal(err)
	}
	final := map[string]bool{}
	for _, s := range steps {
		if s.Status.Final() {
			final[s.Key] = true
		}
	}
	return run, final
}

// finalState reads the finished run, its steps and events.
func (env *crashEnv) finalState(id string) (*store.Run, map[string]*store.StepRecord, []store.Event) {
	env.t.Helper()
	st, err := bolt.Open(env.state, bolt.Options{})
	if err != nil {
		env.t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	run, err := st.Run(ctx, id)
	if err != nil {
		env.t.Fatal(err)
	}
	recs, _ := st.Steps(ctx, id, "")
	steps := map[string]*store.StepRecord{}
	for _, r := range recs {
		steps[r.Key] = r
	}
	evs, _ := st.Events(ctx, id, 0, 0)
	return run, steps, evs
}

// checkNoDuplicateEvents fails on two completion events for one step, or
// a gap or repeat in the sequence.
func checkNoDuplicateEvents(t *testing.T, evs []store.Event) {
	t.Helper()
	seen := map[string]bool{}
	for i, ev := range evs {
		if ev.Seq != uint64(i+1) {
			t.Fatalf("event %d has seq %d", i, ev.Seq)
		}
		switch ev.Type {
		case store.EventStepSucceeded, store.EventStepFailed, store.EventStepSkipped, store.EventStepCancelled, store.EventStepTimedOut,
			store.EventRunSucceeded, store.EventRunFailed:
			k := string(ev.Type) + " " + ev.Step
			if seen[k] {
				t.Errorf("duplicate event %s", k)
			}
			seen[k] = true
		}
	}
}

const fanoutSubs = 50

// fanoutConfig is prepare → notify (50 faulty sub-steps, five at a time,
// staggered sleeps) → after. The last five sub-steps, started last, sleep
// two seconds: a kill after 40 calls lands before the group ends, however
// late a loaded machine lets the test see the count.
func fanoutConfig(prepareSleep, afterSleep int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `
[[providers]]
name = "faulty"
type = "faulty"

[[chains]]
name = "fanout"

[[chains.steps]]
name = "prepare"
provider = "faulty"
payload_template = { record = "DIR/prepare.jsonl", sleep_ms = %d }

[[chains.steps]]
name = "notify"
[chains.steps.parallel]
max_concurrency = 5
`, prepareSleep)
	for i := range fanoutSubs {
		sleep := 40 + (i%7)*25
		if i >= fanoutSubs-5 {
			sleep = 2000
		}
		fmt.Fprintf(&b, "[[chains.steps.parallel.steps]]\nname = \"sub-%02d\"\nprovider = \"faulty\"\npayload_template = { record = \"DIR/subs.jsonl\", sleep_ms = %d, n = %d }\n", i, sleep, i)
	}
	fmt.Fprintf(&b, `
[[chains.steps]]
name = "after"
provider = "faulty"
payload_template = { record = "DIR/after.jsonl", sleep_ms = %d, total = "<<steps.notify.body>>" }
`, afterSleep)
	return b.String()
}

// checkFanout checks the run after a crash and a resume: every sub-step with
// a result persisted before the kill was called exactly once, every one ran
// to a result, the join is complete, and no event is duplicated.
func checkFanout(t *testing.T, env *crashEnv, runID string, persisted map[string]bool) {
	t.Helper()
	run, steps, evs := env.finalState(runID)
	if run.Status != store.RunSucceeded {
		t.Fatalf("run %s: %+v", run.Status, run.Error)
	}
	calls := env.calls("subs.jsonl")
	for i := range fanoutSubs {
		key := fmt.Sprintf("notify/sub-%02d", i)
		n := len(calls[runID+"/"+key])
		switch {
		case persisted[key] && n != 1:
			t.Errorf("%s had a persisted result before the kill but was called %d times", key, n)
		case n < 1:
			t.Errorf("%s was never called", key)
		}
		if steps[key].Status != store.StepSucceeded {
			t.Errorf("%s: %s", key, steps[key].Status)
		}
	}
	var group map[string]json.RawMessage
	if err := json.Unmarshal(steps["notify"].Body, &group); err != nil || len(group) != fanoutSubs {
		t.Errorf("join result has %d of %d sub-steps (%v)", len(group), fanoutSubs, err)
	}
	for name, b := range group {
		if string(b) == "null" {
			t.Errorf("join result for %s is null", name)
		}
	}
	checkNoDuplicateEvents(t, evs)
}

func TestCrashBeforeDispatch(t *testing.T) {
	t.Parallel()
	env := newCrashEnv(t, fanoutConfig(3000, 0))
	cmd, _ := env.start("run", "fanout")
	env.waitFor("prepare to be called", func() bool { return env.lines("prepare.jsonl") == 1 })
	env.kill(cmd)
	run, persisted := env.snapshot()
	if len(persisted) != 0 {
		t.Fatalf("steps final before the group started: %v", persisted)
	}
	env.resume()
	checkFanout(t, env, run.ID, persisted)
	if calls := env.calls("prepare.jsonl")[run.ID+"/prepare"]; len(calls) != 2 || calls[1].Attempt != 1 {
		t.Errorf("prepare, in flight at the kill, should be dispatched again once with the same attempt: %+v", calls)
	}
}

func TestCrashMidGroup(t *testing.T) {
	t.Parallel()
	for _, at := range []int{10, 25, 40} {
		t.Run(fmt.Sprintf("after-%d-calls", at), func(t *testing.T) {
			t.Parallel()
			env := newCrashEnv(t, fanoutConfig(0, 0))
			cmd, _ := env.start("run", "fanout")
			env.waitFor(fmt.Sprintf("%d sub-steps to be called", at), func() bool { return env.lines("subs.jsonl") >= at })
			env.kill(cmd)
			run, persisted := env.snapshot()
			if len(persisted) == 0 || len(persisted) >= fanoutSubs {
				t.Fatalf("kill came at the wrong time: %d sub-steps final", len(persisted))
			}
			env.resume()
			checkFanout(t, env, run.ID, persisted)
		})
	}
}

func TestCrashAfterJoin(t *testing.T) {
	t.Parallel()
	env := newCrashEnv(t, fanoutConfig(0, 3000))
	cmd, _ := env.start("run", "fanout")
	env.waitFor("the step after the group to be called", func() bool { return env.lines("after.jsonl") == 1 })
	env.kill(cmd)
	run, persisted := env.snapshot()
	if !persisted["notify"] {
		t.Fatal("the join was not persisted before the next step started")
	}
	env.resume()
	checkFanout(t, env, run.ID, persisted)
	if n := len(env.calls("after.jsonl")[run.ID+"/after"]); n != 2 {
		t.Errorf("after, in flight at the kill, was called %d times; want 2 (at least once, same dedup key)", n)
	}
}

func TestCrashDuringBackoff(t *testing.T) {
	t.Parallel()
	env := newCrashEnv(t, `
[[providers]]
name = "faulty"
type = "faulty"

[[chains]]
name = "flaky"
[[chains.steps]]
name = "call"
provider = "faulty"
payload_template = { record = "DIR/calls.jsonl", fail_times = 1 }
retry = { max_retries = 2, backoff_ms = 3000, strategy = "fixed" }
`)
	// The gateway dies as soon as the failure and its backoff timer are
	// durable.
	cmd, out := env.startWith([]string{crashpoint.Env + "=after call pending"}, "run", "flaky")
	var ee *exec.ExitError
	if err := cmd.Wait(); !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the gateway was to die once the backoff was persisted but ended with %v:\n%s", err, out)
	}
	run, _ := env.snapshot()
	_, steps, _ := env.finalState(run.ID)
	due := steps["call"].NotBefore
	if steps["call"].Status != store.StepPending || steps["call"].Attempts != 1 || due.IsZero() {
		t.Fatalf("persisted backoff: %+v", steps["call"])
	}
	// Stay down past the due time: a resumed timer fires at once, one
	// counted anew waits its 3 s again.
	time.Sleep(time.Until(due) + 200*time.Millisecond)
	env.resume()
	calls := env.calls("calls.jsonl")[run.ID+"/call"]
	if len(calls) != 2 || calls[0].Attempt != 1 || calls[1].Attempt != 2 {
		t.Fatalf("calls: %+v", calls)
	}
	final, steps, evs := env.finalState(run.ID)
	if final.Status != store.RunSucceeded || steps["call"].Attempts != 2 {
		t.Fatalf("run %s, step %+v", final.Status, steps["call"])
	}
	// Times the gateways recorded, not the test's: the second attempt
	// starts no earlier than the persisted due time, and right after the
	// resume rather than a whole backoff later.
	var started []time.Time
	var resumed time.Time
	for _, ev := range evs {
		switch {
		case ev.Type == store.EventStepStarted && ev.Step == "call":
			started = append(started, ev.Time)
		case ev.Type == store.EventRunResumed:
			resumed = ev.Time
		}
	}
	if len(started) != 2 || resumed.IsZero() {
		t.Fatalf("events: %+v", evs)
	}
	if started[1].Before(due) {
		t.Errorf("the second attempt started at %v, before its persisted due time %v", started[1], due)
	}
	if wait := started[1].Sub(resumed); wait >= 3*time.Second {
		t.Errorf("the second attempt started %v after the resume: the backoff restarted instead of resuming", wait)
	}
	checkNoDuplicateEvents(t, evs)
}

// TestCancelReachesRunningGateway cancels a run held by another gateway
// process through the store's control socket.
func TestCancelReachesRunningGateway(t *testing.T) {
	t.Parallel()
	env := newCrashEnv(t, `
[[providers]]
name = "faulty"
type = "faulty"
[[chains]]
name = "stuck"
[[chains.steps]]
name = "wait"
provider = "faulty"
payload_template = { record = "DIR/calls.jsonl", record_cancel = "DIR/cancelled.jsonl", hang = true }
`)
	cmd, out := env.start("run", "stuck")
	env.waitFor("the call", func() bool { return env.lines("calls.jsonl") == 1 })
	var id string
	for _, k := range keys(env.calls("calls.jsonl")) {
		id, _, _ = strings.Cut(k, "/")
	}
	code, stdout, stderr := runCLI(t, "cancel", id, "--state", env.state)
	if code != exitOK {
		t.Fatalf("cancel: exit %d %s %s", code, stdout, stderr)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatalf("the gateway did not finish after cancel:\n%s", out)
	}
	if !strings.Contains(out.String(), `"status": "cancelled"`) {
		t.Errorf("output:\n%s", out)
	}
	env.waitFor("the plugin to see the cancellation", func() bool { return env.lines("cancelled.jsonl") == 1 })
	// With no gateway running, cancel works on the store itself.
	if code, _, _ := runCLI(t, "cancel", id, "--state", env.state); code != exitFailed {
		t.Errorf("cancelling a finished run: exit %d", code)
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestCrashMidSplit(t *testing.T) {
	t.Parallel()
	const items = 60
	var hosts []string
	for i := range items {
		// The last wave sleeps two seconds: a kill after half the calls
		// lands before the split ends, however late the test sees them.
		sleep := 30 + (i%5)*20
		if i >= items-6 {
			sleep = 2000
		}
		hosts = append(hosts, fmt.Sprint(sleep))
	}
	env := newCrashEnv(t, `
[[providers]]
name = "faulty"
type = "faulty"
[[chains]]
name = "loop"
[[chains.steps]]
name = "hosts"
[chains.steps.split]
items = "<<origin.payload.items>>"
max_concurrency = 6
[[chains.steps.split.steps]]
name = "check"
provider = "faulty"
payload_template = { record = "DIR/items.jsonl", sleep_ms = "<<item>>", i = "<<item_index>>" }
`)
	payload := env.path("payload.json")
	writeFile(t, payload, `{"items":[`+strings.Join(hosts, ",")+`]}`)
	cmd, _ := env.start("run", "loop", "--payload", "@"+payload)
	env.waitFor("half the items to be called", func() bool { return env.lines("items.jsonl") >= items/2 })
	env.kill(cmd)
	run, final := env.snapshot()
	slots := 0
	for k := range final {
		if strings.HasPrefix(k, "hosts[") && !strings.Contains(k, "/") {
			slots++
		}
	}
	if slots == 0 || slots == items {
		t.Fatalf("kill came at the wrong time: %d items finished", slots)
	}
	env.resume()
	done, steps, evs := env.finalState(run.ID)
	if done.Status != store.RunSucceeded {
		t.Fatalf("run %s: %+v", done.Status, done.Error)
	}
	calls := env.calls("items.jsonl")
	for i := range items {
		slot := fmt.Sprintf("hosts[%02d]", i)
		n := len(calls[run.ID+"/"+slot+"/check"])
		switch {
		case final[slot] && n != 1:
			t.Errorf("%s had its result before the kill but was called %d times", slot, n)
		case n < 1:
			t.Errorf("%s never ran", slot)
		}
	}
	var body struct {
		Results   []json.RawMessage `json:"results"`
		Succeeded int               `json:"succeeded"`
	}
	if err := json.Unmarshal(steps["hosts"].Body, &body); err != nil || body.Succeeded != items || len(body.Results) != items {
		t.Errorf("split body: %d results, %d succeeded (%v)", len(body.Results), body.Succeeded, err)
	}
	for i, r := range body.Results {
		if !strings.Contains(string(r), fmt.Sprintf(`"i":%d`, i)) {
			t.Errorf("result %d out of order: %s", i, r)
		}
	}
	checkNoDuplicateEvents(t, evs)
}
