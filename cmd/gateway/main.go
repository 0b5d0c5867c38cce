// Command gateway validates and runs chains described in TOML.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/gateway/api"
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
	rep := validation{Errors: []diagnosticJSON{}, Warnings: []diagnosticJSON{}, Notes: []string{}}
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
			rep.add(d)
		}
	case err != nil:
		rep.Errors = append(rep.Errors, diagnosticJSON{Message: err.Error(), Severity: "error"})
	default:
		for _, d := range cfg.Warnings {
			rep.add(d)
		}
		rep.OK, rep.Chains, rep.Providers = true, len(cfg.Chains), len(cfg.Providers)
		rep.Triggers, rep.Schedules = len(cfg.Triggers), len(cfg.Schedules)
		for _, c := range cfg.Chains {
			rep.Steps += countSteps(c.Steps)
		}
		if *skipSecrets {
			rep.Notes = append(rep.Notes, "the secrets and API tokens serve needs were not checked (--skip-secrets)")
		}
		if !*checkPlugins && len(external) > 0 {
			rep.Notes = append(rep.Notes, fmt.Sprintf("the action types and config of external plugins (%s) were not checked; validate --plugins starts them to check", strings.Join(external, ", ")))
		}
	}
	if *output == "json" {
		printJSON(stdout, rep)
	} else {
		printConfigError(stdout, err)
		if err == nil {
			for _, w := range cfg.Warnings {
				fmt.Fprintln(stdout, w.String())
			}
			summary := "ok: " + textx.Count(rep.Chains, "chain", "chains") + ", " + textx.Count(rep.Steps, "step", "steps") + ", " + textx.Count(rep.Providers, "provider", "providers")
			if rep.Triggers > 0 || rep.Schedules > 0 {
				summary += ", " + textx.Count(rep.Triggers, "trigger", "triggers") + ", " + textx.Count(rep.Schedules, "schedule", "schedules")
			}
			fmt.Fprintln(stdout, summary)
			for _, n := range rep.Notes {
				fmt.Fprintln(stdout, "note:", n)
			}
		}
	}
	if !rep.OK {
		return exitFailed
	}
	return exitOK
}

// validation is what validate --output json prints.
type validation struct {
	OK        bool             `json:"ok"`
	Chains    int              `json:"chains"`
	Steps     int              `json:"steps"`
	Providers int              `json:"providers"`
	Triggers  int              `json:"triggers"`
	Schedules int              `json:"schedules"`
	Errors    []diagnosticJSON `json:"errors"`
	Warnings  []diagnosticJSON `json:"warnings"`
	Notes     []string         `json:"notes"`
}

// diagnosticJSON is one problem, as validate --output json prints it.
type diagnosticJSON struct {
	File     string `json:"file,omitempty"`
	Line     int    `json:"line,omitempty"`
	Col      int    `json:"col,omitempty"`
	Path     string `json:"path,omitempty"`
	Message  string `json:"message"`
	Severity string `json:"severity"`
}

func (v *validation) add(d chain.Diagnostic) {
	j := diagnosticJSON{File: d.File, Line: d.Line, Col: d.Col, Path: d.Path, Message: d.Message, Severity: "error"}
	if d.Severity == chain.SeverityWarning {
		j.Severity = "warning"
		v.Warnings = append(v.Warnings, j)
		return
	}
	v.Errors = append(v.Errors, j)
}

func countSteps(steps []*chain.Step) int {
	n := len(steps)
	for _, s := range steps {
		if s.Parallel != nil {
			n += countSteps(s.Parallel.Steps)
		}
		if s.Split != nil {
			n += countSteps(s.Split.Steps)
		}
	}
	return n
}

func printConfigError(w io.Writer, err error) {
	if err == nil {
		return
	}
	var ce *chain.ConfigError
	if errors.As(err, &ce) {
		for _, d := range ce.Diagnostics {
			fmt.Fprintln(w, d.String())
		}
		return
	}
	fmt.Fprintln(w, err)
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

// session is a gateway opened by a command that advances runs.
type session struct {
	gw     *gateway.Gateway
	log    *slog.Logger
	stdout io.Writer
	stderr io.Writer
	// stopWorker ends the worker that runs distributed splits' items here.
	stopWorker func()
	// stopControl closes the control socket and removes its file.
	stopControl func()
}

// loadConfig loads the configs of a command that advances runs, printing
// what is wrong with them, or their warnings; nil when they do not load.
func loadConfig(configs []string, stderr io.Writer) *chain.Config {
	cfg, err := gateway.LoadConfig(configs)
	if err != nil {
		printConfigError(stderr, err)
		return nil
	}
	for _, w := range cfg.Warnings {
		fmt.Fprintln(stderr, w.String())
	}
	return cfg
}

// openSession opens the store and plugins for cfg, and listens on the
// store's control socket so "gateway cancel" can reach this process.
func openSession(ctx context.Context, cfg *chain.Config, state, logLevel string, work bool, stdout, stderr io.Writer) (*session, int) {
	logger, err := newLogger(stderr, logLevel)
	if err != nil {
		fmt.Fprintln(stderr, "gateway:", err)
		return nil, exitUsage
	}
	progress := newProgressPrinter(stderr)
	gw, err := gateway.Open(ctx, gateway.Options{Config: cfg, State: state, Logger: logger, OnEvent: func(ev store.Event) { progress.print(api.EventOf(ev)) }})
	if err != nil {
		fmt.Fprintln(stderr, "gateway:", err)
		return nil, exitUsage
	}
	s := &session{gw: gw, log: logger, stdout: stdout, stderr: stderr, stopWorker: func() {}, stopControl: func() {}}
	if gw.StoreFile != "" {
		stop, err := gateway.ServeControl(ctx, gateway.ControlPath(gw.StoreFile), gw.Engine, logger)
		if err != nil {
			logger.Warn("gateway cancel will not reach this process", "err", err)
		} else {
			s.stopControl = stop
		}
	}
	if gw.Fanout != nil && work {
		// One process is enough: the items it hands out, it runs too.
		wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := gw.WorkItems(wctx); err != nil {
				logger.Error("working split items stopped", "err", err)
			}
		}()
		s.stopWorker = func() { cancel(); <-done }
	}
	return s, exitOK
}

func (s *session) close() {
	s.stopControl()
	s.stopWorker()
	if err := s.gw.Close(); err != nil {
		s.log.Error("closing gateway", "err", err)
	}
}

// finish waits for a run and prints it; it returns the run's exit status.
func (s *session) finish(ctx context.Context, id string, indent bool) int {
	run, err := s.gw.Engine.Wait(ctx, id)
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintf(s.stderr, "gateway: interrupted; run %s is persisted and \"gateway resume\" continues it\n", id)
			return exitInterrupt
		}
		fmt.Fprintln(s.stderr, "gateway:", err)
		return exitFailed
	}
	res, err := s.gw.Engine.Result(context.WithoutCancel(ctx), run.ID, false)
	if err != nil {
		fmt.Fprintln(s.stderr, "gateway:", err)
		return exitFailed
	}
	if err := writeResult(s.stdout, res, indent); err != nil {
		fmt.Fprintln(s.stderr, "gateway: writing result:", err)
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
	s, code := openSession(ctx, cfg, *state, *logLevel, !*noWorker, stdout, stderr)
	if s == nil {
		return code
	}
	defer s.close()
	if ids, err := s.gw.Store.UnfinishedRuns(ctx); err == nil && len(ids) > 0 {
		them := "them"
		if len(ids) == 1 {
			them = "it"
		}
		fmt.Fprintf(stderr, "note: this store holds %s; \"gateway resume\" continues %s\n", textx.Count(len(ids), "unfinished run", "unfinished runs"), them)
	}
	started, err := s.gw.Engine.Start(ctx, chainName, engine.Input{Payload: payload, StartedBy: store.StartedByCLI})
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
	return s.finish(ctx, started.ID, true)
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
	s, code := openSession(ctx, cfg, state, logLevel, work, stdout, stderr)
	if s == nil {
		return code
	}
	defer s.close()
	unfinished, _ := s.gw.Store.UnfinishedRuns(ctx)
	ids, err := s.gw.Engine.Resume(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "gateway resume:", err)
		code = exitFailed
	}
	fmt.Fprintf(stderr, "resuming %s\n", textx.Count(len(ids), "run", "runs"))
	for _, d := range s.gw.Engine.Damaged() {
		fmt.Fprintf(stderr, "skipped run %s: its record cannot be read back (%s); gateway runs list shows it as damaged\n", d.ID, d.Error)
	}
	if elsewhere := leasedElsewhere(ctx, s.gw.Store, unfinished, ids); len(elsewhere) > 0 && err == nil {
		fmt.Fprintf(stderr, "note: not resumed here, leased by another gateway: %s. A live gateway is advancing them; "+
			"a dead one's lease lapses within [gateway].lease_ttl_seconds, after which run resume again or let gateway serve take them over\n",
			strings.Join(elsewhere, ", "))
	}
	for _, id := range ids {
		switch c := s.finish(ctx, id, false); c {
		case exitOK:
		case exitInterrupt:
			return c
		default:
			code = c
		}
	}
	return code
}

// leasedElsewhere lists the runs that were unfinished before a resume,
// were not resumed, and are still unfinished: another gateway holds them.
func leasedElsewhere(ctx context.Context, st store.Store, unfinished, resumed []string) []string {
	var out []string
	for _, id := range unfinished {
		if slices.Contains(resumed, id) {
			continue
		}
		if run, err := st.Run(ctx, id); err == nil && !run.Status.Final() {
			out = append(out, id)
		}
	}
	return out
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
			printConfigError(stderr, err)
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
	gw, err := gateway.Open(ctx, gateway.Options{Config: cfg, State: *state, Logger: logger, Existing: true})
	switch {
	case errors.Is(err, store.ErrInUse):
		file := gateway.StateFile(*state)
		if err := gateway.SendControl(ctx, gateway.ControlPath(file), "cancel "+id); err != nil {
			fmt.Fprintln(stderr, "gateway cancel:", err)
			return exitFailed
		}
	case err != nil:
		fmt.Fprintln(stderr, "gateway cancel:", err)
		return exitUsage
	default:
		err = gw.Engine.Cancel(ctx, id)
		_ = gw.Close()
		if err != nil {
			fmt.Fprintln(stderr, "gateway cancel:", err)
			return exitFailed
		}
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

// progressPrinter writes one line per step event. On a terminal, a split's
// progress events rewrite one live line instead.
type progressPrinter struct {
	w    io.Writer
	live bool

	mu      sync.Mutex
	pending bool // a live line is on screen without its newline
}

func newProgressPrinter(w io.Writer) *progressPrinter {
	p := &progressPrinter{w: w}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			p.live = true
		}
	}
	return p
}

func (p *progressPrinter) print(ev api.Event) {
	line := progressLine(ev)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.live && ev.Type == string(store.EventStepProgress) {
		fmt.Fprintf(p.w, "\r\033[K%s", line)
		p.pending = true
		return
	}
	if p.pending {
		fmt.Fprintln(p.w)
		p.pending = false
	}
	fmt.Fprintln(p.w, line)
}

func progressLine(ev api.Event) string {
	subject := ev.Step
	if subject == "" {
		subject = "run " + ev.RunID
	}
	what := strings.ReplaceAll(strings.TrimPrefix(strings.TrimPrefix(ev.Type, "step_"), "run_"), "_", " ")
	line := fmt.Sprintf("%s  %-24s %s", ev.Time.Local().Format(time.TimeOnly+".000"), subject, what)
	if ev.Attempt > 1 || (ev.Type == string(store.EventStepStarted) && ev.Attempt > 0) {
		line += fmt.Sprintf(" (attempt %d)", ev.Attempt)
	}
	if ev.Message != "" {
		line += ": " + ev.Message
	}
	return line
}

// bigBody is the size above which a step's body is written as stored, not
// indented: a split over a million items has a body of tens of megabytes,
// and indenting it took several times its size in memory, and seconds.
const bigBody = 1 << 20

// writeResult writes res as JSON, indented when asked. Bodies above bigBody
// are left out of the encoding and written in its place as they are: still
// one JSON document, with those bodies on one line.
func writeResult(w io.Writer, res *engine.Result, indent bool) error {
	var marks [][]byte
	bodies := map[string]json.RawMessage{}
	if indent {
		var nonce [8]byte
		_, _ = rand.Read(nonce[:])
		for key, st := range res.Steps {
			if len(st.Body) > bigBody {
				mark := fmt.Sprintf("@@body-%x-%d@@", nonce, len(marks))
				bodies[mark] = st.Body
				marks = append(marks, []byte(strconv.Quote(mark)))
				st.Body = json.RawMessage(strconv.Quote(mark))
				res.Steps[key] = st
			}
		}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if indent {
		enc.SetIndent("", "  ")
	}
	if err := enc.Encode(res); err != nil {
		return err
	}
	out := buf.Bytes()
	for len(marks) > 0 {
		i, which := -1, 0
		for n, m := range marks {
			if j := bytes.Index(out, m); j >= 0 && (i < 0 || j < i) {
				i, which = j, n
			}
		}
		if i < 0 {
			break
		}
		m := marks[which]
		if _, err := w.Write(out[:i]); err != nil {
			return err
		}
		mark, _ := strconv.Unquote(string(m))
		if _, err := w.Write(bodies[mark]); err != nil {
			return err
		}
		out = out[i+len(m):]
		marks = append(marks[:which], marks[which+1:]...)
	}
	_, err := w.Write(out)
	return err
}
