package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/internal/jsonx"
	"github.com/chaingate/gateway/providers"
)

// open creates a step's record on its first visit: a false `when` skips it,
// delay_seconds sets a persisted timer. The record may come back final.
// When implied is set, a plain pending record is kept in memory only: what
// is already durable says the step is pending, with a dedup key derived
// from its key — a parallel group's running record for its sub-steps, a
// split item's position for its steps.
func (r *runner) open(now time.Time, q *seq, s *chain.Step, key string, sc *scope, implied bool) *store.StepRecord {
	rec := &store.StepRecord{Key: key, Name: s.Name, Status: store.StepPending, DedupKey: r.run.ID + "/" + key}
	r.adopt(q, rec)
	if s.When != nil {
		ok, err := s.When.Eval(sc.env(s.When, nil))
		if err != nil {
			r.finishStep(q, rec, store.StepFailed, &store.ErrorInfo{Message: fmt.Sprintf("when condition of step %q: %v", s.Name, err), Code: "condition"})
			return rec
		}
		if !ok {
			rec.Status = store.StepSkipped
			rec.FinishedAt = now
			r.put(rec)
			r.setStepVar(q, rec, nil)
			r.event(store.EventStepSkipped, key, 0, "when condition is false")
			return rec
		}
	}
	if s.DelaySeconds > 0 {
		rec.NotBefore = now.Add(time.Duration(s.DelaySeconds) * time.Second)
		r.addTimer(rec.NotBefore, key)
		r.put(rec)
		return rec
	}
	if !implied {
		r.put(rec)
	}
	return rec
}

// adopt notes that rec belongs to q, in memory and for the item's cleanup.
func (r *runner) adopt(q *seq, rec *store.StepRecord) {
	if _, ok := r.recs[rec.Key]; !ok {
		r.recs[rec.Key] = rec
		if q.inItem() {
			q.keys = append(q.keys, rec.Key)
		}
	}
	r.seqOf[rec.Key] = q
}

// resumed takes a record read back from the store into q when q first
// meets it, as open does for a new one; a finished step's result goes into
// q's namespace, since a split item's namespace is rebuilt only as the item
// replays its steps.
func (r *runner) resumed(q *seq, rec *store.StepRecord) {
	if r.seqOf[rec.Key] == q {
		return
	}
	r.seqOf[rec.Key] = q
	if q.inItem() {
		q.keys = append(q.keys, rec.Key)
	}
	if rec.Status.Final() {
		r.setStepVar(q, rec, r.bodyValue(rec))
	}
}

// dispatch starts a provider step's next attempt when it is due, or starts
// its current attempt again when the run resumed with the call unanswered.
// bound, when set, caps the call's deadline (a group's deadline). It returns
// the call to start, or whether the step failed before any call.
func (r *runner) dispatch(now time.Time, q *seq, s *chain.Step, rec *store.StepRecord, sc *scope, bound time.Time) (*launch, bool) {
	switch rec.Status {
	case store.StepPending:
		if rec.NotBefore.After(now) {
			return nil, false
		}
		l, errInfo := r.prepare(now, s, rec, rec.Attempts+1, sc, bound)
		if errInfo != nil {
			r.finishStep(q, rec, store.StepFailed, errInfo)
			return nil, true
		}
		rec.Attempts++
		rec.Status = store.StepRunning
		rec.NotBefore = time.Time{}
		if rec.StartedAt.IsZero() {
			rec.StartedAt = now
		}
		if q.inItem() {
			// Successful per-item calls are counted in the split's progress
			// rather than logged one by one; a retry is worth a record.
			if rec.Attempts > 1 {
				r.put(rec)
			}
		} else {
			r.put(rec)
			r.event(store.EventStepStarted, rec.Key, rec.Attempts, "")
		}
		l.batch = r.launchBatch(q)
		if g := r.owner[rec.Key]; g != nil && rec.Attempts == 1 && r.leaseFirm() {
			// A sub-step's first call needs no write of its own before it
			// goes out: its group's record, durable before any sub-step
			// runs, is its intent (startGroup). Resumed, it goes out again
			// with the same dedup key and attempt.
			l.batch = g.launchBatch(r)
		}
		r.track(l, rec.Attempts)
		return l, false
	case store.StepRunning:
		if _, ok := r.calls[rec.Key]; ok {
			return nil, false
		}
		// Running with no call in flight here: read back from the store,
		// the gateway that wrote it stopped mid-call. Dispatch again with
		// the same dedup key and attempt.
		l, errInfo := r.prepare(now, s, rec, rec.Attempts, sc, bound)
		if errInfo != nil {
			r.finishStep(q, rec, store.StepFailed, errInfo)
			return nil, true
		}
		r.event(store.EventStepStarted, rec.Key, rec.Attempts, "dispatched again after a restart")
		l.batch = r.launchBatch(q)
		r.track(l, rec.Attempts)
		return l, false
	}
	return nil, rec.Status.Final()
}

// launchBatch is the batch a call in q must wait for: the one holding q's
// latest write, which follows everything the call depends on; 0 when that
// is durable already.
func (r *runner) launchBatch(q *seq) uint64 {
	if q.ack <= r.ackedSeq {
		return 0
	}
	return q.ack
}

// prepare renders a step's payload and builds its provider call.
func (r *runner) prepare(now time.Time, s *chain.Step, rec *store.StepRecord, attempt int, sc *scope, bound time.Time) (*launch, *store.ErrorInfo) {
	p := r.cfg.Providers[s.Provider]
	if p == nil {
		return nil, &store.ErrorInfo{Message: fmt.Sprintf("provider %q is not configured", s.Provider), Code: "config"}
	}
	prov, err := r.e.providers.Resolve(p)
	if err != nil {
		return nil, &store.ErrorInfo{Message: fmt.Sprintf("provider %q: %v", s.Provider, err), Code: "provider"}
	}
	payload := []byte(`{}`)
	if s.Payload != nil {
		if payload, err = s.Payload.AppendJSON(nil, sc); err != nil {
			return nil, &store.ErrorInfo{Message: fmt.Sprintf("rendering payload_template of step %q: %v", s.Name, err), Code: "template"}
		}
	}
	config := p.Config
	if p.ConfigTemplate != nil {
		if config, err = p.ConfigTemplate.AppendJSON(nil, sc); err != nil {
			return nil, &store.ErrorInfo{Message: fmt.Sprintf("rendering the config of provider %q: %v", p.Name, err), Code: "template"}
		}
	}
	r.payloads[rec.Key] = payload
	timeout := time.Duration(chain.DefaultProviderTimeoutSeconds) * time.Second
	switch {
	case s.TimeoutSeconds > 0:
		timeout = time.Duration(s.TimeoutSeconds) * time.Second
	case p.TimeoutSeconds > 0:
		timeout = time.Duration(p.TimeoutSeconds) * time.Second
	}
	deadline := now.Add(timeout)
	for _, b := range []time.Time{r.run.Deadline, bound} {
		if !b.IsZero() && b.Before(deadline) {
			deadline = b
		}
	}
	return &launch{
		key:      rec.Key,
		provider: p.Name,
		prov:     prov,
		deadline: deadline,
		timeout:  timeout,
		req: providers.Request{
			ActionType: s.ActionType,
			Payload:    payload,
			Config:     config,
			DedupKey:   rec.DedupKey,
			Attempt:    attempt,
			Deadline:   deadline,
			RunID:      r.run.ID,
			Step:       rec.Key,
		},
	}, nil
}

// handle applies a finished provider call to its step.
func (r *runner) handle(o outcome) {
	c := r.calls[o.key]
	if c == nil || c.attempt != o.attempt {
		return
	}
	delete(r.calls, o.key)
	rec := r.recs[o.key]
	if rec == nil || rec.Status != store.StepRunning || rec.Attempts != o.attempt {
		return
	}
	q := r.seqFor(rec.Key)
	defer r.stepChanged(rec)
	s := r.def.Step(rec.Name)
	now := r.e.clock.Now().UTC()
	if o.err == nil {
		body := o.body
		if len(body) == 0 {
			body = json.RawMessage("null")
		}
		if len(body) > r.e.limits.MaxBodyBytes {
			r.finishStep(q, rec, store.StepFailed, &store.ErrorInfo{
				Message: fmt.Sprintf("provider returned a body of %d bytes, above max_body_bytes (%d)", len(body), r.e.limits.MaxBodyBytes), Code: "body_too_large",
			})
			return
		}
		if err := checkNesting("the body the provider returned", body); err != nil {
			r.finishStep(q, rec, store.StepFailed, &store.ErrorInfo{Message: err.Error(), Code: "body_too_deep"})
			return
		}
		if !json.Valid(body) {
			_, err := parseJSON(body)
			r.finishStep(q, rec, store.StepFailed, &store.ErrorInfo{Message: fmt.Sprintf("provider returned a body that is not valid JSON: %v", err), Code: "bad_response"})
			return
		}
		// Kept as strict JSON parsers read it, whatever bytes the provider
		// sent; decoded when a later step reads it: most bodies never are.
		body = jsonx.ValidUTF8(body)
		value := &lazyJSON{raw: body}
		rec.Status = store.StepSucceeded
		rec.Body = body
		rec.Error = nil
		rec.FinishedAt = now
		r.put(rec)
		r.setStepVar(q, rec, value)
		if !q.inItem() {
			r.event(store.EventStepSucceeded, rec.Key, rec.Attempts, "")
		}
		return
	}

	info := errorInfo(o)
	if info.Retryable && s.Retry != nil && rec.Attempts <= s.Retry.MaxRetries {
		wait := backoff(s.Retry, rec.Attempts)
		// The service's own word on when to come back beats the policy's guess.
		var pe *providers.Error
		if errors.As(o.err, &pe) && pe.RetryAfter > wait {
			wait = pe.RetryAfter
		}
		rec.Status = store.StepPending
		rec.NotBefore = now.Add(wait)
		rec.Error = info
		r.put(rec)
		r.addTimer(rec.NotBefore, rec.Key)
		r.event(store.EventStepRetrying, rec.Key, rec.Attempts, fmt.Sprintf("%s; retrying in %s", info.Message, wait))
		return
	}
	status := store.StepFailed
	if o.timedOut {
		status = store.StepTimedOut
	}
	r.finishStep(q, rec, status, info)
}

// seqFor returns the list a record belongs to.
func (r *runner) seqFor(key string) *seq {
	if q := r.seqOf[key]; q != nil {
		return q
	}
	return r.top
}

func errorInfo(o outcome) *store.ErrorInfo {
	if o.timedOut {
		return &store.ErrorInfo{Message: fmt.Sprintf("provider call timed out after %s", o.timeout), Code: "timeout", Retryable: true}
	}
	var pe *providers.Error
	if errors.As(o.err, &pe) {
		return &store.ErrorInfo{Message: pe.Error(), Code: pe.Code, Retryable: pe.Retryable}
	}
	return &store.ErrorInfo{Message: o.err.Error(), Retryable: providers.IsRetryable(o.err)}
}

func (r *runner) finishStep(q *seq, rec *store.StepRecord, status store.StepStatus, info *store.ErrorInfo) {
	rec.Status = status
	rec.Error = info
	rec.FinishedAt = r.e.clock.Now().UTC()
	r.put(rec)
	r.setStepVar(q, rec, nil)
	typ := store.EventStepFailed
	if status == store.StepTimedOut {
		typ = store.EventStepTimedOut
	}
	r.event(typ, rec.Key, rec.Attempts, info.Message)
}

// abandon ends a step that is pending or running because its group or run
// gave up on it; an in-flight call is cancelled and its answer ignored.
func (r *runner) abandon(rec *store.StepRecord, status store.StepStatus, msg string) {
	if c := r.calls[rec.Key]; c != nil {
		c.stop()
		delete(r.calls, rec.Key)
	}
	if rec.Child != "" {
		go func(id string) {
			if err := r.e.Cancel(context.Background(), id); err != nil {
				r.log.Debug("cancelling sub-chain run", "child", id, "err", err)
			}
		}(rec.Child)
	}
	rec.Status = status
	rec.Error = &store.ErrorInfo{Message: msg, Code: string(status)}
	rec.FinishedAt = r.e.clock.Now().UTC()
	r.put(rec)
	r.setStepVar(r.seqFor(rec.Key), rec, nil)
	typ := store.EventStepCancelled
	if status == store.StepTimedOut {
		typ = store.EventStepTimedOut
	}
	r.event(typ, rec.Key, rec.Attempts, msg)
}

func (r *runner) setStepVar(q *seq, rec *store.StepRecord, body any) {
	q.vars[rec.Name] = stepValue(rec, body)
}

// failureText is what a failed step's record says went wrong; a record
// read back without its error still names its status.
func failureText(rec *store.StepRecord) string {
	if rec.Error == nil {
		return "ended " + string(rec.Status) + " with no error recorded"
	}
	return rec.Error.Message
}

// deadLetter parks a failed step in the DLQ with what it was sent.
func (r *runner) deadLetter(rec *store.StepRecord) string {
	info := store.ErrorInfo{Message: failureText(rec)}
	if rec.Error != nil {
		info = *rec.Error
	}
	entry := &store.DLQEntry{
		ID:        store.NewID(),
		RunID:     r.run.ID,
		Chain:     r.run.Chain,
		Step:      rec.Key,
		Error:     info,
		Attempts:  rec.Attempts,
		Payload:   r.payloads[rec.Key],
		CreatedAt: r.e.clock.Now().UTC(),
	}
	r.dlq = append(r.dlq, entry)
	r.event(store.EventDeadLettered, rec.Key, rec.Attempts, "dead-letter entry "+entry.ID)
	return entry.ID
}

// scaled is d times n, saturating rather than wrapping around to a
// negative wait that would fire every remaining retry at once.
func scaled(d time.Duration, n int64) time.Duration {
	if d > 0 && n > int64(math.MaxInt64/d) {
		return math.MaxInt64
	}
	return d * time.Duration(n)
}

// backoff is the wait before retry number attempt (1 for the first retry).
func backoff(p *chain.Retry, attempt int) time.Duration {
	base := time.Duration(p.BackoffMS) * time.Millisecond
	var d time.Duration
	switch p.Strategy {
	case chain.BackoffFixed:
		d = base
	case chain.BackoffLinear:
		d = scaled(base, int64(attempt))
	default:
		d = scaled(base, int64(1)<<min(attempt-1, 62))
	}
	if limit := time.Duration(p.MaxBackoffMS) * time.Millisecond; limit > 0 && d > limit {
		d = limit
	}
	if p.JitterMS > 0 {
		d += time.Duration(rand.IntN(p.JitterMS+1)) * time.Millisecond
	}
	return d
}
