package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chaingate/gateway/internal/testutil/redistest"
)

// exportConfig fails its run: the check succeeds on its third attempt and
// branches on it to "page", whose provider fails for good.
const exportConfig = `
[[providers]]
name = "flaky"
type = "faulty"

[[providers]]
name = "log"
type = "echo"

[[chains]]
name = "restart"

[[chains.steps]]
name = "check"
provider = "flaky"
action_type = "check"
payload_template = { fail_times = 2 }
retry = { max_retries = 3, backoff_ms = 10 }
branches = [{ when = 'result.body.attempt == 3', target = "page" }]
default_next = "fix"

[[chains.steps]]
name = "fix"
provider = "log"
action_type = "fix"
payload_template = { host = "<<origin.payload.host>>" }
default_next = "end"

[[chains.steps]]
name = "page"
provider = "flaky"
action_type = "page"
payload_template = { fail = "pager down" }
on_failure = "dlq"
`

// A failed run exported as a test case passes against the config it ran;
// against a fixed config it fails where the fix changed the path, and
// passes once the expectation says the new path. On a store, and through
// a serving gateway's API alike (the export reads the run through the same
// operations).
func TestRunsExportAsTest(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "restart.toml")
	if err := os.WriteFile(cfg, []byte(exportConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(t.TempDir(), "s.db")
	code, out, errOut := runCLI(t, "run", "restart", "--config", cfg, "--state", state, "--payload", `{"host": "db-1"}`)
	if code != exitFailed {
		t.Fatalf("run: exit %d\n%s%s", code, out, errOut)
	}
	var run struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &run); err != nil || run.ID == "" {
		t.Fatalf("run output: %v\n%s", err, out)
	}
	test := filepath.Join(dir, "restart_test.toml")
	if code, out, errOut := runCLI(t, "runs", "export", run.ID, "--as-test", "--state", state, "--config", cfg, "--out", test); code != exitOK {
		t.Fatalf("export: exit %d\n%s%s", code, out, errOut)
	}
	exported, _ := os.ReadFile(test)
	for _, want := range []string{
		`{ error = "attempt 1 failed (its error is not recorded)", retryable = true }`,
		"error = \"pager down\"\nretryable = false\ncode = \"faulty\"",
		`path = ["check", "page"]`,
		`steps.check = { status = "succeeded", attempts = 3 }`,
		"[[tests.expect.dead_letters]]\nstep = \"page\"",
	} {
		if !strings.Contains(string(exported), want) {
			t.Errorf("the exported case lacks %q:\n%s", want, exported)
		}
	}
	if code, out, errOut := runCLI(t, "test", dir); code != exitOK {
		t.Fatalf("the exported case against the config it ran: exit %d\n%s%s", code, out, errOut)
	}

	// The fix: a third attempt is no reason to page.
	fixed := strings.Replace(exportConfig, "target = \"page\"", "target = \"fix\"", 1)
	if err := os.WriteFile(cfg, []byte(fixed), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, _ = runCLI(t, "test", dir)
	if code != exitFailed || !strings.Contains(out, "restart_test.toml:") || !strings.Contains(out, "run path: expected check → page, got check → fix") {
		t.Fatalf("against the fixed config: exit %d\n%s", code, out)
	}
	// The expectations updated to the fixed path, and fix, which the run
	// never called, given an answer.
	b, _ := os.ReadFile(test)
	updated := string(b)
	updated = updated[:strings.Index(updated, "[tests.expect]")] + "[tests.mocks.fix]\nbody = {}\n\n[tests.expect]\nstatus = \"succeeded\"\npath = [\"check\", \"fix\"]\nsteps.fix.request = { host = \"db-1\" }\n"
	if err := os.WriteFile(test, []byte(updated), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := runCLI(t, "test", dir); code != exitOK {
		t.Fatalf("with the expectations updated: exit %d\n%s%s", code, out, errOut)
	}
}

// The same, from a run on Redis, read through a serving gateway's API.
func TestRunsExportAsTestThroughTheAPI(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "restart.toml")
	if err := os.WriteFile(cfg, []byte(exportConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	gw := startServe(t, cfg, redistest.Open(t))
	id, err := postRun(gw.url, "restart", `{"host": "db-1"}`)
	if err != nil {
		t.Fatal(err)
	}
	waitRunStatus(t, gw.url, id, "failed")
	test := filepath.Join(dir, "restart_test.toml")
	if code, out, errOut := runCLI(t, "runs", "export", id, "--as-test", "--server", gw.url, "--out", test); code != exitOK {
		t.Fatalf("export: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := runCLI(t, "test", dir); code != exitOK {
		t.Fatalf("the exported case: exit %d\n%s%s", code, out, errOut)
	}
}
