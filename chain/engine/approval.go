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
	"github.com/chaingate/gateway/internal/jsonx"
)

// An approval step parks its run until a person answers. The answer is
// claimed in the store under the step's waiting (run, step, when it
// started waiting) before anything else happens, so the first answer wins
// on every gateway sharing the store, a second one is refused naming the
// first, and an answer given while no gateway advances the run (after a
// crash, during a takeover) is found when one does. The run's own runner
// reads the claim when told, and every approvalPoll otherwise.

// approvalPoll is how often a waiting approval step reads the store for an
// answer given through another gateway.
const approvalPoll = 2 * time.Second

// decisionTTL keeps an answer well past any wait.
const decisionTTL = 400 * 24 * time.Hour

// Decision is the answer to an approval step, as its body holds it.
type Decision struct {
	Decision string    `json:"decision"`
	By       string    `json:"by"`
	Comment  string    `json:"comment,omitempty"`
	At       time.Time `json:"at"`
	TimedOut bool      `json:"timed_out,omitempty"`
	Message  string    `json:"message,omitempty"`
}

// ErrNotWaiting is a signal to a step that is not an approval step waiting
// for its answer.
var ErrNotWaiting = errors.New("step is not waiting for a decision")

// AnsweredError is a signal to an approval step someone already answered.
type AnsweredError struct{ First Decision }

func (e *AnsweredError) Error() string {
	msg := fmt.Sprintf("already answered: %s by %s at %s", e.First.Decision, e.First.By, e.First.At.UTC().Format(time.RFC3339))
	if e.First.Comment != "" {
		msg += fmt.Sprintf(" (%q)", e.First.Comment)
	}
	return msg
}

// decisionKey names the claim of one wait of one approval step: a replay
// that runs the step again waits anew.
func decisionKey(runID string, rec *store.StepRecord) string {
	return "decision/" + runID + "/" + rec.Key + "/" + strconv.FormatInt(rec.StartedAt.UnixNano(), 10)
}

// Signal answers the approval step step of run runID, which must be
// waiting: decision is approve or reject, comment says why. Who answers is
// the context's actor. The answer is durable when Signal returns.
func (e *Engine) Signal(ctx context.Context, runID, step, decision, comment string) (*Decision, error) {
	what := fmt.Sprintf("answering step %q of run %s", step, runID)
	if decision != chain.DecisionApprove && decision != chain.DecisionReject {
		return nil, fmt.Errorf("%s: %w: decision %q is not approve or reject", what, ErrNotWaiting, decision)
	}
	run, err := e.store.Run(ctx, runID)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	var rec *store.StepRecord
	err = e.store.ForEachStep(ctx, runID, store.StepScan{Prefix: step, Exact: true}, func(r *store.StepRecord) error {
		rec = r
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if rec != nil && !rec.StartedAt.IsZero() {
		// Answered already, whether the run went on or not: say by whom.
		if bound, err := e.store.KeyRun(ctx, decisionKey(runID, rec)); err == nil && bound != "" {
			var first Decision
			if json.Unmarshal([]byte(bound), &first) == nil {
				return nil, fmt.Errorf("%s: %w", what, &AnsweredError{First: first})
			}
		}
	}
	if run.Status.Final() {
		return nil, fmt.Errorf("%s: %w (%s)", what, ErrFinished, run.Status)
	}
	def, _, err := e.definition(ctx, run.Chain, run.ChainHash)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	switch s := def.Step(step); {
	case s == nil:
		return nil, fmt.Errorf("%s: %w: chain %q has no step %q", what, store.ErrNotFound, run.Chain, step)
	case s.Kind != chain.KindApproval:
		return nil, fmt.Errorf("%s: %w: it is a %s step, not an approval step", what, ErrNotWaiting, s.Kind)
	case rec == nil || rec.Status != store.StepRunning:
		status := "not reached yet"
		if rec != nil {
			status = string(rec.Status)
		}
		return nil, fmt.Errorf("%s: %w: it is %s", what, ErrNotWaiting, status)
	}
	who := Actor(ctx)
	if who == "" {
		who = "unknown"
	}
	d := Decision{Decision: decision, By: who, Comment: comment, At: time.Now().UTC()}
	if first, err := e.claimDecision(ctx, decisionKey(runID, rec), d); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	} else if first != nil {
		return nil, fmt.Errorf("%s: %w", what, &AnsweredError{First: *first})
	}
	if r := e.active(runID); r != nil {
		// Its runner reads the answer now rather than at its next poll.
		select {
		case r.inbox <- outcome{do: func(*runner) {}}:
		case <-r.done:
		case <-ctx.Done():
		}
	}
	return &d, nil
}

// claimDecision binds d to key unless an answer is bound there already,
// which it returns.
func (e *Engine) claimDecision(ctx context.Context, key string, d Decision) (*Decision, error) {
	b, _ := jsonx.Marshal(d)
	bound, err := e.store.ClaimKey(ctx, key, string(b), decisionTTL)
	if err != nil || bound == "" {
		return nil, err
	}
	var first Decision
	if err := json.Unmarshal([]byte(bound), &first); err != nil {
		return nil, fmt.Errorf("reading the answer already given: %w", err)
	}
	return &first, nil
}

// progressApproval starts an approval step's wait, and ends it once an
// answer is claimed or its timeout has passed.
func (r *runner) progressApproval(now time.Time, q *seq, s *chain.Step, rec *store.StepRecord, sc *scope) ([]launch, bool) {
	switch rec.Status {
	case store.StepPending:
		if rec.NotBefore.After(now) {
			return nil, false
		}
		var msg string
		if s.Approval != nil && s.Approval.Message != nil {
			v, err := s.Approval.Message.Render(sc)
			if err != nil {
				r.finishStep(q, rec, store.StepFailed, &store.ErrorInfo{Message: fmt.Sprintf("rendering the message of step %q: %v", s.Name, err), Code: "template"})
				return nil, true
			}
			msg = fmt.Sprint(v)
		}
		rec.Status = store.StepRunning
		rec.Attempts = 1
		rec.StartedAt = now
		rec.NotBefore = time.Time{}
		if s.TimeoutSeconds > 0 {
			rec.Deadline = now.Add(time.Duration(s.TimeoutSeconds) * time.Second)
		}
		rec.Body, _ = jsonx.Marshal(map[string]string{"message": msg})
		r.put(rec)
		text := "waiting for approval"
		if msg != "" {
			text += ": " + msg
		}
		r.event(store.EventStepStarted, rec.Key, 1, text)
		r.addTimer(now.Add(approvalPoll), rec.Key)
		return nil, false
	case store.StepRunning:
		return nil, r.checkDecision(now, q, s, rec)
	}
	return nil, rec.Status.Final()
}

// checkDecision ends the wait when an answer is claimed, or claims the
// timeout's own answer once the deadline has passed; otherwise it polls
// again. It reports whether the step is final.
func (r *runner) checkDecision(now time.Time, q *seq, s *chain.Step, rec *store.StepRecord) bool {
	ctx := context.Background()
	key := decisionKey(r.run.ID, rec)
	bound, err := r.e.store.KeyRun(ctx, key)
	if err != nil {
		r.log.Warn("reading an approval's answer; trying again shortly", "step", rec.Key, "err", err)
		r.addTimer(now.Add(approvalPoll), rec.Key)
		return false
	}
	var d *Decision
	if bound != "" {
		d = &Decision{}
		if err := json.Unmarshal([]byte(bound), d); err != nil {
			r.finishStep(q, rec, store.StepFailed, &store.ErrorInfo{Message: fmt.Sprintf("reading the answer to step %q: %v", s.Name, err), Code: "decision"})
			return true
		}
	} else if !rec.Deadline.IsZero() && !now.Before(rec.Deadline) {
		onTimeout := "fail"
		if s.Approval != nil {
			onTimeout = s.Approval.OnTimeout
		}
		if onTimeout == "fail" {
			// A claim still, so a late answer is refused rather than lost.
			mine := Decision{Decision: "timed_out", By: "timeout", At: now.UTC(), TimedOut: true}
			first, err := r.e.claimDecision(ctx, key, mine)
			if err != nil {
				r.addTimer(now.Add(approvalPoll), rec.Key)
				return false
			}
			if first == nil {
				r.finishStep(q, rec, store.StepTimedOut, &store.ErrorInfo{
					Message: fmt.Sprintf("no answer to step %q within %ds", s.Name, s.TimeoutSeconds), Code: "timeout"})
				return true
			}
			d = first
		} else {
			mine := Decision{Decision: onTimeout, By: "timeout", At: now.UTC(), TimedOut: true}
			first, err := r.e.claimDecision(ctx, key, mine)
			if err != nil {
				r.addTimer(now.Add(approvalPoll), rec.Key)
				return false
			}
			d = &mine
			if first != nil {
				d = first
			}
		}
	}
	if d == nil {
		next := now.Add(approvalPoll)
		if !rec.Deadline.IsZero() && rec.Deadline.Before(next) {
			next = rec.Deadline
		}
		r.addTimer(next, rec.Key)
		return false
	}
	r.decide(q, s, rec, d)
	return true
}

// decide ends an approval step with its answer: approved, it succeeds;
// rejected, it fails unless on_reject = "continue".
func (r *runner) decide(q *seq, s *chain.Step, rec *store.StepRecord, d *Decision) {
	var prior map[string]string
	_ = json.Unmarshal(rec.Body, &prior)
	d.Message = prior["message"]
	body, _ := jsonx.Marshal(d)
	rec.Body = body
	verb := map[string]string{chain.DecisionApprove: "approved", chain.DecisionReject: "rejected"}[d.Decision]
	text := verb + " by " + d.By
	if d.TimedOut {
		text = verb + ": no answer within the step's timeout"
	}
	if d.Comment != "" {
		text += ": " + d.Comment
	}
	if d.Decision == chain.DecisionReject && (s.Approval == nil || s.Approval.OnReject != "continue") {
		rec.Status = store.StepFailed
		rec.Error = &store.ErrorInfo{Message: text, Code: "rejected"}
		rec.FinishedAt = time.Now().UTC()
		r.put(rec)
		value, _ := parseJSON(body)
		r.setStepVar(q, rec, value)
		r.event(store.EventStepFailed, rec.Key, rec.Attempts, text)
		return
	}
	rec.Status = store.StepSucceeded
	rec.Error = nil
	rec.FinishedAt = time.Now().UTC()
	r.put(rec)
	value, _ := parseJSON(body)
	r.setStepVar(q, rec, value)
	r.event(store.EventStepSucceeded, rec.Key, rec.Attempts, text)
}
