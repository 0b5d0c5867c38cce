package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestCountsAgreeWithTheirNouns: what the command line counts reads "1 run"
// and "2 runs", never "1 runs".
func TestCountsAgreeWithTheirNouns(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	one := filepath.Join(dir, "one.toml")
	writeFile(t, one, `
[[providers]]
name = "echo"
type = "echo"
[[chains]]
name = "hello"
[[chains.steps]]
name = "greet"
provider = "echo"
[[triggers]]
name = "hook"
type = "webhook"
chain = "hello"
[[schedules]]
name = "nightly"
chain = "hello"
cron = "30 2 * * *"
`)
	two := filepath.Join(dir, "two.toml")
	writeFile(t, two, `
[[providers]]
name = "faulty"
type = "faulty"
[[chains]]
name = "fails"
[[chains.steps]]
name = "call"
provider = "faulty"
payload_template = { fail = "refused" }
on_failure = "dlq"
[[chains.steps]]
name = "after"
provider = "faulty"
`)
	state := filepath.Join(dir, "gw.db")
	backup := filepath.Join(dir, "gw.backup")
	failing := filepath.Join(dir, "failing.db")
	tests := []struct {
		args []string
		says string
	}{
		{[]string{"validate", one}, "ok: 1 chain, 1 step, 1 provider, 1 trigger, 1 schedule\n"},
		{[]string{"validate", one, two}, "ok: 2 chains, 3 steps, 2 providers, 1 trigger, 1 schedule\n"},
		{[]string{"run", "hello", "--config", one, "--state", state}, ""},
		{[]string{"backup", backup, "--state", state}, "backed up 1 run from"},
		{[]string{"restore", backup, "--state", filepath.Join(dir, "restored.db")}, "restored 1 run (0 unfinished)"},
		{[]string{"resume", "--config", one, "--state", state}, "resuming 0 runs\n"},
		{[]string{"run", "fails", "--config", two, "--state", failing}, ""},
		{[]string{"dlq", "purge", "--all", "--state", failing}, "purged 1 entry\n"},
	}
	for _, tc := range tests {
		_, stdout, stderr := runCLI(t, tc.args...)
		if !strings.Contains(stdout+stderr, tc.says) {
			t.Errorf("%v: want %q in\n%s%s", tc.args, tc.says, stdout, stderr)
		}
	}
}
