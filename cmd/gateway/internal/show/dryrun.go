package show

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway/chaintest"
)

// DryRun prints the calls a dry run made, what it found wrong and how the
// run ended; it reports whether the run succeeded.
func DryRun(w io.Writer, chainName string, res *chaintest.Result, mocked bool) bool {
	fmt.Fprintf(w, "dry run of %s: nothing was called; each call below was answered by a mock\n\n", chainName)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STEP\tPROVIDER\tACTION\tATTEMPT\tREQUEST")
	for _, c := range res.Calls {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", c.Step, c.Provider, c.Action, c.Attempt, c.Request)
	}
	_ = tw.Flush()
	for _, f := range res.Failures {
		fmt.Fprintf(w, "\n%s\n", f.Message)
	}
	if len(res.Runs) == 0 {
		return false
	}
	run := res.Runs[0].Run
	fmt.Fprintf(w, "\nrun %s: path %s (%s on the clock)\n", run.Status, strings.Join(run.Path, " → "), res.Ended.Round(time.Millisecond))
	if run.Error != nil {
		fmt.Fprintf(w, "error: %s\n", run.Error.Message)
	}
	if run.Status != store.RunSucceeded {
		if !mocked {
			fmt.Fprintln(w, "(every call was answered with {}: give the answers later steps read with --mocks FILE)")
		}
		return false
	}
	return true
}
