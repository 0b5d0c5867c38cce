package command_test

import (
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/internal/command"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// decl decodes a commands table written as JSON.
func decl(t *testing.T, where command.Where, commands string) (command.Commands, error) {
	t.Helper()
	return command.DecodeCommands(json.RawMessage(`{"commands": `+commands+`}`), where)
}

func TestDecodeCommands(t *testing.T) {
	for _, tc := range []struct {
		name, commands, err string
		where               command.Where
	}{
		{"argv", `{"df": {"argv": ["df", "-h"]}}`, "", command.Local},
		{"script with args", `{"usage": {"script": "du -sh -- \"$CHAINGATE_ARG_PATH\"", "args": {"path": {"type": "path", "roots": ["/var"]}}}}`, "", command.Local},
		{"every type", `{"x": {"argv": ["true"], "args": {
			"s": {"type": "string", "pattern": "[a-z]+", "max_length": 10, "min_length": 0},
			"e": {"type": "string", "enum": ["a", "b"], "default": "a"},
			"i": {"type": "integer", "min": -5, "max": 5},
			"b": {"type": "boolean", "required": false},
			"h": {"type": "hostname", "pattern": ".*\\.example\\.com"},
			"p": {"type": "path", "roots": ["/var/log", "/srv"]}}}}`, "", command.Local},
		{"remote user", `{"x": {"argv": ["true"], "user": "ops"}}`, "", command.Remote},
		{"remote shell by name", `{"x": {"script": "true", "shell": "bash"}}`, "", command.Remote},
		{"neither", `{"x": {}}`, "give argv", command.Local},
		{"both", `{"x": {"argv": ["true"], "script": "true"}}`, "not both", command.Local},
		{"empty program", `{"x": {"argv": [""]}}`, "argv[0], the program, is empty", command.Local},
		{"blank script", `{"x": {"script": "  "}}`, "give argv", command.Local},
		{"shell with argv", `{"x": {"argv": ["true"], "shell": "/bin/bash"}}`, "shell runs a script", command.Local},
		{"relative shell", `{"x": {"script": "true", "shell": "bash"}}`, "absolute path", command.Local},
		{"relative dir", `{"x": {"argv": ["true"], "dir": "tmp"}}`, "absolute path", command.Local},
		{"local user", `{"x": {"argv": ["true"], "user": "root"}}`, "user is for commands run over ssh", command.Local},
		{"bad user", `{"x": {"argv": ["true"], "user": "-oProxyCommand"}}`, "not a user name", command.Remote},
		{"remote program with =", `{"x": {"argv": ["A=b", "true"]}}`, "env(1) on the host", command.Remote},
		{"case of a key", `{"x": {"Argv": ["true"]}}`, `unknown key "Argv"`, command.Local},
		{"unknown key", `{"x": {"argv": ["true"], "command": ["x"]}}`, `unknown key "command"`, command.Local},
		{"NUL", `{"x": {"argv": ["echo", "a\u0000b"]}}`, "NUL", command.Local},
		{"env name", `{"x": {"argv": ["true"], "env": {"1X": "y"}}}`, "not a valid variable name", command.Local},
		{"env of the gateway", `{"x": {"argv": ["true"], "env": {"CHAINGATE_ARG_X": "y"}}}`, "CHAINGATE_ prefix", command.Local},
		{"command name", `{"x y": {"argv": ["true"]}}`, "not a command name", command.Local},
		{"reserved name", `{"chaingate.probe": {"argv": ["true"]}}`, "gateway's own", command.Local},
		{"arg name", `{"x": {"argv": ["true"], "args": {"Path": {"type": "string"}}}}`, "lower-case", command.Local},
		{"arg type", `{"x": {"argv": ["true"], "args": {"a": {"type": "code"}}}}`, "not an argument type", command.Local},
		{"arg without type", `{"x": {"argv": ["true"], "args": {"a": {}}}}`, "not an argument type", command.Local},
		{"option of another type", `{"x": {"argv": ["true"], "args": {"a": {"type": "integer", "pattern": "[0-9]+"}}}}`, "pattern does not apply to a integer", command.Local},
		{"bad pattern", `{"x": {"argv": ["true"], "args": {"a": {"type": "string", "pattern": "(["}}}}`, "pattern", command.Local},
		{"path without roots", `{"x": {"argv": ["true"], "args": {"a": {"type": "path"}}}}`, "roots", command.Local},
		{"relative root", `{"x": {"argv": ["true"], "args": {"a": {"type": "path", "roots": ["var/log"]}}}}`, "absolute path written plainly", command.Local},
		{"unclean root", `{"x": {"argv": ["true"], "args": {"a": {"type": "path", "roots": ["/var/log/../.."]}}}}`, "absolute path written plainly", command.Local},
		{"default fails its rule", `{"x": {"argv": ["true"], "args": {"a": {"type": "string", "pattern": "[a-z]+", "default": "A"}}}}`, "default", command.Local},
		{"enum fails the type", `{"x": {"argv": ["true"], "args": {"a": {"type": "hostname", "enum": ["-x"]}}}}`, "enum[0]", command.Local},
		{"min above max", `{"x": {"argv": ["true"], "args": {"a": {"type": "integer", "min": 5, "max": 1}}}}`, "min is above max", command.Local},
		{"required with default", `{"x": {"argv": ["true"], "args": {"a": {"type": "boolean", "required": true, "default": true}}}}`, "not required", command.Local},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decl(t, tc.where, tc.commands)
			switch {
			case tc.err == "" && err != nil:
				t.Fatal(err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("err %v, want %q", err, tc.err)
			}
		})
	}
}

// TestArgs runs values, hostile ones first among them, through each
// argument type: what passes reaches the command as the text shown.
func TestArgs(t *testing.T) {
	long := strings.Repeat("a", 100<<10)
	for _, tc := range []struct {
		name  string
		arg   string // the declaration, as JSON
		value string // the value, as JSON
		want  string // the text the command gets
		err   string
	}{
		{"string", `{"type": "string"}`, `"nginx"`, "nginx", ""},
		{"string from a number", `{"type": "string"}`, `90`, "90", ""},
		{"string from a boolean", `{"type": "string"}`, `true`, "true", ""},
		{"shell code is text", `{"type": "string"}`, `"$(touch F); touch F #"`, "$(touch F); touch F #", ""},
		{"backquotes are text", `{"type": "string"}`, "\"`touch F`\"", "`touch F`", ""},
		{"leading dash", `{"type": "string"}`, `"-delete"`, "", "starts with '-'"},
		{"long option", `{"type": "string"}`, `"--help"`, "", "starts with '-'"},
		{"negative number as string", `{"type": "string"}`, `-5`, "", "starts with '-'"},
		{"leading dash allowed", `{"type": "string", "allow_leading_dash": true}`, `"-x"`, "-x", ""},
		{"newline", `{"type": "string"}`, `"a\ntouch F"`, "", "control character (U+000A at byte 1)"},
		{"carriage return", `{"type": "string"}`, `"a\rb"`, "", "control character"},
		{"escape", `{"type": "string"}`, `"\u001b[2J"`, "", "control character"},
		{"NUL", `{"type": "string"}`, `"a\u0000b"`, "", "control character"},
		{"C1 control", `{"type": "string"}`, `"a\u0085b"`, "", "control character"},
		{"empty", `{"type": "string"}`, `""`, "", "is empty"},
		{"empty allowed", `{"type": "string", "min_length": 0}`, `""`, "", ""},
		{"100 KB", `{"type": "string"}`, `"` + long + `"`, "", "over max_length = 1024"},
		{"max_length counts characters", `{"type": "string", "max_length": 2}`, `"éé"`, "éé", ""},
		{"pattern is anchored", `{"type": "string", "pattern": "[a-z]+"}`, `"abc; touch F"`, "", "does not match the pattern [a-z]+"},
		{"pattern alternatives are anchored", `{"type": "string", "pattern": "a|b"}`, `"ab"`, "", "does not match"},
		{"pattern", `{"type": "string", "pattern": "[a-z]+"}`, `"abc"`, "abc", ""},
		{"enum", `{"type": "string", "enum": ["nginx", "php-fpm"]}`, `"sshd"`, "", `is not one of "nginx", "php-fpm"`},
		{"a table", `{"type": "string"}`, `{"a": 1}`, "", "is not a table"},
		{"a list", `{"type": "string"}`, `["a"]`, "", "is not a list"},
		{"null", `{"type": "string"}`, `null`, "", "is null"},
		{"integer", `{"type": "integer"}`, `42`, "42", ""},
		{"integer from a string", `{"type": "integer"}`, `"042"`, "42", ""},
		{"negative integer", `{"type": "integer"}`, `-1`, "", "is negative"},
		{"negative allowed", `{"type": "integer", "min": -10}`, `-1`, "-1", ""},
		{"integer over max", `{"type": "integer", "max": 100}`, `101`, "", "over max = 100"},
		{"integer with code", `{"type": "integer"}`, `"1; touch F"`, "", "not an integer"},
		{"integer with plus", `{"type": "integer"}`, `"+1"`, "", "not an integer"},
		{"fraction", `{"type": "integer"}`, `1.5`, "", "not an integer"},
		{"huge", `{"type": "integer"}`, `99999999999999999999`, "", "not an integer"},
		{"boolean", `{"type": "boolean"}`, `true`, "true", ""},
		{"boolean from a string", `{"type": "boolean"}`, `"false"`, "false", ""},
		{"boolean with code", `{"type": "boolean"}`, `"true; touch F"`, "", "not true or false"},
		{"hostname", `{"type": "hostname"}`, `"db-1.prod.example.com"`, "db-1.prod.example.com", ""},
		{"hostname address", `{"type": "hostname"}`, `"10.0.0.7"`, "10.0.0.7", ""},
		{"hostname v6", `{"type": "hostname"}`, `"fd00::7"`, "fd00::7", ""},
		{"hostname option", `{"type": "hostname"}`, `"-oProxyCommand=touch F"`, "", "not a host name"},
		{"hostname with code", `{"type": "hostname"}`, `"a.com;touch F"`, "", "not a host name"},
		{"hostname with port", `{"type": "hostname"}`, `"a.com:22"`, "", "not a host name"},
		{"hostname with zone", `{"type": "hostname"}`, `"fe80::1%eth0"`, "", "zone"},
		{"hostname pattern", `{"type": "hostname", "pattern": "[a-z0-9-]+\\.prod\\.example\\.com"}`, `"db-1.evil.com"`, "", "does not match"},
		{"path", `{"type": "path", "roots": ["/var/log"]}`, `"/var/log/nginx"`, "/var/log/nginx", ""},
		{"path is the root", `{"type": "path", "roots": ["/var/log"]}`, `"/var/log"`, "/var/log", ""},
		{"path cleaned", `{"type": "path", "roots": ["/var/log"]}`, `"/var/log//nginx/./"`, "/var/log/nginx", ""},
		{"path option", `{"type": "path", "roots": ["/var/log"]}`, `"-delete"`, "", "not an absolute path; it must lie under /var/log"},
		{"path relative", `{"type": "path", "roots": ["/var/log"]}`, `"nginx"`, "", "not an absolute path"},
		{"path climbing", `{"type": "path", "roots": ["/var/log"]}`, `"/var/log/../../etc"`, "", "holds '..'"},
		{"path climbing back in", `{"type": "path", "roots": ["/var/log"]}`, `"/var/log/../log/x"`, "", "holds '..'"},
		{"path outside", `{"type": "path", "roots": ["/var/log"]}`, `"/var/logs"`, "", "not under /var/log"},
		{"path of roots", `{"type": "path", "roots": ["/var/log", "/srv"]}`, `"/etc"`, "", "not under /var/log or /srv"},
		{"path with code", `{"type": "path", "roots": ["/var/log"]}`, `"/var/log/$(touch F)"`, "/var/log/$(touch F)", ""},
		{"path with newline", `{"type": "path", "roots": ["/var/log"]}`, `"/var/log/a\n-delete"`, "", "control character"},
		{"path too long", `{"type": "path", "roots": ["/var/log"], "max_length": 20}`, `"/var/log/aaaaaaaaaaaaaaaaaaaaa"`, "", "over max_length = 20"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmds, err := decl(t, command.Local, `{"x": {"argv": ["true"], "args": {"a": `+tc.arg+`}}}`)
			if err != nil {
				t.Fatal(err)
			}
			inv, _, err := cmds.Resolve(providers.Call{ActionType: "x", Payload: json.RawMessage(`{"args": {"a": ` + tc.value + `}}`)}, command.LocalPayloadKeys, nil)
			switch {
			case tc.err == "" && err != nil:
				t.Fatal(err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("err %v, want %q", err, tc.err)
			case tc.err != "":
				var pe *providers.Error
				if !errors.As(err, &pe) || pe.Retryable || pe.Code != "bad_argument" || !strings.Contains(pe.Message, `argument "a"`) {
					t.Fatalf("err %#v, want a permanent bad_argument naming the argument", err)
				}
				if len(err.Error()) > 600 {
					t.Errorf("the message quotes too much of the value: %d bytes", len(err.Error()))
				}
			case tc.want != "" && inv.ArgEnv["CHAINGATE_ARG_A"] != tc.want:
				t.Fatalf("CHAINGATE_ARG_A = %q, want %q", inv.ArgEnv["CHAINGATE_ARG_A"], tc.want)
			}
		})
	}
}

func TestResolve(t *testing.T) {
	cmds, err := decl(t, command.Remote, `{
		"clean": {"script": "true", "args": {
			"dir": {"type": "path", "roots": ["/var/log"]},
			"days": {"type": "integer", "min": 1, "default": 7},
			"token": {"type": "string", "secret": true, "pattern": "[a-f0-9]{8}"},
			"dry": {"type": "boolean", "required": false}}},
		"df": {"argv": ["df", "-h"]}}`)
	if err != nil {
		t.Fatal(err)
	}
	call := func(action, payload string, written bool, holes map[string]string) (*command.Invocation, command.Payload, error) {
		return cmds.Resolve(providers.Call{Name: "step", ActionType: action, Payload: json.RawMessage(payload), Written: written, Templates: holes}, command.RemotePayloadKeys, nil)
	}
	inv, pl, err := call("clean", `{"host": "web-1", "args": {"dir": "/var/log/app", "token": "deadbeef"}}`, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if pl.Host != "web-1" || inv.Name != "clean" || len(inv.ArgEnv) != 3 || inv.ArgEnv["CHAINGATE_ARG_DAYS"] != "7" || inv.ArgEnv["CHAINGATE_ARG_DIR"] != "/var/log/app" {
		t.Fatalf("invocation %+v, payload %+v", inv, pl)
	}
	if _, _, err := call("df", ``, false, nil); err != nil {
		t.Errorf("no payload: %v", err)
	}
	for _, tc := range []struct {
		name, action, payload string
		written               bool
		holes                 map[string]string
		err                   string
	}{
		{"no action type", "", `{}`, false, nil, `no action_type: a call names the command it runs, one of "clean", "df"`},
		{"unknown command", "rm", `{}`, false, nil, `declares no command "rm"; it declares "clean", "df"`},
		{"missing argument", "clean", `{"args": {"token": "deadbeef"}}`, false, nil, `argument "dir" is required`},
		{"unknown argument", "clean", `{"args": {"dir": "/var/log", "token": "deadbeef", "DIR": "/"}}`, false, nil, `argument "DIR" is not one command "clean" declares`},
		{"several problems", "clean", `{"args": {"dir": "/etc", "token": "x", "days": 0}}`, false, nil, `argument "days": 0 is under min = 1; argument "dir": "/etc" is not under /var/log; argument "token": (a secret value of 3 bytes) does not match`},
		{"unknown key", "clean", `{"Args": {}}`, false, nil, `unknown payload key "Args"; the payload takes args, host`},
		{"not a table", "clean", `"<<origin.payload>>"`, false, nil, "the payload must be a table"},
		{"args not a table", "clean", `{"args": ["/var/log"]}`, false, nil, "args must be a table"},
		{"null at run time", "clean", `{"args": {"dir": null, "token": "deadbeef"}}`, false, nil, `argument "dir": null is null`},
		{"written: templated values wait", "clean", `{"host": null, "args": {"dir": null, "token": null}}`, true, map[string]string{"/host": "<<h>>", "/args/dir": "<<d>>", "/args/token": "<<t>>"}, ""},
		{"written: whole payload templated", "clean", `null`, true, map[string]string{"": "<<origin.payload>>"}, ""},
		{"written: args templated", "clean", `{"args": null}`, true, map[string]string{"/args": "<<origin.payload.args>>"}, ""},
		{"written: literal values checked", "clean", `{"args": {"dir": "/var/log/../../etc", "token": null}}`, true, map[string]string{"/args/token": "<<t>>"}, "holds '..'"},
		{"written: missing argument", "clean", `{"args": {"token": null}}`, true, map[string]string{"/args/token": "<<t>>"}, `argument "dir" is required`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := call(tc.action, tc.payload, tc.written, tc.holes)
			switch {
			case tc.err == "" && err != nil:
				t.Fatal(err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("err %v, want %q", err, tc.err)
			}
		})
	}
}

func TestInvocationEnviron(t *testing.T) {
	cmds, err := decl(t, command.Local, `{"x": {"script": "true", "env": {"LANG": "C", "A": "command"}, "args": {"a": {"type": "string"}}}}`)
	if err != nil {
		t.Fatal(err)
	}
	inv, _, err := cmds.Resolve(providers.Call{ActionType: "x", Payload: json.RawMessage(`{"args": {"a": "v"}}`)}, command.LocalPayloadKeys, nil)
	if err != nil {
		t.Fatal(err)
	}
	env := inv.Environ(map[string]string{"A": "base", "PATH": "/bin"}, providers.Request{DedupKey: "r/x", RunID: "r", Step: "x", Attempt: 3})
	for k, v := range map[string]string{"A": "command", "PATH": "/bin", "LANG": "C", "CHAINGATE_ARG_A": "v", "CHAINGATE_DEDUP_KEY": "r/x", "CHAINGATE_ATTEMPT": "3"} {
		if env[k] != v {
			t.Errorf("%s = %q, want %q", k, env[k], v)
		}
	}
	if got := strings.Join(inv.Program("/bin/sh", "step"), " "); got != "/bin/sh -c true chaingate:step" {
		t.Errorf("program %q", got)
	}
}

// TestMigration pins the message a payload written for commands given
// whole gets: the declaration and the call that replace it.
func TestMigration(t *testing.T) {
	for _, tc := range []struct {
		name    string
		payload string
		holes   map[string]string
	}{
		{"argv", `{"command": ["du", "-sh", "--", null], "timeout_seconds": 30}`, map[string]string{"/command/3": "<<origin.payload.path>>"}},
		{"script", `{"host": null, "shell": true, "script": "set -eu\nfind \"/var/log/$APP\" -name '*.gz' -mtime +7 -delete\n", "env": {"APP": null, "LANG": "C"}}`, map[string]string{"/host": "<<origin.payload.host>>", "/env/APP": "<<origin.payload.app>>"}},
		{"literal argv", `{"command": ["systemctl", "restart", "nginx"]}`, nil},
		{"program from a template", `{"command": [null, "-h"], "stdin": null}`, map[string]string{"/command/0": "<<origin.payload.cmd>>", "/stdin": "<<origin.payload.x>>"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmds, err := decl(t, command.Remote, `{}`)
			if err != nil {
				t.Fatal(err)
			}
			_, _, err = cmds.Resolve(providers.Call{Name: "clean-logs", Payload: json.RawMessage(tc.payload), Written: true, Templates: tc.holes}, command.RemotePayloadKeys, nil)
			if err == nil {
				t.Fatal("a legacy payload passed")
			}
			golden(t, filepath.Join("testdata", "migration", strings.ReplaceAll(tc.name, " ", "-")+".golden"), err.Error()+"\n")
		})
	}
	_, _, err := command.Commands{}.Resolve(providers.Call{Payload: json.RawMessage(`{"command": ["id"]}`)}, command.LocalPayloadKeys, nil)
	if err == nil || !strings.Contains(err.Error(), "[providers.config.commands.NAME]") {
		t.Errorf("at run time: %v", err)
	}
}

func golden(t *testing.T, path, got string) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test -update writes it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs:\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

func TestOutputAndJudge(t *testing.T) {
	out, errs := command.NewOutput(8), command.NewOutput(8)
	_, _ = out.Write([]byte(`{"a": 1}`))
	_, _ = errs.Write([]byte("disk full, really full"))
	limits := command.Limits{}.Defaulted()
	res := command.NewResult(0, out, errs, 0)
	if string(res.Stdout) != `{"a": 1}` || res.Stderr != "disk ful" || !res.StderrTruncated || res.StderrBytes != 22 {
		t.Errorf("result %+v", res)
	}
	if _, err := command.Judge(res, limits); err != nil {
		t.Errorf("exit 0: %v", err)
	}
	res.ExitCode, res.Host = 75, "db-1:22"
	_, err := command.Judge(res, limits)
	if !providers.IsRetryable(err) || !strings.Contains(err.Error(), "exit_75: the command exited with 75 on db-1:22: disk ful") {
		t.Errorf("exit 75: %v", err)
	}
	res.ExitCode = 2
	if _, err := command.Judge(res, limits); err == nil || providers.IsRetryable(err) {
		t.Errorf("exit 2: %v", err)
	}
	// A truncated JSON output is text.
	cut := command.NewOutput(4)
	_, _ = cut.Write([]byte(`{"a": 1}`))
	if got := string(command.NewResult(0, cut, errs, 0).Stdout); got != `"{\"a\""` {
		t.Errorf("truncated JSON: %s", got)
	}
	if err := (command.Limits{OKExitCodes: []int{0, 75}, RetryableExitCodes: []int{75}}).Check(); err == nil {
		t.Error("an exit code both ok and retryable was accepted")
	}
}
