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
// or a program run something.
var hostile = []string{`"; touch pwned #`, `$(touch pwned)`, "`touch pwned`", "*", `'; touch pwned; '`, `${IFS}touch${IFS}pwned`, `|| touch pwned`, `> pwned`}

// call runs the command "c" that cmd declares, on a config of cfg with it,
// giving args.
type call struct {
	cmd  map[string]any
	args map[string]any
	cfg  map[string]any
}

func execute(t *testing.T, ctx context.Context, c call) (map[string]any, error) {
	t.Helper()
	cfg := maps.Clone(c.cfg)
	if cfg == nil {
		cfg = map[string]any{}
	}
	cfg["commands"] = map[string]any{"c": c.cmd}
	return executeWith(t, ctx, cfg, "c", map[string]any{"args": c.args})
}

func executeWith(t *testing.T, ctx context.Context, cfg map[string]any, action string, payload any) (map[string]any, error) {
	t.Helper()
	pl, err := json.Marshal(payload)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := exec.New().Execute(ctx, providers.Request{ActionType: action, Payload: pl, Config: raw, DedupKey: "run1/step1", RunID: "run1", Step: "step1", Attempt: 2})
	if err != nil {
		return nil, err
	}
	var body map[string]any
	if err := json.Unmarshal(resp.Body, &body); err != nil {
		t.Fatalf("result %s: %v", resp.Body, err)
	}
	return body, nil
}

// TestHostileValuesStayLiteral gives hostile values to a script that reads
// its arguments as the docs say, quoted: each is printed as the text it is.
func TestHostileValuesStayLiteral(t *testing.T) {
	dir := t.TempDir()
	cmd := map[string]any{
		"script": `printf '%s\n' "$CHAINGATE_ARG_V"`,
		"args":   map[string]any{"v": map[string]any{"type": "string"}},
	}
	for _, v := range hostile {
		body, err := execute(t, context.Background(), call{cmd, map[string]any{"v": v}, map[string]any{"dir": dir}})
		if err != nil {
			t.Fatalf("%q: %v", v, err)
		}
		if got := body["stdout"]; got != v+"\n" {
			t.Errorf("stdout %q, want %q", got, v+"\n")
		}
	}
	// What the rule refuses never reaches the command.
	for _, v := range []string{"-delete", "--help", "a\ntouch pwned", strings.Repeat("x", 100<<10)} {
		_, err := execute(t, context.Background(), call{cmd, map[string]any{"v": v}, map[string]any{"dir": dir}})
		var pe *providers.Error
		if !errors.As(err, &pe) || pe.Code != "bad_argument" || pe.Retryable {
			t.Errorf("%.20q: err %v, want a permanent bad_argument", v, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "pwned")); err == nil {
		t.Fatal("a hostile value ran a command")
	}
}

// TestPathArguments confines a path to its roots as this machine resolves
// it: a symbolic link under a root that leads out of it is refused.
func TestPathArguments(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	logs := filepath.Join(root, "log")
	for _, d := range []string{filepath.Join(logs, "app"), filepath.Join(outside, "etc")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for link, to := range map[string]string{"escape": filepath.Join(outside, "etc"), "inside": filepath.Join(logs, "app"), "dangling": filepath.Join(outside, "gone")} {
		if err := os.Symlink(to, filepath.Join(logs, link)); err != nil {
			t.Fatal(err)
		}
	}
	cmd := map[string]any{
		"script": `printf '%s' "$CHAINGATE_ARG_DIR"`,
		"args":   map[string]any{"dir": map[string]any{"type": "path", "roots": []string{logs}}},
	}
	for _, tc := range []struct{ value, want, err string }{
		{filepath.Join(logs, "app"), filepath.Join(logs, "app"), ""},
		{filepath.Join(logs, "new", "file"), filepath.Join(logs, "new", "file"), ""},
		{filepath.Join(logs, "inside", "x"), filepath.Join(logs, "inside", "x"), ""},
		{filepath.Join(logs, "escape"), "", "through a symbolic link"},
		{filepath.Join(logs, "escape", "passwd"), "", "through a symbolic link"},
		{filepath.Join(logs, "dangling"), "", "leads nowhere"},
		{logs + "/../../etc", "", "holds '..'"},
		{"-delete", "", "not an absolute path"},
	} {
		body, err := execute(t, context.Background(), call{cmd, map[string]any{"dir": tc.value}, nil})
		switch {
		case tc.err == "" && (err != nil || body["stdout"] != tc.want):
			t.Errorf("%s: body %v, err %v", tc.value, body, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: err %v, want %q", tc.value, err, tc.err)
		}
	}
}

func TestEnvironment(t *testing.T) {
	t.Setenv("GATEWAY_ONLY", "do-not-leak")
	t.Setenv("LANG", "C.UTF-8")
	cmd := map[string]any{"argv": []string{"env"}, "env": map[string]string{"FROM_COMMAND": "c", "FROM_CONFIG": "overridden"}, "args": map[string]any{"unit": map[string]any{"type": "string"}}}
	for _, tc := range []struct {
		name      string
		config    map[string]any
		has, hasn []string
	}{
		{"nothing leaks by default", nil,
			[]string{"PATH=" + exec.DefaultPath, "CHAINGATE_DEDUP_KEY=run1/step1", "CHAINGATE_RUN_ID=run1", "CHAINGATE_STEP=step1", "CHAINGATE_ATTEMPT=2", "FROM_COMMAND=c", "CHAINGATE_ARG_UNIT=nginx"},
			[]string{"GATEWAY_ONLY", "LANG"}},
		{"allowed names pass", map[string]any{"env_allow": []string{"LANG", "NOT_SET"}, "env": map[string]string{"FROM_CONFIG": "p", "ONLY_CONFIG": "p"}},
			[]string{"LANG=C.UTF-8", "ONLY_CONFIG=p", "FROM_CONFIG=overridden"},
			[]string{"GATEWAY_ONLY", "NOT_SET"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body, err := execute(t, context.Background(), call{cmd, map[string]any{"unit": "nginx"}, tc.config})
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
	script := func(s string) map[string]any { return map[string]any{"script": s} }
	argv := func(a ...string) map[string]any { return map[string]any{"argv": a} }
	for _, tc := range []struct {
		name   string
		cmd    map[string]any
		args   map[string]any
		config map[string]any
		check  func(t *testing.T, body map[string]any, err error)
	}{
		{"json stdout is parsed", argv("printf", `{"used": 93, "mount": "/var"}`), nil, nil, func(t *testing.T, body map[string]any, err error) {
			if err != nil {
				t.Fatal(err)
			}
			if out, _ := body["stdout"].(map[string]any); out["used"] != 93.0 || body["exit_code"] != 0.0 {
				t.Errorf("body %v", body)
			}
		}},
		{"text stays text", argv("printf", "93"), nil, nil, func(t *testing.T, body map[string]any, err error) {
			if err != nil || body["stdout"] != "93" {
				t.Errorf("body %v, err %v", body, err)
			}
		}},
		{"arguments of each type", map[string]any{"script": `printf '%s|%s|%s' "$CHAINGATE_ARG_N" "$CHAINGATE_ARG_B" "${CHAINGATE_ARG_O-unset}"`, "args": map[string]any{
			"n": map[string]any{"type": "integer"}, "b": map[string]any{"type": "boolean"}, "o": map[string]any{"type": "string", "required": false}}},
			map[string]any{"n": 90, "b": true}, nil, func(t *testing.T, body map[string]any, err error) {
				if err != nil || body["stdout"] != `90|true|unset` {
					t.Errorf("body %v, err %v", body, err)
				}
			}},
		{"literal stdin", map[string]any{"argv": []string{"cat"}, "stdin": "from the config\n"}, nil, nil, func(t *testing.T, body map[string]any, err error) {
			if err != nil || body["stdout"] != "from the config\n" {
				t.Errorf("body %v, err %v", body, err)
			}
		}},
		{"the command's dir", map[string]any{"argv": []string{"pwd"}, "dir": "/usr"}, nil, nil, func(t *testing.T, body map[string]any, err error) {
			if err != nil || body["stdout"] != "/usr\n" {
				t.Errorf("body %v, err %v", body, err)
			}
		}},
		{"the command's shell", map[string]any{"script": `echo "$0" "${BASH_VERSION:+bash}"`, "shell": "/bin/bash"}, nil, nil, func(t *testing.T, body map[string]any, err error) {
			if err != nil || body["stdout"] != "chaingate:step1 bash\n" {
				t.Errorf("body %v, err %v", body, err)
			}
		}},
		{"binary output is readable", argv("printf", `\377\376ok`), nil, nil, func(t *testing.T, body map[string]any, err error) {
			if err != nil || body["stdout"] != "\uFFFDok" {
				t.Errorf("body %v, err %v", body, err)
			}
		}},
		{"output past the cap is cut and flagged", script("head -c 3000000 /dev/zero | tr '\\0' a; echo err >&2"), nil, map[string]any{"max_output_bytes": 1000}, func(t *testing.T, body map[string]any, err error) {
			if err != nil {
				t.Fatal(err)
			}
			if s := body["stdout"].(string); len(s) != 1000 || body["stdout_truncated"] != true || body["stdout_bytes"] != 3000000.0 || body["stderr"] != "err\n" || body["stderr_truncated"] != nil {
				rest := maps.Clone(body)
				delete(rest, "stdout")
				t.Errorf("stdout %d bytes, the rest: %v", len(s), rest)
			}
		}},
		{"a failing exit is permanent", script("echo disk full >&2; exit 3"), nil, nil, func(t *testing.T, _ map[string]any, err error) {
			if err == nil || providers.IsRetryable(err) || !strings.Contains(err.Error(), "exit_3: the command exited with 3: disk full") {
				t.Errorf("err %v", err)
			}
		}},
		{"EX_TEMPFAIL is retryable", script("exit 75"), nil, nil, func(t *testing.T, _ map[string]any, err error) {
			if !providers.IsRetryable(err) {
				t.Errorf("err %v", err)
			}
		}},
		{"exit codes as configured", script("exit 1"), nil, map[string]any{"ok_exit_codes": []int{0, 1}}, func(t *testing.T, body map[string]any, err error) {
			if err != nil || body["exit_code"] != 1.0 {
				t.Errorf("body %v, err %v", body, err)
			}
		}},
		{"a signal is 128 and its number", script("kill -9 $$"), nil, map[string]any{"retryable_exit_codes": []int{137}}, func(t *testing.T, _ map[string]any, err error) {
			if !providers.IsRetryable(err) || !strings.Contains(err.Error(), "exit_137") {
				t.Errorf("err %v", err)
			}
		}},
		{"unknown program", argv("no-such-program-here"), nil, nil, func(t *testing.T, _ map[string]any, err error) {
			if err == nil || providers.IsRetryable(err) || !strings.Contains(err.Error(), `finding the program "no-such-program-here"`) {
				t.Errorf("err %v", err)
			}
		}},
		{"undeclared argument", argv("true"), map[string]any{"x": "y"}, nil, func(t *testing.T, _ map[string]any, err error) {
			if err == nil || providers.IsRetryable(err) || !strings.Contains(err.Error(), `argument "x" is not one command "c" declares`) {
				t.Errorf("err %v", err)
			}
		}},
		{"bad config", argv("true"), nil, map[string]any{"env": map[string]string{"CHAINGATE_DEDUP_KEY": "x"}}, func(t *testing.T, _ map[string]any, err error) {
			if err == nil || !strings.Contains(err.Error(), "CHAINGATE_ prefix") {
				t.Errorf("err %v", err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body, err := execute(t, context.Background(), call{tc.cmd, tc.args, tc.config})
			tc.check(t, body, err)
		})
	}
}

// TestPayloads: a call names a declared command and gives its arguments;
// the forms that once gave a command whole are refused with the new one.
func TestPayloads(t *testing.T) {
	cfg := map[string]any{"commands": map[string]any{"df": map[string]any{"argv": []string{"df", "-h"}}}}
	for _, tc := range []struct {
		name, action string
		payload      any
		err          string
	}{
		{"undeclared command", "rm", map[string]any{}, `the config declares no command "rm"; it declares "df"`},
		{"no action type", "", map[string]any{}, `no action_type`},
		{"the command given whole", "df", map[string]any{"command": []string{"sh", "-c", "touch pwned"}}, "the payload gives command, which a step no longer may"},
		{"a script given whole", "df", map[string]any{"shell": true, "script": "touch pwned"}, "the payload gives script, shell"},
		{"keys are exact", "df", map[string]any{"Args": map[string]any{}}, `unknown payload key "Args"`},
		{"not a table", "df", "touch pwned", "the payload must be a table"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := executeWith(t, context.Background(), cfg, tc.action, tc.payload)
			if err == nil || providers.IsRetryable(err) || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("err %v, want %q", err, tc.err)
			}
		})
	}
	if _, err := executeWith(t, context.Background(), cfg, "df", nil); err != nil {
		t.Errorf("no payload: %v", err)
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
			cmd := map[string]any{"script": tc.script}
			if tc.want == "timeout" {
				cmd["timeout_seconds"] = 0.5
			}
			_, err := execute(t, ctx, call{cmd, nil, map[string]any{"dir": dir, "kill_grace_seconds": 0.5}})
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
		map[string]any{"script": "setsid sh -c 'echo $$ > daemon.tmp; mv daemon.tmp daemon; exec sleep 300' & while [ ! -e daemon ]; do sleep 0.01; done; echo done"},
		nil, map[string]any{"dir": dir, "kill_grace_seconds": 0.1},
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
	body, err := execute(t, context.Background(), call{map[string]any{"argv": []string{"./bin/tool"}}, nil, map[string]any{"dir": dir}})
	if err != nil || body["stdout"] != "from dir\n" {
		t.Errorf("body %v, err %v", body, err)
	}
}
