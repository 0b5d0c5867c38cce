package store

import "slices"

// Failure is what failed in a run and what handled it: the record the
// run's failure routes (a step's catch, the chain's on_failure and finally
// steps) keep, and what their failure template root reads.
type Failure struct {
	// Step is the top-level step whose failure this is; empty for a run
	// that failed outside any step (its timeout).
	Step string `json:"step,omitempty"`
	// Class is timeout, permanent, exhausted or cancelled.
	Class    string `json:"class"`
	Code     string `json:"code,omitempty"`
	Message  string `json:"message"`
	Attempts int    `json:"attempts,omitempty"`
	// Route is the step a catch entry routed the failure to, if one did;
	// Recovered says that entry recovers the run, which may then succeed.
	Route     string `json:"route,omitempty"`
	Recovered bool   `json:"recovered,omitempty"`
	// Handlers are the on_failure and finally steps that ran for the run,
	// as "on_failure:NAME", in order; HandlerFailures those of them that
	// failed and were parked in the dead-letter queue.
	Handlers        []string `json:"handlers,omitempty"`
	HandlerFailures []string `json:"handler_failures,omitempty"`
}

// Clone copies f; nil stays nil.
func (f *Failure) Clone() *Failure {
	if f == nil {
		return nil
	}
	c := *f
	c.Handlers = slices.Clone(f.Handlers)
	c.HandlerFailures = slices.Clone(f.HandlerFailures)
	return &c
}

// Run phases besides the run's own steps ("").
const (
	PhaseOnFailure = "on_failure"
	PhaseFinally   = "finally"
)

// Events of failure routes.
const (
	// EventFailureRouted is a step's failure caught by a catch entry and
	// routed to its target.
	EventFailureRouted EventType = "failure_routed"
	// EventHandlersStarted is a run entering a handler phase.
	EventHandlersStarted EventType = "handlers_started"
)
