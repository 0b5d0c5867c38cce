package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/gateway"
)

// registerApprovals adds the metrics of approval steps, read from the
// engines' statistics when scraped: those of the runs this process
// advances, so that a cluster's total is the sum over its gateways.
func (m *Metrics) registerApprovals(gw *gateway.Gateway) {
	stats := func() engine.ApprovalStats {
		st := gw.Engine.Approvals()
		if gw.Items != nil && gw.Items != gw.Engine {
			// Sub-chain runs started by split items this process works.
			more := gw.Items.Approvals()
			st.Waiting += more.Waiting
			if !more.OldestSince.IsZero() && (st.OldestSince.IsZero() || more.OldestSince.Before(st.OldestSince)) {
				st.OldestSince = more.OldestSince
			}
			st.Approved += more.Approved
			st.Rejected += more.Rejected
			st.TimedOut += more.TimedOut
		}
		return st
	}
	m.gauge("chaingate_approvals_waiting", prometheus.GaugeValue, "Approval steps waiting for an answer in the runs this gateway advances.", nil, func() []sample {
		return []sample{{value: float64(stats().Waiting)}}
	})
	m.gauge("chaingate_approvals_oldest_waiting_seconds", prometheus.GaugeValue, "How long the approval step waiting longest for an answer, in the runs this gateway advances, has waited (0 when none waits).", nil, func() []sample {
		since := stats().OldestSince
		if since.IsZero() {
			return []sample{{value: 0}}
		}
		return []sample{{value: max(gw.Engine.Clock().Now().Sub(since).Seconds(), 0)}}
	})
	m.gauge("chaingate_approvals_answered_total", prometheus.CounterValue, "Answers to approval steps this gateway applied to runs, by decision (approved, rejected).", []string{"decision"}, func() []sample {
		st := stats()
		return []sample{{labels: []string{"approved"}, value: float64(st.Approved)}, {labels: []string{"rejected"}, value: float64(st.Rejected)}}
	})
	m.gauge("chaingate_approvals_timed_out_total", prometheus.CounterValue, "Approval steps this gateway ended at their deadline, no answer having come before it.", nil, func() []sample {
		return []sample{{value: float64(stats().TimedOut)}}
	})
}
