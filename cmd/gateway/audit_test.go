package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestAuditCommands reads a served gateway's audit log through its API and
// straight from its store once it has stopped: a refused cancel and an
// allowed one, listed newest first as a table and as JSON, and exported
// oldest first as JSON lines; a bad filter is refused as the API would.
func TestAuditCommands(t *testing.T) {
	t.Setenv("CHAINGATE_TOKEN", "")
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gateway.toml")
	state := filepath.Join(dir, "gw.db")
	writeFile(t, cfg, strings.ReplaceAll(serveConfig, "[gateway]", `[gateway]
auth = { tokens = [{ name = "root", token = "root-tok" }, { name = "viewer", token = "view-tok", roles = ["reader"] }] }`))
	gw := startServe(t, cfg, state)
	if code, out, errOut := runCLI(t, "runs", "cancel", "01jx", "--server", gw.url, "--token", "view-tok"); code != exitFailed || !strings.Contains(errOut, "grants cancel") {
		t.Fatalf("a cancel as the viewer: %d\n%s%s", code, out, errOut)
	}
	runCLI(t, "runs", "cancel", "01jy", "--server", gw.url, "--token", "root-tok")

	code, out, errOut := runCLI(t, "audit", "list", "--server", gw.url, "--token", "root-tok")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != exitOK || len(lines) != 3 || !strings.Contains(lines[1], "root") || !strings.Contains(lines[1], "failed 404") ||
		!strings.Contains(lines[2], "viewer") || !strings.Contains(lines[2], "denied 403") || !strings.Contains(lines[2], "run 01jx") {
		t.Errorf("audit list: %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := runCLI(t, "audit", "list", "--server", gw.url, "--token", "view-tok"); code != exitFailed || !strings.Contains(errOut, "grants admin") {
		t.Errorf("audit list as the viewer: %d\n%s%s", code, out, errOut)
	}
	code, out, _ = runCLI(t, "audit", "list", "--server", gw.url, "--token", "root-tok", "--outcome", "denied", "--output", "json")
	var page struct {
		Entries []struct {
			Subject, Outcome, EntryPoint string
			Route                        string `json:"route"`
		} `json:"entries"`
	}
	if err := json.Unmarshal([]byte(out), &page); code != exitOK || err != nil || len(page.Entries) < 2 || page.Entries[len(page.Entries)-1].Subject != "viewer" {
		t.Errorf("audit list --outcome denied --output json: %d %v\n%s", code, err, out)
	}
	// Stopped, so that its store can be read straight.
	_ = gw.cmd.Process.Signal(syscall.SIGTERM)
	_, _ = gw.cmd.Process.Wait()

	code, out, errOut = runCLI(t, "audit", "export", "--state", state, "--subject", "viewer")
	exported := strings.Split(strings.TrimSpace(out), "\n")
	if code != exitOK || len(exported) < 2 {
		t.Fatalf("audit export: %d\n%s%s", code, out, errOut)
	}
	var first map[string]any
	if err := json.Unmarshal([]byte(exported[0]), &first); err != nil || first["action"] != "cancel" || first["outcome"] != "denied" || first["route"] != "POST /v1/runs/{id}/cancel" || first["address"] != "127.0.0.1" {
		t.Errorf("the first exported line: %v %s", err, exported[0])
	}
	// Straight on the store, the command line records what it does as
	// this machine's user.
	runCLI(t, "runs", "delete", "01jz", "--state", state)
	code, out, errOut = runCLI(t, "audit", "list", "--state", state, "--entry-point", "cli", "--output", "json")
	var cli struct {
		Entries []map[string]any `json:"entries"`
	}
	if err := json.Unmarshal([]byte(out), &cli); code != exitOK || err != nil || len(cli.Entries) != 1 || cli.Entries[0]["subject_kind"] != "cli" ||
		cli.Entries[0]["action"] != "delete" || cli.Entries[0]["run"] != "01jz" || cli.Entries[0]["outcome"] != "failed" {
		t.Errorf("the command line's delete on the store: %d %v\n%s%s", code, err, out, errOut)
	}
	if code, _, errOut := runCLI(t, "audit", "list", "--state", state, "--outcome", "maybe"); code != exitUsage || !strings.Contains(errOut, `outcome "maybe"`) {
		t.Errorf("a bad outcome: %d %s", code, errOut)
	}
}
