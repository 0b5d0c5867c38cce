package loader

import (
	"fmt"
	"strings"

	"github.com/chaingate/gateway/chain"
)

// What each name a template or condition reads holds, as the engine and
// the trigger endpoint build it.

// ApprovalFields are the fields of an answered approval step's body, the
// engine's Decision.
var ApprovalFields = []string{"decision", "by", "comment", "at", "timed_out", "message"}

var (
	errorShape = object(field{"message", aString}, field{"code", aString}, field{"retryable", aBoolean}, field{"class", aString})
	// approvalBody is every field a string but timed_out.
	approvalBody = func() *shape {
		s := object()
		for _, name := range ApprovalFields {
			f := field{name, aString}
			if name == "timed_out" {
				f.shape = aBoolean
			}
			s.fields = append(s.fields, f)
		}
		return s
	}()
)

// resultShape is a step's result, {status, body, error, attempts}.
func resultShape(body *shape) *shape {
	return object(field{"body", body}, field{"status", aString}, field{"error", errorShape}, field{"attempts", aNumber})
}

// bodyShape is what a step's body holds, where its kind fixes it: an
// approval's answer, a parallel group's bodies by sub-step, a split's
// results and counts. A provider's or a sub-chain's is free-form.
func bodyShape(s *chain.Step) *shape {
	switch {
	case s.Kind == chain.KindApproval:
		b := *approvalBody
		b.desc = fmt.Sprintf("the body of approval step %q", s.Name)
		return &b
	case s.Parallel != nil:
		subs := s.Parallel.Steps
		return lookupShape(func(name string) (*shape, string) {
			names := make([]string, len(subs))
			for i, sub := range subs {
				if sub.Name == name {
					return bodyShape(sub), ""
				}
				names[i] = sub.Name
			}
			return nil, fmt.Sprintf("the body of parallel step %q is keyed by sub-step, and it has no sub-step %q%s", s.Name, name, didYouMean(name, names, "sub-steps"))
		})
	case s.Split != nil:
		b := object(field{"results", arrayOf(nil)}, field{"succeeded", aNumber}, field{"failed", aNumber},
			field{"skipped", aNumber}, field{"total", aNumber})
		b.desc = fmt.Sprintf("the body of split step %q", s.Name)
		return b
	}
	return nil
}

// stepShapes are the names a step's templates and conditions read in
// scope sc; self is the step whose branch reads result, nil elsewhere.
func (b *chainBuild) stepShapes(sc *scope, self *chain.Step) roots {
	payload := (*shape)(nil)
	if in := b.c.Input; in != nil {
		payload = &shape{kind: kindChecked, check: func(path []string) string { return inputPathProblem(in, path) }}
	}
	rs := roots{
		"origin":     object(field{"payload", payload}, field{"metadata", nil}, field{"id", aString}, field{"received_at", aString}),
		"steps":      lookupShape(func(name string) (*shape, string) { return b.stepResult(sc, name) }),
		"prev":       resultShape(nil),
		"run":        object(field{"id", aString}, field{"url", aString}),
		"chain":      object(field{"name", aString}),
		"secrets":    stringMap,
		"result":     unset("result is only available in branch conditions; use prev or steps.NAME"),
		"item":       unset("item is only set inside a split's per-item steps"),
		"item_index": unset("item_index is only set inside a split's per-item steps"),
	}
	if sc.split != "" {
		rs["item"], rs["item_index"] = nil, aNumber
	}
	if self != nil {
		rs["result"] = resultShape(bodyShape(self))
	}
	return rs
}

// stepResult is the result of step name as scope sc reads it.
func (b *chainBuild) stepResult(sc *scope, name string) (*shape, string) {
	s := b.byName[name]
	switch {
	case s != nil && sc.visible(name):
		return resultShape(bodyShape(s)), ""
	case s != nil && s.Parent == nil && b.c.Phase(s) != "":
		return nil, fmt.Sprintf("step %q is %s step, which runs after the chain's steps; only the handler steps after it read it", name, aPhase(b.c.Phase(s)))
	case s != nil:
		return nil, fmt.Sprintf("step %q is inside split %q and its results are private to each item; read the split's body instead", name, enclosingSplit(s))
	}
	names := make([]string, 0, len(b.sources))
	for n := range b.sources {
		names = append(names, n)
	}
	msg := fmt.Sprintf("unknown step %q", name)
	if s := chain.Suggest(name, names); s != "" {
		msg += fmt.Sprintf(" (did you mean %q?)", s)
	}
	return nil, msg
}

// The fields of an alert and of its group, as Alertmanager's webhook
// (version 4) sends them, and what Grafana's adds.
func alertShape(grafana bool) *shape {
	s := object(field{"status", aString}, field{"labels", stringMap}, field{"annotations", stringMap},
		field{"startsAt", aString}, field{"endsAt", aString}, field{"generatorURL", aString}, field{"fingerprint", aString})
	if grafana {
		s.fields = append(s.fields, field{"values", mapOf(aNumber)}, field{"valueString", aString}, field{"silenceURL", aString},
			field{"dashboardURL", aString}, field{"panelURL", aString}, field{"imageURL", aString})
	}
	return s
}

func groupShape(grafana bool) *shape {
	s := object(field{"version", aString}, field{"groupKey", aString}, field{"truncatedAlerts", aNumber}, field{"status", aString},
		field{"receiver", aString}, field{"groupLabels", stringMap}, field{"commonLabels", stringMap},
		field{"commonAnnotations", stringMap}, field{"externalURL", aString}, field{"alerts", arrayOf(alertShape(grafana))})
	if grafana {
		s.fields = append(s.fields, field{"orgId", aNumber}, field{"title", aString}, field{"state", aString}, field{"message", aString})
	}
	return s
}

// triggerShapes are the names a trigger's when and payload read.
func triggerShapes(tr *chain.Trigger) roots {
	grafana := tr.Type == chain.TriggerGrafana
	switch {
	case !tr.Type.Alerts():
		return roots{"body": nil, "headers": stringMap}
	case tr.Per == chain.PerGroup:
		return roots{"group": groupShape(grafana)}
	}
	return roots{"alert": alertShape(grafana), "group": groupShape(grafana)}
}

// firingRunShape is what a resolve mapping reads of the run the alert's
// firing started, a run of chain c: its id, status and body, and the
// status and body of each top-level step it ran.
func firingRunShape(c *chain.Chain) *shape {
	steps := lookupShape(func(name string) (*shape, string) {
		if c == nil {
			return nil, "" // an unknown chain is reported on its own
		}
		names := make([]string, len(c.Steps))
		for i, s := range c.Steps {
			if s.Name == name {
				return object(field{"status", aString}, field{"body", bodyShape(s)}), ""
			}
			names[i] = s.Name
		}
		nested := false
		chain.WalkSteps(c.Steps, func(s *chain.Step) { nested = nested || s.Name == name })
		if nested {
			return nil, fmt.Sprintf("step %q is not a top-level step of chain %q, and firing_run.steps holds only those (%s)", name, c.Name, strings.Join(names, ", "))
		}
		return nil, fmt.Sprintf("chain %q has no step %q%s", c.Name, name, didYouMean(name, names, "top-level steps"))
	})
	return object(field{"id", aString}, field{"status", aString}, field{"body", nil}, field{"steps", steps})
}

// secretShapes are what a provider's config and a trigger's credentials
// read: secrets, each a string.
var secretShapes = roots{"secrets": stringMap}

// scheduleShapes are the names a schedule's payload reads.
var scheduleShapes = roots{"schedule": object(field{"name", aString}, field{"tick", aString}, field{"timezone", aString})}

// didYouMean suggests the nearest of known, or lists them all.
func didYouMean(name string, known []string, what string) string {
	if s := chain.Suggest(name, known); s != "" {
		return fmt.Sprintf(" (did you mean %q?)", s)
	}
	return fmt.Sprintf("; its %s are %s", what, strings.Join(known, ", "))
}
