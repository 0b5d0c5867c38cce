// Package exec is the exec provider: each call runs one command on the
// machine of the gateway (or of the worker) that makes the call.
//
// Payload fields: command (the argument vector, its first element the
// program, looked up in the gateway's PATH when it has no slash), or shell
// = true with a script run by the config's shell; env (variables set for
// the command); stdin; timeout_seconds. Templates fill whole arguments and
// values: an alert's label holding "; rm -rf /" or "$(…)" reaches the
// program as that literal text. A script is literal too — the gateway
// refuses a template in its text — and reads the step's values from env.
//
// Config fields: dir (the working directory, default /), env (variables
// for every call, secrets included), env_allow (names of the gateway's
// own variables passed through; none by default, and PATH is a fixed
// system path unless allowed), shell (default /bin/sh), max_output_bytes
// (each of stdout and stderr, default 1 MiB), kill_grace_seconds (default
// 5), ok_exit_codes (default [0]) and retryable_exit_codes (default [75],
// EX_TEMPFAIL); any other exit code is a permanent failure.
//
// Every command gets CHAINGATE_DEDUP_KEY, the step's dedup key, the same
// on every attempt and after a restart, and CHAINGATE_RUN_ID,
// CHAINGATE_STEP and CHAINGATE_ATTEMPT. It runs in a process group of its
// own under a small supervisor (the gateway's own binary): a timeout or a
// cancelled step sends TERM to the whole group, then KILL after the grace;
// what the command left running when it exits is killed; and the group
// goes when the gateway does, however it ends.
//
// The result body is {"exit_code", "stdout", "stderr", "stdout_bytes",
// "stderr_bytes", "duration_ms"}, with stdout parsed when it is a JSON
// object or array and *_truncated set when output went past the cap. A
// command killed by a signal exits 128 plus the signal's number, as a
// shell reports it.
//
// It is the gateway's own package, with no compatibility promise.
package exec

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	osexec "os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/chaingate/gateway/plugins"
	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/internal/apicall"
	"github.com/chaingate/gateway/providers/internal/command"
)

// DefaultPath is the PATH a command gets unless env_allow passes the
// gateway's own.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

const configSchema = `{
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "dir": {"type": "string", "minLength": 1},
    "env": {"type": "object", "additionalProperties": {"type": "string"}},
    "env_allow": {"type": "array", "items": {"type": "string", "minLength": 1}},
    "shell": {"type": "string", "minLength": 1},` + command.LimitsSchema + `
  }
}`

type config struct {
	command.Limits
	Dir      string            `json:"dir"`
	Env      map[string]string `json:"env"`
	EnvAllow []string          `json:"env_allow"`
	Shell    string            `json:"shell"`
}

// PayloadKeys are the keys a payload takes, exactly as written; gateway
// validate checks the same keys.
var PayloadKeys = command.SpecKeys

// Provider is the exec provider.
type Provider struct {
	// log reaches the gateway's log: what a result's warning says is said
	// there too, where the on-call engineer looks.
	log *slog.Logger
}

// New returns the exec provider.
func New() providers.Provider { return Provider{log: plugins.NewLogger(slog.LevelWarn)} }

func (Provider) Describe(context.Context) (providers.Info, error) {
	return providers.Info{Name: "exec", Version: "1", ConfigSchema: json.RawMessage(configSchema)}, nil
}

// CheckConfig implements providers.ConfigChecker.
func (Provider) CheckConfig(_ context.Context, raw json.RawMessage) error {
	_, err := decodeConfig(raw)
	return err
}

func decodeConfig(raw json.RawMessage) (config, error) {
	var cfg config
	if err := apicall.DecodeStrict(raw, &cfg); err != nil {
		return cfg, fmt.Errorf("decoding exec config: %w", err)
	}
	if err := cfg.Limits.Check(); err != nil {
		return cfg, err
	}
	if err := command.CheckEnv(cfg.Env); err != nil {
		return cfg, fmt.Errorf("config %w", err)
	}
	for _, name := range cfg.EnvAllow {
		if strings.HasPrefix(name, "CHAINGATE_") {
			return cfg, fmt.Errorf("env_allow: %q is the gateway's own; its values are set for every command anyway", name)
		}
	}
	if cfg.Dir != "" && !filepath.IsAbs(cfg.Dir) {
		return cfg, fmt.Errorf("dir %q must be an absolute path", cfg.Dir)
	}
	if cfg.Shell != "" && !filepath.IsAbs(cfg.Shell) {
		return cfg, fmt.Errorf("shell %q must be an absolute path", cfg.Shell)
	}
	cfg.Limits = cfg.Limits.Defaulted()
	if cfg.Dir == "" {
		cfg.Dir = "/"
	}
	if cfg.Shell == "" {
		cfg.Shell = "/bin/sh"
	}
	return cfg, nil
}

func (p Provider) Execute(ctx context.Context, req providers.Request) (providers.Response, error) {
	cfg, err := decodeConfig(req.Config)
	if err != nil {
		return providers.Response{}, providers.Permanent("bad_config", "%v", err)
	}
	var spec command.Spec
	if err := command.DecodePayload(req.Payload, PayloadKeys, &spec); err != nil {
		return providers.Response{}, providers.Permanent("bad_payload", "decoding the exec payload: %v", err)
	}
	if err := spec.Check(); err != nil {
		return providers.Response{}, providers.Permanent("bad_payload", "%v", err)
	}
	argv := spec.Command
	if spec.Shell {
		// $0 names the step in ps and in the shell's own messages.
		argv = []string{cfg.Shell, "-c", spec.Script, "chaingate:" + req.Step}
	}
	name := argv[0]
	if strings.Contains(name, "/") && !filepath.IsAbs(name) {
		// As the command will run: from dir, not from the gateway's.
		name = filepath.Join(cfg.Dir, name)
	}
	program, err := osexec.LookPath(name)
	if err != nil {
		return providers.Response{}, providers.Permanent("not_found", "finding the program %q: %v", argv[0], err)
	}
	if info, err := os.Stat(cfg.Dir); err != nil || !info.IsDir() {
		return providers.Response{}, providers.Permanent("bad_config", "the working directory %s is not a directory on this machine", cfg.Dir)
	}

	if t := spec.Timeout(); t > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t)
		defer cancel()
	}
	stdout, stderr := command.NewOutput(cfg.MaxOutputBytes), command.NewOutput(cfg.MaxOutputBytes)
	started := time.Now()
	exit, warning, err := run(ctx, job{
		program: program, args: argv[1:], dir: cfg.Dir, env: environ(cfg, spec, req),
		stdin: strings.NewReader(spec.Stdin), stdout: stdout, stderr: stderr, grace: cfg.KillGrace(),
	})
	switch {
	case err != nil && ctx.Err() != nil:
		return providers.Response{}, ended(ctx, spec)
	case errors.As(err, new(*providers.Error)):
		return providers.Response{}, err
	case err != nil:
		return providers.Response{}, providers.Retryable("start_failed", "running %s: %v", argv[0], err)
	}
	res := command.NewResult(exit, stdout, stderr, time.Since(started))
	if res.Warning = warning; warning != "" {
		p.log.Warn("exec: "+warning, "run", req.RunID, "step", req.Step, "program", argv[0])
	}
	return command.Judge(res, cfg.Limits)
}

// ended is the failure of a command stopped because its time ran out or
// its step was cancelled.
func ended(ctx context.Context, spec command.Spec) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		took := "the step's timeout"
		if spec.TimeoutSeconds > 0 {
			took = fmt.Sprintf("timeout_seconds = %g", spec.TimeoutSeconds)
		}
		return &providers.Error{Retryable: true, Code: "timeout", Message: "the command ran past " + took + "; its process group was stopped", Err: ctx.Err()}
	}
	return &providers.Error{Retryable: true, Code: "cancelled", Message: "the step was cancelled; the command's process group was stopped", Err: ctx.Err()}
}

// environ is the command's environment: nothing of the gateway's but what
// env_allow names, then the config's, the step's and the gateway's own
// variables, each over the one before.
func environ(cfg config, spec command.Spec, req providers.Request) []string {
	env := map[string]string{"PATH": DefaultPath}
	for _, name := range cfg.EnvAllow {
		if v, ok := os.LookupEnv(name); ok {
			env[name] = v
		}
	}
	maps.Copy(env, cfg.Env)
	maps.Copy(env, spec.Env)
	maps.Copy(env, command.GatewayEnv(req))
	out := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}

// job is one command to run.
type job struct {
	program string
	args    []string
	dir     string
	env     []string
	stdin   io.Reader
	stdout  io.Writer
	stderr  io.Writer
	grace   time.Duration
}
