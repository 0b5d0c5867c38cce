package engine

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/internal/jsonx"
)

// Failure routes. A top-level step's failure, after its retries, may be
// caught and routed to a later step (settle asks failureRoute); a run that
// would end goes through its chain's handler phases first (finishRun asks
// enterHandlers): on_failure when it failed or timed out, then finally
// whatever the outcome. Each phase is its handler list walked as the run's
// top-level list (r.top), its steps ordinary durable steps, and the
// phase, the status the run will end with (Run.Ending) and what failed
// (Run.Failure) are in the run's record, so a gateway that resumes the run
// carries on in the phase, never calling a recorded step again. A handler
// step's failure is parked in the dead-letter queue and the run moves on
// to its next phase: it never enters on_failure again.

// failureClass is the class a catch entry names for a failed step.
func failureClass(rec *store.StepRecord) string {
	code := ""
	if rec.Error != nil {
		code = rec.Error.Code
	}
	switch {
	case rec.Status == store.StepTimedOut || code == "timeout":
		return chain.ClassTimeout
	case rec.Status == store.StepCancelled || code == "cancelled":
		return chain.ClassCancelled
	case rec.Error != nil && rec.Error.Retryable:
		return chain.ClassExhausted
	}
	return chain.ClassPermanent
}

// failureOf is what failed, as a failed step's record says.
func failureOf(rec *store.StepRecord) *store.Failure {
	f := &store.Failure{Step: rec.Key, Class: failureClass(rec), Message: failureText(rec), Attempts: rec.Attempts}
	if rec.Error != nil {
		f.Code = rec.Error.Code
	}
	return f
}

// errorValueOf is a step's error as templates read it: the error with its
// failure class.
func errorValueOf(rec *store.StepRecord) any {
	v := errorValue(rec.Error)
	if m, ok := v.(map[string]any); ok && rec.Status.Final() && rec.Status != store.StepSucceeded {
		m["class"] = failureClass(rec)
	}
	return v
}

// failureValue is what the failure root reads: empty strings while
// nothing has failed, so a catch target reached without a failure, or a
// finally step of a run that succeeded, reads "".
func failureValue(run *store.Run) map[string]any {
	v := map[string]any{"step": "", "class": "", "code": "", "message": "", "attempts": int64(0), "route": "", "ending": string(run.Ending)}
	if f := run.Failure; f != nil {
		v["step"], v["class"], v["code"], v["message"] = f.Step, f.Class, f.Code, f.Message
		v["attempts"], v["route"] = int64(f.Attempts), f.Route
	}
	return v
}

// setFailure records what failed; the run's record is copied for each
// batch, so a Failure is replaced, never changed in place.
func (r *runner) setFailure(f *store.Failure) {
	r.run.Failure = f
	r.vars.failure = failureValue(r.run)
}

// updateFailure changes a copy of the run's Failure.
func (r *runner) updateFailure(fn func(*store.Failure)) {
	f := r.run.Failure.Clone()
	if f == nil {
		f = &store.Failure{}
	}
	fn(f)
	r.setFailure(f)
}

// failureRoute handles a failed step of the run's top-level list before its
// on_failure policy does: a catch entry that matches routes it, and a
// handler step's failure is parked and ends its phase. handled says the
// step is dealt with, and goOn whether its list goes on (settle's answer).
func (r *runner) failureRoute(q *seq, s *chain.Step, rec *store.StepRecord) (handled, goOn bool) {
	if q != r.top || r.onWorker() {
		return false, false
	}
	if r.run.Phase != "" {
		if s.OnFailure == chain.OnFailureSkip {
			return false, false
		}
		r.parkHandlerFailure(rec, failureText(rec))
		// The phase ends here; advanceHandlers moves on to the next one.
		q.cursor = ""
		return true, false
	}
	f := failureOf(rec)
	for _, c := range s.Catch {
		if !c.Matches(f.Class, f.Code) {
			continue
		}
		f.Route, f.Recovered = c.Target, c.Recover
		what := "the run ends failed once the route has run"
		if c.Recover {
			what = "the route recovers the run"
		} else {
			r.run.Ending = store.RunFailed
		}
		r.setFailure(f)
		r.event(store.EventFailureRouted, rec.Key, rec.Attempts, fmt.Sprintf("%s failure (%s) routed to step %q; %s", f.Class, f.Message, c.Target, what))
		r.eventData(map[string]any{"class": f.Class, "code": f.Code, "target": c.Target, "recovered": c.Recover})
		q.cursor = c.Target
		return true, true
	}
	if s.OnFailure != chain.OnFailureSkip {
		r.setFailure(f)
	}
	return false, false
}

// parkHandlerFailure parks a failed handler step in the dead-letter queue
// and notes it in the run's Failure.
func (r *runner) parkHandlerFailure(rec *store.StepRecord, why string) {
	phase := r.run.Phase
	id := r.deadLetter(rec)
	r.dlq[len(r.dlq)-1].Handler = phase
	r.updateFailure(func(f *store.Failure) {
		f.HandlerFailures = append(f.HandlerFailures, phase+":"+rec.Key)
	})
	r.event(store.EventNote, rec.Key, rec.Attempts, fmt.Sprintf("%s step %q failed (%s); parked as dead-letter entry %s, and the run moves on", phase, rec.Key, why, id))
}

// enterHandlers is asked by finishRun before a run ends: it reports true
// when the run goes on in a handler phase instead (or has ended another
// way), false when finishRun ends it as asked.
func (r *runner) enterHandlers(status store.RunStatus, errInfo *store.ErrorInfo) bool {
	if r.onWorker() || r.ending || r.def == nil {
		return false
	}
	if r.run.Phase != "" {
		return r.stopInHandlers(status, errInfo)
	}
	converted := false
	if status == store.RunSucceeded && r.run.Ending != "" && r.run.Ending != store.RunSucceeded {
		// A caught failure that its route does not recover: the run ends
		// failed now that the route has run.
		status, errInfo, converted = r.run.Ending, r.caughtError(), true
	}
	next := ""
	switch status {
	case store.RunSucceeded:
		if len(r.def.Finally) > 0 {
			next = chain.PhaseFinally
		}
	case store.RunCancelled:
		if len(r.def.Finally) > 0 && r.def.FinallyOnCancel {
			next = chain.PhaseFinally
		}
	default:
		switch {
		case len(r.def.OnFailure) > 0:
			next = chain.PhaseOnFailure
		case len(r.def.Finally) > 0:
			next = chain.PhaseFinally
		}
	}
	if status != store.RunSucceeded {
		r.run.Body, r.run.BodyStep = nil, ""
		if r.run.Failure == nil && next != "" {
			// The run failed outside a step (its timeout), or was
			// cancelled: its handlers read that.
			f := &store.Failure{Step: r.run.Cursor, Class: chain.ClassPermanent}
			if errInfo != nil {
				f.Message, f.Code = errInfo.Message, errInfo.Code
			}
			switch status {
			case store.RunTimedOut:
				f.Class = chain.ClassTimeout
			case store.RunCancelled:
				f.Class = chain.ClassCancelled
			}
			r.setFailure(f)
		}
	}
	if next == "" {
		if converted {
			r.ending = true
			r.finishRun(status, errInfo)
			return true
		}
		return false
	}
	r.mainResult, r.mainResultKey = r.top.result, r.top.resultKey
	r.stopAll(status, errInfo)
	r.run.Ending = status
	r.run.Error = errInfo
	now := r.e.clock.Now().UTC()
	r.run.Deadline = now.Add(time.Duration(max(r.def.HandlersTimeoutSeconds, 1)) * time.Second)
	r.startPhase(next)
	return true
}

// caughtError is the run's error when a caught failure ends it.
func (r *runner) caughtError() *store.ErrorInfo {
	f := r.run.Failure
	if f == nil {
		return &store.ErrorInfo{Message: "a step failed", Code: "step_failed"}
	}
	return &store.ErrorInfo{Message: fmt.Sprintf("step %q failed: %s (caught, routed to step %q)", f.Step, f.Message, f.Route), Code: "step_failed"}
}

// stopInHandlers handles a run told to end while in a handler phase: a
// cancel moves on to finally (or is one the run is already handling), and
// anything else that ends the phase (a step's route that cannot be
// decided, a bug) moves on to the next phase.
func (r *runner) stopInHandlers(status store.RunStatus, errInfo *store.ErrorInfo) bool {
	phase := r.run.Phase
	msg := ""
	if errInfo != nil {
		msg = errInfo.Message
	}
	if status == store.RunCancelled {
		switch {
		case phase == chain.PhaseFinally && r.run.Ending == store.RunCancelled:
			// The cancel is being handled: a request another gateway left
			// is read again at each renewal. handlers_timeout_seconds
			// bounds the phase.
			return true
		case phase == chain.PhaseOnFailure && len(r.def.Finally) > 0 && r.def.FinallyOnCancel:
			r.stopAll(store.RunCancelled, errInfo)
			r.recordHandlers()
			r.run.Ending, r.run.Error = store.RunCancelled, errInfo
			r.startPhase(chain.PhaseFinally)
			return true
		}
		r.stopAll(store.RunCancelled, errInfo)
		r.recordHandlers()
		r.run.Phase = ""
		r.ending = true
		r.finishRun(store.RunCancelled, errInfo)
		return true
	}
	stepStatus := store.StepCancelled
	if status == store.RunTimedOut {
		stepStatus = store.StepTimedOut
	}
	if c := r.run.Cursor; c != "" {
		if rec := r.recs[c]; rec != nil {
			if !rec.Status.Final() {
				r.abandon(rec, stepStatus, msg)
			}
			r.parkHandlerFailure(rec, msg)
		}
	}
	r.stopAll(status, errInfo)
	r.nextPhase()
	return true
}

// stopAll ends what the run has under way, as finishRun does.
func (r *runner) stopAll(status store.RunStatus, errInfo *store.ErrorInfo) {
	msg := ""
	if errInfo != nil {
		msg = errInfo.Message
	}
	stepStatus := store.StepCancelled
	if status == store.RunTimedOut {
		stepStatus = store.StepTimedOut
	}
	for _, rec := range r.recs {
		if !rec.Status.Final() {
			r.abandon(rec, stepStatus, msg)
		}
	}
	for _, sp := range r.splits {
		sp.place.stop(r, sp, stepStatus)
	}
	clear(r.groups)
	clear(r.owner)
	clear(r.splits)
	if c := r.run.Cursor; c != "" && !slices.Contains(r.top.path, c) && (status == store.RunCancelled || status == store.RunTimedOut) {
		r.top.path = append(r.top.path, c)
		r.run.Path = r.top.path
	}
}

// startPhase starts walking a handler list.
func (r *runner) startPhase(phase string) {
	list := r.def.HandlerSteps(phase)
	r.run.Phase = phase
	r.top = &seq{steps: list, cursor: list[0].Name, path: r.top.path, vars: r.top.vars}
	r.run.Cursor = list[0].Name
	r.run.Path = r.top.path
	r.vars.failure = failureValue(r.run)
	r.event(store.EventHandlersStarted, "", 0, fmt.Sprintf("running the %s steps; the run ends %s after them", phase, r.run.Ending))
	r.eventData(map[string]any{"phase": phase, "ending": string(r.run.Ending)})
}

// advanceHandlers is advanceRun in a handler phase.
func (r *runner) advanceHandlers(now time.Time) []launch {
	var out []launch
	// A phase that ends hands over to the next in the same pass.
	for range 3 {
		list := r.def.HandlerSteps(r.run.Phase)
		if len(list) == 0 {
			// The definition the run resumed on has no such list.
			r.endRun()
			return out
		}
		if !sameList(r.top.steps, list) {
			// Resumed: the runner was built on the chain's own steps.
			r.top.steps = list
		}
		if !r.run.Deadline.IsZero() && !now.Before(r.run.Deadline) {
			r.handlersTimedOut()
			return out
		}
		for _, key := range r.dueTimers(now) {
			r.timerDue(key, now)
		}
		top := r.top
		ls, done := r.advanceSeq(now, top)
		out = append(out, ls...)
		r.run.Path = top.path
		if r.run.Status.Final() || r.top != top {
			return out
		}
		if !done {
			r.run.Cursor = top.cursor
			return out
		}
		r.nextPhase()
		if r.run.Status.Final() {
			return out
		}
	}
	return out
}

// recordHandlers notes in the run's Failure the steps of the current
// handler phase that ran.
func (r *runner) recordHandlers() {
	phase := r.run.Phase
	if r.run.Failure == nil || phase == "" {
		return
	}
	var ran []string
	for _, s := range r.def.HandlerSteps(phase) {
		if rec := r.recs[s.Name]; rec != nil && slices.Contains(r.top.path, s.Name) && !(rec.Status == store.StepSkipped && rec.Attempts == 0) {
			ran = append(ran, phase+":"+s.Name)
		}
	}
	if len(ran) > 0 {
		r.updateFailure(func(f *store.Failure) { f.Handlers = append(f.Handlers, ran...) })
	}
}

// nextPhase ends the current handler phase: finally follows on_failure,
// and the run ends after finally.
func (r *runner) nextPhase() {
	r.recordHandlers()
	if r.run.Phase == chain.PhaseOnFailure && len(r.def.Finally) > 0 {
		r.startPhase(chain.PhaseFinally)
		return
	}
	r.endRun()
}

// endRun ends a run whose handlers are done, with the status it was
// ending with.
func (r *runner) endRun() {
	status := r.run.Ending
	if status == "" {
		status = store.RunSucceeded
	}
	errInfo := r.run.Error
	r.run.Phase = ""
	r.top.result, r.top.resultKey = r.mainResult, r.mainResultKey
	if r.top.result == nil && status == store.RunSucceeded {
		r.top.result = r.run.Body
	}
	r.ending = true
	r.finishRun(status, errInfo)
}

// handlersTimedOut ends a run whose handlers ran past
// handlers_timeout_seconds: the step under way is parked, and the run ends
// as it was ending.
func (r *runner) handlersTimedOut() {
	msg := fmt.Sprintf("the %s steps of chain %q ran past handlers_timeout_seconds (%ds)", r.run.Phase, r.def.Name, r.def.HandlersTimeoutSeconds)
	if c := r.run.Cursor; c != "" {
		if rec := r.recs[c]; rec != nil {
			if !rec.Status.Final() {
				r.abandon(rec, store.StepTimedOut, msg)
			}
			r.parkHandlerFailure(rec, msg)
		}
	}
	r.stopAll(store.RunTimedOut, &store.ErrorInfo{Message: msg, Code: "timeout"})
	r.recordHandlers()
	r.event(store.EventNote, "", 0, msg)
	r.endRun()
}

// replayStep is the top-level step a run that ended is replayed from: the
// step whose failure its record names, when it has one on its path (its
// handlers ran after it), else the last step it took.
func replayStep(run *store.Run) string {
	if f := run.Failure; f != nil && f.Step != "" && slices.Contains(run.Path, topStep(f.Step)) {
		return topStep(f.Step)
	}
	if len(run.Path) == 0 {
		return ""
	}
	return run.Path[len(run.Path)-1]
}

// reopenPhase readies a run being reopened at top-level step s (at its
// index on the path) for its handler phases: the records of the steps it
// took after s go, so they run again; reopened at one of its own steps,
// the run has not failed yet, and at a handler step, it carries on in
// that step's phase with a fresh handlers_timeout_seconds.
func (e *Engine) reopenPhase(ctx context.Context, def *chain.Chain, run *store.Run, s *chain.Step, at int, now time.Time, b *store.Batch) error {
	phase := def.Phase(s)
	later := map[string]bool{}
	for _, name := range run.Path[at+1:] {
		later[name] = true
	}
	if phase == "" {
		for _, l := range [][]*chain.Step{def.OnFailure, def.Finally} {
			for _, h := range l {
				later[h.Name] = true
			}
		}
	}
	delete(later, s.Name)
	if len(later) > 0 {
		gone := map[string]bool{}
		for _, k := range b.DeleteSteps {
			gone[k] = true
		}
		err := e.store.ForEachStep(ctx, run.ID, store.StepScan{}, func(rec *store.StepRecord) error {
			if later[topStep(rec.Key)] && !gone[rec.Key] {
				b.DeleteSteps = append(b.DeleteSteps, rec.Key)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	run.Phase = phase
	if phase == "" {
		run.Ending, run.Failure = "", nil
		return nil
	}
	run.Deadline = now.Add(time.Duration(max(def.HandlersTimeoutSeconds, 1)) * time.Second)
	if run.Failure != nil {
		f := run.Failure.Clone()
		f.Handlers, f.HandlerFailures = nil, nil
		run.Failure = f
	}
	return nil
}

// eventData sets the data of the event just appended.
func (r *runner) eventData(v map[string]any) {
	if b, err := jsonx.Marshal(v); err == nil && len(r.events) > 0 {
		r.events[len(r.events)-1].Data = b
	}
}
