package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/crashpoint"
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/internal/testutil/proctest"
	"github.com/chaingate/gateway/internal/testutil/redistest"
)

// The crash-point matrix kills a real gateway with SIGKILL at named commits
// of one run that goes through every kind of step, resumes it in every way
// a run can be resumed, on both stores, and checks from the provider's
// record file and the store that:
//
//   - a step with an outcome recorded before the kill is never called again;
//   - no call (dedup key and attempt) is made more than once after the
//     resume, nor more than once before the kill;
//   - the run ends exactly as an uninterrupted run does.
//
// The kill points are crash points (package crashpoint), so each scenario
// dies at the same place every time.

// matrixChain walks every kind of step, each followed by another kind:
// provider → provider with a retry → parallel group → provider → split
// (with a filtered and a failing item) → provider → sub-chain → provider.
const matrixChain = `
[gateway]
lease_ttl_seconds = LEASE_TTL
shutdown_grace_seconds = 5

[[providers]]
name = "faulty"
type = "faulty"

[[chains]]
name = "matrix"
timeout_seconds = 300

[[chains.steps]]
name = "first"
provider = "faulty"
payload_template = { record = "DIR/calls.jsonl", host = "<<origin.payload.host>>" }

[[chains.steps]]
name = "flaky"
provider = "faulty"
payload_template = { record = "DIR/calls.jsonl", fail_times = 1, from = "<<steps.first.body.host>>" }
retry = { max_retries = 2, backoff_ms = 300, strategy = "fixed" }

[[chains.steps]]
name = "group"
[chains.steps.parallel]
GROUP
[[chains.steps]]
name = "after-group"
provider = "faulty"
payload_template = { record = "DIR/calls.jsonl", joined = "<<steps.group.body>>" }

[[chains.steps]]
name = "loop"
[chains.steps.split]
items = "<<origin.payload.items>>"
max_concurrency = 2
tolerated_failures = 1
[[chains.steps.split.steps]]
name = "check"
provider = "faulty"
when = 'item.keep'
payload_template = { record = "DIR/calls.jsonl", n = "<<item.n>>", fail = "<<item.fail ?? \"\">>", sleep_ms = 20 }
[[chains.steps.split.steps]]
name = "confirm"
provider = "faulty"
payload_template = { record = "DIR/calls.jsonl", checked = "<<steps.check.body.n>>" }

[[chains.steps]]
name = "after-split"
provider = "faulty"
payload_template = { record = "DIR/calls.jsonl", ok = "<<steps.loop.body.succeeded>>", failed = "<<steps.loop.body.failed>>" }

[[chains.steps]]
name = "escalate"
sub_chain = "matrix-child"
input = { ok = "<<steps.after-split.body.ok>>" }

[[chains.steps]]
name = "after-child"
provider = "faulty"
payload_template = { record = "DIR/calls.jsonl", child = "<<steps.escalate.body>>" }

[[chains]]
name = "matrix-child"
[[chains.steps]]
name = "c-one"
provider = "faulty"
payload_template = { record = "DIR/calls.jsonl", ok = "<<origin.payload.ok>>", sleep_ms = 30 }
[[chains.steps]]
name = "c-two"
provider = "faulty"
payload_template = { record = "DIR/calls.jsonl", after = "<<steps.c-one.body.ok>>" }
`

const matrixPayload = `{"host": "db-1", "items": [
  {"n": 0, "keep": true}, {"n": 1, "keep": true}, {"n": 2, "keep": false}, {"n": 3, "keep": true, "fail": "disk full"},
  {"n": 4, "keep": true}, {"n": 5, "keep": true}, {"n": 6, "keep": true}, {"n": 7, "keep": true}]}`

// matrixConfig writes the chain for a scenario. The group's sub-steps end
// in two waves of three at once: answers that arrive while an earlier one is
// being committed are what once made the step after the group go out twice.
func matrixConfig(dir string) string {
	var g strings.Builder
	for i := range 6 {
		fmt.Fprintf(&g, "[[chains.steps.parallel.steps]]\nname = \"g%d\"\nprovider = \"faulty\"\npayload_template = { record = \"DIR/calls.jsonl\", n = %d, sleep_ms = %d }\n", i, i, 20+(i/3)*80)
	}
	config := strings.Replace(matrixChain, "GROUP", g.String(), 1)
	return strings.NewReplacer("DIR", dir, "LEASE_TTL", strconv.Itoa(matrixLeaseTTL)).Replace(config)
}

// matrixLeaseTTL is the runs' lease TTL in seconds. On Redis a resume waits
// for the killed gateway's lease to lapse, so it is short; but a gateway
// that cannot renew within it on a loaded machine loses its own run.
const matrixLeaseTTL = 3

// matrixPoints are where the gateway dies, by the letters of the crash
// points the engine must survive. The engine commits a group's join
// together with the next step's intent, so "after the join, before the next
// intent" is the moment before that one commit lands (d), and "after the
// intent, before its call" the moment after (e).
var matrixPoints = []struct{ name, at string }{
	{"a-before-first-dispatch", "create"},
	{"a-first-intent", "after first running"},
	{"c-mid-retry-backoff", "after flaky pending"},
	{"b-mid-group", "after group/g1 succeeded"},
	{"d-group-joined", "before group succeeded"},
	{"e-next-intent", "after after-group running"},
	{"f-mid-split", "after loop[4] succeeded"},
	{"f-split-joined", "before loop succeeded"},
	{"f-next-intent", "after after-split running"},
	{"g-sub-chain-intent", "after escalate running"},
	{"g-mid-sub-chain", "after c-one succeeded"},
	{"g-sub-chain-ended", "after c-two succeeded"},
	{"g-next-intent", "after after-child running"},
}

// How a run is taken up again after the kill.
const (
	viaResume    = "resume"     // gateway resume
	viaRunResume = "run-resume" // gateway run --resume
	viaServe     = "serve"      // gateway serve: at start on bolt; by takeover once the lease lapses on Redis
)

func TestCrashMatrix(t *testing.T) {
	t.Parallel()
	for _, p := range matrixPoints {
		if _, err := crashpoint.Parse(p.at); err != nil {
			t.Fatal(err)
		}
	}
	want := matrixReference(t)
	stores := []struct {
		name string
		via  []string
	}{
		{"bolt", []string{viaResume, viaRunResume, viaServe}},
		{"redis", []string{viaResume, viaServe}},
	}
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			for _, via := range st.via {
				for _, p := range matrixPoints {
					t.Run(via+"/"+p.name, func(t *testing.T) {
						t.Parallel()
						m := newMatrixEnv(t, st.name)
						m.crashAndResume(p.at, via, want)
					})
				}
			}
		})
	}
}

type matrixEnv struct {
	t      *testing.T
	dir    string
	config string
	state  string
	redis  bool
}

func newMatrixEnv(t *testing.T, kind string) *matrixEnv {
	t.Helper()
	dir := t.TempDir()
	m := &matrixEnv{t: t, dir: dir, config: filepath.Join(dir, "c.toml"), state: filepath.Join(dir, "gw.db")}
	if kind == "redis" {
		m.state, m.redis = redistest.Open(t), true
	}
	writeFile(t, m.config, matrixConfig(dir))
	writeFile(t, filepath.Join(dir, "payload.json"), matrixPayload)
	return m
}

// command builds a gateway command working in the scenario's directory,
// which its plugin processes inherit: that is how they are found once the
// gateway is gone.
func (m *matrixEnv) command(extraEnv []string, args ...string) (*exec.Cmd, *bytes.Buffer) {
	exe, err := os.Executable()
	if err != nil {
		m.t.Fatal(err)
	}
	cmd := exec.Command(exe, append(args, "--config", m.config, "--state", m.state)...)
	cmd.Dir = m.dir
	cmd.Env = append(append(os.Environ(), mainEnv+"=1"), extraEnv...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	return cmd, &out
}

// runToEnd runs a command to completion and returns how it ended.
func (m *matrixEnv) runToEnd(cmd *exec.Cmd, out *bytes.Buffer) error {
	m.t.Helper()
	if err := cmd.Start(); err != nil {
		m.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		m.waitPluginsGone()
		return err
	case <-time.After(90 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		m.t.Fatalf("%s did not finish:\n%s", strings.Join(cmd.Args[1:], " "), out)
		return nil
	}
}

// crashAndResume runs the matrix chain until the gateway dies at the
// point, takes the run up again via the given way, and checks the run.
func (m *matrixEnv) crashAndResume(at, via string, want *matrixOutcome) {
	t := m.t
	cmd, out := m.command([]string{crashpoint.Env + "=" + at}, "run", "matrix", "--payload", "@"+filepath.Join(m.dir, "payload.json"))
	err := m.runToEnd(cmd, out)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the gateway was to die at %q but ended with %v:\n%s", at, err, out)
	}
	before := callsByAttempt(t, filepath.Join(m.dir, "calls.jsonl"))
	runID, recorded := m.recorded()
	for call, n := range before {
		if n > 1 {
			t.Errorf("%s was made %d times before the kill, with no crash between", call, n)
		}
	}

	switch via {
	case viaResume, viaRunResume:
		if m.redis {
			// The dead gateway's lease must lapse before another may
			// take its runs.
			time.Sleep(matrixLeaseTTL*time.Second + 200*time.Millisecond)
		}
		args := []string{"resume"}
		if via == viaRunResume {
			args = []string{"run", "--resume"}
		}
		cmd, out := m.command(nil, args...)
		if err := m.runToEnd(cmd, out); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	case viaServe:
		m.serveUntilDone(runID)
	}

	after := callsByAttempt(t, filepath.Join(m.dir, "calls.jsonl"))
	got := m.outcome(runID)
	for call, n := range after {
		again := n - before[call]
		switch {
		case again > 0 && recorded[call.key]:
			t.Errorf("%s had its outcome recorded before the kill but was called again after the resume", call)
		case again > 1:
			t.Errorf("%s was called %d times after the resume, want at most once", call, again)
		}
	}
	got.check(t, want)
}

// serveUntilDone starts "gateway serve" on the store, waits until the run
// has ended, and stops the gateway with SIGTERM.
func (m *matrixEnv) serveUntilDone(runID string) {
	t := m.t
	cmd, out := m.command(nil, "serve", "--listen", "127.0.0.1:0", "--log-level", "info")
	cmd.Stdout = nil
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	line := bytes.TrimSpace(firstLine(stdout))
	url, ok := strings.CutPrefix(string(line), "gateway: serving on ")
	if !ok {
		t.Fatalf("gateway serve said %q:\n%s", line, out)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		var run struct {
			Status store.RunStatus `json:"status"`
		}
		resp, err := http.Get(url + "/v1/runs/" + runID)
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&run)
			resp.Body.Close()
		}
		if err == nil && run.Status.Final() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the run did not end under gateway serve (last: %q %v):\n%s", run.Status, err, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Fatalf("gateway serve after SIGTERM: %v\n%s", err, out)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("gateway serve did not stop after SIGTERM:\n%s", out)
	}
	m.waitPluginsGone()
}

// firstLine reads the first line a gateway prints on stdout, then drains the
// rest in the background.
func firstLine(r io.Reader) []byte {
	br := bufio.NewReader(r)
	line, _ := br.ReadBytes('\n')
	go func() { _, _ = io.Copy(io.Discard, br) }()
	return line
}

// waitPluginsGone waits until no process works in the scenario's
// directory: plugin processes of a killed gateway die on their own, and a
// call must not land in the record file after it is read.
func (m *matrixEnv) waitPluginsGone() {
	m.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids := processesIn(m.dir)
		if len(pids) == 0 {
			return
		}
		if time.Now().After(deadline) {
			m.t.Fatalf("processes %v still run in %s after their gateway ended", pids, m.dir)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// processesIn lists the live processes whose working directory is dir.
func processesIn(dir string) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid)); err == nil && cwd == dir && proctest.Seen(pid)[0].Alive() {
			out = append(out, pid)
		}
	}
	return out
}

func (m *matrixEnv) openStore() store.Store {
	m.t.Helper()
	st, _, err := gateway.OpenStore(context.Background(), m.state, slog.New(slog.DiscardHandler))
	if err != nil {
		m.t.Fatal(err)
	}
	return st
}

// recorded reads the store the killed gateway left: the run's id, and the
// dedup keys of the steps, in the run and in its sub-chain's, that have an
// outcome. A finished split item's slot stands for every step in it.
func (m *matrixEnv) recorded() (string, map[string]bool) {
	t := m.t
	st := m.openStore()
	defer st.Close()
	ctx := context.Background()
	page, err := st.ListRuns(ctx, store.RunFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var runID string
	final := map[string]bool{}
	for _, run := range page.Runs {
		if run.ParentRun == "" {
			runID = run.ID
		}
		err := st.ForEachStep(ctx, run.ID, store.StepScan{}, func(rec *store.StepRecord) error {
			if rec.Status.Final() {
				final[run.ID+"/"+rec.Key] = true
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if runID == "" {
		t.Fatalf("the killed gateway left no run: %+v", page.Runs)
	}
	recorded := map[string]bool{}
	for _, calls := range readRecords(t, filepath.Join(m.dir, "calls.jsonl")) {
		for _, c := range calls {
			if final[c.DedupKey] || inFinishedItem(final, c.DedupKey) {
				recorded[c.DedupKey] = true
			}
		}
	}
	return runID, recorded
}

// inFinishedItem reports whether a dedup key lies inside a split item
// whose slot has an outcome.
func inFinishedItem(final map[string]bool, dedupKey string) bool {
	for i := range len(dedupKey) - 1 {
		if dedupKey[i] == ']' && dedupKey[i+1] == '/' && final[dedupKey[:i+1]] {
			return true
		}
	}
	return false
}

// call is one provider call: a dedup key and an attempt.
type call struct {
	key     string
	attempt int
}

func (c call) String() string { return fmt.Sprintf("call %s attempt %d", c.key, c.attempt) }

func callsByAttempt(t *testing.T, path string) map[call]int {
	t.Helper()
	out := map[call]int{}
	for key, calls := range readRecords(t, path) {
		for _, c := range calls {
			out[call{key, c.Attempt}]++
		}
	}
	return out
}

// matrixOutcome is how a run of the matrix chain ended, with what differs
// between two runs of it (ids, directories) taken out.
type matrixOutcome struct {
	Status store.RunStatus
	Path   []string
	Body   string
	Steps  map[string]string // key → "status attempts body", the run's and the sub-chain's
	Calls  []string          // every call made, once each
}

func (m *matrixEnv) outcome(runID string) *matrixOutcome {
	t := m.t
	st := m.openStore()
	defer st.Close()
	ctx := context.Background()
	run, err := st.Run(ctx, runID)
	if err != nil {
		t.Fatal(err)
	}
	o := &matrixOutcome{Status: run.Status, Path: run.Path, Body: string(run.Body), Steps: map[string]string{}}
	ids := map[string]string{runID: "RUN"}
	evs, err := st.Events(ctx, runID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	checkNoDuplicateEvents(t, evs)
	for _, id := range []string{runID, ""} {
		if id == "" {
			rec, err := st.Steps(ctx, runID, "escalate")
			if err != nil || len(rec) != 1 || rec[0].Child == "" {
				t.Fatalf("the sub-chain step's record: %v %v", rec, err)
			}
			id = rec[0].Child
			ids[id] = "CHILD"
			child, err := st.Run(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			o.Steps["CHILD"] = string(child.Status) + " " + string(child.Body)
			evs, err := st.Events(ctx, id, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			checkNoDuplicateEvents(t, evs)
		}
		err := st.ForEachStep(ctx, id, store.StepScan{SkipItems: true}, func(rec *store.StepRecord) error {
			o.Steps[ids[id]+"/"+rec.Key] = fmt.Sprintf("%s %d %s", rec.Status, rec.Attempts, rec.Body)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for c := range callsByAttempt(t, filepath.Join(m.dir, "calls.jsonl")) {
		id, rest, _ := strings.Cut(c.key, "/")
		o.Calls = append(o.Calls, fmt.Sprintf("%s/%s#%d", ids[id], rest, c.attempt))
	}
	slices.Sort(o.Calls)
	o.Body = strings.ReplaceAll(o.Body, m.dir, "DIR")
	for k, v := range o.Steps {
		o.Steps[k] = strings.ReplaceAll(v, m.dir, "DIR")
	}
	return o
}

func (o *matrixOutcome) check(t *testing.T, want *matrixOutcome) {
	t.Helper()
	if o.Status != want.Status || !slices.Equal(o.Path, want.Path) || o.Body != want.Body {
		t.Errorf("the run ended %s on path %v with body %s; uninterrupted, it ends %s on %v with %s", o.Status, o.Path, o.Body, want.Status, want.Path, want.Body)
	}
	for k, w := range want.Steps {
		if g, ok := o.Steps[k]; !ok || g != w {
			t.Errorf("step %s ended %q; uninterrupted, %q", k, g, w)
		}
	}
	for k := range o.Steps {
		if _, ok := want.Steps[k]; !ok {
			t.Errorf("step %s has a record an uninterrupted run does not have: %s", k, o.Steps[k])
		}
	}
	if !slices.Equal(o.Calls, want.Calls) {
		t.Errorf("the calls made differ from an uninterrupted run's:\n got %v\nwant %v", o.Calls, want.Calls)
	}
}

// matrixReference runs the matrix chain once without a crash.
func matrixReference(t *testing.T) *matrixOutcome {
	t.Helper()
	m := newMatrixEnv(t, "bolt")
	cmd, out := m.command(nil, "run", "matrix", "--payload", "@"+filepath.Join(m.dir, "payload.json"))
	if err := m.runToEnd(cmd, out); err != nil {
		t.Fatalf("uninterrupted run: %v\n%s", err, out)
	}
	for call, n := range callsByAttempt(t, filepath.Join(m.dir, "calls.jsonl")) {
		if n != 1 {
			t.Errorf("%s was made %d times in a run without a crash", call, n)
		}
	}
	runID, _ := m.recorded()
	want := m.outcome(runID)
	if want.Status != store.RunSucceeded {
		t.Fatalf("the uninterrupted run ended %s:\n%s", want.Status, out)
	}
	return want
}

// TestResumeNamesRunsLeasedElsewhere resumes on Redis before a dead
// gateway's lease has lapsed: the run is left to its lease, and the command
// says so rather than report nothing to do.
func TestResumeNamesRunsLeasedElsewhere(t *testing.T) {
	t.Parallel()
	m := newMatrixEnv(t, "redis")
	// A lease that outlasts the test, however slow the machine.
	writeFile(t, m.config, strings.Replace(matrixConfig(m.dir), fmt.Sprintf("lease_ttl_seconds = %d", matrixLeaseTTL), "lease_ttl_seconds = 60", 1))
	cmd, out := m.command([]string{crashpoint.Env + "=after first running"}, "run", "matrix", "--payload", "@"+filepath.Join(m.dir, "payload.json"))
	if err := m.runToEnd(cmd, out); err == nil {
		t.Fatalf("the gateway was to die:\n%s", out)
	}
	runID, _ := m.recorded()
	cmd, out = m.command(nil, "resume")
	if err := m.runToEnd(cmd, out); err != nil {
		t.Fatalf("resume: %v\n%s", err, out)
	}
	if !strings.Contains(out.String(), "resuming 0 runs") || !strings.Contains(out.String(), "leased by another gateway: "+runID+".") {
		t.Errorf("resume before the lease lapsed said:\n%s", out)
	}
	if n := len(callsByAttempt(t, filepath.Join(m.dir, "calls.jsonl"))); n != 0 {
		t.Errorf("%d calls went out under another gateway's lease", n)
	}
}
