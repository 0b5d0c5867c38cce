package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestPluginCheck(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	payloads := filepath.Join(dir, "payloads.json")
	writeFile(t, payloads, `{"echo": {"text": "from the file"}, "other": {"n": 1}}`)
	for _, tc := range []struct {
		name string
		args []string
		code int
		want []string // in stdout
	}{
		{"conforms", []string{"--builtin", "echo", "--accepts-any-payload", "--payload", `echo={"text": "<hi> & bye"}`},
			exitOK, []string{`PASS  call/echo `, `{"text":"<hi> & bye"}`, "PASS  orphan ", "0 failed, 1 skipped: built-in echo conforms"}},
		{"payloads file and flags", []string{"--builtin", "echo", "--accepts-any-payload", "--payloads", payloads, "--payload", `other={"n": 2}`},
			exitOK, []string{`{"text":"from the file"}`, `{"n":2}`}},
		{"a failed check fails the command", []string{"--builtin", "echo", "--payload", "echo={}"},
			exitFailed, []string{"FAIL  bad-payload/echo  accepted a JSON string", "1 failed, 1 skipped: built-in echo does not conform"}},
		{"json", []string{"--builtin", "http", "--config", `{"base_url": "http://127.0.0.1:1"}`, "--output", "json"},
			exitOK, []string{`"target":"built-in http"`, `"check":"config","status":"PASS"`}},
		{"no target", nil, exitUsage, nil},
		{"two targets", []string{"--builtin", "echo", "./plugin"}, exitUsage, nil},
		{"bad payload flag", []string{"--builtin", "echo", "--payload", "echo"}, exitUsage, nil},
		{"payload not JSON", []string{"--builtin", "echo", "--payload", "echo={"}, exitUsage, nil},
		{"config not an object", []string{"--builtin", "echo", "--config", "[]"}, exitUsage, nil},
		{"bad output", []string{"--builtin", "echo", "--output", "yaml"}, exitUsage, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args := tc.args
			if tc.code != exitUsage {
				// The check's own timeout, not what the test asserts: a
				// loaded machine moves a 6 MiB body slowly.
				args = append(slices.Clone(args), "--timeout", "60s")
			}
			code, out, errOut := runCLI(t, append([]string{"plugin", "check"}, args...)...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tc.code, out, errOut)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("stdout lacks %q:\n%s", w, out)
				}
			}
			if tc.name == "json" && !json.Valid([]byte(out)) {
				t.Errorf("--output json is not JSON:\n%s", out)
			}
		})
	}
}

func TestPluginNew(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pager")
	code, out, errOut := runCLI(t, "plugin", "new", "pager", "--dir", dir, "--gateway-src", "../..", "--module", "example.org/ops/pager")
	if code != exitOK {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	for _, w := range []string{"cd " + dir, "go mod tidy", "gateway plugin check bin/pager --payloads payloads.json"} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	src, _ := filepath.Abs("../..")
	for _, w := range []string{"module example.org/ops/pager\n", "replace github.com/chaingate/gateway => " + src + "\n"} {
		if !strings.Contains(string(gomod), w) {
			t.Errorf("go.mod lacks %q:\n%s", w, gomod)
		}
	}
	if code, _, errOut := runCLI(t, "plugin", "new", "pager", "--dir", dir, "--gateway-src", "../.."); code != exitFailed || !strings.Contains(errOut, "not empty") {
		t.Errorf("into a used directory: exit %d, %s", code, errOut)
	}
	if code, _, _ := runCLI(t, "plugin", "new"); code != exitUsage {
		t.Errorf("without a name: exit %d", code)
	}
}

func TestValidatePlugins(t *testing.T) {
	dir := t.TempDir()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "echo-plugin"), "#!/bin/sh\nCHAINGATE_BUILTIN_PROVIDER=echo exec '"+exe+"' \"$@\"\n")
	writeFile(t, filepath.Join(dir, "broken-plugin"), "#!/bin/sh\nexit 2\n")
	for _, f := range []string{"echo-plugin", "broken-plugin"} {
		if err := os.Chmod(filepath.Join(dir, f), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	config := func(plugin string) string {
		path := filepath.Join(dir, plugin+".toml")
		writeFile(t, path, `
[[providers]]
name = "ext"
plugin = "`+plugin+`"

[[chains]]
name = "c"
[[chains.steps]]
name = "a"
provider = "ext"
action_type = "anything"
`)
		return path
	}
	code, out, _ := runCLI(t, "validate", config("echo-plugin"))
	if code != exitOK || !strings.Contains(out, "note: the action types and config of external plugins (ext) were not checked; validate --plugins") {
		t.Errorf("validate: exit %d\n%s", code, out)
	}
	if code, out, _ := runCLI(t, "validate", "--plugins", config("echo-plugin")); code != exitOK || strings.Contains(out, "note:") {
		t.Errorf("validate --plugins: exit %d\n%s", code, out)
	}
	code, out, _ = runCLI(t, "validate", "--plugins", config("broken-plugin"))
	if code != exitFailed || !strings.Contains(out, "broken-plugin.toml:4:1: providers[ext].plugin: starting the plugin to read what it accepts") {
		t.Errorf("validate --plugins with a broken plugin: exit %d\n%s", code, out)
	}
}
