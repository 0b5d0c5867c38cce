package loader

import (
	"fmt"
	"slices"
	"strings"

	"github.com/chaingate/gateway/chain"
)

// Failure routes: a step's catch entries, the chain's on_failure and
// finally lists, and where the failure root may be read.

// failureUnset is what the failure root says where nothing fills it.
const failureUnset = "failure is only set in the target step of a catch route and in on_failure and finally steps"

// failureShape is the failure root: the step that failed, and why.
var failureShape = func() *shape {
	s := object()
	for _, f := range chain.FailureFields {
		sh := aString
		if f == "attempts" {
			sh = aNumber
		}
		s.fields = append(s.fields, field{f, sh})
	}
	return s
}()

// failureHere reports whether the step being decoded may read the failure
// root: every step of a handler list, and a top-level step some catch
// entry before it routes to (with the steps nested in it).
func (b *chainBuild) noteFailureScope(s *chain.Step, parent *chain.Step) {
	if parent == nil {
		b.failureHere = b.handler != "" || b.catchTargets[s.Name]
	}
}

// catches decodes a step's catch entries.
func (b *chainBuild) catches(t *table, s *chain.Step, parent *chain.Step) {
	if !t.has("catch") {
		return
	}
	entries, ok := t.tables("catch")
	if !ok {
		return
	}
	switch {
	case b.handler != "":
		t.d.errorf(t.path.Key("catch"), "%s step cannot catch: a failure there is parked in the dead-letter queue and the run goes on to its next phase", aPhase(b.handler))
		return
	case parent != nil:
		t.d.errorf(t.path.Key("catch"), "only a top-level step catches; catch the failure of %q on its %s step %q, which fails with it", s.Name, parent.Kind, parent.Name)
		return
	}
	for _, ct := range entries {
		c := &chain.Catch{Source: ct.d.source(ct.path), Recover: ct.boolean("recover", false)}
		if ct.has("errors") {
			c.Errors = ct.strings("errors")
			if c.Errors != nil && len(c.Errors) == 0 {
				ct.d.errorf(ct.path.Key("errors"), "is empty, so it catches nothing; leave errors out to catch every failure")
			}
			for i, e := range c.Errors {
				code, isCode := strings.CutPrefix(e, chain.CodePrefix)
				switch {
				case isCode && strings.TrimSpace(code) == "":
					ct.d.errorf(ct.path.Key("errors").Elem(i, ""), "%q names no error code; write %q", e, "code:DISK_FULL")
				case !isCode && !slices.Contains(chain.ErrorClasses, e):
					hint := ""
					if sug := chain.Suggest(e, chain.ErrorClasses); sug != "" {
						hint = fmt.Sprintf(" (did you mean %q?)", sug)
					}
					ct.d.errorf(ct.path.Key("errors").Elem(i, ""), "unknown error class %q%s; a catch names %s, or a provider's error code as \"code:CODE\"", e, hint, quoteList(chain.ErrorClasses))
				}
			}
		}
		c.Target = ct.requiredStr("target")
		if c.Target != "" {
			b.checkCatchTarget(ct.path.Key("target"), s, c.Target)
			if b.catchTargets == nil {
				b.catchTargets = map[string]bool{}
			}
			b.catchTargets[c.Target] = true
		}
		ct.finish([]string{"errors", "target", "recover"})
		s.Catch = append(s.Catch, c)
	}
}

// checkCatchTarget checks a catch target as checkTarget does a branch's:
// a later step of the same list, so a failure route never loops.
func (b *chainBuild) checkCatchTarget(p chain.KeyPath, s *chain.Step, target string) {
	if target == chain.EndTarget {
		b.d.errorf(p, "a catch routes to a step; to end the run on a failure, leave the failure uncaught (or use on_failure = \"skip\" to go on)")
		return
	}
	b.checks = append(b.checks, func() {
		for _, other := range s.List {
			if other.Name == target {
				if other.Index <= s.Index {
					b.d.errorf(p, "target %q does not come after %q; a catch routes forward only, as branches do, so a failure never loops", target, s.Name)
				}
				return
			}
		}
		if t := b.byName[target]; t != nil {
			where := "is not a top-level step of the chain's steps"
			if ph := b.c.Phase(t); ph != "" && t.Parent == nil {
				where = fmt.Sprintf("is %s step, which runs on its own when the run fails or ends", aPhase(ph))
			}
			b.d.errorf(p, "target %q %s; a catch routes to a later top-level step", target, where)
			return
		}
		b.d.errorf(p, "unknown step %q%s", target, hint(target, s.List))
	})
}

// handlers decodes a chain's on_failure and finally lists and their
// settings; top is the scope of the chain's own steps, which handlers read.
func (b *chainBuild) handlers(t *table, top *scope) {
	c := b.c
	c.FinallyOnCancel = t.boolean("finally_on_cancel", true)
	c.HandlersTimeoutSeconds = t.count("handlers_timeout_seconds", "seconds")
	if c.HandlersTimeoutSeconds == 0 {
		c.HandlersTimeoutSeconds = chain.DefaultHandlersTimeoutSeconds
	}
	for _, phase := range []string{chain.PhaseOnFailure, chain.PhaseFinally} {
		tables, ok := t.tables(phase)
		if !ok {
			continue
		}
		if len(tables) == 0 {
			t.d.errorf(t.path.Key(phase), "is empty; leave it out, or give it at least one step ([[chains.%s]])", phase)
			continue
		}
		b.handler = phase
		list := b.steps(tables, nil, &scope{names: map[string]bool{}, parent: top})
		b.handler = ""
		for _, s := range list {
			if s.Kind == chain.KindApproval {
				b.l.diags.add(s.Source.Key("approval").Errorf("%s step cannot wait for a person; ask in the chain's own steps, or notify from here", aPhase(phase)))
			}
		}
		if phase == chain.PhaseOnFailure {
			c.OnFailure = list
		} else {
			c.Finally = list
		}
	}
}

// failureRoot sets the failure root in rs as the place it is read from
// allows.
func failureRoot(rs roots, here bool) {
	if here {
		rs["failure"] = failureShape
	} else {
		rs["failure"] = unset(failureUnset)
	}
}

// aPhase is a handler phase with its article: "an on_failure", "a finally".
func aPhase(phase string) string {
	if phase == chain.PhaseOnFailure {
		return "an " + phase
	}
	return "a " + phase
}
