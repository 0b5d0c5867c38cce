package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/store"
)

// seq is one list of steps being walked: the run's own steps, or the
// per-item steps of one split item. A run's top-level position is persisted
// in its record; an item's is worked out again on resume by replaying its
// step records, which hold every decision it made.
type seq struct {
	steps  []*chain.Step
	prefix string // "" at top level; "check-hosts[07]/" inside an item
	cursor string // the step being executed; "" once the list is done
	path   []string
	// vars is what steps.NAME reads here: an item sees its own steps and,
	// behind them, those of the lists enclosing it.
	vars map[string]any

	// Set inside a split item.
	split   *split
	index   int
	item    any
	lineage []Frame // the enclosing splits, outermost first, this item's last
	// ack is the batch holding this list's latest write (in an item, or
	// the split's cursor covering it, if later): its next call goes out
	// once that batch is durable.
	ack uint64
	// deadline bounds the item on a worker (item_timeout_seconds).
	deadline time.Time
	keys     []string // records this item holds in memory, dropped when it ends
	// written holds the item's records handed to the store before they
	// were final (a delay, a retry); the others may never need writing.
	written map[string]bool
	dirty   bool

	// How the item ended.
	status store.StepStatus
	result json.RawMessage
	// resultKey is the step whose body result is.
	resultKey string
	err       *store.ErrorInfo
}

func (q *seq) inItem() bool { return q.split != nil }

// Frame is one level of a split item's lineage: which split, which item,
// out of how many. An item's records and dedup keys are scoped by its whole
// lineage, so nested splits never collide; the same stack is what a worker
// needs to commit an item delegated to it.
type Frame struct {
	Split string
	Index int
	Total int
}

// advance moves the runner's work along and returns the calls to start.
func (r *runner) advance(now time.Time) []launch { return r.role.advance(r, now) }

// advanceRun moves the run's own steps along and returns the calls to start.
func (r *runner) advanceRun(now time.Time) []launch {
	if r.slot != nil && r.run.Status == store.RunQueued && !r.advanceQueued(now) {
		return nil
	}
	if r.run.Status.Final() {
		return nil
	}
	if r.run.Phase != "" {
		return r.advanceHandlers(now)
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
	out, done := r.advanceSeq(now, r.top)
	r.run.Path = r.top.path
	if !r.run.Status.Final() {
		// A run that ended on the way has no step to go on from.
		r.run.Cursor = r.top.cursor
	}
	// A run whose steps failed into a handler phase goes on there.
	if done && !r.run.Status.Final() && r.run.Phase == "" {
		if len(r.top.result) > MaxInlineRunBody {
			r.run.BodyStep = r.top.resultKey
		} else {
			r.run.Body = r.top.result
		}
		r.finishRun(store.RunSucceeded, nil)
	}
	return out
}

// advanceSeq moves a list of steps as far as it can go without waiting. It
// returns the calls to start and whether the list has ended.
func (r *runner) advanceSeq(now time.Time, q *seq) ([]launch, bool) {
	q.dirty = false
	var out []launch
	// Each pass settles one step; a list cannot settle more steps in one
	// call than it has, since branches only route forward.
	for range len(q.steps) + 1 {
		if q.cursor == "" {
			return out, true
		}
		s := r.def.Step(q.cursor)
		if s == nil || !sameList(s.List, q.steps) {
			r.failSeq(q, &store.ErrorInfo{
				Message: fmt.Sprintf("at step %q, which this list of chain %q does not have", q.cursor, r.def.Name), Code: "definition",
			})
			return out, true
		}
		ls, final := r.progressStep(now, q, s)
		out = append(out, ls...)
		if !final {
			return out, false
		}
		if !r.settle(q, s) {
			return out, true
		}
	}
	return out, q.cursor == ""
}

func sameList(a, b []*chain.Step) bool {
	return len(a) == len(b) && (len(a) == 0 || a[0] == b[0])
}

// scope returns what templates and conditions read in q.
func (r *runner) scopeOf(q *seq) *scope {
	sc := &scope{v: r.vars, steps: q.vars, seq: q}
	if n := len(q.path); n > 0 {
		if prev, ok := q.vars[q.path[n-1]].(map[string]any); ok {
			sc.prev = prev
		}
	} else if q.split != nil {
		// An item's first step sees as prev what its split step saw.
		sc.prev = r.scopeOf(q.split.owner).prev
	}
	return sc
}

// progressStep moves q's current step along; it returns the calls to start
// and whether the step is final.
func (r *runner) progressStep(now time.Time, q *seq, s *chain.Step) ([]launch, bool) {
	key := q.prefix + s.Name
	sc := r.scopeOf(q)
	rec := r.recs[key]
	if rec == nil {
		rec = r.open(now, q, s, key, sc, q.inItem() && s.Kind == chain.KindProvider)
	} else {
		r.resumed(q, rec)
	}
	if rec.Status.Final() {
		if s.Concurrency != nil {
			r.stepEnded(key)
		}
		return nil, true
	}
	if s.Concurrency != nil && !r.stepHolds(now, q, s, rec, sc) {
		return nil, rec.Status.Final()
	}
	switch s.Kind {
	case chain.KindProvider:
		l, final := r.dispatch(now, q, s, rec, sc, q.bound())
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
				g = r.startGroup(now, q, s, rec, sc)
			} else {
				g = r.resumeGroup(now, q, s, rec, sc)
			}
		}
		return r.progressGroup(now, g)
	case chain.KindSplit:
		return r.progressSplit(now, q, s, rec, sc)
	case chain.KindSubChain:
		return r.progressChild(now, q, s, rec, sc)
	case chain.KindApproval:
		return r.progressApproval(now, q, s, rec, sc)
	}
	return nil, true
}

// bound is the deadline every call in q must keep: its split's, or on a
// worker the item's own if that comes first.
func (q *seq) bound() time.Time {
	if q.split == nil {
		return time.Time{}
	}
	if !q.deadline.IsZero() && (q.split.deadline.IsZero() || q.deadline.Before(q.split.deadline)) {
		return q.deadline
	}
	return q.split.deadline
}

// settle applies a final step's failure policy and routing. It reports
// whether the list goes on to another step.
func (r *runner) settle(q *seq, s *chain.Step) bool {
	key := q.prefix + s.Name
	rec := r.recs[key]
	q.path = append(q.path, s.Name)
	switch rec.Status {
	case store.StepFailed, store.StepTimedOut, store.StepCancelled:
		if handled, goOn := r.failureRoute(q, s, rec); handled {
			return goOn
		}
		switch s.OnFailure {
		case chain.OnFailureSkip:
			rec.Status = store.StepSkipped
			r.put(rec)
			r.setStepVar(q, rec, nil)
			r.event(store.EventStepSkipped, key, rec.Attempts, "failure skipped (on_failure = skip): "+failureText(rec))
			if q.inItem() {
				// Inside a split, a skipped failure ends the item as skipped.
				r.endItem(q, store.StepSkipped, nil, nil)
				return false
			}
		case chain.OnFailureDLQ:
			id := r.deadLetter(rec)
			r.failSeq(q, &store.ErrorInfo{
				Message: fmt.Sprintf("step %q failed: %s (dead-letter entry %s)", s.Name, failureText(rec), id), Code: "step_failed",
			})
			return false
		default:
			r.failSeq(q, &store.ErrorInfo{Message: fmt.Sprintf("step %q failed: %s", s.Name, failureText(rec)), Code: "step_failed"})
			return false
		}
	case store.StepSkipped:
		if q.inItem() && rec.Attempts == 0 && rec.Error == nil {
			// A false when condition filters the item out: it ends here,
			// counted as skipped, so the split still completes.
			r.endItem(q, store.StepSkipped, nil, nil)
			return false
		}
	}
	next, err := r.route(q, s, rec)
	if err != nil {
		r.failSeq(q, &store.ErrorInfo{Message: err.Error(), Code: "condition"})
		return false
	}
	if next == chain.EndTarget {
		next = ""
		if q.inItem() {
			// A branch to the end filters the item out, like a false when.
			q.cursor = ""
			r.endItem(q, store.StepSkipped, nil, nil)
			return false
		}
	}
	q.cursor = next
	if next == "" {
		// The list ran to its end; its result is the last step's body.
		q.resultKey, q.result = lastBody(r, q)
		if q.inItem() {
			r.endItem(q, store.StepSucceeded, q.result, nil)
		}
	}
	return true
}

// lastBody is the key and body of the last step on q's path that
// succeeded.
func lastBody(r *runner, q *seq) (string, json.RawMessage) {
	for i := len(q.path) - 1; i >= 0; i-- {
		if rec := r.recs[q.prefix+q.path[i]]; rec != nil && rec.Status == store.StepSucceeded {
			return rec.Key, rec.Body
		}
	}
	return "", nil
}

// MaxInlineRunBody is the largest result a run's record holds itself; a
// larger one stays only in its step's record (store.Run.BodyStep).
const MaxInlineRunBody = 64 << 10

// RunBody is a run's result: its Body, or its BodyStep's body.
func RunBody(ctx context.Context, st store.Store, run *store.Run) (json.RawMessage, error) {
	if run.BodyStep == "" {
		return run.Body, nil
	}
	var body json.RawMessage
	err := st.ForEachStep(ctx, run.ID, store.StepScan{Prefix: run.BodyStep, Exact: true}, func(rec *store.StepRecord) error {
		body = rec.Body
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading the result of run %s from step %q: %w", run.ID, run.BodyStep, err)
	}
	if body == nil {
		return nil, fmt.Errorf("reading the result of run %s: its step %q has no record: %w", run.ID, run.BodyStep, store.ErrDamaged)
	}
	return body, nil
}

// failSeq ends q because a step failed: the run at top level, the item in
// a split.
func (r *runner) failSeq(q *seq, info *store.ErrorInfo) {
	if q.inItem() {
		r.endItem(q, store.StepFailed, nil, info)
		return
	}
	r.finishRun(store.RunFailed, info)
}

// route picks the step after s: the first matching branch (only for a step
// that succeeded), then default_next, then the next step in order.
func (r *runner) route(q *seq, s *chain.Step, rec *store.StepRecord) (string, error) {
	if rec.Status == store.StepSucceeded && len(s.Branches) > 0 {
		sc := r.scopeOf(q)
		sc.prev = nil
		if n := len(q.path); n > 1 {
			if prev, ok := q.vars[q.path[n-2]].(map[string]any); ok {
				sc.prev = prev
			}
		}
		result, _ := q.vars[s.Name].(map[string]any)
		for i, b := range s.Branches {
			ok, err := b.Cond.Eval(sc.env(b.Cond, result))
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
