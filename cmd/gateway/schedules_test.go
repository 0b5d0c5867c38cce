package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestSchedulesListCommand(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gateway.toml")
	writeFile(t, cfg, `
[[providers]]
name = "echo"
type = "echo"
[[chains]]
name = "tick"
[[chains.steps]]
name = "call"
provider = "echo"
[[schedules]]
name = "nightly"
chain = "tick"
cron = "30 2 * * 1-5"
timezone = "America/New_York"
[[schedules]]
name = "often"
chain = "tick"
every = "10m"
`)
	code, out, errOut := runCLI(t, "schedules", "list", "--config", cfg)
	if code != exitOK || !strings.Contains(out, "nightly   tick   30 2 * * 1-5 America/New_York") || !strings.Contains(out, "every 10m0s") {
		t.Fatalf("schedules list: %d\n%s%s", code, out, errOut)
	}
	code, out, _ = runCLI(t, "schedules", "list", "--config", cfg, "--output", "json")
	var list []struct {
		Name string      `json:"name"`
		Next []time.Time `json:"next"`
	}
	if err := json.Unmarshal([]byte(out), &list); code != exitOK || err != nil || len(list) != 2 {
		t.Fatalf("schedules list --output json: %d %v\n%s", code, err, out)
	}
	ny, _ := time.LoadLocation("America/New_York")
	for _, n := range list[0].Next {
		if n := n.In(ny); n.Hour() != 2 || n.Minute() != 30 || n.Weekday() == time.Saturday || n.Weekday() == time.Sunday {
			t.Errorf("nightly ticks at %s", n)
		}
	}
	if code, _, _ := runCLI(t, "schedules", "list"); code != exitUsage {
		t.Errorf("without a config: exit %d", code)
	}
}
