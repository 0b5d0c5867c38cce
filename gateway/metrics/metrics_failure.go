package metrics

import (
	"encoding/json"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/chaingate/gateway/chain/store"
)

// The metrics of failure routes: which failures catch entries routed
// where, and how often runs went through their handler phases, with the
// status they were ending with. Runs that end failed after their handlers
// are counted in chaingate_runs_finished_total like any failed run.

func (m *Metrics) registerFailureRoutes() {
	m.failureRoutes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "chaingate_failure_routes_total",
		Help: "Step failures a catch entry routed, by chain, step, error class and the step routed to.",
	}, []string{"chain", "step", "class", "target"})
	m.handlerPhases = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "chaingate_failure_handlers_total",
		Help: "Runs that entered their on_failure or finally steps, by chain, phase and the status the run was ending with.",
	}, []string{"chain", "phase", "ending"})
	m.reg.MustRegister(m.failureRoutes, m.handlerPhases)
}

// failureEvent counts a failure_routed or handlers_started event.
func (m *Metrics) failureEvent(ev store.Event) {
	var d struct{ Class, Target, Phase, Ending string }
	_ = json.Unmarshal(ev.Data, &d)
	if ev.Type == store.EventFailureRouted {
		m.failureRoutes.WithLabelValues(ev.Chain, ev.Step, d.Class, d.Target).Inc()
		return
	}
	m.handlerPhases.WithLabelValues(ev.Chain, d.Phase, d.Ending).Inc()
}
