package engine

import (
	"bytes"
	"fmt"
	"strings"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/internal/jsonx"
)

// group is a running parallel step's live state. It is rebuilt from the
// step records when a run resumes, so it holds nothing the store does not.
type group struct {
	seq  *seq // the list holding the parallel step
	step *chain.Step
	rec  *store.StepRecord // the parallel step's own record
	// started is the batch that holds the group's record as it started
	// here; 0 once resumed, when the record is durable already.
	started  uint64
	subs     []*chain.Step
	keys     []string
	index    map[string]int // sub-step key → position
	sc       *scope
	deadline time.Time

	// queue holds sub-steps that may be dispatched now, oldest first.
	queue    []int
	head     int
	inflight int

	succeeded, failed, skipped int
}

func subKey(parent, name string) string { return parent + "/" + name }

// startGroup persists the group's state before anything is dispatched: the
// parent running with its deadline. That record is the whole state: every
// sub-step without a record of its own is pending, with the dedup key its
// key gives it, so a group of ten thousand costs one write to start and each
// sub-step is written as it moves.
func (r *runner) startGroup(now time.Time, q *seq, s *chain.Step, rec *store.StepRecord, sc *scope) *group {
	p := s.Parallel
	rec.Status = store.StepRunning
	rec.Attempts = 1
	rec.StartedAt = now
	rec.NotBefore = time.Time{}
	rec.Deadline = now.Add(time.Duration(p.TimeoutSeconds) * time.Second)
	if !r.run.Deadline.IsZero() && r.run.Deadline.Before(rec.Deadline) {
		rec.Deadline = r.run.Deadline
	}
	r.put(rec)
	if !q.inItem() {
		r.event(store.EventStepStarted, rec.Key, 1, fmt.Sprintf("parallel group of %d, join %s", len(p.Steps), p.Join))
	}
	g := r.newGroup(q, s, rec, sc)
	g.started = q.ack
	for i, sub := range p.Steps {
		g.place(r, i, r.open(now, q, sub, g.keys[i], sc, true), now)
	}
	return g
}

// resumeGroup rebuilds a group from its records; sub-steps with a recorded
// result count at once and are not called again.
func (r *runner) resumeGroup(now time.Time, q *seq, s *chain.Step, rec *store.StepRecord, sc *scope) *group {
	g := r.newGroup(q, s, rec, sc)
	for i, sub := range s.Parallel.Steps {
		sr := r.recs[g.keys[i]]
		if sr == nil {
			sr = r.open(now, q, sub, g.keys[i], sc, true)
		} else {
			r.resumed(q, sr)
		}
		g.place(r, i, sr, now)
	}
	return g
}

func (r *runner) newGroup(q *seq, s *chain.Step, rec *store.StepRecord, sc *scope) *group {
	g := &group{seq: q, step: s, rec: rec, subs: s.Parallel.Steps, sc: sc, deadline: rec.Deadline}
	g.keys = make([]string, len(g.subs))
	g.index = make(map[string]int, len(g.subs))
	for i, sub := range g.subs {
		g.keys[i] = subKey(rec.Key, sub.Name)
		g.index[g.keys[i]] = i
		r.owner[g.keys[i]] = g
	}
	r.groups[rec.Key] = g
	r.addTimer(g.deadline, rec.Key)
	return g
}

// place sorts a sub-step by its record: counted if final, queued if it may
// run now, left to its timer if it waits.
func (g *group) place(r *runner, i int, rec *store.StepRecord, now time.Time) {
	switch {
	case rec.Status.Final():
		g.count(r, rec)
	case rec.Status == store.StepPending && rec.NotBefore.After(now):
		r.addTimer(rec.NotBefore, rec.Key)
	default:
		g.queue = append(g.queue, i)
	}
}

// count folds a final sub-step into the join, applying its own on_failure:
// skip turns a failure into a skip, dlq parks it and counts it as failed.
func (g *group) count(r *runner, rec *store.StepRecord) {
	switch rec.Status {
	case store.StepSucceeded:
		g.succeeded++
	case store.StepSkipped:
		g.skipped++
	default:
		switch r.def.Step(rec.Name).OnFailure {
		case chain.OnFailureSkip:
			rec.Status = store.StepSkipped
			r.put(rec)
			r.setStepVar(g.seq, rec, nil)
			r.event(store.EventStepSkipped, rec.Key, rec.Attempts, "failure skipped (on_failure = skip): "+failureText(rec))
			g.skipped++
		case chain.OnFailureDLQ:
			r.deadLetter(rec)
			g.failed++
		default:
			g.failed++
		}
	}
}

// launchBatch is the batch a sub-step's first call waits for: the one
// holding the group's record; 0 once that is durable.
func (g *group) launchBatch(r *runner) uint64 {
	if g.started <= r.ackedSeq {
		return 0
	}
	return g.started
}

func (g *group) done() int { return g.succeeded + g.failed + g.skipped }

// stepChanged is told about every step whose call ended: its list has
// something to look at again, and a group counts it.
func (r *runner) stepChanged(rec *store.StepRecord) {
	r.markDirty(r.seqFor(rec.Key))
	g := r.owner[rec.Key]
	if g == nil {
		return
	}
	g.inflight--
	if rec.Status.Final() {
		g.count(r, rec)
	}
}

// timerDue wakes whatever a timer was set for: a sub-step whose retry
// backoff or delay has passed is queued in its group, and its list looks
// again.
func (r *runner) timerDue(key string, now time.Time) {
	r.markDirty(r.seqFor(key))
	if sp := r.splits[key]; sp != nil {
		r.markDirty(sp.owner)
	}
	g := r.owner[key]
	if g == nil {
		if g = r.groups[key]; g != nil {
			r.markDirty(g.seq)
		}
		return
	}
	if rec := r.recs[key]; rec != nil && rec.Status == store.StepPending && !rec.NotBefore.After(now) {
		g.queue = append(g.queue, g.index[key])
	}
}

// progressGroup dispatches what the group may run and decides its join.
// It returns the calls to start and whether the group is final.
func (r *runner) progressGroup(now time.Time, g *group) ([]launch, bool) {
	if !now.Before(g.deadline) {
		r.finishGroup(g, store.StepTimedOut, fmt.Sprintf("parallel group timed out after %s", g.deadline.Sub(g.rec.StartedAt).Round(time.Second)))
		return nil, true
	}
	if r.decideGroup(g) {
		return nil, true
	}
	var out []launch
	limit := g.step.Parallel.MaxConcurrency
	for g.head < len(g.queue) && (limit == 0 || g.inflight < limit) {
		i := g.queue[g.head]
		g.head++
		rec := r.recs[g.keys[i]]
		if rec.Status.Final() || (rec.Status == store.StepPending && rec.NotBefore.After(now)) {
			continue
		}
		l, failed := r.dispatch(now, g.seq, g.subs[i], rec, g.sc, g.deadline)
		switch {
		case l != nil:
			g.inflight++
			out = append(out, *l)
		case failed:
			g.count(r, rec)
		}
	}
	if g.head == len(g.queue) {
		g.queue, g.head = g.queue[:0], 0
	}
	return out, r.decideGroup(g)
}

// decideGroup finishes the group once its join policy has an answer.
func (r *runner) decideGroup(g *group) bool {
	p := g.step.Parallel
	n := len(g.subs)
	switch {
	case p.Join == chain.JoinAny && g.succeeded > 0:
		r.finishGroup(g, store.StepSucceeded, "")
	case p.Join == chain.JoinAll && g.failed > 0 && (p.OnFailure == chain.GroupFailFast || g.done() == n):
		r.finishGroup(g, store.StepFailed, r.groupFailure(g))
	case g.done() == n && g.failed > 0:
		r.finishGroup(g, store.StepFailed, r.groupFailure(g))
	case g.done() == n:
		r.finishGroup(g, store.StepSucceeded, "")
	default:
		return false
	}
	return true
}

func (r *runner) groupFailure(g *group) string {
	var parts []string
	for _, k := range g.keys {
		rec := r.recs[k]
		if rec.Status == store.StepFailed || rec.Status == store.StepTimedOut || rec.Status == store.StepCancelled {
			if len(parts) == 3 {
				parts = append(parts, "…")
				break
			}
			parts = append(parts, rec.Name+": "+failureText(rec))
		}
	}
	return fmt.Sprintf("%d of %d sub-steps failed (%s)", g.failed, len(g.subs), strings.Join(parts, "; "))
}

// finishGroup cancels whatever is still pending or running and records the
// parent's result: an object keyed by sub-step name.
func (r *runner) finishGroup(g *group, status store.StepStatus, msg string) {
	reason := "the parallel group finished without it"
	if status == store.StepTimedOut {
		reason = msg
	}
	for _, k := range g.keys {
		if rec := r.recs[k]; !rec.Status.Final() {
			r.abandon(rec, store.StepCancelled, reason)
		}
		delete(r.owner, k)
	}
	delete(r.groups, g.rec.Key)

	var body bytes.Buffer
	merged := make(map[string]any, len(g.subs))
	body.WriteByte('{')
	for i, sub := range g.subs {
		if i > 0 {
			body.WriteByte(',')
		}
		name, _ := jsonx.Marshal(sub.Name)
		body.Write(name)
		body.WriteByte(':')
		rec := r.recs[g.keys[i]]
		if rec.Status == store.StepSucceeded && len(rec.Body) > 0 {
			body.Write(rec.Body)
			v, _ := g.seq.vars[sub.Name].(map[string]any)
			merged[sub.Name] = v["body"]
		} else {
			body.WriteString("null")
			merged[sub.Name] = nil
		}
	}
	body.WriteByte('}')

	rec := g.rec
	rec.Status = status
	rec.Body = body.Bytes()
	rec.FinishedAt = r.e.clock.Now().UTC()
	rec.Error = nil
	typ := store.EventStepSucceeded
	if status != store.StepSucceeded {
		code := "group_failed"
		typ = store.EventStepFailed
		if status == store.StepTimedOut {
			code, typ = "timeout", store.EventStepTimedOut
		}
		rec.Error = &store.ErrorInfo{Message: msg, Code: code}
	}
	r.put(rec)
	g.seq.vars[rec.Name] = stepValue(rec, merged)
	if typ != store.EventStepSucceeded || !g.seq.inItem() {
		r.event(typ, rec.Key, rec.Attempts, msg)
	}
}
