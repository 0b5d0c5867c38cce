// Package ssh is the ssh provider: each call runs one of the commands its
// config declares on a remote host over SSH, as the exec provider runs
// one on the gateway's machine.
//
// Payload fields: host (required; "name", "name:port", an IP address or
// "[v6]:port", usually filled from the alert, such as its instance label)
// and args, the values of the command's arguments. The command, its
// arguments' types and rules, its user, directory, environment and
// standard input are the config's (commands, as the exec provider's,
// plus user); each argument's value is checked here, on every call,
// before any connection, and reaches the remote command only as the
// variable CHAINGATE_ARG_NAME, single-quoted for the remote login shell,
// which must be a POSIX one (sh, bash, dash, zsh, ksh).
//
// Config fields: commands; allowed_hosts (required: glob patterns such as
// "web-*.prod.example.com" or "10.0.0.*", a "*" standing for any run of
// characters within one dot-separated label, and "*" alone for any host;
// a host that matches none is refused before any connection); user; port
// (default 22), the one dialled whatever port the payload's host names
// (an instance label's is the exporter's) unless payload_port = true;
// private_key, passphrase and password (credentials, read from secrets);
// known_hosts (the path of an OpenSSH known_hosts file) and/or host_keys
// (pinned host keys, authorized_keys lines), or insecure_ignore_host_key
// = true, which checks nothing and says so on every call; jump_host and
// jump_user (connect through a bastion); connect_timeout_seconds
// (default 10); max_sessions_per_host (default 4); and the exec
// provider's max_output_bytes, kill_grace_seconds, ok_exit_codes and
// retryable_exit_codes. Agents are never forwarded.
//
// A host key that is unknown or differs from the one on record is a
// permanent error naming the host, the key it offered and what was
// checked; so is a refused login. A host that cannot be reached is
// retryable.
//
// Every command runs under a small POSIX sh wrapper (remote.go) that
// reports its process group, takes a lock named after the step's dedup
// key so that no two attempts of one step run at once on a host, and
// watches the session's input: when the connection ends for any reason,
// the command's whole process group is stopped, TERM then KILL. A timeout
// or a cancelled step stops the group the same way. Every command gets
// CHAINGATE_DEDUP_KEY, the step's dedup key, the same on every attempt and
// after a restart, and CHAINGATE_RUN_ID, CHAINGATE_STEP and
// CHAINGATE_ATTEMPT.
//
// Connections are kept and reused across calls, per config, user and
// host, and closed after a spell of idleness. The result body is the exec
// provider's, with "host" set to the address the command ran on.
//
// It is the gateway's own package, with no compatibility promise.
package ssh

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/chaingate/gateway/plugins"
	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/internal/command"
)

var configSchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "title": "ssh provider config",
  "type": "object",
  "additionalProperties": false,
  "required": ["allowed_hosts"],
  "properties": {
    "allowed_hosts": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1},
      "description": "glob patterns a payload's host must match: web-*.prod.example.com, 10.0.0.*"},
    "user": {"type": "string", "minLength": 1, "description": "the user to log in as, unless the payload names one"},
    "port": {"type": "integer", "minimum": 1, "maximum": 65535, "default": 22},
    "payload_port": {"type": "boolean", "description": "use the port a payload's host names (host:port); by default the port is always the config's"},
    "private_key": {"type": "string", "minLength": 1, "x-secret": true,
      "description": "a private key in OpenSSH or PEM form"},
    "passphrase": {"type": "string", "minLength": 1, "x-secret": true,
      "description": "the passphrase of an encrypted private_key"},
    "password": {"type": "string", "minLength": 1, "x-secret": true},
    "known_hosts": {"type": "string", "minLength": 1, "description": "path of an OpenSSH known_hosts file"},
    "host_keys": {"type": "array", "items": {"type": "string", "minLength": 1},
      "description": "pinned host public keys, as authorized_keys lines"},
    "insecure_ignore_host_key": {"type": "boolean", "description": "accept any host key; anyone in the path can answer"},
    "jump_host": {"type": "string", "minLength": 1, "description": "a bastion to connect through, host or host:port"},
    "jump_user": {"type": "string", "minLength": 1},
    "connect_timeout_seconds": {"type": "number", "exclusiveMinimum": 0, "default": 10},
    "max_sessions_per_host": {"type": "integer", "minimum": 1, "default": 4},` + command.CommandsSchema(command.Remote) + command.LimitsSchema + `
  }
}`

// Defaults for a config that leaves them out.
const (
	DefaultPort               = 22
	DefaultConnectTimeout     = 10 * time.Second
	DefaultMaxSessionsPerHost = 4
)

// idleClose is how long a connection no call uses stays open.
const idleClose = 2 * time.Minute

type config struct {
	command.Limits
	AllowedHosts          []string `json:"allowed_hosts"`
	User                  string   `json:"user"`
	Port                  int      `json:"port"`
	PayloadPort           bool     `json:"payload_port"`
	PrivateKey            string   `json:"private_key"`
	Passphrase            string   `json:"passphrase"`
	Password              string   `json:"password"`
	KnownHosts            string   `json:"known_hosts"`
	HostKeys              []string `json:"host_keys"`
	InsecureIgnoreHostKey bool     `json:"insecure_ignore_host_key"`
	JumpHost              string   `json:"jump_host"`
	JumpUser              string   `json:"jump_user"`
	ConnectTimeoutSeconds float64  `json:"connect_timeout_seconds"`
	MaxSessionsPerHost    int      `json:"max_sessions_per_host"`
	// Commands are decoded by command.DecodeCommands.
	Commands json.RawMessage `json:"commands"`
}

// Provider is the ssh provider. It keeps its connections for as long as
// it lives, which is as long as its plugin process.
type Provider struct {
	log   *slog.Logger
	pool  *pool
	slots *slots

	mu sync.Mutex
	// parsed holds decoded configs by the hash of their JSON, so that an
	// encrypted key's slow key derivation is not paid on every call.
	parsed map[[sha256.Size]byte]*settings
}

// New returns an ssh provider with an empty connection pool.
func New() providers.Provider {
	return &Provider{
		// Built-in providers run in a plugin process, whose log lines
		// reach the gateway's log.
		log:    plugins.NewLogger(slog.LevelWarn),
		pool:   newPool(idleClose),
		slots:  newSlots(),
		parsed: map[[sha256.Size]byte]*settings{},
	}
}

func (p *Provider) Describe(context.Context) (providers.Info, error) {
	return providers.Info{Name: "ssh", Version: "1", ConfigSchema: json.RawMessage(configSchema)}, nil
}

// CheckConfig implements providers.ConfigChecker.
func (p *Provider) CheckConfig(_ context.Context, raw json.RawMessage) error {
	_, err := decodeConfig(raw)
	return err
}

// CheckCall implements providers.CallChecker: the call's command and
// arguments as Execute checks them, and a host written in the config
// against allowed_hosts. The rest of the config (its keys, which read
// secrets) is not needed to tell, and is checked by CheckConfig.
func (p *Provider) CheckCall(_ context.Context, raw json.RawMessage, call providers.Call) error {
	cmds, err := command.DecodeCommands(raw, command.Remote)
	if err != nil {
		return err
	}
	inv, pl, err := cmds.Resolve(call, command.RemotePayloadKeys, nil)
	if err != nil || pl.Host == "" {
		return err
	}
	s, err := hostSettings(raw)
	if err != nil {
		return err
	}
	_, err = s.target(pl.Host, inv.User)
	return err
}

// maxParsed bounds the decoded configs kept; a provider sees one config,
// or a few across reloads.
const maxParsed = 16

// settings returns the decoded config, from the cache when it was seen.
func (p *Provider) settings(raw json.RawMessage) (*settings, error) {
	sum := sha256.Sum256(raw)
	p.mu.Lock()
	s, ok := p.parsed[sum]
	p.mu.Unlock()
	if ok {
		return s, nil
	}
	s, err := decodeConfig(raw)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	if len(p.parsed) >= maxParsed {
		clear(p.parsed)
	}
	p.parsed[sum] = s
	p.mu.Unlock()
	return s, nil
}

func (p *Provider) Execute(ctx context.Context, req providers.Request) (providers.Response, error) {
	s, err := p.settings(req.Config)
	if err != nil {
		return providers.Response{}, providers.Permanent("bad_config", "%v", err)
	}
	inv, pl, err := s.commands.Resolve(providers.Call{Name: req.Step, ActionType: req.ActionType, Payload: req.Payload}, command.RemotePayloadKeys, nil)
	if err != nil {
		return providers.Response{}, err
	}
	if pl.Host == "" {
		return providers.Response{}, providers.Permanent("bad_payload", "no host: the payload names the host to run %q on, host = \"<<...>>\"", inv.Name)
	}
	t, err := s.target(pl.Host, inv.User)
	if err != nil {
		return providers.Response{}, err
	}
	rc := remoteCommand{argv: inv.Program("sh", req.Step), dir: inv.Dir, env: inv.Environ(nil, req), stdin: inv.Stdin, lock: req.DedupKey, grace: s.cfg.KillGrace()}
	line, err := remoteLine(rc)
	if err != nil {
		return providers.Response{}, providers.Permanent("bad_config", "%v", err)
	}

	if d := inv.Timeout(); d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	release, err := p.slots.acquire(ctx, s.fingerprint+" "+t.addr, s.maxSessions)
	if err != nil {
		return providers.Response{}, ended(ctx, inv, fmt.Sprintf("while waiting for one of the %d sessions max_sessions_per_host allows on %s", s.maxSessions, t.addr))
	}
	defer release()

	started := time.Now()
	stdout, stderr := command.NewOutput(s.cfg.MaxOutputBytes), command.NewOutput(s.cfg.MaxOutputBytes)
	exit, warning, err := p.run(ctx, s, t, job{line: line, stdin: rc.stdin, stdout: stdout, stderr: stderr})
	var stopped *stoppedError
	var waiting *lockWaitError
	switch {
	case errors.As(err, &stopped):
		return providers.Response{}, ended(ctx, inv, stopped.Error())
	case errors.As(err, &waiting):
		return providers.Response{}, ended(ctx, inv, waiting.Error())
	case err != nil && ctx.Err() != nil:
		return providers.Response{}, ended(ctx, inv, "before the command started on "+t.addr)
	case err != nil:
		return providers.Response{}, err
	}
	r := command.NewResult(exit, stdout, stderr, time.Since(started))
	r.Host, r.Warning = t.addr, warning
	if s.cfg.InsecureIgnoreHostKey {
		r.Warning = strings.TrimPrefix(r.Warning+"; "+insecureWarning(t.addr), "; ")
	}
	return command.Judge(r, s.cfg.Limits)
}

// insecureWarning goes in every result of a config that checks no host key.
func insecureWarning(addr string) string {
	return "insecure_ignore_host_key is set: the key of " + addr + " was not checked, so anyone between the gateway and the host could have answered for it"
}

// ended is the failure of a call whose time ran out or whose step was
// cancelled; what says at which point, and what became of the command.
func ended(ctx context.Context, inv *command.Invocation, what string) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		took := "the step's timeout"
		if inv.TimeoutSeconds > 0 {
			took = fmt.Sprintf("the command's timeout_seconds = %g", inv.TimeoutSeconds)
		}
		return &providers.Error{Retryable: true, Code: "timeout", Message: "the call ran past " + took + " " + what, Err: ctx.Err()}
	}
	return &providers.Error{Retryable: true, Code: "cancelled", Message: "the step was cancelled " + what, Err: ctx.Err()}
}

// stoppedError is a command stopped because its step ended.
type stoppedError struct {
	addr string
	// err says why the command may still be running; nil when it was
	// stopped.
	err error
}

func (e *stoppedError) Error() string {
	if e.err != nil {
		return "while the command ran on " + e.addr + "; it may still be running there: " + e.err.Error()
	}
	return "while the command ran on " + e.addr + "; its process group there was stopped"
}
