package command_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/internal/command"
)

func TestDecodePayload(t *testing.T) {
	for _, tc := range []struct {
		payload, err string
	}{
		{`{"command": ["df", "-h"], "env": {"N": 90, "B": true, "T": {"a": 1}, "Z": null, "S": "s"}}`, ""},
		{`{"Command": ["sh", "-c", "id"]}`, `unknown payload key "Command"`},
		{`{"command": ["true"], "ENV": {"BASH_ENV": "x"}}`, `unknown payload key "ENV"`},
		{`{"command": "df"}`, "cannot unmarshal"},
		{`"<<origin.payload>>"`, "must be a JSON object"},
		{``, "must be a JSON object"},
	} {
		var spec command.Spec
		err := command.DecodePayload(json.RawMessage(tc.payload), command.SpecKeys, &spec)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.payload, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: %v, want %q", tc.payload, err, tc.err)
		}
		if tc.err == "" {
			want := map[string]string{"N": "90", "B": "true", "T": `{"a":1}`, "Z": "", "S": "s"}
			for k, v := range want {
				if spec.Env[k] != v {
					t.Errorf("env %s = %q, want %q", k, spec.Env[k], v)
				}
			}
		}
	}
}

func TestSpecCheck(t *testing.T) {
	for _, tc := range []struct {
		spec command.Spec
		err  string
	}{
		{command.Spec{Command: []string{"df"}}, ""},
		{command.Spec{Shell: true, Script: "df -h"}, ""},
		{command.Spec{}, "give command"},
		{command.Spec{Shell: true}, "needs a script"},
		{command.Spec{Command: []string{"df"}, Shell: true, Script: "x"}, "not both"},
		{command.Spec{Command: []string{"df"}, Script: "x"}, "only with shell = true"},
		{command.Spec{Command: []string{""}}, "is empty"},
		{command.Spec{Command: []string{"echo", "a\x00b"}}, "NUL"},
		{command.Spec{Command: []string{"df"}, Env: command.Env{"1X": "y"}}, "not a valid variable name"},
		{command.Spec{Command: []string{"df"}, Env: command.Env{"CHAINGATE_DEDUP_KEY": "y"}}, "CHAINGATE_ prefix"},
		{command.Spec{Command: []string{"df"}, TimeoutSeconds: -1}, "negative"},
	} {
		err := tc.spec.Check()
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%+v: %v", tc.spec, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%+v: %v, want %q", tc.spec, err, tc.err)
		}
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
