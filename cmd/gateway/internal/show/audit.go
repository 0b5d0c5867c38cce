package show

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/chaingate/gateway/gateway/api"
)

// Audit prints a page of the audit log as a table, newest first, and the
// cursor that continues it.
func Audit(w io.Writer, page api.AuditPage, loc *time.Location) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tWHO\tVIA\tACTION\tON\tOUTCOME\tDETAIL")
	for _, e := range page.Entries {
		on := e.TargetKind
		if e.Target != "" {
			on += " " + e.Target
		}
		if e.Chain != "" && e.Target != e.Chain {
			on += " (" + e.Chain + ")"
		}
		outcome := e.Outcome
		if e.Status != 0 {
			outcome += fmt.Sprintf(" %d", e.Status)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s %s\t%s\t%s\t%s\t%s\n", e.Time.In(loc).Format(TimeLayout), short(e.Subject, 24), e.EntryPoint, e.Address, e.Action, short(on, 50), outcome, short(e.Detail, 60))
	}
	_ = tw.Flush()
	if page.Next != "" {
		fmt.Fprintf(w, "more: --cursor %s\n", page.Next)
	}
}
