package chaintest

import (
	"fmt"
	"strings"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/store"
)

// notRun is the status a case expects of a step that never started, and
// notStarted of a run its start refused.
const (
	notRun     = "not_run"
	notStarted = "not_started"
)

// checkRefused checks a start that was refused: the case must expect it.
func checkRefused(c *Case, err error, fail func(chain.Source, string, ...any)) {
	w := c.Expect.Status
	if w == nil || w.V != notStarted {
		src := c.Src
		if w != nil {
			src = w.Src
		}
		fail(src, "the run was not started: %v", err)
		return
	}
	if e := c.Expect.Error; e != nil && !strings.Contains(err.Error(), e.V) {
		fail(e.Src, "start refused: expected an error containing %q, got %q", e.V, err.Error())
	}
}

// check compares what the case's runs did with what it expects, calling
// fail once for each expectation not met, at the line it was written.
func check(c *Case, res *Result, dlq []*store.DLQEntry, fail func(chain.Source, string, ...any)) {
	e := c.Expect
	if e.Results != nil {
		checkResults(e.Results, res, fail)
	}
	var top *RunRecord
	if len(res.Runs) > 0 {
		top = res.Runs[0]
	}
	runWanted := e.Status != nil || e.Path != nil || e.Error != nil || len(e.Steps) > 0 || e.Failure != nil
	if top == nil {
		if e.Status != nil && e.Status.V == notStarted {
			return
		}
		if runWanted {
			fail(c.Src, "no run started, and the case expects one")
		}
		return
	}
	run := top.Run
	if w := e.Status; w != nil && w.V == notStarted {
		fail(w.Src, "run status: expected the start to be refused, but run %s started (%s)", run.ID, run.Status)
	} else if w != nil && string(run.Status) != w.V {
		why := ""
		if run.Error != nil {
			why = ": " + run.Error.Message
		}
		fail(w.Src, "run status: expected %q, got %q%s", w.V, run.Status, why)
	}
	if w := e.Path; w != nil && strings.Join(w.V, "\x00") != strings.Join(run.Path, "\x00") {
		fail(w.Src, "run path: expected %s, got %s%s", arrows(w.V), arrows(run.Path), diffLines(w.V, run.Path))
	}
	if w := e.Error; w != nil {
		got := ""
		if run.Error != nil {
			got = run.Error.Message
		}
		if !strings.Contains(got, w.V) {
			fail(w.Src, "run error: expected one containing %q, got %q", w.V, got)
		}
	}
	for _, name := range e.stepOrder {
		checkStep(name, e.Steps[name], res, fail)
	}
	if w := e.DeadLetters; w != nil {
		checkDeadLetters(w, dlq, fail)
	}
	if w := e.Failure; w != nil {
		checkFailure(w, run, fail)
	}
}

func arrows(path []string) string {
	if len(path) == 0 {
		return "(none)"
	}
	return strings.Join(path, " → ")
}

// findStep is the record of the step named name: in the case's first run,
// else in its sub-chains' runs; not a split's items.
func findStep(res *Result, name string) (*store.StepRecord, *RunRecord) {
	for _, rr := range res.Runs {
		for _, rec := range rr.Steps {
			if rec.Name == name && !strings.Contains(rec.Key, "[") {
				return rec, rr
			}
		}
	}
	return nil, nil
}

func checkStep(name string, se *StepExpect, res *Result, fail func(chain.Source, string, ...any)) {
	rec, _ := findStep(res, name)
	status := notRun
	if rec != nil && rec.Status != store.StepPending {
		status = string(rec.Status)
	}
	if w := se.Status; w != nil && status != w.V {
		why := ""
		if rec != nil && rec.Error != nil {
			why = ": " + rec.Error.Message
		}
		fail(w.Src, "step %s: status: expected %q, got %q%s", name, w.V, status, why)
	}
	if rec == nil {
		for _, src := range []*chain.Source{srcOf(se.Attempts), srcOf(se.Body), srcOf(se.Request), srcOf(se.Error), srcOf(se.Items), srcOf(se.Child)} {
			if src != nil {
				fail(*src, "step %s: it never ran", name)
				return
			}
		}
		return
	}
	if w := se.Attempts; w != nil && rec.Attempts != w.V {
		fail(w.Src, "step %s: attempts: expected %d, got %d", name, w.V, rec.Attempts)
	}
	if w := se.Body; w != nil {
		if d := differences("body", decode(rec.Body), w.V); len(d) > 0 {
			fail(w.Src, "step %s: %s", name, strings.Join(d, "; "))
		}
	}
	if w := se.Error; w != nil {
		got := ""
		if rec.Error != nil {
			got = rec.Error.Message
		}
		if !strings.Contains(got, w.V) {
			fail(w.Src, "step %s: error: expected one containing %q, got %q", name, w.V, got)
		}
	}
	if w := se.Request; w != nil {
		var last *Call
		for i := range res.Calls {
			if res.Calls[i].Step == rec.Key {
				last = &res.Calls[i]
			}
		}
		switch {
		case last == nil:
			fail(w.Src, "step %s: request: it called no provider", name)
		default:
			if d := differences("request", decode(last.Request), w.V); len(d) > 0 {
				fail(w.Src, "step %s: %s", name, strings.Join(d, "; "))
			}
		}
	}
	if w := se.Items; w != nil {
		got := map[string]int{}
		if sp := rec.Split; sp != nil {
			got = map[string]int{"succeeded": sp.Succeeded, "failed": sp.Failed, "skipped": sp.Skipped, "total": sp.Total}
		}
		for k, n := range w.V {
			if got[k] != n {
				picked := map[string]int{}
				for k := range w.V {
					picked[k] = got[k]
				}
				fail(w.Src, "step %s: items: expected %s, got %s", name, sortedCounts(w.V), sortedCounts(picked))
				break
			}
		}
	}
	if w := se.Child; w != nil {
		got := notRun
		for _, rr := range res.Runs {
			if rr.Run.ID == rec.Child {
				got = string(rr.Run.Status)
			}
		}
		if got != w.V {
			fail(w.Src, "step %s: sub-chain run: expected %q, got %q", name, w.V, got)
		}
	}
}

func srcOf[T any](w *Want[T]) *chain.Source {
	if w == nil {
		return nil
	}
	return &w.Src
}

func checkDeadLetters(w *Want[[]DeadLetterExpect], dlq []*store.DLQEntry, fail func(chain.Source, string, ...any)) {
	var got []string
	for _, d := range dlq {
		msg := d.Error.Message
		got = append(got, fmt.Sprintf("%s (%s)", d.Step, msg))
	}
	if len(dlq) != len(w.V) {
		fail(w.Src, "dead letters: expected %d, got %d: %s", len(w.V), len(dlq), listOrNone(got))
		return
	}
	for i, want := range w.V {
		d := dlq[i]
		msg := d.Error.Message
		if (want.Step != "" && d.Step != want.Step) || !strings.Contains(msg, want.Error) {
			fail(w.Src, "dead letter %d: expected step %q with an error containing %q, got %s", i+1, want.Step, want.Error, got[i])
		}
	}
}

func listOrNone(list []string) string {
	if len(list) == 0 {
		return "none"
	}
	return strings.Join(list, ", ")
}

func checkResults(w *Want[[]ResultExpect], res *Result, fail func(chain.Source, string, ...any)) {
	if res.Trigger == nil {
		fail(w.Src, "results: the case delivers nothing to a trigger")
		return
	}
	got := res.Trigger.Results
	var lines []string
	for _, r := range got {
		lines = append(lines, strings.TrimSpace(r.Action+" "+r.Chain+" "+r.Reason))
	}
	if len(got) != len(w.V) {
		fail(w.Src, "results: expected %d, got %d: %s", len(w.V), len(got), listOrNone(lines))
		return
	}
	for i, want := range w.V {
		r := got[i]
		switch {
		case r.Action != want.Action:
			fail(w.Src, "result %d: action: expected %q, got %q %s", i+1, want.Action, r.Action, r.Reason)
		case want.Chain != "" && r.Chain != want.Chain:
			fail(w.Src, "result %d: chain: expected %q, got %q", i+1, want.Chain, r.Chain)
		case !strings.Contains(r.Reason, want.Reason):
			fail(w.Src, "result %d: reason: expected one containing %q, got %q", i+1, want.Reason, r.Reason)
		case want.Payload != nil:
			var payload any
			for _, rr := range res.Runs {
				if rr.Run.ID == r.Run {
					payload = decode(rr.Run.Origin.Payload)
				}
			}
			if d := differences("payload", payload, want.Payload); len(d) > 0 {
				fail(w.Src, "result %d: %s", i+1, strings.Join(d, "; "))
			}
		}
	}
}
