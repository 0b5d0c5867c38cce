// Package command is what the exec and ssh providers share: the step's
// payload, the limits and exit-code rules of their configs, output capped
// as it is read, and the shape of a result.
//
// A command is an argument vector. Templates fill whole arguments and
// environment values, never a shell line; a shell runs only when the step
// says shell = true, and then its script is literal text that reads the
// step's values from the environment.
package command

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
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

// Spec is what a step asks to run: a payload's fields common to exec and
// ssh.
type Spec struct {
	// Command is the argument vector; its first element names the program.
	Command []string `json:"command"`
	// Shell runs Script with the shell instead of Command.
	Shell  bool   `json:"shell"`
	Script string `json:"script"`
	// Env is set in the command's environment, over the config's.
	Env Env `json:"env"`
	// Stdin is written to the command's standard input.
	Stdin          string  `json:"stdin"`
	TimeoutSeconds float64 `json:"timeout_seconds"`
}

// SpecKeys are the payload keys of a Spec.
var SpecKeys = []string{"command", "shell", "script", "env", "stdin", "timeout_seconds"}

// DecodePayload decodes a payload into v, refusing any key that is not
// exactly one of keys. encoding/json alone would take "Command" for
// "command", a key the gateway's load-time checks do not read.
func DecodePayload(raw json.RawMessage, keys []string, v any) error {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return fmt.Errorf("the payload must be a JSON object: %w", err)
	}
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		if !slices.Contains(keys, k) {
			return fmt.Errorf("unknown payload key %q; the keys are %s", k, strings.Join(keys, ", "))
		}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Env is a table of environment variables. A template that is a whole
// value keeps the value's type, so a number or a boolean from a payload is
// taken as its JSON text, and an object or array as its JSON.
type Env map[string]string

func (e *Env) UnmarshalJSON(b []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return fmt.Errorf("env must be a table of NAME = value: %w", err)
	}
	*e = make(Env, len(raw))
	for k, v := range raw {
		var s string
		switch {
		case json.Unmarshal(v, &s) == nil:
			(*e)[k] = s
		case string(v) == "null":
			(*e)[k] = ""
		default:
			var buf bytes.Buffer
			if err := json.Compact(&buf, v); err != nil {
				return fmt.Errorf("env %s: %w", k, err)
			}
			(*e)[k] = buf.String()
		}
	}
	return nil
}

// Check says what is wrong with a spec, if anything.
func (s *Spec) Check() error {
	switch {
	case s.Shell && len(s.Command) > 0:
		return errors.New("give command or shell = true with script, not both")
	case s.Shell && strings.TrimSpace(s.Script) == "":
		return errors.New("shell = true needs a script")
	case !s.Shell && s.Script != "":
		return errors.New("a script runs only with shell = true; or give the program and its arguments as command = [...]")
	case !s.Shell && len(s.Command) == 0:
		return errors.New("give command = [program, args...], or shell = true with a script")
	case !s.Shell && s.Command[0] == "":
		return errors.New("command[0], the program, is empty")
	case s.TimeoutSeconds < 0:
		return errors.New("timeout_seconds must not be negative")
	}
	for i, a := range s.Command {
		if strings.ContainsRune(a, 0) {
			return fmt.Errorf("command[%d] holds a NUL byte, which no argument can carry", i)
		}
	}
	if strings.ContainsRune(s.Script, 0) {
		return errors.New("the script holds a NUL byte")
	}
	return CheckEnv(s.Env)
}

// CheckEnv checks the names and values of an environment table.
func CheckEnv(env map[string]string) error {
	for _, k := range slices.Sorted(maps.Keys(env)) {
		switch {
		case !envName.MatchString(k):
			return fmt.Errorf("env name %q is not a valid variable name (letters, digits and _, not starting with a digit)", k)
		case strings.HasPrefix(k, "CHAINGATE_"):
			return fmt.Errorf("env name %q: the CHAINGATE_ prefix is the gateway's own (%s and the like)", k, EnvDedupKey)
		case strings.ContainsRune(env[k], 0):
			return fmt.Errorf("env %s holds a NUL byte, which no variable can carry", k)
		}
	}
	return nil
}

// Timeout is the spec's own timeout; zero when it sets none.
func (s *Spec) Timeout() time.Duration {
	return time.Duration(s.TimeoutSeconds * float64(time.Second))
}

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

// SpecSchema are the JSON Schema properties of a Spec.
const SpecSchema = `
    "command": {"type": "array", "minItems": 1, "items": {"type": "string"}},
    "shell": {"type": "boolean"},
    "script": {"type": "string"},
    "env": {"type": "object"},
    "stdin": {"type": "string"},
    "timeout_seconds": {"type": "number", "minimum": 0}`

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
