package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// redriveTestConfig is a split of items that fail where they say so, up to
// a tolerance, and a step after it that reads the split's counts.
func redriveTestConfig(record, fail string) string {
	return fmt.Sprintf(`
[[providers]]
name = "faulty"
type = "faulty"

[[chains]]
name = "fleet"
[[chains.steps]]
name = "fan"
[chains.steps.split]
items = "<<origin.payload.items>>"
max_concurrency = 8
tolerated_failures = "20%%"
[[chains.steps.split.steps]]
name = "call"
provider = "faulty"
payload_template = { record = %q, n = "<<item.n>>", fail = %s }
[[chains.steps]]
name = "after"
provider = "faulty"
payload_template = { record = %q, ok = "<<steps.fan.body.succeeded>>" }
`, record, fail, record)
}

func redriveItems(n int, failing func(int) bool) string {
	var items []string
	for i := range n {
		if failing(i) {
			items = append(items, fmt.Sprintf(`{"n":%d,"fail":"boom"}`, i))
		} else {
			items = append(items, fmt.Sprintf(`{"n":%d}`, i))
		}
	}
	return `{"items":[` + strings.Join(items, ",") + `]}`
}

// callsOf counts the recorded calls of each item (by n) and of the step
// after the split (n = -1).
func callsOf(t *testing.T, record string) map[int]int {
	t.Helper()
	b, err := os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var c struct {
			Payload struct {
				N  *float64 `json:"n"`
				OK any      `json:"ok"`
			} `json:"payload"`
		}
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatal(err)
		}
		if c.Payload.N == nil {
			out[-1]++
			continue
		}
		out[int(*c.Payload.N)]++
	}
	return out
}

// gateway runs redrive on a store, after a fix to the config: the failed
// items run again, only they, and the step after the split.
func TestRunsRedrive(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	record := filepath.Join(dir, "calls.jsonl")
	cfg, fixed := filepath.Join(dir, "fleet.toml"), filepath.Join(dir, "fixed", "fleet.toml")
	writeFile(t, cfg, redriveTestConfig(record, `"<<item.fail ?? \"\">>"`))
	if err := os.MkdirAll(filepath.Dir(fixed), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, fixed, redriveTestConfig(record, `""`))
	state := filepath.Join(dir, "s.db")
	failing := func(i int) bool { return i%10 == 3 }
	code, out, errOut := runCLI(t, "run", "fleet", "--config", cfg, "--state", state, "--payload", redriveItems(100, failing))
	if code != exitOK {
		t.Fatalf("run: exit %d\n%s%s", code, out, errOut)
	}
	var run struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &run); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := runCLI(t, "runs", "redrive", run.ID, "fan", "--state", state, "--config", fixed); code != exitOK || !strings.Contains(out, "run "+run.ID+" succeeded") {
		t.Fatalf("redrive: exit %d\n%s%s", code, out, errOut)
	}
	calls := callsOf(t, record)
	for i := range 100 {
		want := 1
		if failing(i) {
			want = 2
		}
		if calls[i] != want {
			t.Errorf("item %d called %d times, want %d", i, calls[i], want)
		}
	}
	if calls[-1] != 2 {
		t.Errorf("the step after the split ran %d times, want 2", calls[-1])
	}
	code, _, errOut = runCLI(t, "runs", "redrive", run.ID, "fan", "--state", state, "--config", fixed)
	if code == exitOK || !strings.Contains(errOut, "has no failed item to run again") {
		t.Errorf("a second redrive: exit %d, %s", code, errOut)
	}
}

// The same through a serving gateway's API: only the failed items are
// called again (and fail again, the config being the same).
func TestRunsRedriveThroughTheAPI(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	record := filepath.Join(dir, "calls.jsonl")
	cfg := filepath.Join(dir, "fleet.toml")
	writeFile(t, cfg, redriveTestConfig(record, `"<<item.fail ?? \"\">>"`))
	gw := startServe(t, cfg, filepath.Join(dir, "s.db"))
	failing := func(i int) bool { return i%10 == 3 }
	id, err := postRun(gw.url, "fleet", redriveItems(50, failing))
	if err != nil {
		t.Fatal(err)
	}
	waitRunStatus(t, gw.url, id, "succeeded")
	resp, err := http.Post(gw.url+"/v1/runs/"+id+"/steps/fan/redrive", "application/json", strings.NewReader(`{"items": "everything"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a redrive of unknown items: %d, want 400", resp.StatusCode)
	}
	if code, out, errOut := runCLI(t, "runs", "redrive", id, "fan", "--server", gw.url); code != exitOK {
		t.Fatalf("redrive: exit %d\n%s%s", code, out, errOut)
	}
	var calls map[int]int
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if calls = callsOf(t, record); calls[-1] == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the step after the redriven split did not run again: %v", calls)
		}
	}
	for i := range 50 {
		want := 1
		if failing(i) {
			want = 2
		}
		if calls[i] != want {
			t.Errorf("item %d called %d times, want %d", i, calls[i], want)
		}
	}
}
