package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/secrets"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/providers"
)

// runner advances one run. Only its own goroutine touches its state;
// provider calls report their end to inbox, from the goroutine that reads a
// plugin's answers or one of their own, and a committer goroutine writes
// batches to the store, so the run keeps deciding while a commit is under
// way.
type runner struct {
	e   *Engine
	def *chain.Chain
	cfg *chain.Config // the config def came from; its providers are called
	run *store.Run
	log *slog.Logger
	// endedAt is the step the run was at when it ended, for the log.
	endedAt string

	// lease is this engine's claim on the run; the keeper renews it.
	leaseMu sync.Mutex
	lease   store.Lease
	// released is set once the run gives its lease back, leaseLost when
	// the keeper finds another gateway took it.
	released, leaseLost bool
	// draining stops new calls: the run only records what is in flight.
	draining bool
	drainReq chan struct{}

	recs  map[string]*store.StepRecord
	vars  *vars
	top   *seq            // the run's own list of steps
	seqOf map[string]*seq // record key → the list it belongs to, when not top

	// The pending batch: what changed since the last hand-off to the
	// committer.
	dirty  map[string]*store.StepRecord
	order  []string
	events []store.Event
	dlq    []*store.DLQEntry

	// nextBatch numbers the pending batch.
	nextBatch  uint64
	committing *commit
	ackedSeq   uint64   // the last batch known durable
	waiting    []launch // calls whose intent is in a batch not yet durable
	toCommit   chan *commit
	acks       chan *commit
	// lingerUntil is when the pending batch goes to the sink at the
	// latest, while results of calls still out may join it.
	lingerUntil time.Time

	calls map[string]*inflight
	// childPolls holds when each waited-on sub-chain's record is read next.
	childPolls map[string]time.Time
	payloads   map[string][]byte // last rendered payload per step, for DLQ entries
	timers     timerHeap
	groups     map[string]*group // running parallel steps by key
	owner      map[string]*group // sub-step key → its group
	splits     map[string]*split // running splits by key
	// doneItems holds, on resume, the items each split had finished.
	doneItems map[string]*bitset

	// hooks are work to do once batches are durable.
	hooks []durableHook
	// role is what the runner advances: a run, or items handed to this
	// process as a worker; sink is where it commits.
	role runnerRole
	sink recordSink

	// creating is set while the run is advanced before its create commit
	// (advanceFirst): what would reach outside the run, a step's
	// concurrency slot held in the run's name or a split (whose items may
	// be handed to workers), waits for the run's first pass, so a create
	// the store refuses leaves nothing behind in another run's name.
	creating bool

	// askingKey is the approval step the run waits at, if any;
	// waitingSince tells the engine's statistics since when (Unix
	// nanoseconds, 0 when the run waits for no one).
	askingKey    string
	waitingSince atomic.Int64

	inbox chan outcome
	// acct holds the units of activity (Activity) of the messages given
	// to inbox and not yet taken; once the run's goroutine has exited they
	// are ended, and nothing more is given.
	acct struct {
		sync.Mutex
		held   int
		exited bool
	}
	cancelReq chan string // who cancels, as " by WHO"
	stopReq   chan struct{}
	done      chan struct{} // closed when the loop has returned
	err       error         // why the loop stopped early, if it did

	// slot is the run's concurrency key (queue.go); nil without one.
	// queueDirty says the run's record changed (its place in the queue,
	// its slot taken) with nothing else to commit it.
	slot       *runSlot
	queueDirty bool
	// stepSlots are the steps' concurrency keys held or asked for, by
	// step record key (stepslots.go).
	stepSlots map[string]*stepSlot
	// ending lets finishRun end the run without going through its
	// handler phases (handlers.go); mainResult is the result of the
	// run's own steps, kept while handlers run.
	ending        bool
	mainResult    json.RawMessage
	mainResultKey string
}

// runnerRole is what a runner advances: a run it owns (ownRun), or the
// items of a split handed to this process as a worker (workerItems).
type runnerRole interface {
	advance(r *runner, now time.Time) []launch
	// acked is told a batch is durable.
	acked(r *runner, c *commit)
}

// ownRun is the role of a run's own runner.
type ownRun struct{}

func (ownRun) advance(r *runner, now time.Time) []launch { return r.advanceRun(now) }
func (ownRun) acked(*runner, *commit)                    {}

// onWorker reports whether the runner runs items handed to this process.
func (r *runner) onWorker() bool {
	_, ok := r.role.(*workerItems)
	return ok
}

// recordSink is where a runner commits and reads back step records: the
// run's store, or a worker's sink.
type recordSink interface {
	Commit(ctx context.Context, b *store.Batch) error
	ForEachStep(ctx context.Context, prefix string, fn func(*store.StepRecord) error) error
}

// storeSink is a run's store, as its own runner writes to it.
type storeSink struct {
	st  store.Store
	run string
}

func (s storeSink) Commit(ctx context.Context, b *store.Batch) error { return s.st.Commit(ctx, b) }

func (s storeSink) ForEachStep(ctx context.Context, prefix string, fn func(*store.StepRecord) error) error {
	return s.st.ForEachStep(ctx, s.run, store.StepScan{Prefix: prefix}, fn)
}

// durableUpTo runs what waited for the batches up to seq.
func (r *runner) durableUpTo(seq uint64) {
	for _, sp := range r.splits {
		sp.place.durable(seq)
	}
	for len(r.hooks) > 0 && r.hooks[0].batch <= seq {
		r.hooks[0].then()
		r.hooks = r.hooks[1:]
	}
}

// detach lets go of what the splits hold elsewhere, as the runner stops.
func (r *runner) detach() {
	for _, sp := range r.splits {
		sp.place.detach()
	}
	for _, h := range r.hooks {
		h.abandon()
	}
	r.hooks = nil
}

// commit is one batch handed to the committer.
type commit struct {
	seq   uint64
	batch *store.Batch
	err   error
}

// inflight is a call the run has decided to make: from the moment its
// intent is put in a batch, not only once it has gone out. A step whose call
// waits for its intent to be committed is in flight all the same; were it
// not, the next pass over the run would take its running record for one a
// crash left unanswered and make the call a second time.
type inflight struct {
	attempt int
	// cancel is nil until the call goes out.
	cancel context.CancelFunc
}

// stop cancels the call if it has gone out.
func (c *inflight) stop() {
	if c.cancel != nil {
		c.cancel()
	}
}

// outcome is a finished provider call, or a finished sub-chain run.
type outcome struct {
	key     string
	attempt int
	body    json.RawMessage
	err     error
	// child is the sub-chain run that ended, for a sub_chain step.
	child *store.Run
	// news is what the workers of a distributed split did.
	news *FanoutNews
	// do is work handed to the runner's goroutine.
	do func(*runner)
	// timedOut is set when the call hit its own deadline.
	timedOut bool
	timeout  time.Duration
}

// launch is a provider call the loop starts once its intent is durable.
type launch struct {
	// batch is the batch the call waits for: the one that first writes
	// its intent (the step's record, or for a sub-step's first call its
	// group's record), or 0 when that is durable already: after a crash the
	// same attempt would go out again, so the call need not wait.
	batch    uint64
	key      string
	fl       *inflight   // the run's record of this call, set by track
	child    *childStart // set for a sub_chain step: the run to create
	provider string      // the configured provider's name, for metrics
	prov     providers.Provider
	req      providers.Request
	deadline time.Time
	timeout  time.Duration
}

func (e *Engine) newRunner(def *chain.Chain, cfg *chain.Config, run *store.Run, recs []*store.StepRecord) *runner {
	r := &runner{
		e:          e,
		def:        def,
		cfg:        cfg,
		run:        run,
		log:        e.log.With("run", run.ID, "chain", run.Chain),
		recs:       map[string]*store.StepRecord{},
		vars:       newVars(run, e.config().Gateway.RunURL(run.ID), e.secrets),
		seqOf:      map[string]*seq{},
		splits:     map[string]*split{},
		doneItems:  map[string]*bitset{},
		dirty:      map[string]*store.StepRecord{},
		nextBatch:  1,
		toCommit:   make(chan *commit, 1),
		acks:       make(chan *commit, 1),
		calls:      map[string]*inflight{},
		childPolls: map[string]time.Time{},
		payloads:   map[string][]byte{},
		groups:     map[string]*group{},
		owner:      map[string]*group{},
		inbox:      make(chan outcome, inboxSize(def)),
		cancelReq:  make(chan string, 1),
		drainReq:   make(chan struct{}),
		stopReq:    make(chan struct{}),
		done:       make(chan struct{}),
		role:       ownRun{},
		sink:       storeSink{st: e.store, run: run.ID},
	}
	r.top = &seq{steps: def.Steps, cursor: run.Cursor, path: append([]string(nil), run.Path...), vars: map[string]any{}}
	for _, rec := range recs {
		r.recs[rec.Key] = rec
		// Records inside split items belong to the items, which rebuild
		// their own namespaces as they replay.
		if rec.Status.Final() && !store.IsItemKey(rec.Key) {
			r.top.vars[rec.Name] = stepValue(rec, r.bodyValue(rec))
		}
		if rec.Status == store.StepPending && !rec.NotBefore.IsZero() {
			r.addTimer(rec.NotBefore, rec.Key)
		}
	}
	return r
}

// bodyValue is what a finished record's body reads as in templates; a
// split's results stay raw until something reads them.
func (r *runner) bodyValue(rec *store.StepRecord) any {
	if rec.Split == nil || rec.Status != store.StepSucceeded {
		return decodeJSON(rec.Body)
	}
	var b struct {
		Results                           json.RawMessage `json:"results"`
		Succeeded, Failed, Skipped, Total int64
	}
	if err := json.Unmarshal(rec.Body, &b); err != nil {
		return decodeJSON(rec.Body)
	}
	return map[string]any{"results": &lazyJSON{raw: b.Results}, "succeeded": b.Succeeded, "failed": b.Failed, "skipped": b.Skipped, "total": b.Total}
}

// drain asks the loop to start no new call and to return once the calls in
// flight are recorded.
func (r *runner) drain() {
	select {
	case <-r.drainReq:
	default:
		close(r.drainReq)
	}
}

func (r *runner) stop() {
	select {
	case <-r.stopReq:
	default:
		close(r.stopReq)
	}
	<-r.done
}

func (r *runner) loop() {
	defer close(r.done)
	defer r.exit()
	// The run is no longer this engine's, and its lease is back, before
	// anyone waiting on done acts on it (a replay right after Wait, say).
	defer r.e.forget(r)
	defer r.e.releaseLease(r)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.committer(ctx)
	defer close(r.toCommit)
	defer r.contain()
	timer := r.e.clock.NewTimer()
	defer timer.Stop()

	drainReq := r.drainReq
	defer r.detach()
	// What the create commit made durable (advanceFirst).
	r.durableUpTo(r.ackedSeq)
	r.startDurable(ctx)
	for {
		if !r.draining {
			for _, l := range r.advance(r.e.clock.Now()) {
				if l.batch == 0 {
					r.start(ctx, l)
				} else {
					r.waiting = append(r.waiting, l)
				}
			}
		}
		if c := r.handOff(ctx, r.e.clock.Now()); c != nil {
			if !r.acked(ctx, c) {
				return
			}
			continue
		}
		if r.committing == nil && (r.run.Status.Final() || (r.draining && !r.hasCalls())) {
			return
		}

		var wake <-chan time.Time
		at := r.nextWake()
		if !r.lingerUntil.IsZero() && (at.IsZero() || r.lingerUntil.Before(at)) {
			at = r.lingerUntil
		}
		if !at.IsZero() && !r.run.Status.Final() {
			timer.Set(at)
			wake = timer.C()
		}
		// Waiting, this goroutine holds no unit of activity; what wakes it
		// (a message, an ack, the timer) hands it the unit it carries.
		r.e.act.End()
		select {
		case c := <-r.acks:
			if !r.acked(ctx, c) {
				return
			}
		case o := <-r.inbox:
			r.took()
			r.receive(o)
			r.drainInbox()
		case <-wake:
		case who := <-r.cancelReq:
			r.finishRun(store.RunCancelled, &store.ErrorInfo{Message: "run cancelled" + who, Code: "cancelled"})
		case <-drainReq:
			r.e.act.Begin()
			r.draining = true
			// Their intent is written; they go out on resume.
			for _, l := range r.waiting {
				r.untrack(l)
			}
			r.waiting = nil
			drainReq = nil
		case <-r.stopReq:
			r.e.act.Begin()
			// The engine is closing, or the run was taken over: in-flight
			// calls are abandoned and will be dispatched again, with the
			// same dedup key, on resume. A commit under way is let finish.
			if r.committing != nil {
				<-r.acks
				r.e.act.End()
			}
			r.leaseMu.Lock()
			lost := r.leaseLost
			r.leaseMu.Unlock()
			if lost {
				r.log.Warn("lost the lease on the run: another gateway took it over and advances it now; stopping here", "step", r.run.Cursor, "err", store.ErrLeaseLost)
				return
			}
			r.flushResults()
			return
		}
		if wake != nil {
			timer.Stop()
		}
	}
}

// contain keeps a bug met while advancing one run from taking the gateway
// down: the run ends failed with what went wrong, rather than crash every
// gateway that resumes it.
func (r *runner) contain() {
	p := recover()
	if p == nil {
		return
	}
	if r.onWorker() {
		// Nothing is recorded: the items are delivered again, and parked as
		// poison if they keep hitting it.
		r.err = fmt.Errorf("running split items hit a bug: %v", p)
		r.log.Error("running split items hit a bug; leaving them to be delivered again", "panic", p, "stack", string(debug.Stack()))
		return
	}
	if r.committing != nil {
		<-r.acks
		r.e.act.End()
		r.committing = nil
	}
	if !r.failOnBug(p) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.flush(ctx); err != nil {
		r.log.Error("recording the run's failure", "err", err)
	}
}

// failOnBug ends the run failed with p, a bug met while advancing it, in
// the pending batch. It reports false when ending the run hit a bug too:
// the run then stays as last persisted.
func (r *runner) failOnBug(p any) (ended bool) {
	r.log.Error("advancing the run hit a bug; failing the run", "panic", p, "stack", string(debug.Stack()))
	r.ending = true
	defer func() {
		if p := recover(); p != nil {
			ended = false
			r.log.Error("recording the failure hit a bug too; the run stays as last persisted", "panic", p)
		}
	}()
	r.finishRun(store.RunFailed, &store.ErrorInfo{Message: fmt.Sprintf("the gateway hit a bug advancing this run (%v); its log has the details", p), Code: "internal"})
	return true
}

// advanceFirst advances a run about to be created, on the goroutine that
// starts it, so that the create commit carries the intents of its first
// calls and they go out one commit sooner. The calls wait in r.waiting
// until the run's loop starts them; nothing leaves the run before it is
// durable. A bug met here fails the run in its create commit, as the loop
// would; advanceFirst reports false if even that hit a bug.
func (r *runner) advanceFirst(now time.Time) (ok bool) {
	r.creating = true
	defer func() {
		r.creating = false
		if p := recover(); p != nil {
			ok = r.failOnBug(p)
		}
	}()
	r.waiting = r.advance(now)
	return true
}

// DefaultWorkLinger is how long a worker's results may wait for more to
// join them, while calls are still out and nothing waits on them.
const DefaultWorkLinger = time.Millisecond

// DefaultRunLinger is how long a run's results may wait for more to join
// them, while calls are still out and nothing waits on them: the calls of
// a parallel group end in waves, and a commit per result or two spends on
// page writes and fsyncs the CPU the next wave needs. A result that waits
// is called again after a crash, as one whose commit was under way is.
const DefaultRunLinger = 5 * time.Millisecond

// handOff gives the pending batch to the committer unless it is busy; what
// changes meanwhile goes into the next batch. Results wait a moment for
// those of the calls still out, unless something waits on them (see
// linger). On a worker every commit is a round trip to Redis and news for
// the split's owner; on a run, page writes and an fsync.
//
// When no call is out the run has nothing to do but wait for the batch, so
// it commits the batch itself and returns it, written: a run of single
// steps saves the two hand-offs between goroutines on every step.
func (r *runner) handOff(ctx context.Context, now time.Time) *commit {
	if !r.hasChanges() {
		r.lingerUntil = time.Time{}
		return nil
	}
	if r.committing != nil {
		return nil
	}
	if d := r.linger(); d > 0 {
		if r.lingerUntil.IsZero() {
			r.lingerUntil = now.Add(d)
		}
		if now.Before(r.lingerUntil) {
			return nil
		}
	}
	r.lingerUntil = time.Time{}
	if r.idle() {
		c := r.takeBatch()
		c.err = r.commitWithRetry(ctx, c.batch)
		return c
	}
	r.committing = r.takeBatch()
	r.e.act.Begin()
	r.toCommit <- r.committing
	return nil
}

// idle reports that nothing the run started is under way: no call has gone
// out, and no split is out on workers; what arrives meanwhile (an answer
// to an approval, a cancel) waits in the run's inbox the length of one
// commit. A worker's items always commit through the committer.
func (r *runner) idle() bool {
	if r.onWorker() || len(r.splits) > 0 {
		return false
	}
	for _, fl := range r.calls {
		if fl.cancel != nil {
			return false
		}
	}
	return true
}

// linger is how long the pending batch may wait for more results: none
// once no call is out, or while anything waits on the batch. A call waits
// for its intent, and a split for its decision, hand-off or join; the run's
// next step waits on its list's latest write, so a run of single steps
// never lingers.
func (r *runner) linger() time.Duration {
	if len(r.calls) == 0 || len(r.waiting) > 0 {
		return 0
	}
	if w, ok := r.role.(*workerItems); ok {
		return w.opts.Linger
	}
	if len(r.splits) > 0 || len(r.hooks) > 0 {
		return 0
	}
	return r.e.linger
}

// acked handles a finished commit: its events are published and the calls
// waiting on it start. It reports false when the commit failed and the run
// must stop.
func (r *runner) acked(ctx context.Context, c *commit) bool {
	r.committing = nil
	if c.err != nil {
		r.err = fmt.Errorf("run %s stopped: %w", r.run.ID, c.err)
		if errors.Is(c.err, store.ErrLeaseLost) {
			r.log.Warn("lost the lease on the run: another gateway took it over and advances it now; stopping here", "step", r.run.Cursor, "err", c.err)
		} else {
			r.log.Error("persisting run state failed; the run stays as last persisted and resumes on restart", "err", c.err)
		}
		return false
	}
	r.ackedSeq = c.seq
	r.logOutcomes(c.batch)
	r.published(c.batch.Events)
	r.durableUpTo(c.seq)
	r.role.acked(r, c)
	for _, sp := range r.splits {
		if sp.joining && sp.joinAfter <= c.seq {
			r.markDirty(sp.owner) // its results can be read back now
		}
	}
	r.startDurable(ctx)
	return true
}

// startDurable starts the calls waiting for batches that are now durable.
func (r *runner) startDurable(ctx context.Context) {
	still := r.waiting[:0]
	for _, l := range r.waiting {
		if l.batch <= r.ackedSeq {
			r.start(ctx, l)
		} else {
			still = append(still, l)
		}
	}
	r.waiting = still
}

// committer writes batches in the order the run hands them off.
func (r *runner) committer(ctx context.Context) {
	for c := range r.toCommit {
		c.err = r.commitWithRetry(ctx, c.batch)
		r.acks <- c
	}
}

// hasCalls reports provider calls in flight (not sub-chains being waited on,
// which run on their own).
func (r *runner) hasCalls() bool {
	for k := range r.calls {
		if rec := r.recs[k]; rec == nil || rec.Child == "" {
			return true
		}
	}
	return false
}

func (r *runner) receive(o outcome) {
	if o.do != nil {
		o.do(r)
		return
	}
	if o.news != nil {
		r.fanNews(o.key, o.news)
		return
	}
	if o.child != nil || o.attempt < 0 {
		r.childEnded(o)
		return
	}
	r.handle(o)
}

// drainInbox applies every outcome already waiting, so that one commit
// covers them all.
func (r *runner) drainInbox() {
	for {
		select {
		case o := <-r.inbox:
			// This goroutine holds a unit already.
			r.took()
			r.e.act.End()
			r.receive(o)
		default:
			return
		}
	}
}

// track notes a call as in flight from the moment it is decided.
func (r *runner) track(l *launch, attempt int) {
	l.fl = &inflight{attempt: attempt}
	r.calls[l.key] = l.fl
}

// untrack forgets a call that will not go out.
func (r *runner) untrack(l launch) {
	if r.calls[l.key] == l.fl {
		delete(r.calls, l.key)
	}
}

func (r *runner) start(ctx context.Context, l launch) {
	// The step may have been cancelled, or its item dropped, while the
	// call waited for its intent to be written.
	if rec := r.recs[l.key]; rec == nil || rec.Status != store.StepRunning || r.calls[l.key] != l.fl {
		return
	}
	if l.child != nil {
		r.startChild(ctx, l)
		return
	}
	// On the system's clock the call's context ends at the request's own
	// deadline, so the plugin host needs no timer of its own for it; on
	// another clock it gets as long as that clock leaves it.
	var cctx context.Context
	var cancel context.CancelFunc
	if _, system := r.e.clock.(SystemClock); system {
		cctx, cancel = context.WithDeadline(ctx, l.deadline)
	} else {
		cctx, cancel = context.WithTimeout(ctx, l.deadline.Sub(r.e.clock.Now()))
	}
	l.fl.cancel = cancel
	r.e.act.Begin()
	obs := r.e.observer
	obs.CallStarted(l.provider)
	began := time.Now()
	done := func(resp providers.Response, err error) {
		obs.CallEnded(l.provider, time.Since(began), err)
		o := outcome{key: l.key, attempt: l.req.Attempt, body: resp.Body, err: err, timeout: l.timeout}
		// The plugin enforces the same deadline and may answer a moment
		// before this side's timer fires, so the clock decides too.
		if err != nil && (errors.Is(cctx.Err(), context.DeadlineExceeded) || !r.e.clock.Now().Before(l.deadline)) {
			o.timedOut = true
		}
		cancel()
		// done may run on the goroutine that reads a plugin's answers for
		// every run, or on this runner's own: it waits for neither.
		// The outcome carries the call's unit of activity.
		if !r.tryGive(o) {
			go r.giveHeld(o, nil)
		}
	}
	if s, ok := l.prov.(starter); ok {
		s.Start(cctx, l.req, done)
		return
	}
	go func() { done(l.prov.Execute(cctx, l.req)) }()
}

// starter is a provider that makes a call without a goroutine waiting on
// it, and reports the call's end to done, which must not block; the
// plugin host's providers are. A call waits on a goroutine of its own
// otherwise.
type starter interface {
	Start(ctx context.Context, req providers.Request, done func(providers.Response, error))
}

// event appends an event to the pending batch.
func (r *runner) event(typ store.EventType, step string, attempt int, msg string) {
	r.run.Seq++
	r.events = append(r.events, store.Event{
		RunID: r.run.ID, Chain: r.run.Chain, Seq: r.run.Seq, Time: r.e.clock.Now().UTC(), Type: typ, Step: step, Attempt: attempt, Message: msg,
	})
}

// put records a changed step in memory and in the pending batch.
func (r *runner) put(rec *store.StepRecord) {
	// Batches commit in order, so a list's next call, which waits for the
	// list's latest write, finds every decision before it durable: its own
	// intent and the results that led to it.
	q := r.seqOf[rec.Key]
	if q == nil {
		q = r.top
	}
	q.ack = r.nextBatch
	r.recs[rec.Key] = rec
	if r.askingKey == rec.Key && rec.Status != store.StepRunning {
		r.askingKey = ""
		r.waitingSince.Store(0)
		if r.run.Status == store.RunWaiting {
			r.run.Status = store.RunRunning
		}
	}
	if _, ok := r.dirty[rec.Key]; !ok {
		r.order = append(r.order, rec.Key)
	}
	r.dirty[rec.Key] = rec
}

func (r *runner) hasChanges() bool {
	return len(r.dirty) > 0 || len(r.events) > 0 || len(r.dlq) > 0 || r.queueDirty
}

// takeBatch snapshots the pending batch and starts a new one. Records are
// copied because the run keeps changing them while the copy is written.
func (r *runner) takeBatch() *commit {
	r.run.UpdatedAt = r.e.clock.Now().UTC()
	run := *r.run
	run.Path = append([]string(nil), r.run.Path...)
	if r.run.Queue != nil {
		// A queued run's place moves while its last one is written.
		q := *r.run.Queue
		run.Queue = &q
	}
	b := &store.Batch{Run: &run, Events: r.events, DLQ: r.dlq, Steps: make([]*store.StepRecord, 0, len(r.order))}
	for _, k := range r.order {
		d := r.dirty[k]
		if d == nil {
			continue // dropped from the batch after it was changed
		}
		rec := *d
		if rec.Split != nil {
			st := *rec.Split
			rec.Split = &st
		}
		b.Steps = append(b.Steps, &rec)
	}
	for _, rec := range b.Steps {
		if q := r.seqOf[rec.Key]; q != nil && q.inItem() && !rec.Status.Final() {
			if q.written == nil {
				q.written = map[string]bool{}
			}
			q.written[rec.Key] = true
		}
	}
	r.redact(b)
	r.leaseMu.Lock()
	if r.lease.Owner != "" {
		l := r.lease
		b.Lease = &l
	}
	r.leaseMu.Unlock()
	c := &commit{seq: r.nextBatch, batch: b}
	r.queueDirty = false
	r.nextBatch++
	clear(r.dirty)
	r.order = r.order[:0]
	r.events = nil
	r.dlq = nil
	return c
}

// redact keeps secret values out of everything a batch writes. Steps read
// secrets only through <<secrets.NAME>> in payloads and provider config, but
// a provider may echo them back, and errors may quote them.
func (r *runner) redact(b *store.Batch) {
	red := r.e.redactor
	if !red.Active() {
		return
	}
	b.Run.Body = red.JSON(b.Run.Body)
	b.Run.Error = redactError(red, b.Run.Error)
	if f := b.Run.Failure; f != nil {
		f = f.Clone()
		f.Message = red.String(f.Message)
		b.Run.Failure = f
	}
	for _, st := range b.Steps {
		st.Body = red.JSON(st.Body)
		st.Error = redactError(red, st.Error)
	}
	for i := range b.Events {
		b.Events[i].Message = red.String(b.Events[i].Message)
	}
	for i, d := range b.DLQ {
		c := *d
		c.Payload = red.JSON(c.Payload)
		c.Error.Message = red.String(c.Error.Message)
		b.DLQ[i] = &c
	}
}

func redactError(red *secrets.Redactor, e *store.ErrorInfo) *store.ErrorInfo {
	if e == nil {
		return nil
	}
	c := *e
	c.Message = red.String(c.Message)
	return &c
}

// flushCreate writes the run's first batch, creating it in the store.
func (r *runner) flushCreate(ctx context.Context, def *store.Definition, claim *store.KeyClaim) error {
	c := r.takeBatch()
	c.batch.Create = true
	c.batch.Definition = def
	c.batch.Claim = claim
	// The origin is written once, here, and may hold a secret: a
	// sub-chain's input may read one, a request's payload may carry one.
	// The run goes on with it as it came; a resumed run reads it redacted.
	if red := r.e.redactor; red.Active() {
		o := &c.batch.Run.Origin
		o.Payload, o.Metadata = red.JSON(o.Payload), red.JSON(o.Metadata)
	}
	if err := r.e.store.Commit(ctx, c.batch); err != nil {
		return err
	}
	r.ackedSeq = c.seq
	r.logOutcomes(c.batch)
	r.published(c.batch.Events)
	return nil
}

// flush writes the pending batch and waits for it; for runs no loop
// advances.
func (r *runner) flush(ctx context.Context) error {
	if !r.hasChanges() {
		return nil
	}
	c := r.takeBatch()
	if err := r.commitWithRetry(ctx, c.batch); err != nil {
		return err
	}
	r.ackedSeq = c.seq
	r.published(c.batch.Events)
	return nil
}

// flushResults writes what the runner holds as it stops: results waiting
// for more to join them, and on a worker the steps of items part way
// through, are kept rather than called again on resume, or wherever a
// worker's items go next while it still holds its claims on them.
func (r *runner) flushResults() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := r.flush(ctx); err != nil {
		if r.onWorker() {
			r.log.Warn("writing the results of split items as the worker stops; their items run again elsewhere", "err", err)
			return
		}
		r.log.Warn("writing the run's results as it stops; their calls are made again when it resumes", "err", err)
	}
}

// commitWithRetry commits a batch, retrying briefly: a store that stays
// unavailable stops the run rather than let it act on state that is not
// durable.
func (r *runner) commitWithRetry(ctx context.Context, b *store.Batch) error {
	var err error
	for attempt, delay := 0, 50*time.Millisecond; attempt < 5; attempt, delay = attempt+1, delay*2 {
		if err = r.sink.Commit(ctx, b); err == nil {
			return nil
		}
		if errors.Is(err, store.ErrClosed) || errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) || ctx.Err() != nil {
			break
		}
		r.log.Warn("committing run state failed; retrying", "err", err, "in", delay)
		select {
		case <-time.After(delay):
		case <-ctx.Done():
		}
	}
	return fmt.Errorf("persisting run state: %w", err)
}

// logOutcomes logs the failures a durable batch holds, for operators who
// alert on logs.
func (r *runner) logOutcomes(b *store.Batch) {
	if !r.e.outcomes {
		return
	}
	for _, ev := range b.Events {
		switch ev.Type {
		case store.EventRunFailed:
			r.log.Error("run failed", "step", r.endedAt, "err", ev.Message)
		case store.EventRunTimedOut:
			r.log.Error("run timed out", "step", r.endedAt, "err", ev.Message)
		case store.EventStepFailed:
			r.log.Warn("step failed", "step", ev.Step, "attempts", ev.Attempt, "err", ev.Message)
		case store.EventStepTimedOut:
			r.log.Warn("step timed out", "step", ev.Step, "attempts", ev.Attempt, "err", ev.Message)
		case store.EventDeadLettered:
			for _, e := range b.DLQ {
				if ev.Message == "dead-letter entry "+e.ID {
					r.log.Warn("failure parked in the dead-letter queue", "step", e.Step, "entry", e.ID, "attempts", e.Attempts, "err", e.Error.Message)
				}
			}
		}
	}
}

func (r *runner) published(events []store.Event) {
	// Checked once: a call's arguments are built, and allocated, whether
	// or not the line is written.
	debug := r.log.Enabled(context.Background(), slog.LevelDebug)
	for _, ev := range events {
		if debug {
			r.log.Debug("event", "type", ev.Type, "step", ev.Step, "attempt", ev.Attempt, "message", ev.Message)
		}
		r.e.onEvent(ev)
	}
}

// finishRun ends the run; whatever is still pending or running is cancelled
// (or, when the run timed out, marked timed out).
func (r *runner) finishRun(status store.RunStatus, errInfo *store.ErrorInfo) {
	if r.run.Status.Final() {
		return
	}
	if r.enterHandlers(status, errInfo) {
		return
	}
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
	now := r.e.clock.Now().UTC()
	r.endedAt = r.run.Cursor
	if c := r.run.Cursor; c != "" && !r.onWorker() && !slices.Contains(r.top.path, c) && (status == store.RunCancelled || status == store.RunTimedOut) {
		// The step the run was stopped at is where its path ends; a step
		// that failed is on it already.
		r.top.path = append(r.top.path, c)
		r.run.Path = r.top.path
	}
	r.run.Status = status
	r.run.FinishedAt = now
	r.run.Cursor = ""
	r.run.Queue = nil
	r.run.Error = errInfo
	evt := map[store.RunStatus]store.EventType{
		store.RunSucceeded: store.EventRunSucceeded,
		store.RunFailed:    store.EventRunFailed,
		store.RunCancelled: store.EventRunCancelled,
		store.RunTimedOut:  store.EventRunTimedOut,
		store.RunSkipped:   store.EventRunSkipped,
	}[status]
	r.event(evt, "", 0, msg)
}

// give hands o to the run's goroutine with a unit of activity of its own,
// unless the run stops or ctx (when not nil) ends first; it reports
// whether the run took o in.
func (r *runner) give(o outcome, ctx context.Context) bool {
	r.e.act.Begin()
	return r.giveHeld(o, ctx)
}

// giveHeld is give for a caller that holds the unit o carries.
func (r *runner) giveHeld(o outcome, ctx context.Context) bool {
	r.acct.Lock()
	if r.acct.exited {
		r.acct.Unlock()
		r.e.act.End()
		return false
	}
	r.acct.held++
	r.acct.Unlock()
	var cancelled <-chan struct{}
	if ctx != nil {
		cancelled = ctx.Done()
	}
	select {
	case r.inbox <- o:
		return true
	case <-r.done:
		// The goroutine's exit ended the unit.
	case <-cancelled:
		r.acct.Lock()
		if !r.acct.exited {
			r.acct.held--
			r.e.act.End()
		}
		r.acct.Unlock()
	}
	return false
}

// inboxSize is how many messages wait in a run's inbox before a sender
// makes a goroutine to wait: as many as calls may end together where a
// parallel group or a split makes several at once, a few where the calls
// go one at a time. Every run allocates its inbox whole.
func inboxSize(def *chain.Chain) int {
	size := 4
	def.WalkChain(func(s *chain.Step) {
		if s.Parallel != nil || s.Split != nil {
			size = 64
		}
	})
	return size
}

// tryGive is giveHeld without waiting: it reports false, keeping the unit,
// when the inbox is full.
func (r *runner) tryGive(o outcome) bool {
	r.acct.Lock()
	defer r.acct.Unlock()
	if r.acct.exited {
		r.e.act.End()
		return true
	}
	select {
	case r.inbox <- o:
		r.acct.held++
		return true
	default:
		return false
	}
}

// took notes a message taken from the inbox: its unit is the goroutine's
// now.
func (r *runner) took() {
	r.acct.Lock()
	r.acct.held--
	r.acct.Unlock()
}

// exit ends the units of the messages the goroutine will never take.
func (r *runner) exit() {
	r.acct.Lock()
	defer r.acct.Unlock()
	r.acct.exited = true
	for range r.acct.held {
		r.e.act.End()
	}
	r.acct.held = 0
}
