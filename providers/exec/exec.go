// Package exec is the exec provider: each call runs one of the commands
// its config declares, on the machine of the gateway (or of the worker)
// that makes the call.
//
// Config fields: commands (the commands a step may run, by the name its
// action_type gives: argv, or a script run by shell; dir; env; stdin;
// timeout_seconds; and args, the arguments a call may fill, each with a
// type — string, integer, boolean, hostname, path — and a rule), dir (the
// default working directory, /), env (variables for every command,
// secrets included), env_allow (names of the gateway's own variables
// passed through; none by default, and PATH is a fixed system path unless
// allowed), shell (default /bin/sh), max_output_bytes (each of stdout and
// stderr, default 1 MiB), kill_grace_seconds (default 5), ok_exit_codes
// (default [0]) and retryable_exit_codes (default [75], EX_TEMPFAIL); any
// other exit code is a permanent failure.
//
// Payload: args, the values of the command's arguments. Each is checked
// against its declaration here, in the provider, on every call, and
// reaches the command only as CHAINGATE_ARG_NAME in its environment, so
// an alert's label holding "; rm -rf /", "$(…)" or "-delete" is at worst
// a refused argument, and at best a value a script quotes.
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
	"io/fs"
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

var configSchema = `{
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "dir": {"type": "string", "minLength": 1},
    "env": {"type": "object", "additionalProperties": {"type": "string"}},
    "env_allow": {"type": "array", "items": {"type": "string", "minLength": 1}},
    "shell": {"type": "string", "minLength": 1},` + command.CommandsSchema(command.Local) + command.LimitsSchema + `
  }
}`

type config struct {
	command.Limits
	Dir      string            `json:"dir"`
	Env      map[string]string `json:"env"`
	EnvAllow []string          `json:"env_allow"`
	Shell    string            `json:"shell"`
	// Commands are decoded by command.DecodeCommands.
	Commands json.RawMessage `json:"commands"`

	commands command.Commands
}

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

// CheckCall implements providers.CallChecker: the call's command and
// arguments as Execute checks them, paths by their text alone, since the
// machine that checks may not be the one that runs.
func (Provider) CheckCall(_ context.Context, raw json.RawMessage, call providers.Call) error {
	cmds, err := command.DecodeCommands(raw, command.Local)
	if err != nil {
		return err
	}
	_, _, err = cmds.Resolve(call, command.LocalPayloadKeys, nil)
	return err
}

func decodeConfig(raw json.RawMessage) (config, error) {
	var cfg config
	err := apicall.DecodeStrict(raw, &cfg)
	if err != nil {
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
	if cfg.commands, err = command.DecodeCommands(raw, command.Local); err != nil {
		return cfg, err
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
	inv, _, err := cfg.commands.Resolve(providers.Call{Name: req.Step, ActionType: req.ActionType, Payload: req.Payload}, command.LocalPayloadKeys, confine)
	if err != nil {
		return providers.Response{}, err
	}
	argv := inv.Program(cfg.Shell, req.Step)
	dir := cfg.Dir
	if inv.Dir != "" {
		dir = inv.Dir
	}
	name := argv[0]
	if strings.Contains(name, "/") && !filepath.IsAbs(name) {
		// As the command will run: from dir, not from the gateway's.
		name = filepath.Join(dir, name)
	}
	program, err := osexec.LookPath(name)
	if err != nil {
		return providers.Response{}, providers.Permanent("not_found", "finding the program %q: %v", argv[0], err)
	}
	if info, err := os.Stat(dir); err != nil || !info.IsDir() {
		return providers.Response{}, providers.Permanent("bad_config", "the working directory %s is not a directory on this machine", dir)
	}

	if t := inv.Timeout(); t > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t)
		defer cancel()
	}
	stdout, stderr := command.NewOutput(cfg.MaxOutputBytes), command.NewOutput(cfg.MaxOutputBytes)
	started := time.Now()
	exit, warning, err := run(ctx, job{
		program: program, args: argv[1:], dir: dir, env: environ(cfg, inv, req),
		stdin: strings.NewReader(inv.Stdin), stdout: stdout, stderr: stderr, grace: cfg.KillGrace(), lock: req.DedupKey,
	})
	switch {
	case err != nil && ctx.Err() != nil:
		return providers.Response{}, ended(ctx, inv)
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
func ended(ctx context.Context, inv *command.Invocation) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		took := "the step's timeout"
		if inv.TimeoutSeconds > 0 {
			took = fmt.Sprintf("the command's timeout_seconds = %g", inv.TimeoutSeconds)
		}
		return &providers.Error{Retryable: true, Code: "timeout", Message: "the command ran past " + took + "; its process group was stopped", Err: ctx.Err()}
	}
	return &providers.Error{Retryable: true, Code: "cancelled", Message: "the step was cancelled; the command's process group was stopped", Err: ctx.Err()}
}

// environ is the command's environment: nothing of the gateway's but what
// env_allow names, then the config's, the command's, its arguments' and
// the gateway's own variables, each over the one before.
func environ(cfg config, inv *command.Invocation, req providers.Request) []string {
	base := map[string]string{"PATH": DefaultPath}
	for _, name := range cfg.EnvAllow {
		if v, ok := os.LookupEnv(name); ok {
			base[name] = v
		}
	}
	maps.Copy(base, cfg.Env)
	env := inv.Environ(base, req)
	out := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}

// confine checks that a path argument lies in one of its roots as this
// machine resolves both, symbolic links followed: a link under /var/log
// that leads to /etc is refused.
func confine(p string, roots []string) error {
	real, err := resolve(p)
	if err != nil {
		return err
	}
	var realRoots []string
	for _, r := range roots {
		rr, err := resolve(r)
		if err != nil {
			return err
		}
		realRoots = append(realRoots, rr)
	}
	if !command.Within(real, realRoots) {
		return fmt.Errorf("resolves to %s through a symbolic link, which is not under %s", real, strings.Join(roots, " or "))
	}
	return nil
}

// resolve is p with the symbolic links of its longest existing prefix
// followed; what does not exist yet is kept as written.
func resolve(p string) (string, error) {
	rest := ""
	for cur := p; ; {
		real, err := filepath.EvalSymlinks(cur)
		if err == nil {
			return filepath.Join(real, rest), nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("resolving %s: %w", cur, err)
		}
		if fi, lerr := os.Lstat(cur); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
			return "", fmt.Errorf("%s is a symbolic link that leads nowhere", cur)
		}
		parent := filepath.Dir(cur)
		if parent == cur {
			return p, nil
		}
		rest = filepath.Join(filepath.Base(cur), rest)
		cur = parent
	}
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
	// lock is the step's dedup key: the supervisor holds a lock named
	// after it for as long as the command's group lives, so that a step
	// run again never runs beside what is left of an earlier attempt.
	lock string
}
