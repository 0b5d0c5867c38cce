package gateway_test

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/internal/testutil/sshdtest"
)

// TestDiskRunbookOverSSH runs configs/runbook's chain as shipped, with its
// provider pointed at a real sshd: the usage is collected, the old logs
// are deleted on an approve, the disk verified. Alerts whose labels carry
// shell code run none, here or on the host, and a host outside
// allowed_hosts is never dialled.
func TestDiskRunbookOverSSH(t *testing.T) {
	srv := sshdtest.Start(t)
	_, port, _ := net.SplitHostPort(srv.Addr)
	logs := t.TempDir()
	old := time.Now().Add(-10 * 24 * time.Hour)
	for name, mtime := range map[string]time.Time{"a.1.gz": old, "b.2.gz": old, "fresh.gz": time.Now(), "old.log": old} {
		path := filepath.Join(logs, name)
		if err := os.WriteFile(path, []byte(strings.Repeat("x", 4096)), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("CHAINGATE_SECRET_RUNBOOK_SSH_KEY", srv.ClientKey)
	chain, err := os.ReadFile("../configs/runbook/disk-full.toml")
	if err != nil {
		t.Fatal(err)
	}
	env := newAPIOn(t, fmt.Sprintf(`
[[providers]]
name = "fleet"
type = "ssh"
[providers.config]
user = %q
port = %s
private_key = "<<secrets.RUNBOOK_SSH_KEY>>"
known_hosts = %q
allowed_hosts = ["127.0.0.1"]
`, srv.User, port, srv.KnownHostsFile)+string(chain), "")

	t.Run("approved", func(t *testing.T) {
		var run gateway.StartResponse
		payload := fmt.Sprintf(`{"host": "127.0.0.1", "mount": %q, "log_dir": %q, "threshold_pct": 101}`, logs, logs)
		if code, _, body := env.call("POST", "/v1/chains/disk-full/runs", payload, nil, &run); code != http.StatusAccepted && code != http.StatusOK {
			t.Fatalf("start: %d %s", code, body)
		}
		waitStatus(t, env, run.ID, "waiting")
		var v gateway.RunView
		env.call("GET", "/v1/runs/"+run.ID, "", nil, &v)
		if got := string(v.Steps["collect"].Body); !strings.Contains(got, `"old_logs":2`) || !strings.Contains(got, `"host":"127.0.0.1`) {
			t.Fatalf("collect: %s", got)
		}
		if code, _, body := env.call("POST", "/v1/runs/"+run.ID+"/signals/approve-clean", `{"decision": "approve"}`, nil, nil); code != http.StatusAccepted {
			t.Fatalf("approve: %d %s", code, body)
		}
		end := waitRunEnd(t, env, run.ID)
		if end.Status != "succeeded" {
			t.Fatalf("run %s: %+v", end.Status, end.Error)
		}
		if got := string(end.Steps["clean"].Body); !strings.Contains(got, `"deleted":2`) {
			t.Errorf("clean: %s", got)
		}
		left, _ := filepath.Glob(filepath.Join(logs, "*"))
		for i := range left {
			left[i] = filepath.Base(left[i])
		}
		if strings.Join(left, " ") != "fresh.gz old.log" {
			t.Errorf("left in the log directory: %v", left)
		}
	})

	t.Run("hostile labels", func(t *testing.T) {
		pwned := filepath.Join(t.TempDir(), "pwned")
		alert := func(fp, instance, mount, logDir string) string {
			return fmt.Sprintf(`{"fingerprint": %q, "status": "firing", "startsAt": "2026-11-27T03:00:00Z", "labels": {"alertname": "DiskAlmostFull", "instance": %q, "mountpoint": %q}, "annotations": {"log_dir": %q}}`, fp, instance, mount, logDir)
		}
		body := `{"version": "4", "status": "firing", "groupKey": "g", "alerts": [` + strings.Join([]string{
			alert("f1", "127.0.0.1", logs+`"; touch `+pwned+` #`, "$(touch "+pwned+")"),
			alert("f2", "127.0.0.1", "`touch "+pwned+"`", logs+"\ntouch "+pwned),
			alert("f3", "127.0.0.1", logs, "$(touch "+pwned+")"),
			alert("f4", "127.0.0.1; touch "+pwned, logs, logs),
			alert("f5", "10.1.2.3", logs, logs),
		}, ",") + `]}`
		var resp gateway.TriggerResponse
		if code, _, raw := env.call("POST", "/v1/triggers/disk-full", body, nil, &resp); code != http.StatusAccepted && code != http.StatusOK {
			t.Fatalf("trigger: %d %s", code, raw)
		}
		if len(resp.Results) != 5 {
			t.Fatalf("results: %+v", resp.Results)
		}
		for i, res := range resp.Results {
			if res.Action != "started" {
				t.Fatalf("alert %d: %+v", i, res)
			}
			end := waitRunEnd(t, env, res.Run)
			if end.Status != "failed" || end.Steps["collect"] == nil || end.Steps["collect"].Error == nil {
				t.Fatalf("alert %d: run %s, collect %+v", i, end.Status, end.Steps["collect"])
			}
			// The first three ran on the host, which got the hostile text
			// as the path it names, and said there is no such file.
			if msg := end.Steps["collect"].Error.Message; i < 3 && (!strings.Contains(msg, "exit_1") || !strings.Contains(msg, "No such file or directory") || !strings.Contains(msg, pwned)) {
				t.Errorf("alert %d: %s", i, msg)
			}
		}
		for i, want := range map[int]string{3: "is not a host name", 4: "matches no allowed_hosts pattern"} {
			if msg := waitRunEnd(t, env, resp.Results[i].Run).Steps["collect"].Error.Message; !strings.Contains(msg, want) {
				t.Errorf("alert %d: %s", i, msg)
			}
		}
		if _, err := os.Stat(pwned); err == nil {
			t.Fatal("a label's shell code ran")
		}
	})
}

// waitStatus waits, up to 30 s, for a run to reach a status.
func waitStatus(t *testing.T, env *apiEnv, id, status string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var v gateway.RunView
		if code, _, _ := env.call("GET", "/v1/runs/"+id, "", nil, &v); code == http.StatusOK && string(v.Status) == status {
			return
		}
	}
	t.Fatalf("run %s did not become %s within 30 s", id, status)
}
