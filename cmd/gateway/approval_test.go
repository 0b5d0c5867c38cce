package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chaingate/gateway/internal/testutil/redistest"
)

// approvalConfig is a chain that asks before it calls; no answer within
// timeout seconds rejects.
func approvalConfig(dir string, leaseTTL, timeout int) string {
	return fmt.Sprintf(`
[gateway]
lease_ttl_seconds = %d
shutdown_grace_seconds = 2

[[providers]]
name = "faulty"
type = "faulty"

[[chains]]
name = "restart-db"
[[chains.steps]]
name = "ask"
timeout_seconds = %d
approval = { message = "Restart <<origin.payload.host>>?", on_timeout = "reject" }
[[chains.steps]]
name = "restart"
provider = "faulty"
payload_template = { record = %q, host = "<<origin.payload.host>>", approved_by = "<<steps.ask.body.by>>" }
`, leaseTTL, timeout, filepath.Join(dir, "calls.jsonl"))
}

// stepDeadline reads the deadline of a run's waiting step through the API.
func stepDeadline(t *testing.T, url, id, step string) time.Time {
	t.Helper()
	resp, err := http.Get(url + "/v1/runs/" + id)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var run struct {
		Steps map[string]struct {
			Deadline time.Time `json:"deadline"`
		} `json:"steps"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&run); err != nil || run.Steps[step].Deadline.IsZero() {
		t.Fatalf("the deadline of step %s of run %s: %v", step, id, err)
	}
	return run.Steps[step].Deadline
}

// waitPast waits until the clock has passed t.
func waitPast(t time.Time) {
	for time.Sleep(time.Until(t)); !time.Now().After(t); time.Sleep(time.Millisecond) {
	}
}

// lateSays is how a refused late answer names the deadline it missed.
func lateSays(deadline time.Time) string {
	return "the step's deadline was " + deadline.UTC().Format("2006-01-02T15:04:05.000Z")
}

// waitStep polls a run's step through the API until it has status want.
func waitStep(t *testing.T, url, id, step, want string) {
	t.Helper()
	var last string
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		resp, err := http.Get(url + "/v1/runs/" + id)
		if err != nil {
			continue
		}
		var run struct {
			Steps map[string]struct {
				Status string `json:"status"`
			} `json:"steps"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&run)
		resp.Body.Close()
		if last = run.Steps[step].Status; last == want {
			return
		}
	}
	t.Fatalf("step %s of run %s is %q, want %s", step, id, last, want)
}

// TestApprovalSurvivesKill parks a run at its approval step, kills the
// gateway with SIGKILL, starts it again, and answers with the CLI: the run
// carries on; a second answer is refused naming the first.
func TestApprovalSurvivesKill(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gateway.toml")
	writeFile(t, cfg, approvalConfig(dir, clusterLeaseTTL, 600))
	state := filepath.Join(dir, "gw.db")
	gw := startServe(t, cfg, state)
	id, err := postRun(gw.url, "restart-db", `{"host": "db-1"}`)
	if err != nil {
		t.Fatal(err)
	}
	waitStep(t, gw.url, id, "ask", "running")
	_ = gw.cmd.Process.Signal(syscall.SIGKILL)
	_, _ = gw.cmd.Process.Wait()

	gw = startServe(t, cfg, state)
	code, out, errOut := runCLI(t, "runs", "approve", id, "ask", "--comment", "maintenance window", "--server", gw.url)
	if code != exitOK || !strings.Contains(out, "approved step ask of run "+id) {
		t.Fatalf("runs approve: %d\n%s%s", code, out, errOut)
	}
	waitRunStatus(t, gw.url, id, "succeeded")
	code, _, errOut = runCLI(t, "runs", "reject", id, "ask", "--server", gw.url)
	if code == exitOK || !strings.Contains(errOut, "already answered: approve by a loopback client (API)") {
		t.Errorf("a second answer: %d %s", code, errOut)
	}
	calls := readRecords(t, filepath.Join(dir, "calls.jsonl"))
	if len(calls) != 1 {
		t.Fatalf("the restart step ran %d times: %v", len(calls), calls)
	}
	code, evs, _ := runCLI(t, "runs", "events", id, "--server", gw.url)
	if code != exitOK || !strings.Contains(evs, "waiting for approval: Restart db-1?") || !strings.Contains(evs, "approved by a loopback client (API): maintenance window") {
		t.Errorf("the run's events:\n%s", evs)
	}
}

// TestApprovalAnsweredDuringTakeover kills the gateway holding a waiting
// run on a shared Redis and answers through the other one before it has
// taken the run over: the answer waits in the store, and the run goes on
// once the survivor adopts it.
func TestApprovalAnsweredDuringTakeover(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gateway.toml")
	writeFile(t, cfg, approvalConfig(dir, clusterLeaseTTL, 600))
	state := redistest.Open(t)
	owner := startServe(t, cfg, state)
	other := startServe(t, cfg, state)
	id, err := postRun(owner.url, "restart-db", `{"host": "db-2"}`)
	if err != nil {
		t.Fatal(err)
	}
	waitStep(t, owner.url, id, "ask", "running")
	_ = owner.cmd.Process.Signal(syscall.SIGKILL)
	_, _ = owner.cmd.Process.Wait()
	req, _ := http.NewRequest("POST", other.url+"/v1/runs/"+id+"/signals/ask", strings.NewReader(`{"decision": "approve", "comment": "go"}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("signal: %d", resp.StatusCode)
	}
	waitRunStatus(t, other.url, id, "succeeded")
	if calls := readRecords(t, filepath.Join(dir, "calls.jsonl")); len(calls) != 1 {
		t.Errorf("the restart step ran %d times: %v", len(calls), calls)
	}
}

// TestApprovalLateThroughAnotherGateway kills the gateway holding a waiting
// run on a shared Redis and, once the step's recorded deadline has passed
// and before the other gateway takes the run over (its lease outlives the
// deadline), approves through the other one: the answer is refused naming
// the deadline, and the run, taken over, goes on as on_timeout = "reject"
// says.
func TestApprovalLateThroughAnotherGateway(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gateway.toml")
	writeFile(t, cfg, approvalConfig(dir, 10, 2))
	state := redistest.Open(t)
	owner := startServe(t, cfg, state)
	other := startServe(t, cfg, state)
	id, err := postRun(owner.url, "restart-db", `{"host": "db-3"}`)
	if err != nil {
		t.Fatal(err)
	}
	waitStep(t, owner.url, id, "ask", "running")
	deadline := stepDeadline(t, owner.url, id, "ask")
	_ = owner.cmd.Process.Signal(syscall.SIGKILL)
	_, _ = owner.cmd.Process.Wait()
	waitPast(deadline)
	req, _ := http.NewRequest("POST", other.url+"/v1/runs/"+id+"/signals/ask", strings.NewReader(`{"decision": "approve", "comment": "go"}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict || !strings.Contains(string(body), `"code":"past_deadline"`) || !strings.Contains(string(body), lateSays(deadline)) {
		t.Fatalf("a late answer: %d %s", resp.StatusCode, body)
	}
	waitRunStatus(t, other.url, id, "failed")
	if calls := readRecords(t, filepath.Join(dir, "calls.jsonl")); len(calls) != 0 {
		t.Errorf("the restart step ran: %v", calls)
	}
	code, evs, _ := runCLI(t, "runs", "events", id, "--server", other.url)
	if code != exitOK || !strings.Contains(evs, "rejected: no answer within the step's timeout") {
		t.Errorf("the run's events:\n%s", evs)
	}
}

// TestApprovalOnStoreFile answers with `gateway runs approve --state` while
// no gateway runs on the file, before the step's recorded deadline and
// after it: the first stands, the second is refused naming the deadline,
// and the gateway started again carries the run on as each says.
func TestApprovalOnStoreFile(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout int
		late    bool
		status  string
		says    string
	}{
		{name: "in time", timeout: 600, status: "succeeded", says: "approved by "},
		{name: "late", timeout: 1, late: true, status: "failed", says: "rejected: no answer within the step's timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := filepath.Join(dir, "gateway.toml")
			writeFile(t, cfg, approvalConfig(dir, clusterLeaseTTL, tc.timeout))
			state := filepath.Join(dir, "gw.db")
			gw := startServe(t, cfg, state)
			id, err := postRun(gw.url, "restart-db", `{"host": "db-4"}`)
			if err != nil {
				t.Fatal(err)
			}
			waitStep(t, gw.url, id, "ask", "running")
			deadline := stepDeadline(t, gw.url, id, "ask")
			_ = gw.cmd.Process.Signal(syscall.SIGKILL)
			_, _ = gw.cmd.Process.Wait()
			if tc.late {
				waitPast(deadline)
			}
			code, out, errOut := runCLI(t, "runs", "approve", id, "ask", "--state", state)
			switch {
			case tc.late && (code == exitOK || !strings.Contains(errOut, "too late") || !strings.Contains(errOut, lateSays(deadline))):
				t.Errorf("a late answer on the file: %d\n%s%s", code, out, errOut)
			case !tc.late && (code != exitOK || !strings.Contains(out, "approved step ask of run "+id)):
				t.Errorf("an answer in time on the file: %d\n%s%s", code, out, errOut)
			}
			gw = startServe(t, cfg, state)
			waitRunStatus(t, gw.url, id, tc.status)
			code, evs, _ := runCLI(t, "runs", "events", id, "--server", gw.url)
			if code != exitOK || !strings.Contains(evs, tc.says) {
				t.Errorf("the run's events:\n%s", evs)
			}
		})
	}
}
