package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
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
//
// The step's deadline, persisted in its record, is part of the claim: an
// answer is recorded only if the clock of the gateway recording it reads
// before the deadline just before the claim is written, and the timeout's
// own answer is claimed the same way once the deadline has passed, by the
// run's runner or by the first gateway refusing a late answer. Whichever
// claim lands first is the step's answer, so an answer racing the timeout
// cannot win alongside it, and once a late answer has been refused no
// other can win, whatever the clocks of the gateways still taking answers.

// approvalPoll is how often a waiting approval step reads the store for an
// answer given through another gateway.
const approvalPoll = 2 * time.Second

// decisionTTL keeps an answer well past any wait.
const decisionTTL = 400 * 24 * time.Hour

// Decision is the answer to an approval step, as its body holds it. Every
// field is there whoever answered, so that a template reading one after
// the step (<<steps.ask.body.timed_out>>) finds it on every path.
type Decision struct {
	Decision string    `json:"decision"`
	By       string    `json:"by"`
	Comment  string    `json:"comment"`
	At       time.Time `json:"at"`
	TimedOut bool      `json:"timed_out"`
	Message  string    `json:"message"`
}

// decisionTimedOut is the timeout's answer when on_timeout = "fail".
const decisionTimedOut = "timed_out"

// ErrNotWaiting is a signal to a step that is not an approval step waiting
// for its answer.
var ErrNotWaiting = errors.New("step is not waiting for a decision")

// LateError is an answer to an approval step refused because it came at
// or after the step's deadline: the step goes on as its on_timeout says.
type LateError struct {
	// At is when the answer came, by the clock of the gateway refusing it.
	At, Deadline time.Time
	OnTimeout    string
}

func (e *LateError) Error() string {
	if e.At.Before(e.Deadline) {
		// In time by this clock, but the timeout's answer, given by a
		// clock ahead of it or recorded first, stands.
		return fmt.Sprintf("too late: answered at %s, but the step's deadline, %s, was reached first; it goes on as on_timeout = %q says",
			e.At.UTC().Format(stampMillis), e.Deadline.UTC().Format(stampMillis), e.OnTimeout)
	}
	return fmt.Sprintf("too late: answered at %s, the step's deadline was %s; it goes on as on_timeout = %q says",
		e.At.UTC().Format(stampMillis), e.Deadline.UTC().Format(stampMillis), e.OnTimeout)
}

// stampMillis shows the times that decide whether an answer was late.
const stampMillis = "2006-01-02T15:04:05.000Z07:00"

// NotApproverError refuses an answer from someone an approval step does
// not take answers from: not among its approvers, or, with four eyes, who
// started the run.
type NotApproverError struct{ Why string }

func (e *NotApproverError) Error() string { return e.Why }

// mayAnswer checks who ctx says answers against a's approvers and four
// eyes. Who answers must be known for either to hold.
func mayAnswer(ctx context.Context, a *chain.Approval, run *store.Run) error {
	if a == nil || (len(a.Approvers) == 0 && !a.FourEyes) {
		return nil
	}
	id, ok := IdentityOf(ctx)
	if !ok || id.Name == "" {
		return &NotApproverError{Why: "this step takes answers only from people it can tell apart (approvers or four eyes), and who answers is not known"}
	}
	if a.FourEyes && run.Origin.Subject != "" && id.Name == run.Origin.Subject {
		return &NotApproverError{Why: fmt.Sprintf("four eyes: %s started this run, so another person must answer", id.Name)}
	}
	if len(a.Approvers) == 0 {
		return nil
	}
	for _, who := range a.Approvers {
		if g, isGroup := strings.CutPrefix(who, chain.GroupPrefix); isGroup && slices.Contains(id.Groups, g) || !isGroup && who == id.Name {
			return nil
		}
	}
	return &NotApproverError{Why: fmt.Sprintf("%s is not among the step's approvers (%s)", id.Name, strings.Join(a.Approvers, ", "))}
}

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
// the context's actor. The answer is durable when Signal returns. An
// answer at or after the step's deadline, by this engine's clock, is
// refused with a *LateError, the step's timeout answering instead.
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
	def, _, err := e.definition(ctx, run.Chain, run.ChainHash)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	s := def.Step(step)
	who := Actor(ctx)
	if who == "" {
		who = "unknown"
	}
	refuse := func(first *Decision, at time.Time) error {
		if !first.TimedOut {
			return fmt.Errorf("%s: %w", what, &AnsweredError{First: *first})
		}
		e.log.Info("approval answer refused: the step's deadline had passed", "run", runID, "chain", run.Chain, "step", step,
			"decision", decision, "by", who, "deadline", rec.Deadline)
		return fmt.Errorf("%s: %w", what, &LateError{At: at, Deadline: rec.Deadline, OnTimeout: onTimeout(s)})
	}
	if rec != nil && !rec.StartedAt.IsZero() && s != nil && s.Kind == chain.KindApproval {
		// Answered already, whether the run went on or not: say by whom.
		if bound, err := e.store.KeyRun(ctx, decisionKey(runID, rec)); err == nil && bound != "" {
			var first Decision
			if json.Unmarshal([]byte(bound), &first) == nil {
				return nil, refuse(&first, e.now().UTC())
			}
		}
	}
	if run.Status.Final() {
		return nil, fmt.Errorf("%s: %w (%s)", what, ErrFinished, run.Status)
	}
	switch {
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
	if err := mayAnswer(ctx, s.Approval, run); err != nil {
		e.log.Warn("approval answer refused", "run", runID, "chain", run.Chain, "step", step, "decision", decision, "by", who, "why", err.Error())
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	d := Decision{Decision: decision, By: who, Comment: comment}
	first, err := e.claimAnswer(ctx, runID, rec, s, &d)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if r := e.active(runID); r != nil {
		// Its runner reads the answer now rather than at its next poll.
		r.give(outcome{do: func(*runner) {}}, ctx)
	}
	if first != nil {
		return nil, refuse(first, d.At)
	}
	// The answer as the step's body will hold it.
	d.Message = askedMessage(rec)
	return &d, nil
}

// askedMessage is the message an approval step waiting as rec asked.
func askedMessage(rec *store.StepRecord) string {
	var asked struct {
		Message string `json:"message"`
	}
	_ = json.Unmarshal(rec.Body, &asked)
	return asked.Message
}

// claimAnswer records d as the answer to the approval step s waiting as
// rec, unless its deadline has passed: the clock is read just before the
// claim, and a late answer claims the timeout's answer instead, so that
// no later answer can win either. It returns the answer that stands when
// it is not d.
func (e *Engine) claimAnswer(ctx context.Context, runID string, rec *store.StepRecord, s *chain.Step, d *Decision) (*Decision, error) {
	key := decisionKey(runID, rec)
	now := e.now().UTC()
	d.At = now
	if rec.Deadline.IsZero() || now.Before(rec.Deadline) {
		return e.claimDecision(ctx, key, *d)
	}
	timeout := timeoutDecision(s, now)
	first, err := e.claimDecision(ctx, key, timeout)
	if err != nil || first != nil {
		return first, err
	}
	return &timeout, nil
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

// onTimeout is what no answer before an approval step's deadline means.
func onTimeout(s *chain.Step) string {
	if s.Approval != nil && s.Approval.OnTimeout != "" {
		return s.Approval.OnTimeout
	}
	return "fail"
}

// timeoutDecision is the answer the timeout gives an approval step.
func timeoutDecision(s *chain.Step, now time.Time) Decision {
	decision := onTimeout(s)
	if decision == "fail" {
		decision = decisionTimedOut
	}
	return Decision{Decision: decision, By: "timeout", At: now.UTC(), TimedOut: true}
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
		r.asking(rec.Key, rec.StartedAt)
		text := "waiting for approval"
		if msg != "" {
			text += ": " + msg
		}
		r.event(store.EventStepStarted, rec.Key, 1, text)
		step, deadline := rec.Key, rec.Deadline
		r.whenDurable(func() {
			if deadline.IsZero() {
				r.log.Info("approval waiting", "step", step)
				return
			}
			r.log.Info("approval waiting", "step", step, "deadline", deadline)
		}, func() {})
		r.addTimer(now.Add(approvalPoll), rec.Key)
		return nil, false
	case store.StepRunning:
		r.asking(rec.Key, rec.StartedAt)
		return nil, r.checkDecision(now, q, s, rec)
	}
	return nil, rec.Status.Final()
}

// asking notes the approval step key as waiting in this run, for the
// waiting gauge; put forgets it once its record says otherwise.
func (r *runner) asking(key string, since time.Time) {
	if r.askingKey != key {
		r.askingKey = key
		r.waitingSince.Store(since.UnixNano())
	}
	if r.run.Status == store.RunRunning {
		// Written with the step's record, in the same batch; the event
		// tells those following every run (the console's Approvals page)
		// that a question is pending.
		r.run.Status = store.RunWaiting
		r.event(store.EventRunWaiting, key, 0, "")
	}
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
		// A claim still, so a late answer is refused rather than lost.
		mine := timeoutDecision(s, now)
		first, err := r.e.claimDecision(ctx, key, mine)
		if err != nil {
			r.log.Warn("claiming an approval's timeout; trying again shortly", "step", rec.Key, "err", err)
			r.addTimer(now.Add(approvalPoll), rec.Key)
			return false
		}
		d = &mine
		if first != nil {
			d = first
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
	// Logged and counted once applied durably, by the gateway applying it.
	if step, deadline, answer := rec.Key, rec.Deadline, *d; answer.TimedOut {
		r.whenDurable(func() {
			r.e.approvals.timedOut.Add(1)
			r.log.Info("approval timed out", "step", step, "deadline", deadline, "on_timeout", onTimeout(s))
		}, func() {})
	} else {
		r.whenDurable(func() {
			r.e.approvals.answered(answer.Decision)
			r.log.Info("approval answered", "step", step, "decision", answer.Decision, "by", answer.By)
		}, func() {})
	}
	if d.Decision == decisionTimedOut {
		r.finishStep(q, rec, store.StepTimedOut, &store.ErrorInfo{
			Message: fmt.Sprintf("no answer to step %q within %ds", s.Name, s.TimeoutSeconds), Code: "timeout"})
		return true
	}
	r.decide(q, s, rec, d)
	return true
}

// decide ends an approval step with its answer: approved, it succeeds;
// rejected, it fails unless on_reject = "continue".
func (r *runner) decide(q *seq, s *chain.Step, rec *store.StepRecord, d *Decision) {
	d.Message = askedMessage(rec)
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
		rec.FinishedAt = r.e.clock.Now().UTC()
		r.put(rec)
		value, _ := parseJSON(body)
		r.setStepVar(q, rec, value)
		r.event(store.EventStepFailed, rec.Key, rec.Attempts, text)
		return
	}
	rec.Status = store.StepSucceeded
	rec.Error = nil
	rec.FinishedAt = r.e.clock.Now().UTC()
	r.put(rec)
	value, _ := parseJSON(body)
	r.setStepVar(q, rec, value)
	r.event(store.EventStepSucceeded, rec.Key, rec.Attempts, text)
}

// approvalCounts counts how approval steps' waits ended in the runs an
// engine advanced.
type approvalCounts struct {
	approved, rejected, timedOut atomic.Uint64
}

func (c *approvalCounts) answered(decision string) {
	if decision == chain.DecisionApprove {
		c.approved.Add(1)
	} else {
		c.rejected.Add(1)
	}
}

// ApprovalStats are an engine's approval steps, for metrics.
type ApprovalStats struct {
	// Waiting is how many approval steps wait for an answer in the runs
	// the engine advances now; OldestSince is when the longest waiting of
	// them asked, zero when none waits.
	Waiting     int
	OldestSince time.Time
	// Approved and Rejected count the answers the engine applied to the
	// runs it advanced; TimedOut the waits it ended at their deadline.
	Approved, Rejected, TimedOut uint64
}

// Approvals returns the engine's approval statistics.
func (e *Engine) Approvals() ApprovalStats {
	st := ApprovalStats{
		Approved: e.approvals.approved.Load(),
		Rejected: e.approvals.rejected.Load(),
		TimedOut: e.approvals.timedOut.Load(),
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, r := range e.runners {
		if ns := r.waitingSince.Load(); ns != 0 {
			st.Waiting++
			if since := time.Unix(0, ns); st.OldestSince.IsZero() || since.Before(st.OldestSince) {
				st.OldestSince = since
			}
		}
	}
	return st
}
