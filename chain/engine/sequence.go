package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/providers"
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
		l, final := r.progress(now, s, s.Name, r.topScope())
		if l != nil {
			out = append(out, *l)
		}
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

// progress moves one step along. It returns a call to start, if any, and
// whether the step is final.
func (r *runner) progress(now time.Time, s *chain.Step, key string, sc *scope) (*launch, bool) {
	rec := r.recs[key]
	if rec != nil && rec.Status.Final() {
		return nil, true
	}
	if rec == nil {
		rec = &store.StepRecord{Key: key, Name: s.Name, Status: store.StepPending, DedupKey: r.run.ID + "/" + key}
		if s.When != nil {
			ok, err := s.When.Eval(sc.env(nil))
			if err != nil {
				r.finishStep(rec, store.StepFailed, &store.ErrorInfo{Message: "when: " + err.Error(), Code: "condition"})
				return nil, true
			}
			if !ok {
				rec.Status = store.StepSkipped
				rec.FinishedAt = now
				r.put(rec)
				r.setStepVar(rec, nil)
				r.event(store.EventStepSkipped, key, 0, "when condition is false")
				return nil, true
			}
		}
		if s.DelaySeconds > 0 {
			rec.NotBefore = now.Add(time.Duration(s.DelaySeconds) * time.Second)
			r.put(rec)
			return nil, false
		}
	}
	if s.Kind != chain.KindProvider {
		r.finishStep(rec, store.StepFailed, &store.ErrorInfo{
			Message: fmt.Sprintf("%s steps are not supported by this gateway version", s.Kind), Code: "unsupported",
		})
		return nil, true
	}

	switch rec.Status {
	case store.StepPending:
		if rec.NotBefore.After(now) {
			return nil, false
		}
		l, errInfo := r.prepare(now, s, rec, rec.Attempts+1, sc)
		if errInfo != nil {
			r.finishStep(rec, store.StepFailed, errInfo)
			return nil, true
		}
		rec.Attempts++
		rec.Status = store.StepRunning
		rec.NotBefore = time.Time{}
		if rec.StartedAt.IsZero() {
			rec.StartedAt = now
		}
		r.put(rec)
		r.event(store.EventStepStarted, key, rec.Attempts, "")
		return l, false
	case store.StepRunning:
		if _, ok := r.calls[key]; ok {
			return nil, false
		}
		// Persisted as running with no call in flight: the gateway stopped
		// mid-call. Dispatch again with the same dedup key and attempt.
		l, errInfo := r.prepare(now, s, rec, rec.Attempts, sc)
		if errInfo != nil {
			r.finishStep(rec, store.StepFailed, errInfo)
			return nil, true
		}
		r.event(store.EventStepStarted, key, rec.Attempts, "dispatched again after a restart")
		return l, false
	}
	return nil, false
}

// prepare renders a step's payload and builds its provider call.
func (r *runner) prepare(now time.Time, s *chain.Step, rec *store.StepRecord, attempt int, sc *scope) (*launch, *store.ErrorInfo) {
	p := r.e.cfg.Providers[s.Provider]
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
	r.payloads[rec.Key] = payload
	timeout := time.Duration(chain.DefaultProviderTimeoutSeconds) * time.Second
	switch {
	case s.TimeoutSeconds > 0:
		timeout = time.Duration(s.TimeoutSeconds) * time.Second
	case p.TimeoutSeconds > 0:
		timeout = time.Duration(p.TimeoutSeconds) * time.Second
	}
	deadline := now.Add(timeout)
	if !r.run.Deadline.IsZero() && r.run.Deadline.Before(deadline) {
		deadline = r.run.Deadline
	}
	return &launch{
		key:      rec.Key,
		prov:     prov,
		deadline: deadline,
		timeout:  timeout,
		req: providers.Request{
			ActionType: s.ActionType,
			Payload:    payload,
			Config:     p.Config,
			DedupKey:   rec.DedupKey,
			Attempt:    attempt,
			Deadline:   deadline,
			RunID:      r.run.ID,
			Step:       rec.Key,
		},
	}, nil
}

// handle applies a finished provider call.
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
	s := r.def.Step(rec.Name)
	now := time.Now().UTC()
	if o.err == nil {
		body := o.body
		if len(body) == 0 {
			body = json.RawMessage("null")
		}
		if !json.Valid(body) {
			r.finishStep(rec, store.StepFailed, &store.ErrorInfo{Message: "provider returned a body that is not valid JSON", Code: "bad_response"})
			return
		}
		rec.Status = store.StepSucceeded
		rec.Body = body
		rec.Error = nil
		rec.FinishedAt = now
		r.put(rec)
		r.setStepVar(rec, decodeJSON(body))
		r.event(store.EventStepSucceeded, rec.Key, rec.Attempts, "")
		return
	}

	info := errorInfo(o)
	if info.Retryable && s.Retry != nil && rec.Attempts <= s.Retry.MaxRetries {
		wait := backoff(s.Retry, rec.Attempts)
		rec.Status = store.StepPending
		rec.NotBefore = now.Add(wait)
		rec.Error = info
		r.put(rec)
		r.event(store.EventStepRetrying, rec.Key, rec.Attempts, fmt.Sprintf("%s; retrying in %s", info.Message, wait))
		return
	}
	status := store.StepFailed
	if o.timedOut {
		status = store.StepTimedOut
	}
	r.finishStep(rec, status, info)
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

func (r *runner) finishStep(rec *store.StepRecord, status store.StepStatus, info *store.ErrorInfo) {
	rec.Status = status
	rec.Error = info
	rec.FinishedAt = time.Now().UTC()
	r.put(rec)
	r.setStepVar(rec, nil)
	typ := store.EventStepFailed
	if status == store.StepTimedOut {
		typ = store.EventStepTimedOut
	}
	r.event(typ, rec.Key, rec.Attempts, info.Message)
}

func (r *runner) setStepVar(rec *store.StepRecord, body any) {
	r.vars.steps[rec.Name] = stepValue(rec, body)
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

// deadLetter parks a failed step in the DLQ with what it was sent.
func (r *runner) deadLetter(rec *store.StepRecord) string {
	entry := &store.DLQEntry{
		ID:        store.NewID(),
		RunID:     r.run.ID,
		Chain:     r.run.Chain,
		Step:      rec.Key,
		Error:     *rec.Error,
		Attempts:  rec.Attempts,
		Payload:   r.payloads[rec.Key],
		CreatedAt: time.Now().UTC(),
	}
	r.dlq = append(r.dlq, entry)
	r.event(store.EventDeadLettered, rec.Key, rec.Attempts, "dead-letter entry "+entry.ID)
	return entry.ID
}

// backoff is the wait before retry number attempt (1 for the first retry).
func backoff(p *chain.Retry, attempt int) time.Duration {
	base := time.Duration(p.BackoffMS) * time.Millisecond
	var d time.Duration
	switch p.Strategy {
	case chain.BackoffFixed:
		d = base
	case chain.BackoffLinear:
		d = base * time.Duration(attempt)
	default:
		d = base << min(attempt-1, 30)
	}
	if limit := time.Duration(p.MaxBackoffMS) * time.Millisecond; limit > 0 && d > limit {
		d = limit
	}
	if p.JitterMS > 0 {
		d += time.Duration(rand.IntN(p.JitterMS+1)) * time.Millisecond
	}
	return d
}
