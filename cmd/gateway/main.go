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
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/plugins"
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
  gateway validate PATH...                      check config files or directories
  gateway run CHAIN --config PATH... [flags]    run one chain to completion

Run "gateway COMMAND -h" for a command's flags.
`

func main() {
	// A built-in provider runs as this same binary in plugin mode.
	plugins.ServeBuiltinIfRequested(builtin.New)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
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
	case "validate":
		return cmdValidate(args[1:], stdout, stderr)
	case "run":
		return cmdRun(ctx, args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return exitOK
	default:
		fmt.Fprintf(stderr, "gateway: unknown command %q\n\n%s", args[0], usage)
		return exitUsage
	}
}

// stringList is a repeatable flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// parseInterleaved parses flags that may come before, between or after
// positional arguments, and returns the positional ones.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
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

func newFlagSet(name string, stderr io.Writer, help string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, help)
		fs.PrintDefaults()
	}
	return fs
}

func cmdValidate(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("validate", stderr, "Usage: gateway validate PATH... (files or directories of *.toml)\n")
	var configs stringList
	fs.Var(&configs, "config", "config file or directory (repeatable; same as a PATH argument)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return exitUsage
	}
	paths := append(configs, pos...)
	if len(paths) == 0 {
		fs.Usage()
		return exitUsage
	}
	cfg, err := gateway.LoadConfig(paths)
	if err != nil {
		printConfigError(stdout, err)
		return exitFailed
	}
	for _, w := range cfg.Warnings {
		fmt.Fprintln(stdout, w.String())
	}
	steps := 0
	for _, c := range cfg.Chains {
		steps += countSteps(c.Steps)
	}
	fmt.Fprintf(stdout, "ok: %d chains, %d steps, %d providers\n", len(cfg.Chains), steps, len(cfg.Providers))
	return exitOK
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

Runs one chain to completion on the embedded store. Progress goes to stderr,
the finished run to stdout as JSON. Exit status: 0 the run succeeded,
1 it failed, 2 usage or config error.

`

func cmdRun(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("run", stderr, runHelp)
	var configs stringList
	fs.Var(&configs, "config", "config file or directory (repeatable)")
	payloadArg := fs.String("payload", "{}", "origin payload: JSON text, or @FILE to read it from a file")
	state := fs.String("state", "", "store: a bolt file path or bolt://PATH (default [gateway].state, else "+gateway.DefaultState+")")
	logLevel := fs.String("log-level", "warn", "log level: debug, info, warn or error")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return exitUsage
	}
	if len(pos) != 1 || len(configs) == 0 {
		fmt.Fprintln(stderr, "gateway run: need exactly one CHAIN and at least one --config")
		fs.Usage()
		return exitUsage
	}
	chainName := pos[0]
	logger, err := newLogger(stderr, *logLevel)
	if err != nil {
		fmt.Fprintln(stderr, "gateway run:", err)
		return exitUsage
	}
	payload, err := readPayload(*payloadArg)
	if err != nil {
		fmt.Fprintln(stderr, "gateway run:", err)
		return exitUsage
	}
	cfg, err := gateway.LoadConfig(configs)
	if err != nil {
		printConfigError(stderr, err)
		return exitUsage
	}
	for _, w := range cfg.Warnings {
		fmt.Fprintln(stderr, w.String())
	}
	if cfg.Chains[chainName] == nil {
		fmt.Fprintf(stderr, "gateway run: unknown chain %q; the config defines %s\n", chainName, strings.Join(cfg.ChainNames, ", "))
		return exitUsage
	}

	progress := &progressPrinter{w: stderr}
	gw, err := gateway.Open(ctx, gateway.Options{Config: cfg, State: *state, Logger: logger, OnEvent: progress.print})
	if err != nil {
		fmt.Fprintln(stderr, "gateway run:", err)
		return exitUsage
	}
	defer func() {
		if err := gw.Close(); err != nil {
			logger.Error("closing gateway", "err", err)
		}
	}()

	started, err := gw.Engine.Start(ctx, chainName, engine.Input{Payload: payload})
	if err != nil {
		fmt.Fprintln(stderr, "gateway run:", err)
		return exitFailed
	}
	run, err := gw.Engine.Wait(ctx, started.ID)
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintf(stderr, "gateway run: interrupted; run %s is persisted and can be resumed\n", started.ID)
			return exitInterrupt
		}
		fmt.Fprintln(stderr, "gateway run:", err)
		return exitFailed
	}
	res, err := gw.Engine.Result(context.WithoutCancel(ctx), run.ID)
	if err != nil {
		fmt.Fprintln(stderr, "gateway run:", err)
		return exitFailed
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(res); err != nil {
		fmt.Fprintln(stderr, "gateway run: writing result:", err)
		return exitFailed
	}
	if res.Status != store.RunSucceeded {
		return exitFailed
	}
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
	if !json.Valid(data) {
		return nil, fmt.Errorf("--payload is not valid JSON: %.80s", data)
	}
	return data, nil
}

func newLogger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("bad --log-level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}

// progressPrinter writes one line per step event.
type progressPrinter struct{ w io.Writer }

func (p *progressPrinter) print(ev store.Event) {
	subject := ev.Step
	if subject == "" {
		subject = "run " + ev.RunID
	}
	what := strings.ReplaceAll(strings.TrimPrefix(strings.TrimPrefix(string(ev.Type), "step_"), "run_"), "_", " ")
	line := fmt.Sprintf("%s  %-24s %s", ev.Time.Local().Format(time.TimeOnly+".000"), subject, what)
	if ev.Attempt > 1 || (ev.Type == store.EventStepStarted && ev.Attempt > 0) {
		line += fmt.Sprintf(" (attempt %d)", ev.Attempt)
	}
	if ev.Message != "" {
		line += ": " + ev.Message
	}
	fmt.Fprintln(p.w, line)
}
