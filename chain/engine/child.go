package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/store"
)

// A sub_chain step runs another chain as a run of its own, linked to its
// parent. The child's id is chosen and written in the parent step's record
// before the child is created, so a restart between the two finds the same
// child, or creates it under the same id.

// childStart is the run a sub_chain step creates once its intent is durable.
type childStart struct {
	id       string
	chain    string
	input    json.RawMessage
	deadline time.Time
}

func (r *runner) progressChild(now time.Time, q *seq, s *chain.Step, rec *store.StepRecord, sc *scope) ([]launch, bool) {
	switch rec.Status {
	case store.StepPending:
		if rec.NotBefore.After(now) {
			return nil, false
		}
		l, errInfo := r.prepareChild(now, q, s, rec, sc)
		if errInfo != nil {
			r.finishStep(q, rec, store.StepFailed, errInfo)
			return nil, true
		}
		rec.Status = store.StepRunning
		rec.Attempts = 1
		rec.StartedAt = now
		rec.NotBefore = time.Time{}
		rec.Child = l.child.id
		r.put(rec)
		r.event(store.EventStepStarted, rec.Key, 1, fmt.Sprintf("sub-chain %q as run %s", s.SubChain, rec.Child))
		l.batch = r.launchBatch(q)
		r.track(l, 1)
		return []launch{*l}, false
	case store.StepRunning:
		if _, waiting := r.calls[rec.Key]; waiting {
			r.pollChild(now, rec)
			return nil, false
		}
		// Resumed: the child may have finished, be running, or (stopped
		// between the two writes) not exist yet.
		child, err := r.e.childRun(context.Background(), rec.Child)
		switch {
		case errors.Is(err, store.ErrNotFound):
			l, errInfo := r.prepareChild(now, q, s, rec, sc)
			if errInfo != nil {
				r.finishStep(q, rec, store.StepFailed, errInfo)
				return nil, true
			}
			l.child.id = rec.Child
			l.batch = r.launchBatch(q)
			r.track(l, rec.Attempts)
			return []launch{*l}, false
		case err != nil:
			// The store may answer next time; the child's step stays as it is.
			r.log.Warn("reading a sub-chain run; trying again shortly", "step", rec.Key, "child", rec.Child, "err", err)
			r.addTimer(now.Add(childPoll), rec.Key)
			return nil, false
		case child.Status.Final():
			r.childResult(q, rec, child)
			return nil, true
		}
		// Still running: it is resumed on its own and reports back here.
		r.calls[rec.Key] = &inflight{attempt: rec.Attempts}
		r.pollChild(now, rec)
		return nil, false
	}
	return nil, rec.Status.Final()
}

// prepareChild renders the sub-chain's input and bounds its deadline.
func (r *runner) prepareChild(now time.Time, q *seq, s *chain.Step, rec *store.StepRecord, sc *scope) (*launch, *store.ErrorInfo) {
	input := []byte(`{}`)
	if s.Input != nil {
		var err error
		if input, err = s.Input.AppendJSON(nil, sc); err != nil {
			return nil, &store.ErrorInfo{Message: fmt.Sprintf("rendering input of step %q: %v", s.Name, err), Code: "template"}
		}
	}
	if len(input) > r.e.limits.MaxBodyBytes {
		return nil, &store.ErrorInfo{Message: fmt.Sprintf("input of step %q is %d bytes, above max_body_bytes (%d)", s.Name, len(input), r.e.limits.MaxBodyBytes), Code: "body_too_large"}
	}
	if err := checkNesting("the input of step "+strconv.Quote(s.Name), input); err != nil {
		return nil, &store.ErrorInfo{Message: err.Error(), Code: "body_too_deep"}
	}
	if sub := r.cfg.Chains[s.SubChain]; sub != nil {
		if err := sub.Input.Check(sub.Name, input); err != nil {
			return nil, &store.ErrorInfo{Message: fmt.Sprintf("input of step %q: %v", s.Name, err), Code: "invalid_input"}
		}
	}
	deadline := r.run.Deadline
	if b := q.bound(); !b.IsZero() && (deadline.IsZero() || b.Before(deadline)) {
		deadline = b
	}
	return &launch{key: rec.Key, child: &childStart{id: store.NewID(), chain: s.SubChain, input: input, deadline: deadline}}, nil
}

// startChild creates and starts the child run.
func (r *runner) startChild(ctx context.Context, l launch) {
	parent := ParentRef{Run: r.run.ID, Step: l.key}
	labels := r.run.Labels
	r.e.act.Begin()
	go func() {
		defer r.e.act.End()
		for wait := 10 * time.Millisecond; ; wait = min(2*wait, time.Second) {
			_, err := r.e.startRun(ctx, r.cfg, l.child.chain, Input{Payload: l.child.input, Labels: labels}, l.child.id, &parent, l.child.deadline)
			if errors.Is(err, store.ErrExists) || errors.Is(err, ErrClosed) {
				// Created before a restart, it reports when it ends; or the
				// engine is closing, and the parent creates it on resume.
				return
			}
			if !errors.Is(err, store.ErrLeaseHeld) {
				if err != nil {
					r.give(outcome{key: l.key, attempt: -1, err: err}, nil)
				}
				return
			}
			// Another gateway holds the child's lease: it advances the
			// child, which reports when it ends (or is read by pollChild);
			// or it was creating it, or died doing so (a worker killed
			// while the item that starts it runs), and the child is
			// created once that lease is let go of or lapses.
			if _, err := r.e.store.RunHeader(ctx, l.child.id); err == nil {
				return
			}
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return
			}
		}
	}()
}

// childPoll is how often a parent reads the record of a child it waits
// on: a child that another gateway advances, after a takeover, cannot
// report to it directly.
const childPoll = 2 * time.Second

// pollChild reads a waited-on child's record once per childPoll, off the
// run's goroutine; a final child is handled as if it had reported.
func (r *runner) pollChild(now time.Time, rec *store.StepRecord) {
	next, polled := r.childPolls[rec.Key]
	if polled && now.Before(next) {
		return
	}
	r.childPolls[rec.Key] = now.Add(childPoll)
	r.addTimer(now.Add(childPoll), rec.Key)
	if !polled {
		return
	}
	key, id := rec.Key, rec.Child
	r.e.act.Begin()
	go func() {
		defer r.e.act.End()
		ctx, cancel := context.WithTimeout(context.Background(), childPoll)
		defer cancel()
		child, err := r.e.childRun(ctx, id)
		if err != nil || !child.Status.Final() {
			return
		}
		r.give(outcome{key: key, attempt: -1, child: child}, nil)
	}()
}

// childRun reads a sub-chain's run, with its result when it has ended.
func (e *Engine) childRun(ctx context.Context, id string) (*store.Run, error) {
	child, err := e.store.RunHeader(ctx, id)
	if err != nil || child.Status != store.RunSucceeded || child.BodyStep == "" {
		return child, err
	}
	if child.Body, err = RunBody(ctx, e.store, child); err != nil {
		return nil, err
	}
	return child, nil
}

// childEnded applies a sub-chain run's end to its step.
func (r *runner) childEnded(o outcome) {
	rec := r.recs[o.key]
	if rec == nil || rec.Status != store.StepRunning {
		return
	}
	delete(r.calls, o.key)
	delete(r.childPolls, o.key)
	q := r.seqFor(o.key)
	defer r.markDirty(q)
	if o.err != nil {
		r.finishStep(q, rec, store.StepFailed, &store.ErrorInfo{Message: fmt.Sprintf("starting sub-chain run: %v", o.err), Code: "sub_chain"})
		return
	}
	if o.child.ID != rec.Child {
		return
	}
	r.childResult(q, rec, o.child)
}

// childResult makes a finished child run's outcome its step's.
func (r *runner) childResult(q *seq, rec *store.StepRecord, child *store.Run) {
	if child.Status != store.RunSucceeded {
		msg := fmt.Sprintf("sub-chain %q (run %s) %s", child.Chain, child.ID, child.Status)
		if child.Error != nil {
			msg += ": " + child.Error.Message
		}
		status := store.StepFailed
		if child.Status == store.RunTimedOut {
			status = store.StepTimedOut
		}
		r.finishStep(q, rec, status, &store.ErrorInfo{Message: msg, Code: "sub_chain_" + string(child.Status)})
		return
	}
	body := child.Body
	if len(body) == 0 {
		body = json.RawMessage("null")
	}
	rec.Status = store.StepSucceeded
	rec.Body = body
	rec.FinishedAt = r.e.clock.Now().UTC()
	r.put(rec)
	r.setStepVar(q, rec, decodeJSON(body))
	if !q.inItem() {
		r.event(store.EventStepSucceeded, rec.Key, rec.Attempts, "sub-chain run "+child.ID+" succeeded")
	}
}
