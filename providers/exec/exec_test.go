package exec_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chaingate/gateway/internal/testutil/proctest"
	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/exec"
)

// hostile are values an alert's labels may carry, meant to make a shell
// run something.
var hostile = []string{`"; touch pwned #`, `$(touch pwned)`, "`touch pwned`", "a\ntouch pwned", "*", `'; touch pwned; '`, `${IFS}touch${IFS}pwned`}

type call struct {
	payload any
	config  any
}

func execute(t *testing.T, ctx context.Context, c call) (map[string]any, error) {
	t.Helper()
	payload, _ := json.Marshal(c.payload)
	cfg, _ := json.Marshal(c.config)
	if c.config == nil {
		cfg = nil
	}
	resp, err := exec.New().Execute(ctx, providers.Request{Payload: payload, Config: cfg, DedupKey: "run1/step1", RunID: "run1", Step: "step1", Attempt: 2})
	if err != nil {
		return nil, err
	}
	var body map[string]any
	if err := json.Unmarshal(resp.Body, &body); err != nil {
		t.Fatalf("result %s: %v", resp.Body, err)
	}
	return body, nil
}

func TestHostileValuesStayLiteral(t *testing.T) {
	dir := t.TempDir()
	cfg := map[string]any{"dir": dir}
	for _, tc := range []struct {
		name    string
		payload map[string]any
	}{
		{"argv", map[string]any{"command": append([]string{"printf", `%s\n`}, hostile...)}},
		{"shell reads env", map[string]any{"shell": true, "script": `for v in "$A" "$B" "$C" "$D" "$E" "$F" "$G"; do printf '%s\n' "$v"; done`,
			"env": map[string]string{"A": hostile[0], "B": hostile[1], "C": hostile[2], "D": hostile[3], "E": hostile[4], "F": hostile[5], "G": hostile[6]}}},
		{"stdin", map[string]any{"command": []string{"cat"}, "stdin": strings.Join(hostile, "\n") + "\n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body, err := execute(t, context.Background(), call{tc.payload, cfg})
			if err != nil {
				t.Fatal(err)
			}
			if got, want := body["stdout"], strings.Join(hostile, "\n")+"\n"; got != want {
				t.Errorf("stdout %q, want %q", got, want)
			}
			if _, err := os.Stat(filepath.Join(dir, "pwned")); err == nil {
				t.Fatal("a hostile value ran a command")
			}
		})
	}
}

func TestEnvironment(t *testing.T) {
	t.Setenv("GATEWAY_ONLY", "do-not-leak")
	t.Setenv("LANG", "C.UTF-8")
	for _, tc := range []struct {
		name      string
		config    map[string]any
		has, hasn []string
	}{
		{"nothing leaks by default", nil,
			[]string{"PATH=" + exec.DefaultPath, "CHAINGATE_DEDUP_KEY=run1/step1", "CHAINGATE_RUN_ID=run1", "CHAINGATE_STEP=step1", "CHAINGATE_ATTEMPT=2", "FROM_STEP=s"},
			[]string{"GATEWAY_ONLY", "LANG"}},
		{"allowed names pass", map[string]any{"env_allow": []string{"LANG", "NOT_SET"}, "env": map[string]string{"FROM_CONFIG": "c", "FROM_STEP": "overridden"}},
			[]string{"LANG=C.UTF-8", "FROM_CONFIG=c", "FROM_STEP=s"},
			[]string{"GATEWAY_ONLY", "NOT_SET"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body, err := execute(t, context.Background(), call{map[string]any{"command": []string{"env"}, "env": map[string]string{"FROM_STEP": "s"}}, tc.config})
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(body["stdout"].(string), "\n")
			for _, want := range tc.has {
				if !contains(lines, want) {
					t.Errorf("no %s in\n%s", want, body["stdout"])
				}
			}
			for _, not := range tc.hasn {
				if strings.Contains(body["stdout"].(string), not) {
					t.Errorf("%s leaked:\n%s", not, body["stdout"])
				}
			}
		})
	}
}

func contains(lines []string, s string) bool {
	for _, l := range lines {
		if l == s {
			return true
		}
	}
	return false
}

func TestResults(t *testing.T) {
	for _, tc := range []struct {
		name    string
		payload map[string]any
		config  map[string]any
		check   func(t *testing.T, body map[string]any, err error)
	}{
		{"json stdout is parsed", map[string]any{"command": []string{"printf", `{"used": 93, "mount": "/var"}`}}, nil, func(t *testing.T, body map[string]any, err error) {
			if err != nil {
				t.Fatal(err)
			}
			if out, _ := body["stdout"].(map[string]any); out["used"] != 93.0 || body["exit_code"] != 0.0 {
				t.Errorf("body %v", body)
			}
		}},
		{"text stays text", map[string]any{"command": []string{"printf", "93"}}, nil, func(t *testing.T, body map[string]any, err error) {
			if err != nil || body["stdout"] != "93" {
				t.Errorf("body %v, err %v", body, err)
			}
		}},
		{"env values of any type", map[string]any{"shell": true, "script": `printf '%s|%s|%s|%s' "$N" "$B" "$O" "$Z"`, "env": map[string]any{"N": 90, "B": true, "O": map[string]any{"a": 1}, "Z": nil}}, nil, func(t *testing.T, body map[string]any, err error) {
			if err != nil || body["stdout"] != `90|true|{"a":1}|` {
				t.Errorf("body %v, err %v", body, err)
			}
		}},
		{"binary output is readable", map[string]any{"command": []string{"printf", `\377\376ok`}}, nil, func(t *testing.T, body map[string]any, err error) {
			if err != nil || body["stdout"] != "\uFFFDok" {
				t.Errorf("body %v, err %v", body, err)
			}
		}},
		{"output past the cap is cut and flagged", map[string]any{"shell": true, "script": "head -c 3000000 /dev/zero | tr '\\0' a; echo err >&2"}, map[string]any{"max_output_bytes": 1000}, func(t *testing.T, body map[string]any, err error) {
			if err != nil {
				t.Fatal(err)
			}
			if s := body["stdout"].(string); len(s) != 1000 || body["stdout_truncated"] != true || body["stdout_bytes"] != 3000000.0 || body["stderr"] != "err\n" || body["stderr_truncated"] != nil {
				rest := maps.Clone(body)
				delete(rest, "stdout")
				t.Errorf("stdout %d bytes, the rest: %v", len(s), rest)
			}
		}},
		{"a failing exit is permanent", map[string]any{"shell": true, "script": "echo disk full >&2; exit 3"}, nil, func(t *testing.T, _ map[string]any, err error) {
			if err == nil || providers.IsRetryable(err) || !strings.Contains(err.Error(), "exit_3: the command exited with 3: disk full") {
				t.Errorf("err %v", err)
			}
		}},
		{"EX_TEMPFAIL is retryable", map[string]any{"shell": true, "script": "exit 75"}, nil, func(t *testing.T, _ map[string]any, err error) {
			if !providers.IsRetryable(err) {
				t.Errorf("err %v", err)
			}
		}},
		{"exit codes as configured", map[string]any{"shell": true, "script": "exit 1"}, map[string]any{"ok_exit_codes": []int{0, 1}}, func(t *testing.T, body map[string]any, err error) {
			if err != nil || body["exit_code"] != 1.0 {
				t.Errorf("body %v, err %v", body, err)
			}
		}},
		{"a signal is 128 and its number", map[string]any{"shell": true, "script": "kill -9 $$"}, map[string]any{"retryable_exit_codes": []int{137}}, func(t *testing.T, _ map[string]any, err error) {
			if !providers.IsRetryable(err) || !strings.Contains(err.Error(), "exit_137") {
				t.Errorf("err %v", err)
			}
		}},
		{"unknown program", map[string]any{"command": []string{"no-such-program-here"}}, nil, func(t *testing.T, _ map[string]any, err error) {
			if err == nil || providers.IsRetryable(err) || !strings.Contains(err.Error(), `finding the program "no-such-program-here"`) {
				t.Errorf("err %v", err)
			}
		}},
		{"bad payload", map[string]any{"command": []string{"true"}, "script": "x"}, nil, func(t *testing.T, _ map[string]any, err error) {
			if err == nil || providers.IsRetryable(err) || !strings.Contains(err.Error(), "a script runs only with shell = true") {
				t.Errorf("err %v", err)
			}
		}},
		{"keys are exact", map[string]any{"Command": []string{"sh", "-c", "touch pwned"}}, nil, func(t *testing.T, _ map[string]any, err error) {
			if err == nil || providers.IsRetryable(err) || !strings.Contains(err.Error(), `unknown payload key "Command"`) {
				t.Errorf("err %v", err)
			}
		}},
		{"reserved env", map[string]any{"command": []string{"true"}, "env": map[string]string{"CHAINGATE_DEDUP_KEY": "x"}}, nil, func(t *testing.T, _ map[string]any, err error) {
			if err == nil || !strings.Contains(err.Error(), "CHAINGATE_ prefix") {
				t.Errorf("err %v", err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body, err := execute(t, context.Background(), call{tc.payload, tc.config})
			tc.check(t, body, err)
		})
	}
}

// TestStoppedCommandLeavesNothing stops a command that started another in
// the background, by its timeout and by its step's cancellation, and
// after it exited on its own: no process of it is left.
func TestStoppedCommandLeavesNothing(t *testing.T) {
	for _, tc := range []struct {
		name   string
		script string
		stop   func(ctx context.Context) (context.Context, context.CancelFunc)
		want   string
	}{
		{"timeout", "sleep 300 & echo $! > pids; echo $$ >> pids; sleep 300", nil, "timeout"},
		{"cancel", "sleep 300 & echo $! > pids; echo $$ >> pids; sleep 300", func(ctx context.Context) (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(ctx)
			go func() {
				time.Sleep(500 * time.Millisecond)
				cancel()
			}()
			return ctx, cancel
		}, "cancelled"},
		{"ignores TERM", "trap '' TERM; sleep 300 & echo $! > pids; echo $$ >> pids; while :; do sleep 1; done", nil, "timeout"},
		{"exits, leaving a child", "sleep 300 & echo $! > pids; echo $$ >> pids", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			ctx := context.Background()
			if tc.stop != nil {
				var cancel context.CancelFunc
				ctx, cancel = tc.stop(ctx)
				defer cancel()
			}
			payload := map[string]any{"shell": true, "script": tc.script}
			if tc.want == "timeout" {
				payload["timeout_seconds"] = 0.5
			}
			_, err := execute(t, ctx, call{payload, map[string]any{"dir": dir, "kill_grace_seconds": 0.5}})
			var pe *providers.Error
			switch {
			case tc.want == "" && err != nil:
				t.Fatal(err)
			case tc.want != "" && (!errors.As(err, &pe) || pe.Code != tc.want || !pe.Retryable):
				t.Fatalf("err %v, want %s", err, tc.want)
			}
			pids := proctest.ReadPIDs(filepath.Join(dir, "pids"))
			if len(pids) != 2 {
				t.Fatalf("pids %v", pids)
			}
			proctest.WaitGone(t, 30*time.Second, proctest.Seen(pids...))
		})
	}
}

// TestDaemonHoldingOutput: a command that exits while a process it
// started in a session of its own still holds its output keeps its exit
// code, with a warning, rather than failing retryably and running again.
func TestDaemonHoldingOutput(t *testing.T) {
	dir := t.TempDir()
	body, err := execute(t, context.Background(), call{
		// The command exits only once the daemon is in a session of its own.
		map[string]any{"shell": true, "script": "setsid sh -c 'echo $$ > daemon.tmp; mv daemon.tmp daemon; exec sleep 300' & while [ ! -e daemon ]; do sleep 0.01; done; echo done"},
		map[string]any{"dir": dir, "kill_grace_seconds": 0.1},
	})
	for _, pid := range proctest.ReadPIDs(filepath.Join(dir, "daemon")) {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
	if err != nil {
		t.Fatal(err)
	}
	if body["exit_code"] != 0.0 || body["stdout"] != "done\n" || !strings.Contains(fmt.Sprint(body["warning"]), "held its output open") {
		t.Errorf("body %v", body)
	}
}

// TestRelativeProgram runs a program named relative to dir, as the
// command will run, whatever the gateway's own working directory.
func TestRelativeProgram(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "tool"), []byte("#!/bin/sh\necho from dir\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	body, err := execute(t, context.Background(), call{map[string]any{"command": []string{"./bin/tool"}}, map[string]any{"dir": dir}})
	if err != nil || body["stdout"] != "from dir\n" {
		t.Errorf("body %v, err %v", body, err)
	}
}
