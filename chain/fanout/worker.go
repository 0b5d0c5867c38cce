package fanout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/fanout/broker"
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
	// ctx is Run's: it ends when the worker stops.
	ctx context.Context
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
	w.mu.Lock()
	w.ctx = ctx
	w.mu.Unlock()
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
	wg.Add(3)
	go consume(broker.Items, w.f.cfg.Prefetch, w.deliver)
	go consume(broker.Dead, 4, w.poison)
	go func() {
		defer wg.Done()
		w.janitor(ctx)
	}()
	<-ctx.Done()
	w.closeAll()
	wg.Wait()
	select {
	case err := <-errs:
		return fmt.Errorf("working split items: %w", err)
	default:
		return nil
	}
}

func (w *Worker) runCtx() context.Context {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ctx == nil {
		return context.Background()
	}
	return w.ctx
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
	over    bool               // the split is over: what comes for it is acknowledged
	closing bool               // this worker stops: what it holds is delivered again
	used    time.Time
	unsub   func()
}

// pending is a delivery whose items are not all finished.
type pending struct {
	d     *broker.Delivery
	items []engine.WorkItem
	left  int
}

func (ws *worked) held() int {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return len(ws.waiting)
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

func (w *Worker) ack(d *broker.Delivery) {
	if err := d.Ack(); err != nil && !errors.Is(err, broker.ErrStale) && !errors.Is(err, broker.ErrSettled) {
		w.log.Warn("acknowledging a message", "err", err)
	}
}

// split returns the split a message belongs to, loading what its items
// need once; nil when the split is gone (it ended, or never existed).
func (w *Worker) split(ctx context.Context, r ref) *worked {
	key := r.String()
	w.mu.Lock()
	ws := w.splits[key]
	w.mu.Unlock()
	if ws != nil {
		return ws
	}
	b := newBarrier(w.f.rdb, w.f.cfg.Prefix, r)
	var work *engine.WorkSplit
	if !w.retry(ctx, "reading a split's context from Redis", func() (err error) {
		work, err = b.work(ctx)
		return err
	}) || work == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if ws := w.splits[key]; ws != nil {
		return ws
	}
	ws = &worked{w: w, r: r, b: b, ws: work, waiting: map[int][]*pending{}, used: time.Now()}
	ws.unsub = w.f.notices.subscribe(key, ws.notice)
	w.splits[key] = ws
	return ws
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
	ws := w.split(ctx, r)
	if ws == nil {
		if ctx.Err() == nil {
			w.ack(d) // the split is over
		}
		return
	}
	var body message
	if err := json.Unmarshal(d.Body, &body); err != nil {
		w.park(ctx, ws, d, indexes, nil, fmt.Sprintf("its message could not be decoded: %v", err))
		return
	}
	items := make([]engine.WorkItem, 0, len(body.Items))
	for _, it := range body.Items {
		items = append(items, engine.WorkItem{Index: it.Index, Value: it.Value})
	}
	ws.run(ctx, d, items)
}

// run claims the items of a delivery and hands those not done to the
// split's runner.
func (ws *worked) run(ctx context.Context, d *broker.Delivery, items []engine.WorkItem) {
	w := ws.w
	indexes := make([]int, len(items))
	for i, it := range items {
		indexes[i] = it.Index
	}
	var state string
	var claims []claimed
	if !w.retry(ctx, "reading split items from Redis", func() (err error) {
		state, claims, err = ws.b.claim(ctx, indexes)
		return err
	}) {
		return
	}
	if state != string(engine.FanoutOpen) {
		ws.end()
		w.ack(d)
		return
	}
	byIndex := make(map[int]claimed, len(claims))
	for _, c := range claims {
		byIndex[c.index] = c
	}
	var todo []engine.WorkItem
	for _, it := range items {
		c := byIndex[it.Index]
		if c.done {
			continue
		}
		it.Records = c.records
		todo = append(todo, it)
	}
	if len(todo) == 0 {
		w.ack(d)
		return
	}
	p := &pending{d: d, items: todo, left: len(todo)}
	var runner *engine.ItemRunner
	if !w.retry(ctx, "starting a runner for split items", func() (err error) {
		runner, err = ws.hold(p)
		return err
	}) {
		return
	}
	switch {
	case runner == nil && ws.isOver():
		w.ack(d)
	case runner != nil:
		// If the runner stopped meanwhile, its watcher hands p over again.
		_ = runner.Add(todo)
	}
}

func (ws *worked) isOver() bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.over
}

// hold records that p waits for its items and returns the runner to hand
// them to, starting one if needed; nil when the split is over.
func (ws *worked) hold(p *pending) (*engine.ItemRunner, error) {
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
		go ws.watch(r)
	}
	for _, it := range p.items {
		ws.waiting[it.Index] = append(ws.waiting[it.Index], p)
	}
	ws.used = time.Now()
	return ws.runner, nil
}

// finished is told by the runner that an item's result is durable, or that
// the item was dropped because the split is over: either way its message
// is done with it.
func (ws *worked) finished(index int, _ bool) {
	ws.mu.Lock()
	ps := ws.waiting[index]
	delete(ws.waiting, index)
	var acks []*broker.Delivery
	for _, p := range ps {
		p.left--
		if p.left == 0 {
			acks = append(acks, p.d)
		}
	}
	ws.used = time.Now()
	ws.mu.Unlock()
	for _, d := range acks {
		go ws.w.ack(d)
	}
}

// watch hands the items of a runner that stopped early to a new one: their
// messages stay unacknowledged meanwhile, so a store outage does not count
// as a failed delivery.
func (ws *worked) watch(r *engine.ItemRunner) {
	<-r.Done()
	ws.mu.Lock()
	if ws.runner == r {
		ws.runner = nil
	}
	seen := map[*pending]bool{}
	var again []*pending
	for _, ps := range ws.waiting {
		for _, p := range ps {
			if !seen[p] {
				seen[p] = true
				again = append(again, p)
			}
		}
	}
	clear(ws.waiting)
	over, closing := ws.over, ws.closing
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
		time.Sleep(time.Second)
	}
	for _, p := range again {
		var items []engine.WorkItem
		for _, it := range p.items {
			items = append(items, engine.WorkItem{Index: it.Index, Value: it.Value})
		}
		go ws.run(ws.w.runCtx(), p.d, items)
	}
}

// notice follows the split's state: once it is over, what is left here is
// dropped and its messages acknowledged.
func (ws *worked) notice(state string) {
	switch state {
	case string(engine.FanoutOpen):
	case "":
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			st, err := ws.w.f.rdb.HGet(ctx, ws.b.k.meta, "state").Result()
			if err == nil && st != string(engine.FanoutOpen) || errors.Is(err, goredis.Nil) {
				ws.end()
			}
		}()
	default:
		ws.end()
	}
}

// end drops what is left of an ended split.
func (ws *worked) end() {
	ws.mu.Lock()
	ws.over = true
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
					go r.Close()
				}
			}
		}
		w.mu.Unlock()
	}
}

// closeAll stops every runner; what they held is delivered again.
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
	}
}

// sink commits a worker runner's batches to the split's barrier.
type sink struct{ ws *worked }

func (s sink) Commit(ctx context.Context, b *store.Batch) error {
	state, err := s.ws.b.commit(ctx, b)
	if err != nil {
		return err
	}
	switch state {
	case string(engine.FanoutOpen), string(engine.FanoutComplete):
	default:
		s.ws.end()
	}
	return nil
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
	ws := w.split(ctx, r)
	if ws == nil {
		if ctx.Err() == nil {
			w.ack(d)
		}
		return
	}
	var body message
	_ = json.Unmarshal(d.Body, &body)
	w.park(ctx, ws, d, indexes, body.Items, fmt.Sprintf("its message was delivered %d times and never finished (max_redeliveries = %d): each worker that took it stopped first", w.f.cfg.MaxRedeliveries+1, w.f.cfg.MaxRedeliveries))
}

// park fails the items of a message that cannot be run, with a DLQ entry
// each, and acknowledges it.
func (w *Worker) park(ctx context.Context, ws *worked, d *broker.Delivery, indexes []int, values []messageItem, why string) {
	var state string
	var claims []claimed
	if !w.retry(ctx, "reading split items from Redis", func() (err error) {
		state, claims, err = ws.b.claim(ctx, indexes)
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
		if !w.retry(ctx, "parking poison items in Redis", func() error { _, err := ws.b.commit(ctx, b); return err }) {
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
	vals, err := s.ws.w.f.rdb.HGetAll(ctx, s.ws.b.k.item(i)).Result()
	if err != nil {
		return fmt.Errorf("reading item %d of split %s from Redis: %w", i, s.ws.b.ref, err)
	}
	keys := make([]string, 0, len(vals))
	for k := range vals {
		if strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		var rec store.StepRecord
		if err := json.Unmarshal([]byte(vals[k]), &rec); err != nil {
			return fmt.Errorf("decoding step record %s of split %s: %w", k, s.ws.b.ref, err)
		}
		if err := fn(&rec); err != nil {
			return err
		}
	}
	return nil
}
