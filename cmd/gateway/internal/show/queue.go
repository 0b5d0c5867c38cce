package show

import (
	"fmt"
	"io"
	"strings"

	"github.com/chaingate/gateway/gateway/api"
)

// queue prints where a queued run waits for its concurrency key.
func queue(w io.Writer, q *api.QueuePlace) {
	if q == nil {
		return
	}
	place := "asking"
	if q.Position > 0 {
		place = fmt.Sprintf("place %d", q.Position)
	}
	waiting := ""
	if len(q.WaitingFor) > 0 {
		waiting = ", waiting for " + strings.Join(q.WaitingFor, ", ")
	}
	fmt.Fprintf(w, "queue    key %q, %s%s, since %s\n", q.Key, place, waiting, q.Since.Local().Format(TimeLayout))
}
