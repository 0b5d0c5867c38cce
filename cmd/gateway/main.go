// Command gateway validates and runs chains described in TOML.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/cmd/gateway/internal/show"
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/gateway/local"
	"github.com/chaingate/gateway/gateway/server"
	"github.com/chaingate/gateway/internal/textx"
	"github.com/chaingate/gateway/plugins/conformance"
	"github.com/chaingate/gateway/plugins/host"
	"github.com/chaingate/gateway/providers/builtin"
)

// Exit codes.
const (
	exitOK        = 0
	exitFailed    = 1
	exitUsage     = 2
	exitInterrupt = 130
)

const usage = `gateway runs incident-response and automation chains described in TOML.

Usage:
  gateway validate PATH... [--plugins]          check config files or directories
  gateway test PATH... [--run RE] [--coverage]  run the chains' test files (*_test.toml), mocked, no side effects
  gateway run CHAIN --config PATH... [flags]    run one chain to completion (--dry-run: call nothing)
  gateway resume --config PATH... [flags]       resume every unfinished run in a store
  gateway cancel RUN_ID [--state PATH]          cancel a run
  gateway serve --config PATH... [flags]        serve the HTTP API and advance runs
  gateway worker --config PATH... [flags]       run the items of distributed splits
  gateway runs list|show|events|dag             inspect runs
  gateway runs cancel|replay|approve|reject     cancel, replay, answer an approval step
  gateway runs redrive RUN_ID SPLIT             run a split's failed items again, then what followed it
  gateway runs delete|prune                     delete runs that ended, or prune them by age
  gateway runs export RUN_ID --as-test          write a run that ended as a test case
  gateway dlq list|show|replay|delete|purge     work the dead-letter queue
  gateway graph CHAIN                           draw a chain as a Mermaid flowchart
  gateway backup OUT                            write a backup of a store (--server URL or --state URL)
  gateway restore IN --state URL                bring a backup back into an empty store
  gateway compact --state FILE                  give a store file's free pages back to the disk
  gateway schedules list                        the schedules' next fire times
  gateway pause|unpause trigger|schedule NAME   stop a trigger or schedule on every gateway, and start it again
  gateway audit list|export                     read the audit log: who did what, and what was refused
  gateway plugin check|new                      check a provider plugin, or start writing one

The runs, dlq and graph commands talk to a gateway's API (--server URL,
--token T, or CHAINGATE_SERVER and CHAINGATE_TOKEN), or work straight on a
store file when no server is given (--state PATH, --config PATH...).

  gateway version                               print the version, commit and Go version
  gateway health [--server URL]                 exit 0 when a gateway or worker is ready

Run "gateway help COMMAND" or "gateway COMMAND -h" for a command's flags.
`

func main() {
	// A built-in provider runs as this same binary in plugin mode.
	host.ServeBuiltinIfRequested(builtin.New)
	conformance.ServeOrphanHostIfRequested()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// Once the first signal has asked for a clean stop, a second one ends
	// the process at once, as by default: runs stay as persisted. "gateway
	// serve" catches it itself, to cancel its calls in flight first.
	context.AfterFunc(ctx, stop)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "test":
		return cmdTest(ctx, args[1:], stdout, stderr)
	case "pause", "unpause":
		return cmdPause(ctx, args[1:], stdout, stderr, args[0] == "unpause")
	case "validate":
		return cmdValidate(ctx, args[1:], stdout, stderr)
	case "run":
		return cmdRun(ctx, args[1:], stdout, stderr)
	case "resume":
		return cmdResume(ctx, args[1:], stdout, stderr)
	case "cancel":
		return cmdCancel(ctx, args[1:], stdout, stderr)
	case "serve":
		return cmdServe(ctx, args[1:], stdout, stderr)
	case "worker":
		return cmdWorker(ctx, args[1:], stdout, stderr)
	case "runs":
		return cmdRuns(ctx, args[1:], stdout, stderr)
	case "dlq":
		return cmdDLQ(ctx, args[1:], stdout, stderr)
	case "graph":
		return cmdGraph(ctx, args[1:], stdout, stderr)
	case "schedules":
		return cmdSchedules(ctx, args[1:], stdout, stderr)
	case "audit":
		return cmdAudit(ctx, args[1:], stdout, stderr)
	case "backup":
		return cmdBackup(ctx, args[1:], stdout, stderr)
	case "restore":
		return cmdRestore(ctx, args[1:], stdout, stderr)
	case "compact":
		return cmdCompact(ctx, args[1:], stdout, stderr)
	case "plugin":
		return cmdPlugin(ctx, args[1:], stdout, stderr)
	case "version", "-version", "--version":
		return cmdVersion(args[1:], stdout, stderr)
	case "health":
		return cmdHealth(ctx, args[1:], stdout, stderr)
	case "help":
		if len(args) > 1 && args[1] != "help" {
			return run(ctx, append(args[1:], "-h"), stdout, stderr)
		}
		fmt.Fprint(stdout, usage)
		return exitOK
	case "-h", "-help", "--help", "--h":
		fmt.Fprint(stdout, usage)
		return exitOK
	default:
		fmt.Fprintf(stderr, "gateway: unknown command %q\n\n%s", args[0], usage)
		return exitUsage
	}
}

// isHelp reports whether arg asks for help in place of a sub-command.
func isHelp(arg string) bool {
	switch arg {
	case "-h", "-help", "--help", "--h", "help":
		return true
	}
	return false
}

// stringList is a repeatable flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// parseInterleaved parses flags that may come before, between or after
// positional arguments, and returns the positional ones. -h prints the
// command's help on stdout and returns flag.ErrHelp.
func parseInterleaved(fs *flagSet, args []string) ([]string, error) {
	var pos []string
	// The help is printed here, after Parse, where -h can be told from a
	// bad flag (whose error Parse has printed on stderr already).
	usage := fs.Usage
	fs.Usage = func() {}
	defer func() { fs.Usage = usage }()
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fs.usage(fs.stdout)
			} else {
				fs.usage(fs.stderr)
			}
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// parseExit is the exit status for flags that did not parse: 0 after -h,
// which asked for the help, else a usage error.
func parseExit(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	return exitUsage
}

// flagSet is a command's flags and its help text.
type flagSet struct {
	*flag.FlagSet
	help           string
	stdout, stderr io.Writer
}

func newFlagSet(name string, stdout, stderr io.Writer, help string) *flagSet {
	fs := &flagSet{FlagSet: flag.NewFlagSet(name, flag.ContinueOnError), help: help, stdout: stdout, stderr: stderr}
	fs.SetOutput(stderr)
	fs.Usage = func() { fs.usage(stderr) }
	return fs
}

func (fs *flagSet) usage(w io.Writer) {
	fmt.Fprint(w, fs.help)
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(fs.stderr)
}

const validateHelp = `Usage: gateway validate PATH... [--plugins] [--skip-secrets] [--output text|json] (files or directories of *.toml)

Checks config files as every command that loads them does, including each
provider step's action_type and each built-in provider's config against
what the provider declares, and every path a template or condition reads
(a step, a field of its result, an origin.payload field the chain's input
declares, a trigger's alert or body fields). It also checks what serve
would refuse in this environment: every secret the config reads must be
set (the message names the CHAINGATE_SECRET_ variable), each built-in
provider's config must work with its secrets filled in, and a
[gateway].listen other machines can reach needs API tokens; where the
secrets are not at hand (CI), --skip-secrets leaves that out. External
plugins are checked too with --plugins, which starts each one to read
what it declares. Exit status: 0 the config is fine, 1 it has errors,
2 usage. --output json prints one document with ok, counts, and errors
and warnings with file, line, col, path and message.

`

func cmdValidate(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("validate", stdout, stderr, validateHelp)
	var configs stringList
	fs.Var(&configs, "config", "config file or directory (repeatable; same as a PATH argument)")
	checkPlugins := fs.Bool("plugins", false, "also start every external plugin, and check the steps and config that use it against what it declares")
	skipSecrets := fs.Bool("skip-secrets", false, "check the config alone, not the secrets and API tokens serve needs from the environment")
	pluginTimeout := fs.Duration("plugin-timeout", 15*time.Second, "with --plugins, how long each plugin may take to start and describe itself")
	output := fs.String("output", "text", "text (one FILE:LINE:COL: KEY.PATH: message line per problem) or json")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return parseExit(err)
	}
	paths := append(configs, pos...)
	if len(paths) == 0 || (*output != "text" && *output != "json") {
		fs.Usage()
		return exitUsage
	}
	rep := show.Validation{Errors: []show.Diagnostic{}, Warnings: []show.Diagnostic{}, Notes: []string{}}
	cfg, err := gateway.LoadConfig(paths)
	var external []string
	if err == nil {
		external = gateway.ExternalProviders(cfg)
	}
	if err == nil && *checkPlugins && len(external) > 0 {
		logger, _ := newLogger(stderr, "warn")
		if diags := gateway.CheckPlugins(ctx, cfg, gateway.PluginCheckOptions{Timeout: *pluginTimeout, Logger: logger}); len(diags) > 0 {
			err = &chain.ConfigError{Diagnostics: diags}
		}
	}
	if err == nil && !*skipSecrets {
		err = server.CheckServe(ctx, cfg)
	}
	var ce *chain.ConfigError
	switch {
	case errors.As(err, &ce):
		for _, d := range ce.Diagnostics {
			rep.Add(d)
		}
	case err != nil:
		rep.Errors = append(rep.Errors, show.Diagnostic{Message: err.Error(), Severity: "error"})
	default:
		for _, d := range cfg.Warnings {
			rep.Add(d)
		}
		rep.OK, rep.Chains, rep.Providers = true, len(cfg.Chains), len(cfg.Providers)
		rep.Triggers, rep.Schedules = len(cfg.Triggers), len(cfg.Schedules)
		for _, c := range cfg.Chains {
			rep.Steps += show.CountSteps(c.Steps)
		}
		if *skipSecrets {
			rep.Notes = append(rep.Notes, "the secrets and API tokens serve needs were not checked (--skip-secrets)")
		}
		if !*checkPlugins && len(external) > 0 {
			rep.Notes = append(rep.Notes, fmt.Sprintf("the action types and config of external plugins (%s) were not checked; validate --plugins starts them to check", strings.Join(external, ", ")))
		}
	}
	if *output == "json" {
		show.JSON(stdout, rep)
	} else {
		rep.Text(stdout, err, cfg)
	}
	if !rep.OK {
		return exitFailed
	}
	return exitOK
}

const runHelp = `Usage: gateway run CHAIN --config PATH... [--payload JSON|@FILE] [--state PATH]
       gateway run --resume --config PATH... [--state PATH]

Runs one chain to completion on the embedded store. Progress goes to stderr,
the finished run to stdout as JSON. Exit status: 0 the run succeeded,
1 it failed, 2 usage or config error, 130 interrupted (the run stays
persisted; "gateway resume" continues it). With --resume, resumes every
unfinished run instead, as "gateway resume" does.

With --dry-run nothing is called and nothing stored: the run goes as a
gateway test case does (docs/testing.md), each call answered by --mocks
(a file of [mocks.STEP] and [approvals.STEP] tables) or else with {}, and
each call is listed with the request it would have sent.

`

// loadConfig loads the configs of a command that advances runs, printing
// what is wrong with them, or their warnings; nil when they do not load.
func loadConfig(configs []string, stderr io.Writer) *chain.Config {
	cfg, err := gateway.LoadConfig(configs)
	if err != nil {
		show.ConfigError(stderr, err)
		return nil
	}
	for _, w := range cfg.Warnings {
		fmt.Fprintln(stderr, w.String())
	}
	return cfg
}

// openSession opens a gateway that advances runs here, printing each step
// event to stderr.
func openSession(ctx context.Context, cfg *chain.Config, state, logLevel string, work bool, stderr io.Writer) (*local.Session, int) {
	logger, err := newLogger(stderr, logLevel)
	if err != nil {
		fmt.Fprintln(stderr, "gateway:", err)
		return nil, exitUsage
	}
	progress := show.NewProgress(stderr)
	s, err := local.Open(ctx, local.Options{Config: cfg, State: state, Logger: logger, Work: work, OnEvent: func(ev store.Event) { progress.Print(api.EventOf(ev)) }})
	if err != nil {
		fmt.Fprintln(stderr, "gateway:", err)
		return nil, exitUsage
	}
	return s, exitOK
}

// finish waits for a run and prints it; it returns the run's exit status.
func finish(ctx context.Context, s *local.Session, id string, indent bool, stdout, stderr io.Writer) int {
	res, err := s.Result(ctx, id)
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintf(stderr, "gateway: interrupted; run %s is persisted and \"gateway resume\" continues it\n", id)
			return exitInterrupt
		}
		fmt.Fprintln(stderr, "gateway:", err)
		return exitFailed
	}
	if err := show.Result(stdout, res, indent); err != nil {
		fmt.Fprintln(stderr, "gateway: writing result:", err)
		return exitFailed
	}
	if res.Status != store.RunSucceeded {
		return exitFailed
	}
	return exitOK
}

func stateFlag(fs *flag.FlagSet) *string {
	return fs.String("state", "", "store: a bolt file path or bolt://PATH, or redis://[:PASSWORD@]HOST:PORT/DB (rediss:// for TLS) for runs shared by several gateways (default [gateway].state, else "+gateway.DefaultState+")")
}

func cmdRun(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("run", stdout, stderr, runHelp)
	var configs stringList
	fs.Var(&configs, "config", "config file or directory (repeatable)")
	payloadArg := fs.String("payload", "{}", "origin payload: JSON text, or @FILE to read it from a file")
	state := stateFlag(fs.FlagSet)
	logLevel := fs.String("log-level", "warn", logLevelUsage)
	resume := fs.Bool("resume", false, "resume every unfinished run in the store instead of starting one")
	noWorker := fs.Bool("no-worker", false, "with [gateway.fanout], leave distributed splits' items to gateway worker processes")
	dryRun := fs.Bool("dry-run", false, "call nothing: show what each step would be called with, every call answered by --mocks or else with {}, on a virtual clock and no store")
	mocks := fs.String("mocks", "", "with --dry-run, a file of [mocks.STEP] and [approvals.STEP] tables, as a test case writes them (docs/testing.md)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return parseExit(err)
	}
	if *mocks != "" && !*dryRun {
		fmt.Fprintln(stderr, "gateway run: --mocks goes with --dry-run")
		return exitUsage
	}
	if *resume {
		if len(pos) != 0 || len(configs) == 0 {
			fmt.Fprintln(stderr, "gateway run --resume: takes no CHAIN and needs at least one --config")
			return exitUsage
		}
		return resumeAll(ctx, configs, *state, *logLevel, !*noWorker, stdout, stderr)
	}
	if len(pos) != 1 || len(configs) == 0 {
		fmt.Fprintln(stderr, "gateway run: need exactly one CHAIN and at least one --config")
		fs.Usage()
		return exitUsage
	}
	chainName := pos[0]
	payload, err := readPayload(*payloadArg)
	if err != nil {
		fmt.Fprintln(stderr, "gateway run:", err)
		return exitUsage
	}
	if *dryRun {
		return dryRunChain(ctx, configs, chainName, payload, *mocks, stdout, stderr)
	}
	cfg := loadConfig(configs, stderr)
	if cfg == nil {
		return exitUsage
	}
	// Refused before the store is opened, which would create its file.
	if cfg.Chains[chainName] == nil {
		fmt.Fprintf(stderr, "gateway run: unknown chain %q; the config defines %s\n", chainName, strings.Join(cfg.ChainNames, ", "))
		return exitUsage
	}
	s, code := openSession(ctx, cfg, *state, *logLevel, !*noWorker, stderr)
	if s == nil {
		return code
	}
	defer s.Close()
	if ids, err := s.GW.Store.UnfinishedRuns(ctx); err == nil && len(ids) > 0 {
		them := "them"
		if len(ids) == 1 {
			them = "it"
		}
		fmt.Fprintf(stderr, "note: this store holds %s; \"gateway resume\" continues %s\n", textx.Count(len(ids), "unfinished run", "unfinished runs"), them)
	}
	started, err := s.GW.Engine.Start(ctx, chainName, engine.Input{Payload: payload, StartedBy: store.StartedByCLI})
	var ie *chain.InputError
	if errors.As(err, &ie) {
		fmt.Fprintln(stderr, "gateway run: --payload:", ie)
		return exitUsage
	}
	if errors.Is(err, engine.ErrNestedTooDeep) {
		fmt.Fprintln(stderr, "gateway run: --payload:", err)
		return exitUsage
	}
	if err != nil {
		fmt.Fprintln(stderr, "gateway run:", err)
		return exitFailed
	}
	return finish(ctx, s, started.ID, true, stdout, stderr)
}

const resumeHelp = `Usage: gateway resume --config PATH... [--state PATH]

Resumes every unfinished run in the store after a crash or restart: steps
with a recorded result are not called again, steps that were in flight are
dispatched again with the same dedup key, timers and deadlines carry on
where they were. Prints each finished run as one JSON line on stdout.
Exit status: 0 when every resumed run succeeded, 1 otherwise.

`

func cmdResume(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("resume", stdout, stderr, resumeHelp)
	var configs stringList
	fs.Var(&configs, "config", "config file or directory (repeatable)")
	state := stateFlag(fs.FlagSet)
	logLevel := fs.String("log-level", "warn", logLevelUsage)
	noWorker := fs.Bool("no-worker", false, "with [gateway.fanout], leave distributed splits' items to gateway worker processes")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return parseExit(err)
	}
	if len(pos) != 0 || len(configs) == 0 {
		fmt.Fprintln(stderr, "gateway resume: takes no arguments and needs at least one --config")
		fs.Usage()
		return exitUsage
	}
	return resumeAll(ctx, configs, *state, *logLevel, !*noWorker, stdout, stderr)
}

func resumeAll(ctx context.Context, configs []string, state, logLevel string, work bool, stdout, stderr io.Writer) int {
	cfg := loadConfig(configs, stderr)
	if cfg == nil {
		return exitUsage
	}
	s, code := openSession(ctx, cfg, state, logLevel, work, stderr)
	if s == nil {
		return code
	}
	defer s.Close()
	res, err := s.Resume(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "gateway resume:", err)
		code = exitFailed
	}
	fmt.Fprintf(stderr, "resuming %s\n", textx.Count(len(res.Runs), "run", "runs"))
	for _, d := range res.Damaged {
		fmt.Fprintf(stderr, "skipped run %s: its record cannot be read back (%s); gateway runs list shows it as damaged\n", d.ID, d.Error)
	}
	if len(res.Elsewhere) > 0 {
		fmt.Fprintf(stderr, "note: not resumed here, leased by another gateway: %s. A live gateway is advancing them; "+
			"a dead one's lease lapses within [gateway].lease_ttl_seconds, after which run resume again or let gateway serve take them over\n",
			strings.Join(res.Elsewhere, ", "))
	}
	for _, id := range res.Runs {
		switch c := finish(ctx, s, id, false, stdout, stderr); c {
		case exitOK:
		case exitInterrupt:
			return c
		default:
			code = c
		}
	}
	return code
}

const cancelHelp = `Usage: gateway cancel RUN_ID [--state PATH] [--config PATH...]

Cancels a run: its in-flight provider calls are cancelled and it ends with
status cancelled. If a gateway is running on the store, the command reaches
it through the store's control socket; otherwise it cancels the run in the
store directly. --config is only read for [gateway].state.

`

func cmdCancel(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("cancel", stdout, stderr, cancelHelp)
	var configs stringList
	fs.Var(&configs, "config", "config file or directory, read for [gateway].state (repeatable)")
	state := stateFlag(fs.FlagSet)
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return parseExit(err)
	}
	if len(pos) != 1 {
		fmt.Fprintln(stderr, "gateway cancel: need exactly one RUN_ID")
		fs.Usage()
		return exitUsage
	}
	id := pos[0]
	cfg := &chain.Config{Chains: map[string]*chain.Chain{}, Providers: map[string]*chain.Provider{}}
	if len(configs) > 0 {
		if cfg, err = gateway.LoadConfig(configs); err != nil {
			show.ConfigError(stderr, err)
			return exitUsage
		}
	}
	if *state == "" {
		*state = cfg.Gateway.State
	}
	if *state == "" {
		*state = gateway.DefaultState
	}
	logger, _ := newLogger(stderr, "warn")
	if err := local.Cancel(ctx, cfg, *state, logger, id); err != nil {
		fmt.Fprintln(stderr, "gateway cancel:", err)
		if errors.Is(err, local.ErrOpening) {
			return exitUsage
		}
		return exitFailed
	}
	fmt.Fprintf(stdout, "cancelled run %s\n", id)
	return exitOK
}

func readPayload(arg string) (json.RawMessage, error) {
	data := []byte(arg)
	if name, ok := strings.CutPrefix(arg, "@"); ok {
		var err error
		if data, err = os.ReadFile(name); err != nil {
			return nil, fmt.Errorf("reading payload: %w", err)
		}
	}
	if err := api.ParseJSON(data, nil); err != nil {
		return nil, fmt.Errorf("--payload must be one JSON value: %w", err)
	}
	return data, nil
}

// logLevelUsage says how plugins' log lines fare, which is easy to miss:
// they keep the level they were written at.
const logLevelUsage = "log level: debug, info, warn or error. Plugins' log lines keep their own level: at warn, a plugin's " +
	"warnings, errors and panics show, its info and debug lines and plain text it prints do not (see docs/plugins.md)"

func newLogger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("bad --log-level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}
