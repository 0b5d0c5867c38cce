package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/chaingate/gateway/cmd/gateway/internal/show"
	"github.com/chaingate/gateway/gateway/api"
)

const pauseHelp = `Usage:
  gateway pause trigger|schedule NAME [--reason TEXT]
  gateway unpause trigger|schedule NAME
  gateway pause --list

pause stops a trigger or schedule on every gateway sharing the store, until
unpause: a paused trigger still answers its sender, and keeps each delivery
in the dead-letter queue (code trigger_paused) to replay once it is
unpaused; a paused schedule's ticks start nothing. Who paused, when and why
are kept, logged and shown by --list and the console's Now page. Add
--server URL (and --token) to go through a gateway's API, or --state PATH
with --config to work on a store.

`

func cmdPause(ctx context.Context, args []string, stdout, stderr io.Writer, unpause bool) int {
	name := "pause"
	if unpause {
		name = "unpause"
	}
	fs := newFlagSet(name, stdout, stderr, pauseHelp)
	t := addTarget(fs.FlagSet)
	reason := fs.String("reason", "", "pause: why, shown with the pause")
	list := fs.Bool("list", false, "pause: list what is paused")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return parseExit(err)
	}
	if (*list && (len(pos) != 0 || unpause)) || (!*list && len(pos) != 2) || (unpause && *reason != "") {
		fs.Usage()
		return exitUsage
	}
	if !*list && pos[0] != api.PauseTrigger && pos[0] != api.PauseSchedule {
		fmt.Fprintf(stderr, "gateway %s: %q is not trigger or schedule\n", name, pos[0])
		return exitUsage
	}
	ops, _, done, err := t.open(ctx, stderr)
	if err != nil {
		return fail(stderr, name, err)
	}
	defer done()
	switch {
	case *list:
		ps, err := ops.Pauses(ctx)
		if err != nil {
			return fail(stderr, name, err)
		}
		if t.json() {
			show.JSON(stdout, ps)
			return exitOK
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "KIND\tNAME\tBY\tSINCE\tREASON")
		for _, p := range ps {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", p.Kind, p.Name, p.By, p.At.Local().Format(show.TimeLayout), p.Reason)
		}
		_ = tw.Flush()
	case unpause:
		p, err := ops.Resume(ctx, pos[0], pos[1])
		if err != nil {
			return fail(stderr, name, err)
		}
		if p == nil {
			fmt.Fprintf(stdout, "%s %s was not paused\n", pos[0], pos[1])
			return exitOK
		}
		fmt.Fprintf(stdout, "unpaused %s %s (paused by %s at %s)\n", pos[0], pos[1], p.By, p.At.Local().Format(show.TimeLayout))
		if pos[0] == api.PauseTrigger {
			fmt.Fprintln(stdout, "the deliveries it kept while paused wait in the dead-letter queue (code trigger_paused): gateway dlq list, then gateway dlq replay")
		}
	default:
		p, err := ops.Pause(ctx, pos[0], pos[1], *reason)
		if err != nil {
			return fail(stderr, name, err)
		}
		fmt.Fprintf(stdout, "%s %s paused by %s at %s\n", pos[0], pos[1], p.By, p.At.Local().Format(show.TimeLayout))
	}
	return exitOK
}
