// Package show writes what the gateway command prints: tables of runs and
// dead-letter entries, a run's record and DAG, progress lines, and a finished
// run; for jq, JSON that does not HTML-escape.
package show

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/internal/textx"
)

// JSON writes v indented, without HTML escapes, so "<" stays "<".
func JSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// Prune prints what a prune removed, or would remove.
func Prune(w io.Writer, res *api.PruneResult) {
	n := 0
	var by []string
	for _, st := range store.FinalRunStatuses {
		if c := res.Runs[string(st)]; c > 0 {
			n += c
			by = append(by, fmt.Sprintf("%d %s", c, st))
		}
	}
	verb := "pruned"
	if res.DryRun {
		verb = "would prune"
	}
	line := verb + " " + textx.Count(n, "run", "runs")
	if len(by) > 0 {
		line += " (" + strings.Join(by, ", ") + ")"
	}
	if !res.DryRun {
		line += ", " + textx.Count(res.Freed.Records, "record", "records") + " freed"
	}
	fmt.Fprintln(w, line)
	if k := res.Kept; k.DeadLetter+k.Key+k.Parent > 0 {
		fmt.Fprintf(w, "kept %d with a dead-letter entry, %d whose idempotency key still holds, %d whose parent run is kept\n", k.DeadLetter, k.Key, k.Parent)
	}
	if res.DryRun {
		for _, id := range res.IDs {
			fmt.Fprintln(w, id)
		}
	}
}

// TimeLayout is how the CLI's tables print a time: to the second, with its
// zone, so a time read off one machine's table means the same on another.
const TimeLayout = "2006-01-02 15:04:05 MST"

// took is how long a run took, or has taken so far.
func took(r *api.Run) string {
	end := r.FinishedAt
	if end.IsZero() {
		end = time.Now()
	}
	return end.Sub(r.CreatedAt).Round(time.Millisecond).String()
}

// howStarted is how a run started, as --started-by takes it; "-" for a run
// an older version started, which did not record it.
func howStarted(r *api.Run) string {
	if r.StartedBy == "" {
		return "-"
	}
	return r.StartedBy
}

func errMsg(e *api.ErrorInfo) string {
	if e == nil {
		return ""
	}
	return e.Message
}

func short(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > n {
		return s[:n-1] + "…"
	}
	return s
}

// Run prints a run's record: who started it, where it waits or failed,
// its path and each step's outcome.
func Run(w io.Writer, v *api.RunView) {
	by := ""
	if v.StartedBy != "" {
		by = " by " + v.StartedBy
	}
	fmt.Fprintf(w, "run      %s\nchain    %s\nstatus   %s\nstarted  %s%s\ntook     %s\n", v.ID, v.Chain, v.Status, v.CreatedAt.Local().Format(TimeLayout), by, took(v.Run))
	if v.ParentRun != "" {
		fmt.Fprintf(w, "parent   %s (step %s)\n", v.ParentRun, v.ParentStep)
	}
	if len(v.Labels) > 0 {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(v.Labels)) {
			parts = append(parts, k+"="+v.Labels[k])
		}
		fmt.Fprintf(w, "labels   %s\n", strings.Join(parts, " "))
	}
	if v.Error != nil {
		fmt.Fprintf(w, "error    %s\n", v.Error.Message)
	}
	queue(w, v.Queue)
	failure(w, v.Run)
	fmt.Fprintf(w, "path     %s\n\n", strings.Join(v.Path, " → "))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STEP\tSTATUS\tATTEMPTS\tRESULT")
	for _, k := range sortedStepKeys(v.Steps) {
		rec := v.Steps[k]
		result := string(rec.Body)
		if rec.Error != nil {
			result = rec.Error.Message
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", k, rec.Status, rec.Attempts, short(result, 70))
	}
	_ = tw.Flush()
}

func sortedStepKeys(m map[string]*api.Step) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	// The order the run reached them in, roughly: by start time, then key.
	sort.SliceStable(keys, func(i, j int) bool {
		ta, tb := m[keys[i]].StartedAt, m[keys[j]].StartedAt
		if !ta.Equal(tb) {
			return ta.Before(tb)
		}
		return keys[i] < keys[j]
	})
	return keys
}

// DAG prints a run's steps as an indented tree with their outcomes.
func DAG(w io.Writer, nodes []*api.DAGNode, indent string) {
	for _, n := range nodes {
		extra := ""
		switch {
		case n.Split != nil:
			extra = fmt.Sprintf(" %d/%d items (%d ok, %d failed, %d skipped)", n.Split.Succeeded+n.Split.Failed+n.Split.Skipped, n.Split.Total, n.Split.Succeeded, n.Split.Failed, n.Split.Skipped)
			if n.Split.Distributed {
				extra += ", on workers"
			}
		case n.ChildRun != "":
			extra = " run " + n.ChildRun
		}
		fmt.Fprintf(w, "%s%s [%s] %s%s\n", indent, n.Name, n.Kind, n.Status, extra)
		DAG(w, n.Children, indent+"  ")
	}
}

// ReplayedEntry says what a replay of an entry started: a run, or, for a
// delivery whose every alert was skipped, nothing.
func ReplayedEntry(w io.Writer, entry, run string) {
	if run == "" {
		fmt.Fprintf(w, "replayed entry %s: it started no run (each of its alerts was skipped), and is removed\n", entry)
		return
	}
	fmt.Fprintf(w, "replaying entry %s as run %s\n", entry, run)
}

// Runs prints a page of runs as a table, damaged records last, and the
// cursor that continues it.
func Runs(w io.Writer, page api.RunPage) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tCHAIN\tSTATUS\tSTARTED\tSTARTED BY\tTOOK\tERROR")
	for _, r := range page.Runs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.Chain, r.Status, r.CreatedAt.Local().Format(TimeLayout), howStarted(r), took(r), short(errMsg(r.Error), 60))
	}
	for _, d := range page.Damaged {
		fmt.Fprintf(tw, "%s\t?\tdamaged\t\t\t\t%s\n", d.ID, short(d.Error, 60))
	}
	_ = tw.Flush()
	if page.Next != "" {
		fmt.Fprintf(w, "more: --cursor %s\n", page.Next)
	}
}

// DeadLetters prints dead-letter entries as a table.
func DeadLetters(w io.Writer, entries []*api.DLQEntry) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tCHAIN\tSTEP\tRUN\tATTEMPTS\tPARKED\tERROR")
	for _, e := range entries {
		step, run := e.Step, e.RunID
		if e.Kind == store.DLQDelivery {
			// No run started: the trigger it came to stands in.
			step, run = "(trigger "+e.Trigger+")", "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", e.ID, e.Chain, step, run, e.Attempts, e.CreatedAt.Local().Format(TimeLayout), short(e.Error.Message, 60))
	}
	_ = tw.Flush()
}
