package chain

import "strings"

// Failure routes: a step's catch entries, and a chain's on_failure and
// finally handler lists.

// The error classes a catch entry names; a provider's error code is named
// "code:CODE".
const (
	// ClassTimeout is a step that ran out of time (its own timeout, its
	// group's or split's, or its provider call's).
	ClassTimeout = "timeout"
	// ClassPermanent is an error the provider said retrying cannot mend.
	ClassPermanent = "permanent"
	// ClassExhausted is a retryable error still there after the step's
	// retries ran out (or with no retry policy to run).
	ClassExhausted = "exhausted"
	// ClassCancelled is a step cancelled: its group gave up on it, a
	// sub-chain's run was cancelled.
	ClassCancelled = "cancelled"
	// CodePrefix starts a catch entry that names a provider's error code.
	CodePrefix = "code:"
)

// ErrorClasses are the classes a catch entry may name besides codes.
var ErrorClasses = []string{ClassTimeout, ClassPermanent, ClassExhausted, ClassCancelled}

// Catch routes a top-level step's failure, after its retries, to a later
// top-level step.
type Catch struct {
	// Errors are the classes and codes caught; empty catches any failure.
	Errors []string
	Target string
	// Recover lets the run carry on from Target as if nothing failed: it
	// may end succeeded. Without it, the run ends failed once the route
	// has run (and its on_failure steps after that).
	Recover bool
	Source  Source
}

// Matches reports whether the entry catches a failure of that class and
// error code.
func (c *Catch) Matches(class, code string) bool {
	if len(c.Errors) == 0 {
		return true
	}
	for _, e := range c.Errors {
		if e == class || (code != "" && strings.HasPrefix(e, CodePrefix) && e[len(CodePrefix):] == code) {
			return true
		}
	}
	return false
}

// Handler phases: the chain's lists that run when its steps are done.
const (
	PhaseOnFailure = "on_failure"
	PhaseFinally   = "finally"
)

// DefaultHandlersTimeoutSeconds bounds a run's on_failure and finally
// steps together when the chain does not say.
const DefaultHandlersTimeoutSeconds = 300

// FailureFields are what the failure template root holds: the step that
// failed, and why.
var FailureFields = []string{"step", "class", "code", "message", "attempts", "route", "ending"}

// HandlerSteps returns the handler list of a phase.
func (c *Chain) HandlerSteps(phase string) []*Step {
	switch phase {
	case PhaseOnFailure:
		return c.OnFailure
	case PhaseFinally:
		return c.Finally
	}
	return nil
}

// StepLists are the chain's top-level lists: its steps, then its
// on_failure and finally handlers.
func (c *Chain) StepLists() [][]*Step {
	return [][]*Step{c.Steps, c.OnFailure, c.Finally}
}

// WalkChain calls fn for every step of the chain, handlers and nested
// steps included, in order.
func (c *Chain) WalkChain(fn func(*Step)) {
	for _, l := range c.StepLists() {
		WalkSteps(l, fn)
	}
}

// Phase is the handler phase a top-level step runs in: "" for the
// chain's own steps.
func (c *Chain) Phase(s *Step) string {
	for s.Parent != nil {
		s = s.Parent
	}
	if len(c.OnFailure) > 0 && sameSteps(s.List, c.OnFailure) {
		return PhaseOnFailure
	}
	if len(c.Finally) > 0 && sameSteps(s.List, c.Finally) {
		return PhaseFinally
	}
	return ""
}

func sameSteps(a, b []*Step) bool {
	return len(a) == len(b) && (len(a) == 0 || a[0] == b[0])
}
