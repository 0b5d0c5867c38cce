// Package approvals serves approval steps while they wait: the calls
// their notify, remind and escalate make, and the Slack messages that ask
// their questions, answered with Slack's buttons and settled once the
// question ends, whichever gateway ends it.
//
// It is the gateway's own package, with no compatibility promise.
package approvals

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/gateway/events"
	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/templates"
)

// Approvals serves the approval steps of a gateway's runs.
type Approvals struct {
	*gateway.Gateway
}

// New returns the approvals of gw's runs.
func New(gw *gateway.Gateway) *Approvals { return &Approvals{Gateway: gw} }

// approvalResync is how often the loop reads every waiting run again.
const approvalResync = time.Minute

// Run makes the calls of waiting approval steps as they come
// due, and settles the Slack messages of questions that no longer stand,
// until ctx ends. hub, when the store is shared, brings other gateways'
// runs; it may be nil.
func (gw *Approvals) Run(ctx context.Context, hub *events.Hub) {
	l := &approvalLoop{gw: gw, ctx: ctx, clock: gw.Engine.Clock(), waits: map[string]*approvalWait{},
		resolving: map[string]bool{}, retry: map[string]*questionRetry{}, done: make(chan questionResolved), swept: make(chan []string, 1),
		settlers: make(chan struct{}, questionSettlers)}
	feed := gw.ApprovalFeed
	feed.On.Store(true)
	defer feed.On.Store(false)
	defer l.busy.Wait()

	var runs <-chan store.Event
	if _, shared := gw.Store.(store.RunFeed); shared && hub != nil {
		w := hub.WatchRuns()
		defer w.Close()
		runs, l.watch = w.C, w
	}
	timer := l.clock.NewTimer()
	defer timer.Stop()
	// A clock that moves on when nothing is under way counts the unit a
	// fired timer begins until the loop has handled it.
	act, _ := l.clock.(engine.Activity)
	resync := time.NewTicker(approvalResync)
	defer resync.Stop()

	l.resync()
	l.sweep()
	for {
		if at, ok := l.next(); ok {
			timer.Set(at)
		} else {
			timer.Stop()
		}
		select {
		case <-ctx.Done():
			return
		case id := <-feed.C:
			l.look(id)
		case ev := <-runs:
			if ev.RunID != "" && feed.Concerns(ev) {
				l.look(ev.RunID)
			}
			if l.watch.Lost() {
				feed.Missed.Store(true)
			}
		case <-timer.C():
			l.fire()
			if act != nil {
				act.End()
			}
		case r := <-l.done:
			l.resolved(r)
		case ids := <-l.swept:
			for _, id := range ids {
				l.resolve(id)
			}
		case <-resync.C:
			l.resync()
			// What was missed is looked for at this pace, so that a
			// gateway behind on its news does not fall further behind.
			if feed.Missed.Swap(false) {
				l.sweep()
			}
		}
	}
}

// approvalLoop is Run's state; only its goroutine touches
// it.
type approvalLoop struct {
	gw    *Approvals
	ctx   context.Context
	clock engine.Clock
	watch *events.RunWatch
	// waits are the approval steps waiting, by run/step.
	waits map[string]*approvalWait
	// resolving are the questions being settled, by run/step; true has
	// the loop settle one again when done, for news heard meanwhile.
	resolving map[string]bool
	retry     map[string]*questionRetry
	done      chan questionResolved
	swept     chan []string
	// settlers holds a place for each settlement under way.
	settlers chan struct{}
	// busy counts the calls and settlements under way.
	busy sync.WaitGroup
}

// approvalWait is one wait of an approval step.
type approvalWait struct {
	run, step string
	asked     time.Time
	a         *chain.Approval
	// reminded is the latest notification made or claimed: 0 is the one
	// at ask, -1 none yet.
	reminded  int
	escalated bool
	// due is when its next call is; zero when none is left.
	due time.Time
}

// schedule sets when the wait's next call is due.
func (w *approvalWait) schedule() {
	w.due = time.Time{}
	if n := w.a.Notify; n != nil {
		switch {
		case w.reminded < 0:
			w.due = w.asked
		case n.Every > 0:
			w.due = w.asked.Add(time.Duration(w.reminded+1) * n.Every)
		}
	}
	if e := w.a.Escalate; e != nil && !w.escalated {
		if at := w.asked.Add(e.After); w.due.IsZero() || at.Before(w.due) {
			w.due = at
		}
	}
}

// questionRetry is when to try settling a question's messages again
// (zero while a try is under way), and how long the last wait was.
type questionRetry struct {
	at   time.Time
	wait time.Duration
}

// Settling a question's messages again after a failure waits from
// questionRetryMin, doubling up to questionRetryMax.
const (
	questionRetryMin = 15 * time.Second
	questionRetryMax = 10 * time.Minute
)

// questionSettlers bounds how many questions are settled at once: a
// gateway that starts may find many.
const questionSettlers = 8

type questionResolved struct {
	id  string
	err error
}

// next is the earliest time the loop has something to do.
func (l *approvalLoop) next() (time.Time, bool) {
	var at time.Time
	for _, w := range l.waits {
		if !w.due.IsZero() && (at.IsZero() || w.due.Before(at)) {
			at = w.due
		}
	}
	for _, r := range l.retry {
		if !r.at.IsZero() && (at.IsZero() || r.at.Before(at)) {
			at = r.at
		}
	}
	return at, !at.IsZero()
}

// resync looks at every waiting run, and again at the runs of the waits
// it knew that no longer wait. It reads the index of unfinished runs and
// their headers only, never the runs that ended: over a store of a million
// runs with none waiting, it reads an empty index.
func (l *approvalLoop) resync() {
	waiting := map[string]bool{}
	ids, err := l.gw.Store.UnfinishedRuns(l.ctx)
	if err != nil {
		if l.ctx.Err() == nil {
			l.gw.Log.Warn("listing unfinished runs for their approval steps' calls", "err", err)
		}
		return
	}
	for _, id := range ids {
		run, err := l.gw.Store.RunHeader(l.ctx, id)
		if err != nil || run.Status != store.RunWaiting {
			continue
		}
		waiting[run.ID] = true
		l.lookRun(run)
	}
	gone := map[string]bool{}
	for _, w := range l.waits {
		if !waiting[w.run] {
			gone[w.run] = true
		}
	}
	for id := range gone {
		l.look(id)
	}
}

// look reads a run's approval steps again.
func (l *approvalLoop) look(id string) {
	run, err := l.gw.Store.RunHeader(l.ctx, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		// Removed: its waits are over, and what asked them says so.
		for key, w := range l.waits {
			if w.run == id {
				delete(l.waits, key)
				l.resolve(key)
			}
		}
	case err != nil:
		if l.ctx.Err() == nil {
			l.gw.Log.Warn("reading a run for its approval steps; the next look finds it", "run", id, "err", err)
		}
	default:
		l.lookRun(run)
	}
}

// lookRun follows the waits of run's approval steps, forgets those that
// ended, and has the questions of those that ended settled.
func (l *approvalLoop) lookRun(run *store.Run) {
	def, err := l.gw.Engine.Definition(l.ctx, run.Chain, run.ChainHash)
	if err != nil {
		l.gw.Log.Warn("reading a run's definition for its approval steps; the next look finds it", "run", run.ID, "err", err)
		return
	}
	recs := map[string]*store.StepRecord{}
	if !run.Status.Final() {
		err = l.gw.Store.ForEachStep(l.ctx, run.ID, store.StepScan{SkipItems: true}, func(rec *store.StepRecord) error {
			if s := def.Step(rec.Name); s != nil && s.Kind == chain.KindApproval && rec.Key == rec.Name {
				recs[rec.Key] = rec
			}
			return nil
		})
		if err != nil {
			l.gw.Log.Warn("reading a run's steps for its approval steps; the next look finds them", "run", run.ID, "err", err)
			return
		}
	}
	for _, s := range def.Steps {
		if s.Kind != chain.KindApproval {
			continue
		}
		key := run.ID + "/" + s.Name
		rec := recs[s.Name]
		if rec != nil && rec.Status == store.StepRunning {
			l.follow(key, run.ID, rec, s.Approval)
			continue
		}
		delete(l.waits, key)
		if run.Status.Final() || (rec != nil && rec.Status.Final()) {
			l.resolve(key)
		}
	}
}

// follow notes the wait rec, a new one or the one known already.
func (l *approvalLoop) follow(key, runID string, rec *store.StepRecord, a *chain.Approval) {
	if w := l.waits[key]; w != nil && w.asked.Equal(rec.StartedAt) {
		return
	}
	w := &approvalWait{run: runID, step: rec.Key, asked: rec.StartedAt, a: a, reminded: -1}
	w.schedule()
	l.waits[key] = w
}

// fire makes the calls that are due: the notification however late, and
// of the reminders due, only the latest.
func (l *approvalLoop) fire() {
	now := l.clock.Now()
	for _, w := range l.waits {
		if w.due.IsZero() || w.due.After(now) {
			continue
		}
		if n := w.a.Notify; n != nil {
			if w.reminded < 0 {
				w.reminded = 0
				l.call(w, n, "notify", 0)
			}
			if n.Every > 0 && now.After(w.asked) {
				if k := int(now.Sub(w.asked) / n.Every); k > w.reminded {
					w.reminded = k
					l.call(w, n, "notify", k)
				}
			}
		}
		if e := w.a.Escalate; e != nil && !w.escalated && !now.Before(w.asked.Add(e.After)) {
			w.escalated = true
			l.call(w, e, "escalate", 0)
		}
		w.schedule()
	}
	for id, r := range l.retry {
		if !r.at.IsZero() && !r.at.After(now) {
			r.at = time.Time{} // until this try ends
			l.resolve(id)
		}
	}
}

// call makes one call of a wait, if the step still waits as it did.
func (l *approvalLoop) call(w *approvalWait, c *chain.ApprovalCall, what string, n int) {
	ctx, gw := l.ctx, l.gw
	l.busy.Go(func() {
		run, err := gw.Store.RunHeader(ctx, w.run)
		if err != nil {
			gw.Log.Warn("reading a waiting run for its approval step's call", "run", w.run, "step", w.step, "err", err)
			return
		}
		var rec *store.StepRecord
		err = gw.Store.ForEachStep(ctx, w.run, store.StepScan{Prefix: w.step, Exact: true}, func(r *store.StepRecord) error {
			rec = r
			return nil
		})
		if err != nil {
			gw.Log.Warn("reading a waiting approval step for its call", "run", w.run, "step", w.step, "err", err)
			return
		}
		if run.Status.Final() || rec == nil || rec.Status != store.StepRunning || !rec.StartedAt.Equal(w.asked) {
			return // answered meanwhile: the loop hears of it
		}
		gw.approvalCall(ctx, run, rec, c, what, n)
	})
}

// resolve has the messages that asked question id (run/step) settled,
// unless that is under way already.
func (l *approvalLoop) resolve(id string) {
	if _, busy := l.resolving[id]; busy {
		l.resolving[id] = true
		return
	}
	l.resolving[id] = false
	ctx, gw := l.ctx, l.gw
	l.busy.Go(func() {
		select {
		case l.settlers <- struct{}{}:
		case <-ctx.Done():
			return
		}
		err := gw.settleQuestion(ctx, id)
		<-l.settlers
		select {
		case l.done <- questionResolved{id, err}:
		case <-ctx.Done():
		}
	})
}

// resolved takes the end of a settlement.
func (l *approvalLoop) resolved(r questionResolved) {
	again := l.resolving[r.id]
	delete(l.resolving, r.id)
	switch {
	case again || errors.Is(r.err, gateway.ErrQuestionChanged):
		l.resolve(r.id)
	case r.err != nil:
		prev := l.retry[r.id]
		wait := questionRetryMin
		if prev != nil {
			wait = min(2*prev.wait, questionRetryMax)
		}
		l.retry[r.id] = &questionRetry{at: l.clock.Now().Add(wait), wait: wait}
		if l.ctx.Err() == nil {
			l.gw.Log.Warn("settling the Slack messages of an approval step's question; trying again later", "question", r.id, "in", wait, "err", r.err)
		}
	default:
		delete(l.retry, r.id)
	}
}

// sweep finds the questions whose messages are kept in the store, for
// those that ended while no loop looked: the loop settles each that no
// longer stands. The listing may take a while, so it is made aside.
func (l *approvalLoop) sweep() {
	ctx, gw := l.ctx, l.gw
	l.busy.Go(func() {
		var ids []string
		err := gw.Store.ForEachKey(ctx, gateway.QuestionPrefix, func(key, _ string) error {
			ids = append(ids, strings.TrimPrefix(key, gateway.QuestionPrefix))
			return nil
		})
		if err != nil {
			if ctx.Err() == nil {
				gw.Log.Warn("listing the Slack messages of approval steps' questions", "err", err)
			}
			return
		}
		select {
		case l.swept <- ids:
		case <-ctx.Done():
		}
	})
}

// approvalCall makes one call of an approval step's wait, unless a gateway
// has claimed it already.
func (gw *Approvals) approvalCall(ctx context.Context, run *store.Run, rec *store.StepRecord, c *chain.ApprovalCall, what string, n int) {
	key := "approval-call/" + run.ID + "/" + rec.Key + "/" + strconv.FormatInt(rec.StartedAt.UnixNano(), 10) + "/" + what + "/" + strconv.Itoa(n)
	// The notification and the escalation are claimed for as long as a
	// wait may last; a reminder only until well past the next one, after
	// which no gateway makes it, so that a wait reminding every second
	// does not leave a key a second in the store.
	ttl := 400 * 24 * time.Hour
	if what == "notify" && n > 0 {
		ttl = 2*c.Every + time.Hour
	}
	// A value of its own: a claim with the value bound already succeeds.
	bound, err := gw.Store.ClaimKey(ctx, key, gw.Engine.Owner()+"/"+store.NewID(), ttl)
	if err != nil || bound != "" {
		if err != nil {
			gw.Log.Warn("claiming an approval step's call", "run", run.ID, "step", rec.Key, "call", what, "err", err)
		}
		return
	}
	label := what
	switch {
	case what == "escalate":
		label = "escalated"
	case n == 0:
		label = "notified"
	default:
		label = fmt.Sprintf("reminded (%d)", n)
	}
	msg := fmt.Sprintf("approval step %q: %s through %s", rec.Key, label, c.Provider)
	if err := gw.callApproval(ctx, run, rec, c, key, n); err != nil {
		msg = fmt.Sprintf("approval step %q: could not be %s through %s: %v", rec.Key, label, c.Provider, err)
		gw.Log.Warn("an approval step's call failed", "run", run.ID, "step", rec.Key, "call", label, "provider", c.Provider, "err", err)
	} else {
		gw.Log.Info("approval call made", "run", run.ID, "step", rec.Key, "call", label, "provider", c.Provider)
	}
	if err := gw.Engine.Note(ctx, run.ID, gw.Redactor.String(msg), nil); err != nil {
		gw.Log.Warn("noting an approval step's call on its run", "run", run.ID, "err", err)
	}
}

// callApproval renders and makes the call; its dedup key is the claim's,
// so a provider that dedupes sends it once even if it is made again.
func (gw *Approvals) callApproval(ctx context.Context, run *store.Run, rec *store.StepRecord, c *chain.ApprovalCall, key string, n int) error {
	cfg := gw.Engine.Config()
	p := cfg.Providers[c.Provider]
	if p == nil {
		return fmt.Errorf("no provider %q in the config", c.Provider)
	}
	full, err := gw.Store.Run(ctx, run.ID)
	if err != nil {
		return err
	}
	var message map[string]any
	_ = json.Unmarshal(rec.Body, &message)
	var payload any
	_ = json.Unmarshal(full.Origin.Payload, &payload)
	url := cfg.Gateway.RunURL(run.ID)
	stepURL := ""
	if url != "" {
		stepURL = url + "/steps/" + rec.Key
	}
	approval := map[string]any{"step": rec.Key, "message": message["message"], "asked_at": rec.StartedAt.UTC().Format(time.RFC3339), "url": stepURL, "reminder": int64(n)}
	if !rec.Deadline.IsZero() {
		approval["deadline"] = rec.Deadline.UTC().Format(time.RFC3339)
	}
	labels := map[string]any{}
	for k, v := range run.Labels {
		labels[k] = v
	}
	scope := templates.MapScope{
		"approval": approval,
		"origin":   map[string]any{"payload": payload},
		"run":      map[string]any{"id": run.ID, "chain": run.Chain, "url": url, "labels": labels},
		"secrets":  gw.secretScope(),
	}
	body := []byte(`{}`)
	if c.Payload != nil {
		if body, err = c.Payload.AppendJSON(nil, scope); err != nil {
			return fmt.Errorf("rendering the payload: %w", err)
		}
	}
	return gw.callProvider(ctx, p, providers.Request{ActionType: c.ActionType, Payload: body, DedupKey: key, Attempt: 1, RunID: run.ID, Step: rec.Key})
}

// callProvider makes a call of p outside any step, as the approval loop
// does: with p's config filled in, bounded like a step's call by default,
// and a provider's error redacted.
func (gw *Approvals) callProvider(ctx context.Context, p *chain.Provider, req providers.Request) error {
	config := p.Config
	if p.ConfigTemplate != nil {
		var err error
		if config, err = p.ConfigTemplate.AppendJSON(nil, templates.MapScope{"secrets": gw.secretScope()}); err != nil {
			return fmt.Errorf("rendering the provider's config: %w", err)
		}
	}
	prov, err := gw.Providers.Resolve(p)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, chain.DefaultProviderTimeoutSeconds*time.Second)
	defer cancel()
	req.Config = config
	req.Deadline, _ = cctx.Deadline()
	_, err = prov.Execute(cctx, req)
	var pe *providers.Error
	if errors.As(err, &pe) {
		return &providers.Error{Message: gw.Redactor.String(pe.Error()), Retryable: pe.Retryable, RetryAfter: pe.RetryAfter}
	}
	return err
}

// secretScope is the secrets as templates read them.
func (gw *Approvals) secretScope() map[string]any {
	out := make(map[string]any, len(gw.SecretValues()))
	for k, v := range gw.SecretValues() {
		out[k] = v
	}
	return out
}
