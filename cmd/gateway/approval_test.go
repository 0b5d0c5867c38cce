package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chaingate/gateway/internal/testutil/redistest"
)

func approvalConfig(dir string) string {
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
timeout_seconds = 600
approval = { message = "Restart <<origin.payload.host>>?" }
[[chains.steps]]
name = "restart"
provider = "faulty"
payload_template = { record = %q, host = "<<origin.payload.host>>", approved_by = "<<steps.ask.body.by>>" }
`, clusterLeaseTTL, filepath.Join(dir, "calls.jsonl"))
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
	writeFile(t, cfg, approvalConfig(dir))
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
	writeFile(t, cfg, approvalConfig(dir))
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
