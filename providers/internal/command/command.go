// Package command is what the exec and ssh providers share: the commands
// their configs declare and the arguments each takes, the one function
// that decides what a call runs (Commands.Resolve), the limits and
// exit-code rules of their configs, output capped as it is read, and the
// shape of a result.
//
// What runs is the config's: a call names a declared command and gives
// values for its declared arguments, each checked against the type and
// rule its declaration gives, and each reaching the command only as the
// value of a variable of the gateway's own prefix (CHAINGATE_ARG_NAME).
// No value a call gives becomes a program, an argument vector, a script,
// a variable's name, a directory or a shell.
package command

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/chaingate/gateway/internal/jsonx"
	"github.com/chaingate/gateway/providers"
)

// The environment a command gets from the gateway, whatever else is set.
const (
	EnvDedupKey = "CHAINGATE_DEDUP_KEY"
	EnvRunID    = "CHAINGATE_RUN_ID"
	EnvStep     = "CHAINGATE_STEP"
	EnvAttempt  = "CHAINGATE_ATTEMPT"
)

// Defaults for a config that leaves them out.
const (
	DefaultMaxOutputBytes = 1 << 20
	DefaultKillGrace      = 5 * time.Second
	// DefaultRetryableExit is EX_TEMPFAIL, what sysexits.h gives a
	// failure worth trying again.
	DefaultRetryableExit = 75
)

// Limits are the keys of a config that bound and judge a command.
type Limits struct {
	// MaxOutputBytes caps each of stdout and stderr as kept.
	MaxOutputBytes int64 `json:"max_output_bytes"`
	// KillGraceSeconds is how long a command has between TERM and KILL.
	KillGraceSeconds float64 `json:"kill_grace_seconds"`
	// OKExitCodes succeed; default [0].
	OKExitCodes []int `json:"ok_exit_codes"`
	// RetryableExitCodes fail retryably; every other exit fails for good.
	RetryableExitCodes []int `json:"retryable_exit_codes"`
}

// LimitsSchema are the JSON Schema properties of Limits, for the providers'
// config schemas.
const LimitsSchema = `
    "max_output_bytes": {"type": "integer", "minimum": 1},
    "kill_grace_seconds": {"type": "number", "minimum": 0},
    "ok_exit_codes": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 255}},
    "retryable_exit_codes": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 255}}`

// Defaulted returns the limits with defaults in place of what is unset.
func (l Limits) Defaulted() Limits {
	if l.MaxOutputBytes <= 0 {
		l.MaxOutputBytes = DefaultMaxOutputBytes
	}
	if l.KillGraceSeconds == 0 {
		l.KillGraceSeconds = DefaultKillGrace.Seconds()
	}
	if l.OKExitCodes == nil {
		l.OKExitCodes = []int{0}
	}
	if l.RetryableExitCodes == nil {
		l.RetryableExitCodes = []int{DefaultRetryableExit}
	}
	return l
}

// Check says what is wrong with the limits, if anything.
func (l Limits) Check() error {
	if l.KillGraceSeconds < 0 {
		return errors.New("kill_grace_seconds must not be negative")
	}
	for _, c := range append(slices.Clone(l.OKExitCodes), l.RetryableExitCodes...) {
		if c < 0 || c > 255 {
			return fmt.Errorf("exit code %d is not one a process can exit with (0 to 255)", c)
		}
	}
	for _, c := range l.OKExitCodes {
		if slices.Contains(l.RetryableExitCodes, c) {
			return fmt.Errorf("exit code %d is both in ok_exit_codes and in retryable_exit_codes", c)
		}
	}
	return nil
}

// KillGrace is how long a command has between TERM and KILL.
func (l Limits) KillGrace() time.Duration {
	return time.Duration(l.KillGraceSeconds * float64(time.Second))
}

// GatewayEnv is the environment every command gets: the step's dedup key,
// stable across retries and restarts, so that a script can make itself
// idempotent, and where the call comes from.
func GatewayEnv(req providers.Request) map[string]string {
	return map[string]string{
		EnvDedupKey: req.DedupKey,
		EnvRunID:    req.RunID,
		EnvStep:     req.Step,
		EnvAttempt:  fmt.Sprint(req.Attempt),
	}
}

// Environ is the variables an invocation sets over base: the command's
// env, its arguments' and the gateway's own, each over the one before.
func (inv *Invocation) Environ(base map[string]string, req providers.Request) map[string]string {
	env := maps.Clone(base)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, inv.Env)
	maps.Copy(env, inv.ArgEnv)
	maps.Copy(env, GatewayEnv(req))
	return env
}

// Program is what an invocation runs: its argv, or its script run by shell
// (the command's own, else the one given), with $0 naming the step in ps
// and in the shell's own messages.
func (inv *Invocation) Program(shell, step string) []string {
	if inv.Script == "" {
		return slices.Clone(inv.Argv)
	}
	if inv.Shell != "" {
		shell = inv.Shell
	}
	return []string{shell, "-c", inv.Script, "chaingate:" + step}
}

// Output keeps the first max bytes written to it and counts the rest.
type Output struct {
	max   int64
	buf   []byte
	total int64
}

// NewOutput returns an Output that keeps at most max bytes.
func NewOutput(max int64) *Output { return &Output{max: max} }

// Write never fails, so that a command writing more than is kept is not
// stopped by a broken pipe.
func (o *Output) Write(p []byte) (int, error) {
	o.total += int64(len(p))
	if room := o.max - int64(len(o.buf)); room > 0 {
		o.buf = append(o.buf, p[:min(int64(len(p)), room)]...)
	}
	return len(p), nil
}

// Truncated reports whether more was written than kept.
func (o *Output) Truncated() bool { return o.total > int64(len(o.buf)) }

// Bytes are the bytes kept.
func (o *Output) Bytes() []byte { return o.buf }

// Result is what a command did, as the step's result body holds it.
type Result struct {
	ExitCode int `json:"exit_code"`
	// Stdout is the output parsed when it is one JSON value, else text.
	Stdout          json.RawMessage `json:"stdout"`
	Stderr          string          `json:"stderr"`
	StdoutTruncated bool            `json:"stdout_truncated,omitempty"`
	StderrTruncated bool            `json:"stderr_truncated,omitempty"`
	StdoutBytes     int64           `json:"stdout_bytes"`
	StderrBytes     int64           `json:"stderr_bytes"`
	DurationMS      int64           `json:"duration_ms"`
	// Host is where an ssh command ran.
	Host string `json:"host,omitempty"`
	// Warning is something about how the command ran that the chain's
	// owner should know, such as an ssh host key left unchecked.
	Warning string `json:"warning,omitempty"`
}

// NewResult shapes what a command printed.
func NewResult(exit int, stdout, stderr *Output, took time.Duration) *Result {
	return &Result{
		ExitCode:        exit,
		Stdout:          stdoutValue(stdout),
		Stderr:          text(stderr.Bytes()),
		StdoutTruncated: stdout.Truncated(),
		StderrTruncated: stderr.Truncated(),
		StdoutBytes:     stdout.total,
		StderrBytes:     stderr.total,
		DurationMS:      took.Milliseconds(),
	}
}

// stdoutValue is the output as JSON when the whole of it is a JSON object
// or array (a truncated one is not), else as a string.
func stdoutValue(o *Output) json.RawMessage {
	b := o.Bytes()
	if t := strings.TrimSpace(string(b)); !o.Truncated() && (strings.HasPrefix(t, "{") || strings.HasPrefix(t, "[")) && json.Valid([]byte(t)) {
		return json.RawMessage(t)
	}
	s, _ := jsonx.Marshal(text(b))
	return s
}

// text is b as a string, bytes that are not UTF-8 replaced, so that a
// binary output cannot make the result unreadable.
func text(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

// snippetBytes is how much of a failed command's output its error holds.
const snippetBytes = 512

// Judge turns a result into the step's answer: a body when the exit code is
// one of ok, else a failure, retryable when the code is one of retryable.
func Judge(r *Result, l Limits) (providers.Response, error) {
	if slices.Contains(l.OKExitCodes, r.ExitCode) {
		body, err := jsonx.Marshal(r)
		if err != nil {
			return providers.Response{}, providers.Permanent("bad_output", "encoding the command's result: %v", err)
		}
		return providers.Response{Body: body}, nil
	}
	what := strings.TrimSpace(r.Stderr)
	if what == "" {
		var s string
		if json.Unmarshal(r.Stdout, &s) == nil {
			what = strings.TrimSpace(s)
		} else {
			what = string(r.Stdout)
		}
	}
	if len(what) > snippetBytes {
		what = "…" + strings.ToValidUTF8(what[len(what)-snippetBytes:], "")
	}
	where := ""
	if r.Host != "" {
		where = " on " + r.Host
	}
	msg := fmt.Sprintf("the command exited with %d%s", r.ExitCode, where)
	if what != "" {
		msg += ": " + what
	}
	code := fmt.Sprintf("exit_%d", r.ExitCode)
	if slices.Contains(l.RetryableExitCodes, r.ExitCode) {
		return providers.Response{}, &providers.Error{Retryable: true, Code: code, Message: msg}
	}
	return providers.Response{}, &providers.Error{Code: code, Message: msg}
}
