package loader

import (
	"fmt"
	"slices"
	"strings"

	"github.com/chaingate/gateway/chain"
)

// What each template root holds, as the engine builds it: a path naming
// anything else can never resolve, so it is a config error rather than a
// step that fails at run time (and, with on_failure = "skip", a
// notification silently not sent).
var (
	originFields = []string{"payload", "metadata", "id", "received_at"}
	resultFields = []string{"body", "status", "error", "attempts"}
	errorFields  = []string{"message", "code", "retryable"}
	splitFields  = []string{"results", "succeeded", "failed", "skipped", "total"}
	runFields    = []string{"id"}
	chainFields  = []string{"name"}
)

// checkRef checks one path a template or condition reads: root and the
// segments after it, indexes as decimal strings. text is the path as
// written, for messages.
func (b *chainBuild) checkRef(at chain.KeyPath, root string, path []string, text string, sc *scope) {
	fail := func(format string, args ...any) {
		b.d.errorf(at, "%s: %s", text, fmt.Sprintf(format, args...))
	}
	switch root {
	case "origin":
		if len(path) == 0 {
			return
		}
		switch path[0] {
		case "payload":
			if b.c.Input != nil {
				if msg := inputPathProblem(b.c.Input, path[1:]); msg != "" {
					fail("%s", msg)
				}
			}
		case "metadata":
		case "id", "received_at":
			if len(path) > 1 {
				fail("origin.%s is a string; it has no field %q", path[0], path[1])
			}
		default:
			fail("%s", unknownField("origin", path[0], originFields))
		}
	case "steps":
		if len(path) == 0 {
			return
		}
		name := path[0]
		if msg := resultPathProblem("steps."+name, path[1:]); msg != "" {
			fail("%s", msg)
			return
		}
		b.checkStepRef(at, sc, name, text)
		if len(path) > 2 && path[1] == "body" {
			b.checks = append(b.checks, func() {
				if msg := b.bodyPathProblem(name, path[2]); msg != "" {
					fail("%s", msg)
				}
			})
		}
	case "prev", "result":
		if msg := resultPathProblem(root, path); msg != "" {
			fail("%s", msg)
		}
	case "run":
		if len(path) > 0 && !slices.Contains(runFields, path[0]) {
			fail("%s", unknownField("run", path[0], runFields))
		}
	case "chain":
		if len(path) > 0 && !slices.Contains(chainFields, path[0]) {
			fail("%s", unknownField("chain", path[0], chainFields))
		}
	case "item_index":
		if len(path) > 0 {
			fail("item_index is a number; it has no field %q", path[0])
		}
	}
}

// resultPathProblem checks the part of a path after a step's result
// (steps.NAME, prev or result).
func resultPathProblem(what string, path []string) string {
	if len(path) == 0 {
		return ""
	}
	switch path[0] {
	case "body":
	case "status", "attempts":
		if len(path) > 1 {
			kind := "a string"
			if path[0] == "attempts" {
				kind = "a number"
			}
			return fmt.Sprintf("%s.%s is %s; it has no field %q", what, path[0], kind, path[1])
		}
	case "error":
		if len(path) > 1 && !slices.Contains(errorFields, path[1]) {
			return unknownField(what+".error", path[1], errorFields)
		}
	default:
		return unknownField(what, path[0], resultFields)
	}
	return ""
}

// bodyPathProblem checks the first field read in the body of a parallel
// group (keyed by sub-step) or a split (results and counts).
func (b *chainBuild) bodyPathProblem(name, field string) string {
	s := b.byName[name]
	if s == nil {
		return ""
	}
	switch {
	case s.Parallel != nil:
		names := make([]string, len(s.Parallel.Steps))
		for i, sub := range s.Parallel.Steps {
			names[i] = sub.Name
		}
		if !slices.Contains(names, field) {
			return fmt.Sprintf("the body of parallel step %q is keyed by sub-step, and it has no sub-step %q%s", name, field, didYouMean(field, names, "sub-steps"))
		}
	case s.Split != nil && !slices.Contains(splitFields, field):
		return fmt.Sprintf("the body of split step %q has no field %q%s", name, field, didYouMean(field, splitFields, "fields"))
	case s.Kind == chain.KindApproval && !slices.Contains(ApprovalFields, field):
		return fmt.Sprintf("the body of approval step %q has no field %q%s", name, field, didYouMean(field, ApprovalFields, "fields"))
	}
	return ""
}

func unknownField(what, field string, known []string) string {
	return fmt.Sprintf("%s has no field %q%s", what, field, didYouMean(field, known, "fields"))
}

// didYouMean suggests the nearest of known, or lists them all.
func didYouMean(name string, known []string, what string) string {
	if s := chain.Suggest(name, known); s != "" {
		return fmt.Sprintf(" (did you mean %q?)", s)
	}
	return fmt.Sprintf("; its %s are %s", what, strings.Join(known, ", "))
}

// ApprovalFields are the fields of an approval step's body.
var ApprovalFields = []string{"decision", "by", "comment", "at", "timed_out", "message"}
