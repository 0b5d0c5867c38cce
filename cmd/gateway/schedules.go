package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/chaingate/gateway/cmd/gateway/internal/show"
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/gateway/schedules"
)

const schedulesHelp = `Usage:
  gateway schedules list --config PATH... [--state PATH]   (or --server URL)

Lists the [[schedules]] of a config, or of a running gateway with --server:
what each starts, its next three ticks in its time zone, and its latest
tick with the run it started (from the store, with --state or --server).

`

func cmdSchedules(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || isHelp(args[0]) {
		if len(args) == 0 {
			fmt.Fprint(stderr, schedulesHelp)
			return exitUsage
		}
		fmt.Fprint(stdout, schedulesHelp)
		return exitOK
	}
	fs := newFlagSet("schedules "+args[0], stdout, stderr, schedulesHelp)
	t := addTarget(fs.FlagSet)
	pos, err := parseInterleaved(fs, args[1:])
	if err != nil {
		return parseExit(err)
	}
	if args[0] != "list" || len(pos) != 0 || (*t.server == "" && len(t.configs) == 0) {
		fmt.Fprint(stderr, schedulesHelp)
		return exitUsage
	}
	var list []api.ScheduleInfo
	switch {
	case *t.server != "":
		if list, err = api.NewClient(*t.server, *t.token).Schedules(ctx); err != nil {
			return fail(stderr, "schedules", err)
		}
	case isSet(fs.FlagSet, "state"):
		_, gw, done, err := t.open(ctx, stderr)
		if err != nil {
			return fail(stderr, "schedules", err)
		}
		list = schedules.Schedules(ctx, gw.Config, gw.Store, time.Now())
		done()
	default:
		cfg, err := gateway.LoadConfig(t.configs)
		if err != nil {
			show.ConfigError(stderr, err)
			return exitUsage
		}
		list = schedules.Schedules(ctx, cfg, nil, time.Now())
	}
	if t.json() {
		show.JSON(stdout, list)
		return exitOK
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SCHEDULE\tCHAIN\tWHEN\tNEXT\tLAST TICK\tLAST RUN")
	for _, s := range list {
		when := s.Cron + " " + s.Timezone
		if s.Every != "" {
			when = "every " + s.Every
		}
		if s.CatchUp {
			when += " (catch up)"
		}
		next := make([]string, len(s.Next))
		for i, n := range s.Next {
			next[i] = n.Format(show.TimeLayout)
		}
		last := ""
		if !s.LastTick.IsZero() {
			last = s.LastTick.Format(show.TimeLayout)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, s.Chain, when, strings.Join(next, ", "), last, s.LastRun)
	}
	_ = tw.Flush()
	return exitOK
}
