package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/chaingate/gateway/cmd/gateway/internal/show"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/internal/jsonx"
)

const auditHelp = `Usage:
  gateway audit list [--since T] [--until T] [--subject NAME] [--action A] [--outcome ok|denied|failed]
                     [--entry-point api|console|slack|trigger|cli] [--chain C] [--limit N] [--cursor X]
  gateway audit export [the same filters] > audit.jsonl

The audit log holds every operator action and every refusal: who, what, on
which run, chain or trigger, from which address and way in, and what came
of it. list shows it newest first; export writes every entry the filters
select, oldest first, one JSON object a line, for a SIEM. --since takes an
RFC 3339 time or a duration (24h); --until an RFC 3339 time. Reading it is
an admin's action. Add --server URL (and --token), or --state PATH to read
a store.

`

func cmdAudit(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || isHelp(args[0]) {
		if len(args) == 0 {
			fmt.Fprint(stderr, auditHelp)
			return exitUsage
		}
		fmt.Fprint(stdout, auditHelp)
		return exitOK
	}
	sub := args[0]
	fs := newFlagSet("audit "+sub, stdout, stderr, auditHelp)
	t := addTarget(fs.FlagSet)
	q := map[string]*string{}
	for _, name := range []string{"since", "until", "subject", "action", "outcome", "entry-point", "chain", "cursor"} {
		q[name] = fs.String(name, "", "only entries with this "+name)
	}
	limit := fs.Int("limit", 0, "at most this many entries (list; default 100)")
	pos, err := parseInterleaved(fs, args[1:])
	if err != nil {
		return parseExit(err)
	}
	if (sub != "list" && sub != "export") || len(pos) != 0 {
		fmt.Fprint(stderr, auditHelp)
		return exitUsage
	}
	values := map[string][]string{}
	for name, v := range q {
		if *v != "" {
			key := name
			if name == "entry-point" {
				key = "entry_point"
			}
			values[key] = []string{*v}
		}
	}
	if *limit != 0 {
		values["limit"] = []string{fmt.Sprint(*limit)}
	}
	// The API's own checks, so a store and a server refuse alike.
	f, err := api.ParseAuditFilter(values)
	if err != nil {
		fmt.Fprintf(stderr, "gateway audit %s: %v\n", sub, api.AsAPIError(err).Message)
		return exitUsage
	}
	ops, _, done, err := t.open(ctx, stderr)
	if err != nil {
		return fail(stderr, "audit", err)
	}
	defer done()
	if sub == "export" {
		err := ops.ExportAudit(ctx, f, func(e *api.AuditEntry) error {
			b, err := jsonx.Marshal(e)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(stdout, string(b))
			return err
		})
		if err != nil {
			return fail(stderr, "audit", err)
		}
		return exitOK
	}
	page, err := ops.ListAudit(ctx, f)
	if err != nil {
		return fail(stderr, "audit", err)
	}
	if t.json() {
		show.JSON(stdout, page)
		return exitOK
	}
	show.Audit(stdout, page, time.Local)
	return exitOK
}
