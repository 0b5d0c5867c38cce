package show

import (
	"fmt"
	"io"
	"strings"

	"github.com/chaingate/gateway/gateway/api"
)

// failure prints what failed in a run and what handled it, for runs
// show: the failed step and why, the catch route it took, the handler
// steps that ran and those that failed.
func failure(w io.Writer, r *api.Run) {
	if r.Phase != "" {
		fmt.Fprintf(w, "phase    %s (the run ends %s after its handlers)\n", r.Phase, r.Ending)
	}
	f := r.Failure
	if f == nil {
		return
	}
	what := f.Class
	if f.Code != "" {
		what += ", code " + f.Code
	}
	step := f.Step
	if step == "" {
		step = "the run"
	}
	fmt.Fprintf(w, "failed   %s (%s, %d attempts): %s\n", step, what, f.Attempts, short(f.Message, 100))
	var handled []string
	if f.Route != "" {
		route := "routed to " + f.Route
		if f.Recovered {
			route += ", which recovers the run"
		}
		handled = append(handled, route)
	}
	handled = append(handled, f.Handlers...)
	if len(handled) > 0 {
		fmt.Fprintf(w, "handled  %s\n", strings.Join(handled, "; "))
	}
	if len(f.HandlerFailures) > 0 {
		fmt.Fprintf(w, "handler failures  %s (parked in the dead-letter queue)\n", strings.Join(f.HandlerFailures, ", "))
	}
}
