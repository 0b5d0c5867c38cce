package fanout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/fanout/internal/broker"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/internal/jsonx"
)

// idleAfter is how long a worker keeps the runner of a split it has no
// item of before letting it go.
const idleAfter = time.Minute

// Worker runs the items that distributed splits hand out, with the
// engine's own runner. Any number of workers, in any number of processes,
// may consume the same queue.
type Worker struct {
	f   *Fanout
	eng *engine.Engine
	log *slog.Logger

	mu     sync.Mutex
	splits map[string]*worked
	// reading reads a split's context once for the deliveries that find
	// it missing together: with prefetch 8 and a payload of 60 MB, eight
	// reads at once held a gigabyte.
	reading singleflight.Group
	// tasks are the goroutines the worker starts beside Run's own; Run
	// waits for them before it returns, and starts none once stopped.
	tasksMu sync.Mutex
	tasks   sync.WaitGroup
	stopped bool
}

// Worker returns a worker that runs items with eng.
func (f *Fanout) Worker(eng *engine.Engine) *Worker {
	return &Worker{f: f, eng: eng, log: f.log.With("component", "worker"), splits: map[string]*worked{}}
}

// Run consumes items, and the messages parked as poison, until ctx ends.
// Items not finished then are delivered again, here or elsewhere.
func (w *Worker) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	consume := func(q broker.Queue, prefetch int, handle func(context.Context, *broker.Delivery)) {
		defer wg.Done()
		err := w.f.broker.Consume(ctx, q, prefetch, func(d *broker.Delivery) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				handle(ctx, d)
			}()
		})
		if err != nil && ctx.Err() == nil {
			errs <- err
			cancel()
		}
	}
	wg.Add(4)
	go consume(broker.Items, w.f.cfg.Prefetch, w.deliver)
	go consume(broker.Dead, 4, w.poison)
	go func() {
		defer wg.Done()
		w.janitor(ctx)
	}()
	go func() {
		defer wg.Done()
		w.renewClaims(ctx)
	}()
	<-ctx.Done()
	w.closeAll()
	wg.Wait()
	w.tasksMu.Lock()
	w.stopped = true
	w.tasksMu.Unlock()
	w.tasks.Wait()
	select {
	case err := <-errs:
		return fmt.Errorf("working split items: %w", err)
	default:
		return nil
	}
}

// spawn runs fn on a goroutine of its own that Run waits for; once the
// worker has stopped it runs nothing.
func (w *Worker) spawn(fn func()) {
	w.tasksMu.Lock()
	defer w.tasksMu.Unlock()
	if w.stopped {
		return
	}
	w.tasks.Add(1)
	go func() {
		defer w.tasks.Done()
		fn()
	}()
}

// worked is a split this worker runs items of.
type worked struct {
	w  *Worker
	r  ref
	b  *barrier
	ws *engine.WorkSplit

	mu      sync.Mutex
	runner  *engine.ItemRunner
	waiting map[int][]*pending // item → the deliveries waiting for it
	claims  map[int]string     // item → this worker's claim on it, OWNER|FENCE
	lost    map[int]bool       // items whose claim went while they ran
	renewed time.Time          // when the claims were last renewed
	over    bool               // the split is over: what comes for it is acknowledged
	closing bool               // this worker stops: what it holds is delivered again
	used    time.Time
	unsub   func()
	// opened is closed by the next notice that the split is open, which
	// its release is, or once it is over.
	opened chan struct{}
}

// pending is a delivery whose items are not all finished.
type pending struct {
	d     *broker.Delivery
	items []engine.WorkItem
	left  int
	// requeue: an item of it was given up, not finished, so the message
	// goes back to the queue rather than being acknowledged.
	requeue bool
}

// retry runs fn until it succeeds or ctx ends, logging an outage once.
func (w *Worker) retry(ctx context.Context, what string, fn func() error) bool {
	delay, warned := 100*time.Millisecond, false
	for {
		err := fn()
		if err == nil {
			if warned {
				w.log.Info(what + ": working again")
			}
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		if !warned {
			w.log.Warn(what+"; retrying", "err", err)
			warned = true
		}
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return false
		}
		delay = min(delay*2, 5*time.Second)
	}
}

// settle acknowledges a delivery, or returns it to the queue.
func (w *Worker) settle(d *broker.Delivery, requeue bool) {
	if !requeue {
		w.ack(d)
		return
	}
	if err := d.Nack(true); err != nil && !errors.Is(err, broker.ErrStale) && !errors.Is(err, broker.ErrSettled) {
		w.log.Warn("returning a message to the queue", "err", err)
	}
}

// claimTTL is how long a claim on an item lasts unless renewed.
func (w *Worker) claimTTL() time.Duration {
	if n := w.f.cfg.ClaimTTLSeconds; n > 0 {
		return time.Duration(n) * time.Second
	}
	return chain.DefaultFanoutClaimTTLSeconds * time.Second
}

func (w *Worker) ack(d *broker.Delivery) {
	if err := d.Ack(); err != nil && !errors.Is(err, broker.ErrStale) && !errors.Is(err, broker.ErrSettled) {
		w.log.Warn("acknowledging a message", "err", err)
	}
}

// claimedNow is what a claim found, made before the split was known.
type claimedNow struct {
	state  string
	claims []claimed
}

// split returns the split a message belongs to, loading what its items
// need once; nil when the split is gone (it ended, or never existed). The
// delivery that loads it claims the items it names (none for a parked
// message) in the same round trip, and gets what it claimed; the others
// claim their own.
func (w *Worker) split(ctx context.Context, r ref, indexes []int) (*worked, *claimedNow) {
	key := r.String()
	known := func() *worked {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.splits[key]
	}
	if ws := known(); ws != nil {
		return ws, nil
	}
	var ws *worked
	var mine *claimedNow
	if !w.retry(ctx, "reading a split's context from Redis", func() error {
		v, err, _ := w.reading.Do(key, func() (any, error) {
			// A delivery that comes once the last reader is done finds
			// the split registered by then.
			if ws := known(); ws != nil {
				return ws, nil
			}
			b := newBarrier(w.f.rdb, w.f.cfg.Prefix, r)
			var work *engine.WorkSplit
			var err error
			if len(indexes) == 0 {
				work, err = b.work(ctx)
			} else {
				var now claimedNow
				work, now.state, now.claims, err = b.workAndClaim(ctx, w.eng.Owner(), w.claimTTL(), indexes)
				mine = &now
			}
			if err != nil || work == nil {
				return nil, err
			}
			ws := &worked{w: w, r: r, b: b, ws: work, waiting: map[int][]*pending{}, claims: map[int]string{}, lost: map[int]bool{}, used: time.Now()}
			ws.unsub = w.f.notices.subscribe(key, ws.notice)
			w.mu.Lock()
			w.splits[key] = ws
			w.mu.Unlock()
			return ws, nil
		})
		ws, _ = v.(*worked)
		return err
	}) {
		return nil, nil
	}
	return ws, mine
}

// deliver runs the items of one message; the message is acknowledged once
// each of them has its result committed, or the split is over.
func (w *Worker) deliver(ctx context.Context, d *broker.Delivery) {
	r, indexes, err := refOf(d.Headers)
	if err != nil {
		w.log.Error("dropping a message that names no split item", "err", err)
		w.ack(d)
		return
	}
	if d.DeliveryCount > 0 {
		w.f.metrics.ItemsRedelivered(len(indexes))
	}
	ws, claimed := w.split(ctx, r, indexes)
	if ws == nil {
		if ctx.Err() == nil {
			w.ack(d) // the split is over
		}
		return
	}
	var body message
	if err := jsonx.Unmarshal(d.Body, &body); err != nil {
		w.park(ctx, ws, d, indexes, nil, fmt.Sprintf("its message could not be decoded: %v", err))
		return
	}
	items := make([]engine.WorkItem, 0, len(body.Items))
	for _, it := range body.Items {
		items = append(items, engine.WorkItem{Index: it.Index, Value: it.Value})
	}
	ws.run(ctx, d, items, claimed)
}

// run claims the items of a delivery and hands those not done to the
// split's runner. Items another worker's live claim holds are waited for:
// done there, or taken over once that claim lapses.
func (ws *worked) run(ctx context.Context, d *broker.Delivery, items []engine.WorkItem, claimed *claimedNow) {
	p := &pending{d: d, left: len(items)}
	ws.claimAndRun(ctx, p, items, claimed)
}

// claimAndRun claims items of p, unless already says how their claim
// went, and runs those it got; it returns the items still held elsewhere,
// which it has started waiting for.
func (ws *worked) claimAndRun(ctx context.Context, p *pending, items []engine.WorkItem, already *claimedNow) {
	w := ws.w
	indexes := make([]int, len(items))
	for i, it := range items {
		indexes[i] = it.Index
	}
	var state string
	var claims []claimed
	opened := ws.openSignal()
	if already != nil {
		state, claims = already.state, already.claims
	} else if !w.retry(ctx, "claiming split items in Redis", func() (err error) {
		state, claims, err = ws.b.claim(ctx, w.eng.Owner(), w.claimTTL(), true, indexes)
		return err
	}) {
		return
	}
	if state == stateHeld {
		if already != nil {
			// Its release may have come before this split was followed
			// here: the claim is tried again, now that a release is heard.
			ws.claimAndRun(ctx, p, items, nil)
			return
		}
		ws.w.spawn(func() { ws.await(ctx, p, items, opened) })
		return
	}
	if state != string(engine.FanoutOpen) {
		ws.end()
		w.ack(p.d)
		return
	}
	byIndex := make(map[int]claimed, len(claims))
	for _, c := range claims {
		byIndex[c.index] = c
	}
	var todo, held []engine.WorkItem
	done := 0
	for _, it := range items {
		switch c := byIndex[it.Index]; {
		case c.done:
			done++
		case c.held:
			held = append(held, it)
		default:
			it.Records = c.records
			todo = append(todo, it)
			ws.mu.Lock()
			ws.claims[it.Index] = c.claim
			delete(ws.lost, it.Index)
			if ws.renewed.IsZero() {
				ws.renewed = time.Now()
			}
			ws.mu.Unlock()
		}
	}
	ws.settle(p, done)
	if len(held) > 0 {
		ws.w.spawn(func() { ws.await(ctx, p, held, nil) })
	}
	if len(todo) == 0 {
		return
	}
	p.items = append(p.items, todo...)
	var runner *engine.ItemRunner
	if !w.retry(ctx, "starting a runner for split items", func() (err error) {
		runner, err = ws.hold(ctx, p, todo)
		return err
	}) {
		return
	}
	switch {
	case runner == nil && ws.isOver():
		w.ack(p.d)
	case runner != nil:
		// If the runner stopped meanwhile, its watcher hands p over again.
		_ = runner.Add(todo)
	}
}

// await waits for items another worker holds, or for the release of a
// split whose run has not made its decision durable yet (opened, nil
// otherwise), and claims them again: those done are settled, those whose
// claim lapsed, or that were released, are run here. A release's notice,
// or the split's end, ends the wait early; should the notice be lost, the
// wait is the one for a claim.
func (ws *worked) await(ctx context.Context, p *pending, items []engine.WorkItem, opened <-chan struct{}) {
	t := time.NewTimer(ws.w.claimTTL() / 3)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-opened:
	case <-t.C:
	}
	ws.mu.Lock()
	over, closing := ws.over, ws.closing
	ws.mu.Unlock()
	switch {
	case closing:
		return
	case over:
		ws.w.ack(p.d)
		return
	}
	ws.claimAndRun(ctx, p, items, nil)
}

// wakeLocked wakes what waits for the split to open: it has, or it is
// over. ws.mu is held.
func (ws *worked) wakeLocked() {
	if ws.opened != nil {
		close(ws.opened)
		ws.opened = nil
	}
}

// openSignal is closed by the next notice that the split is open, or
// once it is over.
func (ws *worked) openSignal() <-chan struct{} {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.opened == nil {
		ws.opened = make(chan struct{})
	}
	return ws.opened
}

// settle counts n items of p as finished, and acknowledges (or requeues)
// its message once none is left.
func (ws *worked) settle(p *pending, n int) {
	if n == 0 {
		return
	}
	ws.mu.Lock()
	p.left -= n
	last, requeue := p.left == 0, p.requeue
	ws.mu.Unlock()
	if last {
		ws.w.spawn(func() { ws.w.settle(p.d, requeue) })
	}
}

func (ws *worked) isOver() bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.over
}

// hold records that p waits for items and returns the runner to hand
// them to, starting one if needed; nil when the split is over.
func (ws *worked) hold(ctx context.Context, p *pending, items []engine.WorkItem) (*engine.ItemRunner, error) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.over || ws.closing {
		return nil, nil
	}
	if ws.runner == nil {
		cfg := ws.w.f.cfg
		r, err := ws.w.eng.Work(ws.ws, sink{ws}, engine.WorkOptions{
			Concurrency: cfg.WorkerConcurrency,
			ItemTimeout: time.Duration(cfg.ItemTimeoutSeconds) * time.Second,
			Finished:    ws.finished,
		})
		if err != nil {
			return nil, err
		}
		ws.runner = r
		ws.w.spawn(func() { ws.watch(ctx, r) })
	}
	for _, it := range items {
		ws.waiting[it.Index] = append(ws.waiting[it.Index], p)
	}
	ws.used = time.Now()
	return ws.runner, nil
}

// finished is told by the runner that an item's result is durable, or that
// the item was dropped: because the split is over, or because this worker
// lost its claim on it, in which case its message goes back to the queue
// unless the item is done elsewhere by then.
func (ws *worked) finished(index int, dropped bool) {
	ws.mu.Lock()
	ps := ws.waiting[index]
	delete(ws.waiting, index)
	delete(ws.claims, index)
	lost := dropped && ws.lost[index]
	delete(ws.lost, index)
	type settlement struct {
		d       *broker.Delivery
		requeue bool
	}
	var out []settlement
	for _, p := range ps {
		if lost {
			p.requeue = true
		}
		p.left--
		if p.left == 0 {
			out = append(out, settlement{p.d, p.requeue})
		}
	}
	ws.used = time.Now()
	ws.mu.Unlock()
	for _, s := range out {
		ws.w.spawn(func() { ws.w.settle(s.d, s.requeue) })
	}
}

// lose stops the items whose claim this worker no longer holds: another
// worker runs them now, or will.
func (ws *worked) lose(indexes []int, why string) {
	if len(indexes) == 0 {
		return
	}
	ws.mu.Lock()
	var mine []int
	for _, i := range indexes {
		if _, ok := ws.claims[i]; ok {
			ws.lost[i] = true
			delete(ws.claims, i)
			mine = append(mine, i)
		}
	}
	r := ws.runner
	ws.mu.Unlock()
	if len(mine) == 0 || r == nil {
		return
	}
	ws.w.log.Warn("stopping split items this worker no longer holds a claim on", "split", ws.r.String(), "items", len(mine), "why", why)
	r.Drop(mine)
}

// renew extends this worker's claims on the items it runs. Claims it can
// no longer renew in time are given up: their items stop here before
// another worker may take them over.
func (ws *worked) renew(ctx context.Context, ttl time.Duration) {
	ws.mu.Lock()
	claims := maps.Clone(ws.claims)
	renewed := ws.renewed
	ws.mu.Unlock()
	if len(claims) == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, ttl/3)
	lost, err := ws.b.renew(rctx, ttl, claims)
	cancel()
	if err != nil {
		// Stop a third of a ttl before the claims lapse, so no call of
		// this worker overlaps the next one's.
		if time.Since(renewed) > ttl*2/3 {
			ws.lose(slices.Collect(maps.Keys(claims)), fmt.Sprintf("the claims could not be renewed for %s: %v", time.Since(renewed).Round(time.Millisecond), err))
		}
		return
	}
	ws.mu.Lock()
	ws.renewed = time.Now()
	ws.mu.Unlock()
	ws.lose(lost, "another worker took them over")
}

// watch hands the items of a runner that stopped early to a new one: their
// messages stay unacknowledged meanwhile, so a store outage does not count
// as a failed delivery.
func (ws *worked) watch(ctx context.Context, r *engine.ItemRunner) {
	<-r.Done()
	ws.mu.Lock()
	if ws.runner == r {
		ws.runner = nil
	}
	// The items each delivery still waits for, to be run again for it.
	left := map[*pending]map[int]bool{}
	var again []*pending
	for i, ps := range ws.waiting {
		for _, p := range ps {
			if left[p] == nil {
				left[p] = map[int]bool{}
				again = append(again, p)
			}
			left[p][i] = true
		}
	}
	clear(ws.waiting)
	over, closing := ws.over, ws.closing
	var redo [][]engine.WorkItem
	for _, p := range again {
		var items, kept []engine.WorkItem
		for _, it := range p.items {
			if left[p][it.Index] {
				items = append(items, engine.WorkItem{Index: it.Index, Value: it.Value})
			} else {
				kept = append(kept, it)
			}
		}
		p.items = kept
		redo = append(redo, items)
	}
	ws.mu.Unlock()
	switch {
	case closing || len(again) == 0:
		return
	case over:
		for _, p := range again {
			ws.w.ack(p.d)
		}
		return
	}
	if err := r.Err(); err != nil && !errors.Is(err, engine.ErrClosed) {
		ws.w.log.Warn("a runner of split items stopped; running its items again", "split", ws.r.String(), "err", err)
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
			return
		}
	}
	for i, p := range again {
		ws.w.spawn(func() { ws.claimAndRun(ctx, p, redo[i], nil) })
	}
}

// notice follows the split's state: once it is over, what is left here is
// dropped and its messages acknowledged.
func (ws *worked) notice(state string) {
	switch state {
	case string(engine.FanoutOpen):
		ws.mu.Lock()
		ws.wakeLocked()
		ws.mu.Unlock()
	case "":
		ws.w.spawn(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			st, err := ws.w.f.rdb.HGet(ctx, ws.b.k.meta, "state").Result()
			if err == nil && st != string(engine.FanoutOpen) || errors.Is(err, goredis.Nil) {
				ws.end()
			}
		})
	default:
		ws.end()
	}
}

// end drops what is left of an ended split.
func (ws *worked) end() {
	ws.mu.Lock()
	ws.over = true
	ws.wakeLocked()
	r := ws.runner
	ws.mu.Unlock()
	if r != nil {
		r.Cancel()
	}
}

// janitor lets go of the runners of splits with nothing left here.
func (w *Worker) janitor(ctx context.Context) {
	t := time.NewTicker(idleAfter / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.mu.Lock()
		for key, ws := range w.splits {
			ws.mu.Lock()
			idle := len(ws.waiting) == 0 && time.Since(ws.used) > idleAfter
			r := ws.runner
			ws.mu.Unlock()
			if idle {
				delete(w.splits, key)
				ws.unsub()
				if r != nil {
					w.spawn(r.Close)
				}
			}
		}
		w.mu.Unlock()
	}
}

// renewClaims renews, a few times per claim's life, the claims this
// worker holds on the items it runs, in one script per split.
func (w *Worker) renewClaims(ctx context.Context) {
	ttl := w.claimTTL()
	t := time.NewTicker(ttl / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.mu.Lock()
		splits := slices.Collect(maps.Values(w.splits))
		w.mu.Unlock()
		for _, ws := range splits {
			ws.renew(ctx, ttl)
		}
	}
}

// closeAll stops every runner; what they held is delivered again, and
// their claims are let go so the next worker need not wait for them to
// lapse.
func (w *Worker) closeAll() {
	w.mu.Lock()
	splits := w.splits
	w.splits = map[string]*worked{}
	w.mu.Unlock()
	for _, ws := range splits {
		ws.unsub()
		ws.mu.Lock()
		ws.closing = true
		r := ws.runner
		clear(ws.waiting)
		ws.mu.Unlock()
		if r != nil {
			r.Close()
		}
		ws.mu.Lock()
		claims := maps.Clone(ws.claims)
		clear(ws.claims)
		ws.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if _, err := ws.b.renew(ctx, 0, claims); err != nil {
			w.log.Warn("letting go of claims on split items; they lapse on their own", "split", ws.r.String(), "err", err)
		}
		cancel()
	}
}

// sink commits a worker runner's batches to the split's barrier.
type sink struct{ ws *worked }

func (s sink) Commit(ctx context.Context, b *store.Batch) error {
	state, lost, err := s.ws.b.commit(ctx, b, s.ws.claim)
	if err != nil {
		return err
	}
	s.ws.lose(lost, "another worker took them over")
	switch state {
	case string(engine.FanoutOpen), string(engine.FanoutComplete):
	default:
		s.ws.end()
	}
	return nil
}

// claim is this worker's claim on an item, for a commit to carry.
func (ws *worked) claim(item int) string {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if c, ok := ws.claims[item]; ok {
		return c
	}
	// Not claimed here (it was lost): a claim no one holds, so the commit
	// writes nothing for it.
	return ws.w.eng.Owner() + "|0"
}

// poison takes a message that was delivered more often than
// max_redeliveries: each of its items that has no result yet fails, with a
// dead-letter entry naming its run, split and index, so the split can
// finish and an operator can replay the item.
func (w *Worker) poison(ctx context.Context, d *broker.Delivery) {
	r, indexes, err := refOf(d.Headers)
	if err != nil {
		w.log.Error("dropping a parked message that names no split item", "err", err)
		w.ack(d)
		return
	}
	ws, _ := w.split(ctx, r, nil)
	if ws == nil {
		if ctx.Err() == nil {
			w.ack(d)
		}
		return
	}
	var body message
	_ = jsonx.Unmarshal(d.Body, &body)
	w.park(ctx, ws, d, indexes, body.Items, fmt.Sprintf("its message was delivered %d times and never finished (max_redeliveries = %d): each worker that took it stopped first", w.f.cfg.MaxRedeliveries+1, w.f.cfg.MaxRedeliveries))
}

// park fails the items of a message that cannot be run, with a DLQ entry
// each, and acknowledges it.
func (w *Worker) park(ctx context.Context, ws *worked, d *broker.Delivery, indexes []int, values []messageItem, why string) {
	var state string
	var claims []claimed
	if !w.retry(ctx, "reading split items from Redis", func() (err error) {
		state, claims, err = ws.b.claim(ctx, w.eng.Owner(), w.claimTTL(), false, indexes)
		return err
	}) {
		return
	}
	if state != string(engine.FanoutOpen) {
		w.ack(d)
		return
	}
	payload := make(map[int]json.RawMessage, len(values))
	for _, v := range values {
		payload[v.Index] = v.Value
	}
	now := time.Now().UTC()
	b := &store.Batch{}
	for _, c := range claims {
		if c.done {
			continue
		}
		key := engine.ItemKey(ws.ws.Key, c.index, ws.ws.Total)
		info := &store.ErrorInfo{Message: fmt.Sprintf("item %d of split %q was parked as poison: %s", c.index, ws.ws.Step, why), Code: "poison"}
		body, _ := jsonx.Marshal(map[string]any{"error": info})
		b.Steps = append(b.Steps, &store.StepRecord{Key: key, Name: ws.ws.Step, Status: store.StepFailed, Error: info, Body: body, FinishedAt: now})
		entry := &store.DLQEntry{
			ID: store.NewID(), RunID: ws.ws.Run.ID, Chain: ws.ws.Run.Chain, Step: key, Error: *info,
			Attempts: w.f.cfg.MaxRedeliveries + 1, Payload: payload[c.index], CreatedAt: now,
		}
		b.DLQ = append(b.DLQ, entry)
		b.Events = append(b.Events, store.Event{Time: now, Type: store.EventDeadLettered, Step: key, Message: "dead-letter entry " + entry.ID + ": " + info.Message})
	}
	if len(b.Steps) > 0 {
		unclaimed := func(int) string { return "" }
		if !w.retry(ctx, "parking poison items in Redis", func() error { _, _, err := ws.b.commit(ctx, b, unclaimed); return err }) {
			return
		}
		w.f.metrics.ItemsPoisoned(len(b.Steps))
		w.log.Warn("parked items as poison", "split", ws.r.String(), "items", len(b.Steps), "why", why)
	}
	w.ack(d)
}

// ForEachStep reads back what an item committed: a nested split joins from
// its items' slots.
func (s sink) ForEachStep(ctx context.Context, prefix string, fn func(*store.StepRecord) error) error {
	_, i, ok := slotOf(prefix, s.ws.b.ref.Split)
	if !ok {
		return fmt.Errorf("reading step records %q: not inside an item of split %s", prefix, s.ws.b.ref)
	}
	keys, vals, err := s.ws.b.itemRecords(ctx, i, prefix)
	if err != nil {
		return err
	}
	for j, k := range keys {
		var rec store.StepRecord
		if err := jsonx.Unmarshal([]byte(vals[j]), &rec); err != nil {
			return fmt.Errorf("decoding step record %s of split %s: %w", k, s.ws.b.ref, err)
		}
		if err := fn(&rec); err != nil {
			return err
		}
	}
	return nil
}
