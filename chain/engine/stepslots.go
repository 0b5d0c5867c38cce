package engine

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/store"
)

// A step's concurrency key, inside a split's items or at top level: the
// step takes a slot of its key (held as RUN/STEP) once its record is open
// (after its when condition), and gives it back once it has ended; a step
// that finds the key taken waits, pending, asking again every QueuePoll
// and at once when a step of this run gives the key back, or is skipped
// (on_busy = "skip", or a full queue). How long it has waited is kept in
// memory: a restart counts its queue_timeout_seconds again.

// stepSlot is a step's concurrency key, held or asked for.
type stepSlot struct {
	key     string
	held    bool
	since   time.Time
	nextAsk time.Time
}

// keyedItems reports whether a split's per-item steps take concurrency
// keys: its items then run in this process, where their slots are asked
// for and given back.
func keyedItems(s *chain.Step) bool {
	keyed := false
	chain.WalkSteps(s.Split.Steps, func(st *chain.Step) { keyed = keyed || st.Concurrency != nil })
	return keyed
}

// stepHolds gates step s, whose record rec is open and not final, on its
// concurrency key: it reports whether the step holds its slot and goes on.
// A step it ends (its key cannot be rendered, it waited too long, it is
// skipped) is final when it returns.
func (r *runner) stepHolds(now time.Time, q *seq, s *chain.Step, rec *store.StepRecord, sc *scope) bool {
	if r.stepSlots == nil {
		r.stepSlots = map[string]*stepSlot{}
	}
	c := s.Concurrency
	ss := r.stepSlots[rec.Key]
	if ss != nil && ss.held {
		return true
	}
	if ss == nil {
		if r.e.slots == nil {
			r.finishStep(q, rec, store.StepFailed, &store.ErrorInfo{Message: fmt.Sprintf("step %q has a concurrency key, and this store keeps no slots", s.Name), Code: "concurrency_key"})
			return false
		}
		key, err := RenderConcurrencyKey(c.Key, sc)
		if err != nil {
			r.finishStep(q, rec, store.StepFailed, &store.ErrorInfo{Message: fmt.Sprintf("step %q: %v", s.Name, err), Code: "concurrency_key"})
			return false
		}
		ss = &stepSlot{key: key, since: now}
		r.stepSlots[rec.Key] = ss
	}
	holder := r.run.ID + "/" + rec.Key
	if c.QueueTimeoutSeconds > 0 && now.Sub(ss.since) >= time.Duration(c.QueueTimeoutSeconds)*time.Second {
		r.releaseStepSlot(rec.Key)
		r.finishStep(q, rec, store.StepFailed, &store.ErrorInfo{
			Message: fmt.Sprintf("waited %ds (queue_timeout_seconds) for concurrency key %q", c.QueueTimeoutSeconds, ss.key), Code: "queue_timeout",
		})
		return false
	}
	if now.Before(ss.nextAsk) {
		return false
	}
	if r.creating {
		r.markDirty(q) // asked for in the run's first pass once it exists
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g, err := r.e.slots.AcquireSlot(ctx, store.SlotRequest{Key: ss.key, Holder: holder, Limit: c.Limit, Queue: c.OnBusy == chain.OnBusyQueue, QueueLimit: c.QueueLimit})
	switch {
	case err != nil:
		r.log.Warn("asking for a step's concurrency slot; asking again", "step", rec.Key, "key", ss.key, "err", err, "in", QueuePoll)
	case g.Granted:
		ss.held = true
		return true
	case g.Full || c.OnBusy == chain.OnBusySkip:
		delete(r.stepSlots, rec.Key)
		msg := fmt.Sprintf("skipped: concurrency key %q is held by %s", ss.key, strings.Join(g.Holders, ", "))
		code := "concurrency_busy"
		if g.Full {
			msg += fmt.Sprintf(" and %d wait for it already (queue_limit)", c.QueueLimit)
			code = "queue_full"
		}
		rec.Status = store.StepSkipped
		rec.Error = &store.ErrorInfo{Message: msg, Code: code}
		rec.FinishedAt = now.UTC()
		r.put(rec)
		r.setStepVar(q, rec, nil)
		r.event(store.EventStepSkipped, rec.Key, 0, msg)
		return false
	}
	ss.nextAsk = now.Add(QueuePoll)
	r.addTimer(ss.nextAsk, rec.Key)
	if c.QueueTimeoutSeconds > 0 {
		r.addTimer(ss.since.Add(time.Duration(c.QueueTimeoutSeconds)*time.Second), rec.Key)
	}
	return false
}

// stepEnded gives back the slot of a step that has ended, and has this
// run's steps waiting for its key ask at once.
func (r *runner) stepEnded(key string) {
	ss := r.stepSlots[key]
	if ss == nil {
		return
	}
	r.releaseStepSlot(key)
	for k, w := range r.stepSlots {
		if w.key == ss.key && !w.held {
			w.nextAsk = time.Time{}
			r.markDirty(r.seqFor(k))
		}
	}
}

// releaseStepSlot gives back a step's slot, or its place in the queue.
func (r *runner) releaseStepSlot(key string) {
	ss := r.stepSlots[key]
	if ss == nil {
		return
	}
	delete(r.stepSlots, key)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.e.slots.ReleaseSlot(ctx, ss.key, r.run.ID+"/"+key); err != nil {
		r.log.Warn("giving back a step's concurrency slot; it is free once the run ends", "step", key, "key", ss.key, "err", err)
	}
}

// releaseStepSlots gives back every slot the run's steps hold or wait for,
// as the run ends.
func (r *runner) releaseStepSlots() {
	for k := range r.stepSlots {
		r.releaseStepSlot(k)
	}
}
