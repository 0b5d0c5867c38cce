package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/backup"
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/internal/testutil/proctest"
	"github.com/chaingate/gateway/internal/testutil/redistest"
)

// slowConfig is a chain of a step, a parallel group of five whose calls
// take from 0.3 to 1.5 s, and a last step, every call recorded in
// DIR/calls.jsonl: a backup taken while runs of it are under way finds
// them in every state.
const slowConfig = `
[[providers]]
name = "faulty"
type = "faulty"

[[chains]]
name = "slow"
[[chains.steps]]
name = "first"
provider = "faulty"
payload_template = { record = "DIR/calls.jsonl", sleep_ms = 100 }
[[chains.steps]]
name = "notify"
[chains.steps.parallel]
[[chains.steps.parallel.steps]]
name = "s0"
provider = "faulty"
payload_template = { record = "DIR/calls.jsonl", sleep_ms = 300 }
[[chains.steps.parallel.steps]]
name = "s1"
provider = "faulty"
payload_template = { record = "DIR/calls.jsonl", sleep_ms = 600 }
[[chains.steps.parallel.steps]]
name = "s2"
provider = "faulty"
payload_template = { record = "DIR/calls.jsonl", sleep_ms = 900 }
[[chains.steps.parallel.steps]]
name = "s3"
provider = "faulty"
payload_template = { record = "DIR/calls.jsonl", sleep_ms = 1200 }
[[chains.steps.parallel.steps]]
name = "s4"
provider = "faulty"
payload_template = { record = "DIR/calls.jsonl", sleep_ms = 1500 }
[[chains.steps]]
name = "after"
provider = "faulty"
payload_template = { record = "DIR/calls.jsonl", sleep_ms = 200 }
`

// TestBackupUnderLoadResumes takes a backup through a serving gateway's
// API while its runs are under way, kills the gateway, restores the backup
// into a fresh store and resumes it: every run is readable and finishes,
// and no step whose result the backup recorded is called again.
func TestBackupUnderLoadResumes(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"bolt", "redis"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			state, fresh := filepath.Join(dir, "gw.db"), filepath.Join(dir, "restored.db")
			if kind == "redis" {
				state, fresh = redistest.Open(t), redistest.Open(t)
			}
			cfg := filepath.Join(dir, "gateway.toml")
			writeFile(t, cfg, strings.ReplaceAll(slowConfig, "DIR", dir))
			calls := filepath.Join(dir, "calls.jsonl")
			gw := startServe(t, cfg, state)
			// Four runs done or at their last step, four in their group,
			// four at their first step: the backup finds every state.
			const runs = 12
			waits := []struct {
				suffix string
				n      int
			}{{"/after", 4}, {"/notify/s", 28}, {"/first", 12}}
			for _, w := range waits {
				for range 4 {
					if _, err := postRun(gw.url, "slow", "{}"); err != nil {
						t.Fatal(err)
					}
				}
				waitCalls(t, calls, func(l recordLine) bool { return strings.Contains(l.DedupKey, w.suffix) }, w.n)
			}
			out := filepath.Join(dir, "gw.backup")
			if code, stdout, stderr := runCLI(t, "backup", out, "--server", gw.url); code != exitOK || !strings.Contains(stdout, fmt.Sprintf("backed up %d runs from the %s store", runs, kind)) {
				t.Fatalf("backup: exit %d\n%s%s", code, stdout, stderr)
			}
			children := childPIDs(gw.cmd.Process.Pid)
			if err := gw.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			_, _ = gw.cmd.Process.Wait()
			proctest.WaitGone(t, 5*time.Second, proctest.Seen(children...))

			if code, stdout, stderr := runCLI(t, "restore", out, "--state", fresh); code != exitOK || !strings.Contains(stdout, fmt.Sprintf("restored %d runs", runs)) {
				t.Fatalf("restore: exit %d\n%s%s", code, stdout, stderr)
			}
			recorded, unfinished := recordedSteps(t, fresh, runs)
			if unfinished == 0 || len(recorded) == 0 {
				t.Fatalf("the backup caught %d unfinished runs and %d recorded calls; want some of each", unfinished, len(recorded))
			}
			before := fileSize(t, calls)
			resumeStore(t, cfg, fresh)

			st, _, err := gateway.OpenStore(context.Background(), fresh, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			page, err := st.ListRuns(context.Background(), store.RunFilter{})
			if err != nil || len(page.Runs) != runs {
				t.Fatalf("runs after the resume: %d %v", len(page.Runs), err)
			}
			for _, run := range page.Runs {
				if run.Status != store.RunSucceeded {
					t.Errorf("run %s: %s %+v", run.ID, run.Status, run.Error)
				}
				evs, err := st.Events(context.Background(), run.ID, 0, 0)
				if err != nil {
					t.Fatal(err)
				}
				checkNoDuplicateEvents(t, evs)
			}
			again := 0
			for _, l := range recordsAfter(t, calls, before) {
				if recorded[l.DedupKey] {
					t.Errorf("%s had its result in the backup but was called again after the restore", l.DedupKey)
				}
				again++
			}
			if again == 0 {
				t.Errorf("the resume made no call; %d runs were unfinished", unfinished)
			}
			t.Logf("the backup held %d runs, %d unfinished, and %d recorded calls; the resume made %d calls", runs, unfinished, len(recorded), again)
		})
	}
}

// waitCalls waits for n calls that match in the record file.
func waitCalls(t *testing.T, path string, match func(recordLine) bool, n int) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		found := 0
		for _, l := range recordsAfter(t, path, 0) {
			if match(l) {
				found++
			}
		}
		if found >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls of the %d waited for", found, n)
		}
	}
}

// recordedSteps reads a store's runs, every one of which must be readable,
// and returns the dedup keys of the steps with a result, and how many runs
// are unfinished.
func recordedSteps(t *testing.T, state string, runs int) (map[string]bool, int) {
	t.Helper()
	ctx := context.Background()
	st, _, err := gateway.OpenStore(ctx, state, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	page, err := st.ListRuns(ctx, store.RunFilter{})
	if err != nil || len(page.Runs) != runs || len(page.Damaged) > 0 {
		t.Fatalf("runs restored: %d, damaged %v, %v", len(page.Runs), page.Damaged, err)
	}
	recorded, unfinished := map[string]bool{}, 0
	for _, run := range page.Runs {
		if !run.Status.Final() {
			unfinished++
		}
		steps, err := st.Steps(ctx, run.ID, "")
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range steps {
			if s.Status.Final() && s.DedupKey != "" {
				recorded[s.DedupKey] = true
			}
		}
		if _, err := st.Events(ctx, run.ID, 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	if ids, err := st.UnfinishedRuns(ctx); err != nil || len(ids) != unfinished {
		t.Fatalf("unfinished runs listed: %v %v; %d runs are unfinished", ids, err, unfinished)
	}
	return recorded, unfinished
}

// resumeStore runs gateway resume on a store as a process of its own.
func resumeStore(t *testing.T, cfg, state string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "resume", "--config", cfg, "--state", state)
	cmd.Env = append(os.Environ(), mainEnv+"=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("gateway resume: %v\n%s", err, out.String())
		}
	case <-time.After(90 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("gateway resume did not finish:\n%s", out.String())
	}
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// recordsAfter reads the record file's whole lines from offset on.
func recordsAfter(t *testing.T, path string, offset int64) []recordLine {
	t.Helper()
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	data = data[offset:]
	data = data[:bytes.LastIndexByte(data, '\n')+1]
	var out []recordLine
	for _, l := range strings.Split(string(data), "\n") {
		if l == "" {
			continue
		}
		var r recordLine
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("torn record line %q: %v", l, err)
		}
		out = append(out, r)
	}
	return out
}

// TestBackupCommands runs backup, restore and compact on embedded stores,
// with what each refuses.
func TestBackupCommands(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gateway.toml")
	writeFile(t, cfg, `
[[providers]]
name = "echo"
type = "echo"
[[chains]]
name = "hello"
[[chains.steps]]
name = "greet"
provider = "echo"
`)
	state := filepath.Join(dir, "gw.db")
	for range 2 {
		if code, _, stderr := runCLI(t, "run", "hello", "--config", cfg, "--state", state); code != exitOK {
			t.Fatalf("run: %d %s", code, stderr)
		}
	}
	out := filepath.Join(dir, "b", "gw.backup")
	if err := os.Mkdir(filepath.Dir(out), 0o755); err != nil {
		t.Fatal(err)
	}
	restored := filepath.Join(dir, "restored.db")
	cut := filepath.Join(dir, "cut.backup")
	empty := filepath.Join(dir, "empty.backup")
	later := filepath.Join(dir, "later.backup")
	steps := []struct {
		args    []string
		code    int
		says    string
		prepare func()
	}{
		{args: []string{"backup", out, "--state", state}, says: "backed up 2 runs from the bolt store " + state + " to " + out},
		{args: []string{"backup", out, "--server", "http://127.0.0.1:1", "--state", state}, code: exitUsage, says: "not both"},
		// A second backup replaces the first.
		{args: []string{"backup", out, "--config", cfg, "--state", "bolt://" + state}, says: "backed up 2 runs"},
		{args: []string{"restore", out, "--state", restored}, says: "restored 2 runs (0 unfinished) into " + restored},
		{args: []string{"runs", "list", "--state", restored}, says: "hello"},
		{args: []string{"restore", out, "--state", restored}, code: exitFailed, says: "not empty"},
		{args: []string{"restore", cut, "--state", filepath.Join(dir, "never.db")}, code: exitFailed, says: "backup file is truncated: it ends after 20000 bytes, ", prepare: func() {
			data, _ := os.ReadFile(out)
			if len(data) <= 20000 {
				t.Fatalf("the backup is %d bytes, too few to cut", len(data))
			}
			writeFile(t, cut, string(data[:20000]))
		}},
		{args: []string{"restore", empty, "--state", filepath.Join(dir, "never.db")}, code: exitFailed, says: "backup file is damaged: it holds no store file", prepare: func() {
			var b bytes.Buffer
			w, err := backup.NewWriter(&b, backup.Header{Kind: "bolt", Format: "3", Created: time.Now().UTC()})
			if err == nil {
				err = w.Close(backup.Trailer{})
			}
			if err != nil {
				t.Fatal(err)
			}
			writeFile(t, empty, b.String())
		}},
		{args: []string{"restore", later, "--state", filepath.Join(dir, "never.db")}, code: exitFailed, says: "version 2 of the backup format", prepare: func() {
			data, _ := os.ReadFile(out)
			writeFile(t, later, "chaingate-backup 2\n"+string(data[len("chaingate-backup 1\n"):]))
		}},
		{args: []string{"restore", cfg, "--state", filepath.Join(dir, "never.db")}, code: exitFailed, says: "not a chaingate backup file"},
		{args: []string{"restore", out, "--state", "redis://127.0.0.1:1/0"}, code: exitFailed, says: "the backup holds a bolt store"},
		{args: []string{"restore", out}, code: exitUsage, says: "--state URL"},
		{args: []string{"backup"}, code: exitUsage, says: "need exactly one OUT"},
		{args: []string{"backup", out, "--state", filepath.Join(dir, "none.db")}, code: exitFailed, says: "no such file"},
		{args: []string{"compact", "--state", restored}, says: "compacted " + restored + " from "},
		{args: []string{"compact", "--state", "redis://127.0.0.1:6379/0"}, code: exitFailed, says: "embedded store file"},
		{args: []string{"compact"}, code: exitUsage, says: "--state FILE"},
	}
	for _, s := range steps {
		if s.prepare != nil {
			s.prepare()
		}
		code, stdout, stderr := runCLI(t, s.args...)
		if code != s.code || !strings.Contains(stdout+stderr, s.says) {
			t.Errorf("%v: exit %d, want %d saying %q\nstdout: %s\nstderr: %s", s.args, code, s.code, s.says, stdout, stderr)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "never.db")); !os.IsNotExist(err) {
		t.Errorf("a refused restore left a store: %v", err)
	}
	if entries, _ := os.ReadDir(filepath.Dir(out)); len(entries) != 1 {
		t.Errorf("files beside the backup: %v", entries)
	}
	code, stdout, stderr := runCLI(t, "backup", "-", "--state", state)
	if h, tr, err := backup.Check(strings.NewReader(stdout)); code != exitOK || err != nil || h.Kind != "bolt" || tr.Runs != 2 || !strings.Contains(stderr, "backed up 2 runs") {
		t.Errorf("backup to stdout: exit %d %v %+v %+v\n%s", code, err, h, tr, stderr)
	}
}

// TestBackupRefusesAHeldFile: with a gateway serving on a store file,
// backup --state and compact refuse it, naming the way through the
// gateway, and backup --server takes it.
func TestBackupRefusesAHeldFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gateway.toml")
	writeFile(t, cfg, strings.ReplaceAll(slowConfig, "DIR", dir))
	state := filepath.Join(dir, "gw.db")
	gw := startServe(t, cfg, state)
	if code, _, stderr := runCLI(t, "backup", filepath.Join(dir, "x.backup"), "--state", state); code != exitFailed || !strings.Contains(stderr, "--server URL") {
		t.Errorf("backup --state of a held file: exit %d %s", code, stderr)
	}
	if code, _, stderr := runCLI(t, "compact", "--state", state); code != exitFailed || !strings.Contains(stderr, "a gateway is running on it") {
		t.Errorf("compact of a held file: exit %d %s", code, stderr)
	}
	if code, stdout, stderr := runCLI(t, "backup", filepath.Join(dir, "x.backup"), "--server", gw.url); code != exitOK || !strings.Contains(stdout, "backed up 0 runs") {
		t.Errorf("backup --server: exit %d %s %s", code, stdout, stderr)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.Contains(e.Name(), "tmp") {
			t.Errorf("left behind: %s", e.Name())
		}
	}
}
