package chaintest

import (
	"slices"
	"strings"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/store"
)

// Failure routes in test cases: a mock fails with an error code (code =
// "DISK_FULL"), a case expects what failed and what handled it, and
// coverage counts catch routes never taken and handler steps never run.

// FailureExpect is what a case expects of its run's failure record; an
// empty field is not checked. Handlers lists the handler steps that ran,
// in order, as "on_failure:NAME" or "finally:NAME".
type FailureExpect struct {
	Step, Class, Code, Route string
	Recovered                *bool
	Handlers                 []string
}

var failureExpectKeys = []string{"step", "class", "code", "route", "recovered", "handlers"}

// failureExpect reads expect.failure.
func (r *reader) failureExpect(t *table) *Want[FailureExpect] {
	ft := t.sub("failure")
	if ft == nil {
		return nil
	}
	fe := FailureExpect{Step: ft.str("step"), Class: ft.str("class"), Code: ft.str("code"), Route: ft.str("route")}
	if _, ok := ft.m["recovered"]; ok {
		b := ft.boolean("recovered")
		fe.Recovered = &b
	}
	if _, ok := ft.m["handlers"]; ok {
		fe.Handlers = ft.strs("handlers")
		if fe.Handlers == nil {
			fe.Handlers = []string{}
		}
	}
	if fe.Class != "" && !slices.Contains(chain.ErrorClasses, fe.Class) {
		r.errorf(ft.path.Key("class"), "unknown error class %q; want one of %s", fe.Class, strings.Join(chain.ErrorClasses, ", "))
	}
	ft.done(failureExpectKeys...)
	return &Want[FailureExpect]{V: fe, Src: r.src(t.path.Key("failure"))}
}

// checkFailure checks a run's failure record against a case's failure
// expectation.
func checkFailure(w *Want[FailureExpect], run *store.Run, fail func(chain.Source, string, ...any)) {
	f := run.Failure
	if f == nil {
		fail(w.Src, "run failure: expected one, but the run records no failure (%s)", run.Status)
		return
	}
	e := w.V
	for _, c := range []struct{ what, want, got string }{
		{"step", e.Step, f.Step}, {"class", e.Class, f.Class}, {"code", e.Code, f.Code}, {"route", e.Route, f.Route},
	} {
		if c.want != "" && c.want != c.got {
			fail(w.Src, "run failure %s: expected %q, got %q", c.what, c.want, c.got)
		}
	}
	if e.Recovered != nil && *e.Recovered != f.Recovered {
		fail(w.Src, "run failure recovered: expected %t, got %t", *e.Recovered, f.Recovered)
	}
	if e.Handlers != nil && !slices.Equal(e.Handlers, f.Handlers) {
		fail(w.Src, "handlers that ran: expected %v, got %v", e.Handlers, f.Handlers)
	}
}

// failureRouteKey is a catch route in seen.routes.
func failureRouteKey(chainKey, from, to string) string { return chainKey + "/" + from + "⇢" + to }

// failureRoutes notes the catch route a run took.
func (sn *seen) failureRoutes(c string, run *store.Run) {
	if f := run.Failure; f != nil && f.Route != "" {
		sn.routes[failureRouteKey(c, f.Step, f.Route)] = true
	}
}

// phaseOf is the handler phase of the top-level step name of the chain
// being noted: "" for the chain's own steps.
func (sn *seen) phaseOf(chainName, name string) string {
	ch := sn.cfg.Chains[chainName]
	if ch == nil {
		return ""
	}
	if s := ch.Step(name); s != nil && s.Parent == nil {
		return ch.Phase(s)
	}
	return ""
}

// failureItems adds a chain's catch routes to its coverage; its handler
// steps are walked as its steps are.
func (sn *seen) failureItems(ch *chain.Chain, item func(bool, chain.Source, string, ...any)) {
	for _, s := range ch.Steps {
		for _, c := range s.Catch {
			what := "any failure"
			if len(c.Errors) > 0 {
				what = strings.Join(c.Errors, ", ")
			}
			item(sn.routes[failureRouteKey(chainKey(ch), s.Name, c.Target)], c.Source, "step %s: failure route (%s) to %s never taken", s.Name, what, c.Target)
		}
	}
}
