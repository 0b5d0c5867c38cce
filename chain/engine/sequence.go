package engine

import (
	"fmt"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/store"
)

// advance moves the run as far as it can go without waiting and returns the
// provider calls to start once the pending batch is durable.
func (r *runner) advance(now time.Time) []launch {
	if r.run.Status.Final() {
		return nil
	}
	if !r.run.Deadline.IsZero() && !now.Before(r.run.Deadline) {
		r.finishRun(store.RunTimedOut, &store.ErrorInfo{
			Message: fmt.Sprintf("chain %q timed out after %ds", r.def.Name, r.def.TimeoutSeconds), Code: "timeout",
		})
		return nil
	}
	for _, key := range r.dueTimers(now) {
		r.timerDue(key, now)
	}
	var out []launch
	// Each pass settles one step; a chain cannot settle more steps in one
	// call than it has, since branches only route forward.
	for range len(r.def.Steps) + 1 {
		if r.run.Cursor == "" {
			r.finishRun(store.RunSucceeded, nil)
			return out
		}
		s := r.def.Step(r.run.Cursor)
		if s == nil || s.Parent != nil {
			r.finishRun(store.RunFailed, &store.ErrorInfo{
				Message: fmt.Sprintf("run is at step %q, which chain %q does not have at top level", r.run.Cursor, r.def.Name), Code: "definition",
			})
			return out
		}
		ls, final := r.progressTop(now, s)
		out = append(out, ls...)
		if !final || !r.settle(s, s.Name) {
			return out
		}
	}
	return out
}

func (r *runner) topScope() *scope {
	sc := &scope{v: r.vars}
	if n := len(r.run.Path); n > 0 {
		if prev, ok := r.vars.steps[r.run.Path[n-1]].(map[string]any); ok {
			sc.prev = prev
		}
	}
	return sc
}

// progressTop moves the run's current step along; it returns the calls to
// start and whether the step is final.
func (r *runner) progressTop(now time.Time, s *chain.Step) ([]launch, bool) {
	key := s.Name
	sc := r.topScope()
	rec := r.recs[key]
	if rec == nil {
		rec = r.open(now, s, key, sc)
	}
	if rec.Status.Final() {
		return nil, true
	}
	switch s.Kind {
	case chain.KindProvider:
		l, final := r.dispatch(now, s, rec, sc, time.Time{})
		if l != nil {
			return []launch{*l}, false
		}
		return nil, final
	case chain.KindParallel:
		g := r.groups[key]
		if g == nil {
			if rec.Status == store.StepPending {
				if rec.NotBefore.After(now) {
					return nil, false
				}
				g = r.startGroup(now, s, rec, sc)
			} else {
				g = r.resumeGroup(now, s, rec, sc)
			}
		}
		return r.progressGroup(now, g)
	default:
		r.finishStep(rec, store.StepFailed, &store.ErrorInfo{
			Message: fmt.Sprintf("%s steps are not supported by this gateway version", s.Kind), Code: "unsupported",
		})
		return nil, true
	}
}

// settle applies a final top-level step's failure policy and routing. It
// reports whether the run moved on to another step.
func (r *runner) settle(s *chain.Step, key string) bool {
	rec := r.recs[key]
	r.run.Path = append(r.run.Path, s.Name)
	switch rec.Status {
	case store.StepFailed, store.StepTimedOut, store.StepCancelled:
		switch s.OnFailure {
		case chain.OnFailureSkip:
			rec.Status = store.StepSkipped
			r.put(rec)
			r.setStepVar(rec, nil)
			r.event(store.EventStepSkipped, key, rec.Attempts, "failure skipped (on_failure = skip): "+rec.Error.Message)
		case chain.OnFailureDLQ:
			id := r.deadLetter(rec)
			r.finishRun(store.RunFailed, &store.ErrorInfo{
				Message: fmt.Sprintf("step %q failed: %s (dead-letter entry %s)", s.Name, rec.Error.Message, id), Code: "step_failed",
			})
			return false
		default:
			r.finishRun(store.RunFailed, &store.ErrorInfo{Message: fmt.Sprintf("step %q failed: %s", s.Name, rec.Error.Message), Code: "step_failed"})
			return false
		}
	}
	next, err := r.route(s, rec)
	if err != nil {
		r.finishRun(store.RunFailed, &store.ErrorInfo{Message: err.Error(), Code: "condition"})
		return false
	}
	r.run.Cursor = next
	return true
}

// route picks the step after s: the first matching branch (only for a step
// that succeeded), then default_next, then the next step in order.
func (r *runner) route(s *chain.Step, rec *store.StepRecord) (string, error) {
	if rec.Status == store.StepSucceeded && len(s.Branches) > 0 {
		env := r.topScope().env(r.vars.steps[s.Name].(map[string]any))
		for i, b := range s.Branches {
			ok, err := b.Cond.Eval(env)
			if err != nil {
				return "", fmt.Errorf("evaluating branch %d of step %q: %w", i+1, s.Name, err)
			}
			if ok {
				return b.Target, nil
			}
		}
	}
	if s.DefaultNext != "" {
		return s.DefaultNext, nil
	}
	if n := s.Next(); n != nil {
		return n.Name, nil
	}
	return "", nil
}
