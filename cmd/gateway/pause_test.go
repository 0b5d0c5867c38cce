package main

import (
	"net/http"
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

// TestReplayOfAPausedTriggersAlerts: the alerts a paused trigger kept are
// replayed with gateway dlq replay once it is unpaused: the alert its when
// selects starts its run, the other is skipped, the command exits 0 and
// the entry is gone; an entry whose alerts are all left out by when goes
// too, starting nothing.
func TestReplayOfAPausedTriggersAlerts(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gw.toml")
	writeFile(t, cfg, `
[[providers]]
name = "echo"
type = "echo"

[[triggers]]
name = "am"
type = "alertmanager"
chain = "c"
when = 'alert.labels.alertname == "DiskAlmostFull"'

[[chains]]
name = "c"
[[chains.steps]]
name = "s"
provider = "echo"
`)
	gw := startServe(t, cfg, filepath.Join(dir, "gw.db"))
	server := []string{"--server", gw.url}
	if code, out, errOut := runCLI(t, append([]string{"pause", "trigger", "am"}, server...)...); code != exitOK {
		t.Fatalf("pause: exit %d\n%s%s", code, out, errOut)
	}
	alert := func(name, fp string) string {
		return `{"status":"firing","labels":{"alertname":"` + name + `"},"startsAt":"2026-11-25T03:12:00Z","fingerprint":"` + fp + `"}`
	}
	var entries []string
	for _, alerts := range []string{alert("DiskAlmostFull", "d1") + "," + alert("HighLoad", "h1"), alert("HighLoad", "h2")} {
		code, res, err := postAlerts(gw.url, `{"version":"4","status":"firing","alerts":[`+alerts+`]}`)
		if err != nil || code != http.StatusAccepted || res.Results[0].Action != "parked" {
			t.Fatalf("while paused: %d %v %+v", code, err, res)
		}
		entries = append(entries, res.Results[0].DeadLetter)
	}
	if code, out, errOut := runCLI(t, append([]string{"unpause", "trigger", "am"}, server...)...); code != exitOK {
		t.Fatalf("unpause: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := runCLI(t, append([]string{"dlq", "replay", entries[0]}, server...)...); code != exitOK || !strings.Contains(out, "replaying entry "+entries[0]+" as run ") {
		t.Errorf("replaying the mixed entry: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := runCLI(t, append([]string{"dlq", "replay", entries[1]}, server...)...); code != exitOK || !strings.Contains(out, "it started no run") {
		t.Errorf("replaying the entry of a skipped alert: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, _ := runCLI(t, append([]string{"dlq", "list", "--output", "json"}, server...)...); code != exitOK || strings.Contains(out, `"id"`) {
		t.Errorf("the queue after the replays: exit %d\n%s", code, out)
	}
}
