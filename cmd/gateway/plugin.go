package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/plugins/conformance"
	"github.com/chaingate/gateway/plugins/scaffold"
)

const pluginHelp = `Usage:
  gateway plugin check PATH [flags]            put a plugin binary through the plugin contract
  gateway plugin check --builtin TYPE [flags]  the same for a built-in provider
  gateway plugin new NAME [flags]              write a plugin module that passes the check

See docs/plugins.md. Run "gateway plugin check -h" or "gateway plugin new -h"
for their flags.
`

func cmdPlugin(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, pluginHelp)
		return exitUsage
	}
	switch args[0] {
	case "check":
		return cmdPluginCheck(ctx, args[1:], stdout, stderr)
	case "new":
		return cmdPluginNew(args[1:], stdout, stderr)
	case "-h", "-help", "--help", "--h", "help":
		fmt.Fprint(stdout, pluginHelp)
		return exitOK
	default:
		fmt.Fprintf(stderr, "gateway plugin: unknown command %q\n\n%s", args[0], pluginHelp)
		return exitUsage
	}
}

const pluginCheckHelp = `Usage: gateway plugin check PATH [flags]
       gateway plugin check --builtin TYPE [flags]

Starts the plugin and puts it through the gateway's plugin contract: the
handshake, Describe, the config against the provider's schema, a call to
each action with the payload given for it, a bad payload, cancellation and
deadlines, the dedup key, large bodies, and exiting when the gateway dies.
Prints one line per check, PASS, FAIL or SKIP with the reason, and exits 1
if any check failed. Every action with a payload is called for real, so
give a config that points at a sandbox. The plugin's own log lines go to
stderr at --log-level.

`

func cmdPluginCheck(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("plugin check", stdout, stderr, pluginCheckHelp)
	builtinType := fs.String("builtin", "", "check this built-in provider type instead of a plugin binary")
	var payloadArgs stringList
	fs.Var(&payloadArgs, "payload", "a valid payload for an action: ACTION=JSON or ACTION=@FILE (repeatable)")
	payloadsFile := fs.String("payloads", "", "a JSON file holding a valid payload per action: {\"ACTION\": PAYLOAD, ...}")
	configArg := fs.String("config", "", "the provider's [providers.config] table as a JSON object, or @FILE")
	acceptsAny := fs.Bool("accepts-any-payload", false, "the actions accept any JSON payload, so a bad payload may succeed")
	timeout := fs.Duration("timeout", 10*time.Second, "how long the plugin may take to start, and each call")
	output := fs.String("output", "text", "text, or json for machines")
	logLevel := fs.String("log-level", "warn", "level of the plugin's own log lines shown on stderr: debug, info, warn or error")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return parseExit(err)
	}
	if (*builtinType == "") == (len(pos) != 1) || len(pos) > 1 || (*output != "text" && *output != "json") {
		fmt.Fprintln(stderr, "gateway plugin check: give one plugin PATH or --builtin TYPE; --output is text or json")
		fs.Usage()
		return exitUsage
	}
	logger, err := newLogger(stderr, *logLevel)
	if err != nil {
		fmt.Fprintln(stderr, "gateway plugin check:", err)
		return exitUsage
	}
	opts := conformance.Options{AcceptsAnyPayload: *acceptsAny, Timeout: *timeout, Logger: logger}
	if opts.Payloads, err = readPayloads(*payloadsFile, payloadArgs); err != nil {
		fmt.Fprintln(stderr, "gateway plugin check:", err)
		return exitUsage
	}
	if *configArg != "" {
		if opts.Config, err = readJSONArg("--config", *configArg); err != nil {
			fmt.Fprintln(stderr, "gateway plugin check:", err)
			return exitUsage
		}
		if !bytes.HasPrefix(bytes.TrimSpace(opts.Config), []byte("{")) {
			fmt.Fprintln(stderr, "gateway plugin check: --config must be a JSON object, as [providers.config] is a table")
			return exitUsage
		}
	}
	target := conformance.Target{Builtin: *builtinType}
	if len(pos) == 1 {
		// Made absolute, as the config loader does, so that a bare name is
		// not looked up in PATH.
		if target.Path, err = filepath.Abs(pos[0]); err != nil {
			fmt.Fprintln(stderr, "gateway plugin check:", err)
			return exitUsage
		}
	}
	report := conformance.Check(ctx, target, opts)
	if *output == "json" {
		err = report.WriteJSON(stdout)
	} else {
		err = report.WriteText(stdout)
	}
	switch {
	case err != nil:
		fmt.Fprintln(stderr, "gateway plugin check: writing the report:", err)
		return exitFailed
	case report.Interrupted:
		return exitInterrupt
	case !report.OK():
		return exitFailed
	}
	return exitOK
}

// readPayloads merges the payloads file with --payload flags, which win.
func readPayloads(file string, args []string) (map[string]json.RawMessage, error) {
	payloads := map[string]json.RawMessage{}
	if file != "" {
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("reading --payloads: %w", err)
		}
		if err := json.Unmarshal(data, &payloads); err != nil {
			return nil, fmt.Errorf("--payloads %s must hold a JSON object of payloads by action type: %w", file, err)
		}
	}
	flagged := map[string]json.RawMessage{}
	for _, arg := range args {
		action, value, ok := strings.Cut(arg, "=")
		if !ok || action == "" {
			return nil, fmt.Errorf("--payload %q: want ACTION=JSON or ACTION=@FILE", arg)
		}
		payload, err := readJSONArg("--payload "+action, value)
		if err != nil {
			return nil, err
		}
		flagged[action] = payload
	}
	maps.Copy(payloads, flagged)
	return payloads, nil
}

// readJSONArg reads a flag's JSON value, given inline or as @FILE.
func readJSONArg(flagName, arg string) (json.RawMessage, error) {
	data := []byte(arg)
	if name, ok := strings.CutPrefix(arg, "@"); ok {
		var err error
		if data, err = os.ReadFile(name); err != nil {
			return nil, fmt.Errorf("reading %s: %w", flagName, err)
		}
	}
	if err := api.ParseJSON(data, nil); err != nil {
		return nil, fmt.Errorf("%s must be one JSON value: %w", flagName, err)
	}
	return data, nil
}

const pluginNewHelp = `Usage: gateway plugin new NAME [--dir DIR] [--module PATH] [--gateway-src DIR]

Writes a Go module for a new provider plugin: main.go serving it with
plugins.Serve, provider.go with one action, provider_test.go, README.md,
and payloads.json for "gateway plugin check". The module builds against a
checkout of the gateway through a replace directive in go.mod, found by
looking up from the current directory unless --gateway-src names it.

`

func cmdPluginNew(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("plugin new", stdout, stderr, pluginNewHelp)
	dir := fs.String("dir", "", "where to write the module (default ./NAME-provider)")
	module := fs.String("module", "", "the module path (default example.com/NAME-provider)")
	src := fs.String("gateway-src", "", "the gateway checkout to build against (default: found above the current directory)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return parseExit(err)
	}
	if len(pos) != 1 {
		fmt.Fprintln(stderr, "gateway plugin new: need exactly one NAME")
		fs.Usage()
		return exitUsage
	}
	opts := scaffold.Options{Name: pos[0], Dir: *dir, Module: *module, GatewaySrc: *src}
	if opts.GatewaySrc == "" {
		if opts.GatewaySrc, err = scaffold.FindGatewaySrc("."); err != nil {
			fmt.Fprintln(stderr, "gateway plugin new:", err)
			return exitUsage
		}
	}
	if opts.Dir == "" {
		opts.Dir = opts.Name + "-provider"
	}
	files, err := scaffold.Generate(opts)
	if err != nil {
		fmt.Fprintln(stderr, "gateway plugin new:", err)
		return exitFailed
	}
	fmt.Fprintf(stdout, "wrote %s in %s, building against the gateway checkout in %s\n\nnext:\n", strings.Join(files, ", "), opts.Dir, opts.GatewaySrc)
	for _, step := range []string{
		"cd " + opts.Dir,
		"go mod tidy",
		"go test ./...",
		"go build -o bin/" + opts.Name + " .",
		"gateway plugin check bin/" + opts.Name + " --payloads payloads.json",
	} {
		fmt.Fprintf(stdout, "  %s\n", step)
	}
	fmt.Fprintln(stdout, "\nthen README.md shows how to pin the binary and call it from a chain.")
	return exitOK
}
