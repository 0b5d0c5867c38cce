package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// gateway pause and unpause on a store: the pause is listed with who and
// why, and lifted.
func TestPauseCommand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gw.toml")
	writeFile(t, cfg, `
[[schedules]]
name = "nightly"
chain = "c"
cron = "0 3 * * *"

[[providers]]
name = "echo"
type = "echo"

[[chains]]
name = "c"
[[chains.steps]]
name = "s"
provider = "echo"
`)
	state := filepath.Join(dir, "s.db")
	at := []string{"--state", state, "--config", cfg}
	if code, out, errOut := runCLI(t, "run", "c", "--config", cfg, "--state", state); code != exitOK {
		t.Fatalf("run: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := runCLI(t, append([]string{"pause", "schedule", "nightly", "--reason", "maintenance window"}, at...)...); code != exitOK || !strings.Contains(out, "schedule nightly paused by") {
		t.Fatalf("pause: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, _ := runCLI(t, append([]string{"pause", "--list"}, at...)...); code != exitOK || !strings.Contains(out, "maintenance window") || !strings.Contains(out, "nightly") {
		t.Fatalf("list: exit %d\n%s", code, out)
	}
	if code, out, errOut := runCLI(t, append([]string{"unpause", "schedule", "nightly"}, at...)...); code != exitOK || !strings.Contains(out, "unpaused schedule nightly") {
		t.Fatalf("unpause: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, _ := runCLI(t, append([]string{"unpause", "schedule", "nightly"}, at...)...); code != exitOK || !strings.Contains(out, "was not paused") {
		t.Errorf("unpause again: exit %d\n%s", code, out)
	}
	if code, _, errOut := runCLI(t, append([]string{"pause", "trigger", "nope"}, at...)...); code == exitOK || !strings.Contains(errOut, `no trigger "nope"`) {
		t.Errorf("an unknown trigger: exit %d %s", code, errOut)
	}
	if code, _, _ := runCLI(t, "pause", "runs", "x"); code != exitUsage {
		t.Errorf("pause of something else: exit %d", code)
	}
}
