package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/user"
	"slices"
	"strings"
	"time"

	"github.com/chaingate/gateway/cmd/gateway/internal/show"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/gateway/audit"
	"github.com/chaingate/gateway/gateway/authz"
	"github.com/chaingate/gateway/gateway/chaintest"
	"github.com/chaingate/gateway/gateway/ops"
	"github.com/chaingate/gateway/internal/jsonx"
	"github.com/chaingate/gateway/internal/textx"
)

// target is where an operator command acts: a server's API, or a store.
type target struct {
	server  *string
	token   *string
	state   *string
	output  *string
	configs stringList
}

func addTarget(fs *flag.FlagSet) *target {
	t := &target{
		server: fs.String("server", os.Getenv("CHAINGATE_SERVER"), "gateway API to talk to, e.g. http://127.0.0.1:8080 (default $CHAINGATE_SERVER; none: work on the store)"),
		token:  fs.String("token", os.Getenv("CHAINGATE_TOKEN"), "API bearer token (default $CHAINGATE_TOKEN)"),
		state:  stateFlag(fs),
		output: fs.String("output", "table", "output: table or json"),
	}
	fs.Var(&t.configs, "config", "config file or directory, for work on the store (repeatable)")
	return t
}

// open returns the Ops to run and a function to release them. Working on a
// store needs no server; a replay there also needs the config's providers.
func (t *target) open(ctx context.Context, stderr io.Writer) (api.Ops, *gateway.Gateway, func(), error) {
	if *t.server != "" {
		return api.NewClient(*t.server, *t.token), nil, func() {}, nil
	}
	cfg := &chain.Config{Chains: map[string]*chain.Chain{}, Providers: map[string]*chain.Provider{}}
	if len(t.configs) > 0 {
		var err error
		if cfg, err = gateway.LoadConfig(t.configs); err != nil {
			show.ConfigError(stderr, err)
			return nil, nil, nil, errUsage
		}
	}
	logger, _ := newLogger(stderr, "warn")
	l, err := ops.OpenStore(ctx, cfg, *t.state, logger)
	if err != nil {
		return nil, nil, nil, err
	}
	audited := &ops.Audited{Ops: l, Log: audit.New(l.GW.Store, logger), Subject: authz.Subject{Kind: authz.CLI, Name: cliUser()}}
	return audited, l.GW, func() { _ = l.GW.Close() }, nil
}

var errUsage = errors.New("usage")

// isSet reports whether the named flag was given.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// fail prints err and returns the exit status it calls for.
func fail(stderr io.Writer, cmd string, err error) int {
	if errors.Is(err, errUsage) {
		return exitUsage
	}
	var ae *api.APIError
	if errors.As(err, &ae) && ae.Status == http.StatusUnauthorized {
		fmt.Fprintf(stderr, "gateway %s: %v; pass a token the gateway accepts with --token T or CHAINGATE_TOKEN\n", cmd, err)
		return exitFailed
	}
	fmt.Fprintf(stderr, "gateway %s: %v\n", cmd, err)
	return exitFailed
}

func (t *target) json() bool { return *t.output == "json" }

const runsHelp = `Usage:
  gateway runs list [--chain C] [--status S] [--since T] [--started-by KIND[:NAME]]
                    [--hide-chain C]... [--label KEY=VALUE]... [--limit N] [--cursor X]
  gateway runs show RUN_ID [--items]
  gateway runs cancel RUN_ID
  gateway runs replay RUN_ID [--mode resume|restart] [--definition current|pinned]
  gateway runs redrive RUN_ID SPLIT [--skipped] [--definition current|pinned]
  gateway runs approve RUN_ID STEP [--comment TEXT]
  gateway runs reject RUN_ID STEP [--comment TEXT]
  gateway runs events RUN_ID [--follow]
  gateway runs dag RUN_ID
  gateway runs delete RUN_ID...
  gateway runs prune --older-than D [--chain C] [--status S] [--dry-run]
  gateway runs export RUN_ID --as-test [--out FILE]

--since takes an RFC 3339 time or a duration (1h). Add --server URL (and
--token) to go through a gateway's API, or --state PATH to read a store.

--started-by keeps the runs started one way: trigger, schedule, api, cli,
replay or sub_chain, or by one trigger or schedule (trigger:NAME,
schedule:NAME). --hide-chain leaves a chain's runs out; repeat it to leave
out more, so a schedule's runs do not bury an incident's. --label keeps
the runs that carry a label (an alert's instance=db-1:9100, say; KEY alone:
any value); repeat it to need more. The search goes through every run, not
one page.

replay runs a failed, timed-out or cancelled run again, whether or not its
failure was dead-lettered (when it was, the entry goes): --mode resume (the
default) carries on from the step it stopped at, keeping what succeeded;
--mode restart starts a new run with the same payload, which works on a
succeeded run too. On a store it needs --config and waits for the run.

redrive runs again the failed items of a top-level split of a run that
ended (with --skipped, its skipped items too), keeping every other item's
result, then the steps after the split: a split of 20,000 items with 201
failures makes 201 calls. It works whatever the run ended as, locally and on
workers. On a store it needs --config and waits for the run.

delete removes runs that have ended, with their dead-letter entries. prune
removes the runs that ended longer ago than --older-than (36h, 30d, 2w), as
retention would: it keeps a run with a dead-letter entry, a sub-chain's run
while its parent is there and a run whose idempotency key still holds;
--dry-run lists what it would remove. A serving gateway prunes by
[gateway.retention] by itself.

export --as-test writes a run that ended as a test case for gateway test
(docs/testing.md): its payload, what each call answered as mocks, each
approval's answer, and its path and outcomes as expectations; so last
night's incident tests tomorrow's config. Add it to a *_test.toml file
beside the config.

approve and reject answer an approval step the run waits at; the first
answer wins, and a second is refused naming who gave the first. An answer
at or after the step's deadline is refused, and the step goes on as its
on_timeout says.

`

// runsCommands are the sub-commands of "gateway runs".
var runsCommands = []string{"list", "show", "cancel", "replay", "redrive", "approve", "reject", "events", "dag", "delete", "prune", "export"}

func cmdRuns(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, runsHelp)
		return exitUsage
	}
	if isHelp(args[0]) {
		fmt.Fprint(stdout, runsHelp)
		return exitOK
	}
	sub := args[0]
	fs := newFlagSet("runs "+sub, stdout, stderr, runsHelp)
	t := addTarget(fs.FlagSet)
	chainName := fs.String("chain", "", "only runs of this chain")
	status := fs.String("status", "", "only runs with this status")
	sinceArg := fs.String("since", "", "only runs created since this time or duration ago")
	limit := fs.Int("limit", 50, "at most this many runs")
	cursor := fs.String("cursor", "", "continue a listing")
	startedBy := fs.String("started-by", "", "only runs started this way: trigger, schedule, api, cli, replay, sub_chain, or trigger:NAME, schedule:NAME")
	var hideChains, labels stringList
	fs.Var(&hideChains, "hide-chain", "leave out the runs of this chain (repeatable)")
	fs.Var(&labels, "label", "only runs with this label, KEY=VALUE or KEY (repeatable)")
	items := fs.Bool("items", false, "include every split item's records")
	follow := fs.Bool("follow", false, "keep streaming events until the run ends")
	mode := fs.String("mode", "resume", "replay mode: resume or restart")
	definition := fs.String("definition", "current", "definition a resumed run carries on with: current or pinned")
	comment := fs.String("comment", "", "why, for approve and reject")
	olderThan := fs.String("older-than", "", "prune the runs that ended longer ago than this (36h, 30d, 2w)")
	dryRun := fs.Bool("dry-run", false, "list what prune would remove, and remove nothing")
	asTest := fs.Bool("as-test", false, "export: write the run as a test case of gateway test")
	skipped := fs.Bool("skipped", false, "redrive: run the split's skipped items again too, not only its failed ones")
	out := fs.String("out", "", "export: write to this file rather than to standard output")
	pos, err := parseInterleaved(fs, args[1:])
	if err != nil {
		return parseExit(err)
	}
	if !slices.Contains(runsCommands, sub) {
		fmt.Fprintf(stderr, "gateway runs: unknown command %q\n\n%s", sub, runsHelp)
		return exitUsage
	}
	arity := map[string]int{"list": 0, "approve": 2, "reject": 2, "prune": 0, "redrive": 2}
	want, ok := arity[sub]
	if !ok {
		want = 1
	}
	if len(pos) != want && !(sub == "delete" && len(pos) > 0) {
		fmt.Fprint(stderr, runsHelp)
		return exitUsage
	}
	if sub == "export" && !*asTest {
		fmt.Fprintln(stderr, "gateway runs export: give --as-test (a test case is the one form it writes)")
		return exitUsage
	}
	var older time.Duration
	if sub == "prune" {
		d, err := chain.ParseDuration(*olderThan)
		if *olderThan == "" || err != nil || d <= 0 {
			fmt.Fprintln(stderr, `gateway runs prune: --older-than must be a positive duration such as "36h", "30d" or "2w"`)
			return exitUsage
		}
		if err := api.CheckRunStatus(store.RunStatus(*status)); err != nil || !store.RunStatus(*status).Final() && *status != "" {
			fmt.Fprintln(stderr, "gateway runs prune: --status must be one a run ends with: succeeded, failed, cancelled, timed_out or skipped")
			return exitUsage
		}
		older = d
	}
	if sub == "list" {
		// The API's own checks, so a store and a server refuse alike.
		_, labelErr := api.ParseLabels("--label", labels, false)
		if err := errors.Join(api.CheckRunStatus(store.RunStatus(*status)), api.CheckStartedBy("--started-by", *startedBy), api.CheckHideChains("--hide-chain", hideChains), api.CheckRange("limit", *limit, api.MaxPageLimit), labelErr); err != nil {
			fmt.Fprintf(stderr, "gateway runs list: %v\n", err)
			return exitUsage
		}
	}
	replayOpts := engine.ReplayOptions{Mode: engine.ReplayMode(*mode), Definition: engine.ReplayDefinition(*definition)}
	if err := replayOpts.Check(); sub == "replay" && err != nil {
		fmt.Fprintf(stderr, "gateway runs replay: %s\n", strings.TrimPrefix(err.Error(), engine.ErrNotReplayable.Error()+": "))
		return exitUsage
	}
	ops, gw, done, err := t.open(ctx, stderr)
	if err != nil {
		return fail(stderr, "runs", err)
	}
	defer done()
	switch sub {
	case "list":
		since, err := api.ParseSince(*sinceArg)
		if err != nil {
			return fail(stderr, "runs", err)
		}
		// The table shows no payload; JSON carries the runs whole.
		byLabel, _ := api.ParseLabels("--label", labels, false)
		page, err := ops.ListRuns(ctx, store.RunFilter{Chain: *chainName, Status: store.RunStatus(*status), Since: since, Limit: *limit, Cursor: *cursor, NoOrigins: !t.json(),
			StartedBy: *startedBy, HideChains: hideChains, Labels: byLabel})
		if err != nil {
			return fail(stderr, "runs", err)
		}
		if t.json() {
			if page.Damaged == nil {
				page.Damaged = []api.DamagedRun{}
			}
			show.JSON(stdout, page)
			return exitOK
		}
		show.Runs(stdout, page)
	case "export":
		b, err := chaintest.Export(ctx, ops, pos[0])
		if err != nil {
			return fail(stderr, "runs", err)
		}
		if *out == "" {
			_, _ = stdout.Write(b)
			return exitOK
		}
		if err := os.WriteFile(*out, b, 0o644); err != nil {
			return fail(stderr, "runs", fmt.Errorf("writing the test case: %w", err))
		}
		fmt.Fprintf(stdout, "wrote %s\n", *out)
	case "show":
		v, err := ops.Run(ctx, pos[0], *items)
		if err != nil {
			return fail(stderr, "runs", err)
		}
		if t.json() {
			show.JSON(stdout, v)
			return exitOK
		}
		show.Run(stdout, v)
	case "cancel":
		if err := ops.CancelRun(ctx, pos[0]); err != nil {
			return fail(stderr, "runs", err)
		}
		fmt.Fprintf(stdout, "cancelling run %s\n", pos[0])
	case "delete":
		code := exitOK
		for _, id := range pos {
			res, err := ops.DeleteRun(ctx, id)
			if err != nil {
				code = fail(stderr, "runs", err)
				continue
			}
			if t.json() {
				show.JSON(stdout, res)
				continue
			}
			fmt.Fprintf(stdout, "deleted run %s (%s, %s)\n", id, textx.Count(res.Freed.Records, "record", "records"), textx.Count(len(res.DeadLetters), "dead-letter entry", "dead-letter entries"))
		}
		return code
	case "prune":
		res, err := ops.PruneRuns(ctx, api.PruneOptions{OlderThan: older, Chain: *chainName, Status: store.RunStatus(*status), DryRun: *dryRun})
		if err != nil {
			return fail(stderr, "runs", err)
		}
		if t.json() {
			show.JSON(stdout, res)
			return exitOK
		}
		show.Prune(stdout, res)
	case "approve", "reject":
		if gw != nil {
			// Straight on a store, the answer is the machine user's.
			ctx = engine.Acting(ctx, engine.Identity{Name: cliUser()}, "CLI")
		}
		d, err := ops.Signal(ctx, pos[0], pos[1], sub, *comment)
		if err != nil {
			return fail(stderr, "runs", err)
		}
		verb := map[string]string{"approve": "approved", "reject": "rejected"}[sub]
		fmt.Fprintf(stdout, "%s step %s of run %s as %s\n", verb, pos[1], pos[0], d.By)
	case "replay":
		if gw != nil && len(gw.Config.Chains) == 0 {
			fmt.Fprintln(stderr, "gateway runs replay: working on a store needs --config, to run what is replayed")
			return exitUsage
		}
		run, err := ops.ReplayRun(ctx, pos[0], replayOpts)
		if err != nil {
			return fail(stderr, "runs", err)
		}
		fmt.Fprintf(stdout, "replaying run %s as run %s\n", pos[0], run.ID)
		if gw != nil {
			final, err := gw.Engine.Wait(ctx, run.ID)
			if err != nil {
				return fail(stderr, "runs", err)
			}
			fmt.Fprintf(stdout, "run %s %s\n", run.ID, final.Status)
		}
	case "redrive":
		if gw != nil && len(gw.Config.Chains) == 0 {
			fmt.Fprintln(stderr, "gateway runs redrive: working on a store needs --config, to run what is redriven")
			return exitUsage
		}
		run, err := ops.RedriveSplit(ctx, pos[0], pos[1], engine.RedriveOptions{Skipped: *skipped, Definition: engine.ReplayDefinition(*definition)})
		if err != nil {
			return fail(stderr, "runs", err)
		}
		fmt.Fprintf(stdout, "redriving split %s of run %s\n", pos[1], run.ID)
		if gw != nil {
			final, err := gw.Engine.Wait(ctx, run.ID)
			if err != nil {
				return fail(stderr, "runs", err)
			}
			fmt.Fprintf(stdout, "run %s %s\n", run.ID, final.Status)
		}
	case "events":
		p := show.NewProgress(stdout)
		err := ops.Events(ctx, pos[0], 0, *follow, func(ev api.Event) error {
			if t.json() {
				b, _ := jsonx.Marshal(ev)
				_, err := fmt.Fprintln(stdout, string(b))
				return err
			}
			p.Print(ev)
			return nil
		})
		if err != nil && ctx.Err() == nil {
			return fail(stderr, "runs", err)
		}
	case "dag":
		d, err := ops.DAG(ctx, pos[0])
		if err != nil {
			return fail(stderr, "runs", err)
		}
		if t.json() {
			show.JSON(stdout, d)
			return exitOK
		}
		show.DAG(stdout, d.Nodes, "")
	}
	return exitOK
}

const dlqHelp = `Usage:
  gateway dlq list [--chain C] [--step S] [--since T] [--limit N]
  gateway dlq show ENTRY_ID
  gateway dlq replay ENTRY_ID [--mode resume|restart] [--definition current|pinned]
  gateway dlq replay --chain C [--step S] [--since T] [--limit N] [--mode M] [--definition D] [--concurrency N]   (or --all)
  gateway dlq delete ENTRY_ID
  gateway dlq purge --chain C [--step S] [--since T] [--limit N]                                  (or --all)

replay resume (the default) runs the failed run again from the step that
failed, keeping what succeeded and the dedup keys it sent; restart starts
a new run with the same input (new dedup keys: providers see a new event).

A resumed run carries on with the chain as the config defines it now
(--definition current, the default), so a fix to a provider's config or a
step's payload applies once the gateway has reloaded it; the replay is
refused, naming the difference, if a step the run already took is gone
or changed kind. --definition pinned resumes on the definition the run
started with. Working on a store (no --server), replay needs --config and
waits for the replayed runs.

`

func cmdDLQ(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, dlqHelp)
		return exitUsage
	}
	if isHelp(args[0]) {
		fmt.Fprint(stdout, dlqHelp)
		return exitOK
	}
	sub := args[0]
	fs := newFlagSet("dlq "+sub, stdout, stderr, dlqHelp)
	t := addTarget(fs.FlagSet)
	chainName := fs.String("chain", "", "only entries of this chain")
	step := fs.String("step", "", "only entries of this step")
	sinceArg := fs.String("since", "", "only entries since this time or duration ago")
	limit := fs.Int("limit", 0, "at most this many entries")
	mode := fs.String("mode", "resume", "replay mode: resume or restart")
	definition := fs.String("definition", "current", "definition a resumed run carries on with: current or pinned")
	concurrency := fs.Int("concurrency", 4, "replays at a time")
	all := fs.Bool("all", false, "every entry (replay, purge)")
	pos, err := parseInterleaved(fs, args[1:])
	if err != nil {
		return parseExit(err)
	}
	since, err := api.ParseSince(*sinceArg)
	if err != nil {
		return fail(stderr, "dlq", err)
	}
	filter := store.DLQFilter{Chain: *chainName, Step: *step, Since: since, Limit: *limit}
	filtered := *chainName != "" || *step != "" || *sinceArg != "" || *all
	switch {
	case sub == "list" && len(pos) == 0:
	case (sub == "show" || sub == "delete") && len(pos) == 1:
	case sub == "replay" && (len(pos) == 1) != filtered:
	case sub == "purge" && len(pos) == 0 && filtered:
	case (sub == "purge" || sub == "replay") && len(pos) == 0:
		fmt.Fprintf(stderr, "gateway dlq %s: refusing to %s every entry without being told: give --chain, --step or --since to select entries, or --all\n", sub, sub)
		return exitUsage
	case sub == "replay" && len(pos) == 1:
		fmt.Fprintln(stderr, "gateway dlq replay: give an entry id or a filter (--chain, --step, --since, --all), not both")
		return exitUsage
	default:
		fmt.Fprint(stderr, dlqHelp)
		return exitUsage
	}
	replayOpts := engine.ReplayOptions{Mode: engine.ReplayMode(*mode), Definition: engine.ReplayDefinition(*definition)}
	if err := replayOpts.Check(); err != nil {
		fmt.Fprintf(stderr, "gateway dlq: %s\n", strings.TrimPrefix(err.Error(), engine.ErrNotReplayable.Error()+": "))
		return exitUsage
	}
	// The API's own checks, so a store and a server refuse alike.
	var checks []error
	switch {
	case sub == "list" && isSet(fs.FlagSet, "limit"):
		checks = append(checks, api.CheckRange("limit", *limit, api.MaxPageLimit))
	case (sub == "replay" || sub == "purge") && *limit != 0:
		// 0 means every entry the filter selects, as in the API.
		checks = append(checks, api.CheckRange("limit", *limit, api.MaxBulkLimit))
	}
	if sub == "replay" && len(pos) == 0 {
		checks = append(checks, api.CheckRange("concurrency", *concurrency, api.MaxConcurrency))
	}
	if err := errors.Join(checks...); err != nil {
		fmt.Fprintf(stderr, "gateway dlq %s: %v\n", sub, err)
		return exitUsage
	}
	ops, gw, done, err := t.open(ctx, stderr)
	if err != nil {
		return fail(stderr, "dlq", err)
	}
	defer done()
	switch sub {
	case "list":
		entries, err := ops.ListDLQ(ctx, filter)
		if err != nil {
			return fail(stderr, "dlq", err)
		}
		if t.json() {
			show.JSON(stdout, map[string]any{"entries": entries})
			return exitOK
		}
		show.DeadLetters(stdout, entries)
	case "show":
		e, err := ops.DLQEntry(ctx, pos[0])
		if err != nil {
			return fail(stderr, "dlq", err)
		}
		show.JSON(stdout, e)
	case "delete":
		if err := ops.DeleteDLQ(ctx, pos[0]); err != nil {
			return fail(stderr, "dlq", err)
		}
		fmt.Fprintf(stdout, "deleted entry %s\n", pos[0])
	case "purge":
		n, err := ops.PurgeDLQ(ctx, filter)
		if err != nil {
			return fail(stderr, "dlq", err)
		}
		fmt.Fprintf(stdout, "purged %s\n", textx.Count(n, "entry", "entries"))
	case "replay":
		if gw != nil && len(gw.Config.Chains) == 0 {
			fmt.Fprintln(stderr, "gateway dlq replay: working on a store needs --config, to run what is replayed")
			return exitUsage
		}
		var runs []string
		code := exitOK
		if len(pos) == 1 {
			run, err := ops.Replay(ctx, pos[0], replayOpts)
			if err != nil {
				return fail(stderr, "dlq", err)
			}
			show.ReplayedEntry(stdout, pos[0], run.ID)
			if run.ID != "" {
				runs = append(runs, run.ID)
			}
		} else {
			res, err := ops.ReplayMany(ctx, filter, replayOpts, *concurrency)
			if err != nil {
				return fail(stderr, "dlq", err)
			}
			if t.json() {
				show.JSON(stdout, res)
			} else {
				for _, r := range res.Replayed {
					show.ReplayedEntry(stdout, r.Entry, r.Run)
				}
				for _, f := range res.Failed {
					fmt.Fprintf(stdout, "could not replay entry %s: %s\n", f.Entry, f.Error)
				}
			}
			for _, r := range res.Replayed {
				if r.Run != "" {
					runs = append(runs, r.Run)
				}
			}
			if len(res.Failed) > 0 {
				code = exitFailed
			}
		}
		// On a store, this process advances the replayed runs: wait for them.
		if gw != nil {
			for _, id := range runs {
				run, err := gw.Engine.Wait(ctx, id)
				if err != nil {
					return fail(stderr, "dlq", err)
				}
				fmt.Fprintf(stdout, "run %s %s\n", id, run.Status)
			}
		}
		return code
	}
	return exitOK
}

const graphHelp = `Usage: gateway graph CHAIN --config PATH...    (or --server URL)

Prints the chain as a Mermaid flowchart: parallel groups and splits as
subgraphs, branches as labelled edges.

`

func cmdGraph(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("graph", stdout, stderr, graphHelp)
	t := addTarget(fs.FlagSet)
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return parseExit(err)
	}
	if len(pos) != 1 || (*t.server == "" && len(t.configs) == 0) {
		fmt.Fprint(stderr, graphHelp)
		return exitUsage
	}
	if *t.server != "" {
		c, err := api.NewClient(*t.server, *t.token).Chain(ctx, pos[0])
		if err != nil {
			return fail(stderr, "graph", err)
		}
		fmt.Fprint(stdout, c["mermaid"])
		return exitOK
	}
	cfg, err := gateway.LoadConfig(t.configs)
	if err != nil {
		show.ConfigError(stderr, err)
		return exitUsage
	}
	c := cfg.Chains[pos[0]]
	if c == nil {
		fmt.Fprintf(stderr, "gateway graph: unknown chain %q; the config defines %s\n", pos[0], strings.Join(cfg.ChainNames, ", "))
		return exitUsage
	}
	fmt.Fprint(stdout, c.Mermaid())
	return exitOK
}

// cliUser is who works straight on a store: this machine's user.
func cliUser() string {
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return "unknown user"
}
