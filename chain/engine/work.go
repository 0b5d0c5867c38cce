package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/loader"
	"github.com/chaingate/gateway/chain/store"
)

// A worker runs the items of distributed splits with the same runner that
// runs a local split's items: each item is a list of steps advanced by the
// same code, with the same dedup keys, retries, timers, parallel groups,
// nested splits and sub-chains. Only where it writes differs: a worker's
// runner commits to a WorkSink (the fan-out's Redis) instead of the run's
// store, and what it commits for an item is the item's own step records
// and, at its end, its slot.

// WorkSink is where a worker's runner commits. A batch holds item step
// records, the slot records of items that ended, and the DLQ entries and
// events those items produced; its Run is only the run's identity.
type WorkSink interface {
	Commit(ctx context.Context, b *store.Batch) error
	// ForEachStep calls fn with the committed item step records whose key
	// starts with prefix, in key order: a nested split joins from them.
	ForEachStep(ctx context.Context, prefix string, fn func(*store.StepRecord) error) error
}

// WorkItem is one item handed to a worker.
type WorkItem struct {
	Index int
	Value json.RawMessage
	// Records are what an earlier delivery of the item recorded: its steps
	// with a result are not called again.
	Records []*store.StepRecord
}

// WorkOptions tune a worker's runner.
type WorkOptions struct {
	// Concurrency bounds the items run at once; default
	// DefaultSplitConcurrency.
	Concurrency int
	// ItemTimeout bounds how long one item may run; 0 leaves only the
	// split's deadline.
	ItemTimeout time.Duration
	// Finished is told of each item whose slot record is durable in the
	// sink, or that was dropped because the split is over (dropped set).
	// It runs on the runner's goroutine and must not block.
	Finished func(index int, dropped bool)
}

// ItemRunner runs the items of one split that a worker was handed.
type ItemRunner struct {
	r *runner
}

// workSplit is a worker runner's split and what it was handed.
type workSplit struct {
	sp    *split
	items map[int]any
	queue []int
	sink  WorkSink
	opts  WorkOptions
	// checkAt is when the items' deadlines are next looked at.
	checkAt time.Time
	in      chan []WorkItem
	cancel  chan struct{}
	drop    chan []int
	over    atomic.Bool
}

// Work starts a runner for the items of a split handed to this worker.
func (e *Engine) Work(ws *WorkSplit, sink WorkSink, opts WorkOptions) (*ItemRunner, error) {
	if ws.Run == nil {
		return nil, errors.New("running split items: the split names no run")
	}
	def, cfg, err := e.definitionFrom(ws.Run.Chain, ws.Run.ChainHash, ws.Definition)
	if err != nil {
		return nil, fmt.Errorf("running items of split %q: %w", ws.Key, err)
	}
	s := def.Step(ws.Step)
	if s == nil || s.Split == nil {
		return nil, fmt.Errorf("running items of split %q: chain %q has no split step %q", ws.Key, def.Name, ws.Step)
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = DefaultSplitConcurrency
	}
	if opts.Finished == nil {
		opts.Finished = func(int, bool) {}
	}
	run := *ws.Run
	run.Status = store.RunRunning
	r := e.newRunner(def, cfg, &run, ws.Records)
	owner := r.top
	if len(ws.Lineage) > 0 {
		// The items enclosing the split see their own steps over the
		// run's; the innermost wins, as it does in a local item.
		owner = &seq{steps: s.List, prefix: keyPrefix(ws.Lineage), lineage: ws.Lineage, vars: maps.Clone(r.top.vars)}
		for i := range ws.Lineage {
			prefix := []string{keyPrefix(ws.Lineage[:i+1])}
			for _, rec := range ws.Records {
				if visibleFrom(rec.Key, prefix) {
					owner.vars[rec.Name] = stepValue(rec, r.bodyValue(rec))
				}
			}
		}
	}
	if ws.Prev != "" {
		owner.path = []string{ws.Prev}
	}
	w := &workSplit{
		items:  map[int]any{},
		sink:   sink,
		opts:   opts,
		in:     make(chan []WorkItem, 16),
		cancel: make(chan struct{}, 1),
		drop:   make(chan []int, 16),
	}
	w.sp = &split{
		step: s, key: ws.Key, owner: owner, total: ws.Total, width: indexWidth(ws.Total), deadline: ws.Deadline,
		rec:    &store.StepRecord{Key: ws.Key, Name: s.Name, Status: store.StepRunning, Split: &store.SplitState{Total: ws.Total}},
		active: map[int]*seq{}, work: w,
	}
	r.work = w
	r.splits[ws.Key] = w.sp
	if !e.addWorker(r) {
		return nil, ErrClosed
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		r.loop()
		e.removeWorker(r)
	}()
	return &ItemRunner{r: r}, nil
}

// Add hands items to the runner. Items it runs already are left alone.
func (w *ItemRunner) Add(items []WorkItem) error {
	select {
	case w.r.work.in <- items:
		return nil
	case <-w.r.done:
		return w.Err()
	}
}

// Cancel drops every item: the split is over. Each is reported to Finished
// as dropped.
func (w *ItemRunner) Cancel() {
	w.r.work.over.Store(true)
	select {
	case w.r.work.cancel <- struct{}{}:
	default:
	}
}

// Drop stops the given items where they are, cancelling their calls in
// flight and recording nothing more for them: this worker no longer holds
// them. Each is reported to Finished as dropped.
func (w *ItemRunner) Drop(indexes []int) {
	select {
	case w.r.work.drop <- indexes:
	case <-w.r.done:
	}
}

// Close stops the runner; items not finished are left unrecorded.
func (w *ItemRunner) Close() { w.r.stop() }

// Done is closed once the runner has stopped.
func (w *ItemRunner) Done() <-chan struct{} { return w.r.done }

// Err says why a stopped runner stopped early, if it did.
func (w *ItemRunner) Err() error {
	select {
	case <-w.r.done:
		if w.r.err != nil {
			return w.r.err
		}
		return ErrClosed
	default:
		return nil
	}
}

// take adds items handed over.
func (r *runner) take(items []WorkItem) {
	w := r.work
	for _, it := range items {
		if _, held := w.items[it.Index]; held || it.Index < 0 || it.Index >= w.sp.total {
			continue
		}
		v, err := parseJSON(it.Value)
		if err != nil {
			v = string(it.Value)
		}
		w.items[it.Index] = v
		// As on a resume: nested splits count their finished items, whose
		// own records stay out of memory.
		recs := slices.SortedFunc(slices.Values(it.Records), func(a, b *store.StepRecord) int { return strings.Compare(a.Key, b.Key) })
		live, done := splitLive(recs)
		for k, b := range done {
			r.doneItems[k] = b
		}
		for _, rec := range live {
			r.recs[rec.Key] = rec
			if rec.Status == store.StepPending && !rec.NotBefore.IsZero() {
				r.addTimer(rec.NotBefore, rec.Key)
			}
		}
		w.queue = append(w.queue, it.Index)
	}
	r.workHeld.Store(int64(len(w.items)))
}

// dropItems forgets items without writing anything about them, and
// reports them finished: the split is over.
func (r *runner) dropItems(indexes []int) {
	w := r.work
	for _, i := range indexes {
		if _, held := w.items[i]; !held {
			continue
		}
		if q := w.sp.active[i]; q != nil {
			q.status = store.StepCancelled
			for _, k := range q.keys {
				delete(r.dirty, k)
			}
			r.forgetItem(q)
			delete(w.sp.active, i)
		}
		delete(w.items, i)
		w.opts.Finished(i, true)
	}
	kept := w.queue[:0]
	for _, i := range w.queue {
		if _, held := w.items[i]; held {
			kept = append(kept, i)
		}
	}
	w.queue = kept
	r.workHeld.Store(int64(len(w.items)))
}

// advanceWork moves a worker's items along and returns the calls to start.
func (r *runner) advanceWork(now time.Time) []launch {
	w := r.work
	sp := w.sp
	due := r.dueTimers(now)
	for _, key := range due {
		r.timerDue(key, now)
	}
	if w.over.Load() || (!sp.deadline.IsZero() && !now.Before(sp.deadline)) || (!r.run.Deadline.IsZero() && !now.Before(r.run.Deadline)) {
		// The split is over, or its time is: the run that owns it records
		// that; what is left here is dropped.
		r.dropItems(heldItems(w))
		return nil
	}
	if !w.checkAt.IsZero() && !now.Before(w.checkAt) {
		// One timer at a time watches the items' deadlines, however many
		// items go through: the earliest is set again after each check.
		w.checkAt = time.Time{}
		for _, q := range sp.active {
			if !q.deadline.IsZero() && !now.Before(q.deadline) {
				r.abandonItem(q, "item timed out")
				r.endItem(q, store.StepFailed, nil, &store.ErrorInfo{
					Message: fmt.Sprintf("item %d of split %q took longer than %s (item_timeout_seconds)", q.index, sp.step.Name, r.work.opts.ItemTimeout), Code: "timeout",
				})
			}
		}
		for _, q := range sp.active {
			if !q.deadline.IsZero() && (w.checkAt.IsZero() || q.deadline.Before(w.checkAt)) {
				w.checkAt = q.deadline
			}
		}
		if !w.checkAt.IsZero() {
			r.addTimer(w.checkAt, sp.key)
		}
	}
	var out []launch
	for len(sp.dirty) > 0 {
		item := sp.dirty[len(sp.dirty)-1]
		sp.dirty = sp.dirty[:len(sp.dirty)-1]
		if item.status == "" {
			ls, _ := r.advanceSeq(now, item)
			out = append(out, ls...)
		}
	}
	for len(sp.active) < w.opts.Concurrency && len(w.queue) > 0 {
		i := w.queue[0]
		w.queue = w.queue[1:]
		q := r.startItem(sp, i)
		if t := w.opts.ItemTimeout; t > 0 {
			q.deadline = now.Add(t)
			if !sp.deadline.IsZero() && sp.deadline.Before(q.deadline) {
				q.deadline = sp.deadline
			}
			if w.checkAt.IsZero() {
				w.checkAt = q.deadline
				r.addTimer(w.checkAt, sp.key)
			}
		}
		ls, _ := r.advanceSeq(now, q)
		out = append(out, ls...)
	}
	r.workHeld.Store(int64(len(w.items)))
	return out
}

func heldItems(w *workSplit) []int {
	out := make([]int, 0, len(w.items))
	for i := range w.items {
		out = append(out, i)
	}
	return out
}

// workAcked tells the worker which items' slots a durable batch held. An
// item stays held until then, so that a second delivery of it is not run
// again meanwhile.
func (r *runner) workAcked(c *commit) {
	w := r.work
	for _, rec := range c.batch.Steps {
		if splitKey, i, ok := itemSlot(rec.Key); ok && splitKey == w.sp.key {
			if _, held := w.items[i]; held {
				delete(w.items, i)
				w.opts.Finished(i, false)
			}
		}
	}
	r.workHeld.Store(int64(len(w.items)))
}

// commit writes a batch where this runner writes: the run's store, or a
// worker's sink.
func (r *runner) commit(ctx context.Context, b *store.Batch) error {
	if r.work != nil {
		return r.work.sink.Commit(ctx, b)
	}
	return r.e.store.Commit(ctx, b)
}

// forEachStep reads back committed step records, where this runner writes.
func (r *runner) forEachStep(ctx context.Context, prefix string, fn func(*store.StepRecord) error) error {
	if r.work != nil {
		return r.work.sink.ForEachStep(ctx, prefix, fn)
	}
	return r.e.store.ForEachStep(ctx, r.run.ID, store.StepScan{Prefix: prefix}, fn)
}

// definitionFrom returns a chain from a definition document a worker was
// handed, loading it once per hash.
func (e *Engine) definitionFrom(name, hash string, src []byte) (*chain.Chain, *chain.Config, error) {
	cur := e.config()
	if c := cur.Chains[name]; c != nil && c.Hash == hash {
		return c, cur, nil
	}
	e.defMu.Lock()
	defer e.defMu.Unlock()
	if cfg := e.defs[hash]; cfg != nil && cfg.Chains[name] != nil {
		return cfg.Chains[name], cfg, nil
	}
	cfg, err := e.loadStored(name, src)
	if err != nil {
		return nil, nil, err
	}
	e.defs[hash] = cfg
	return cfg.Chains[name], cfg, nil
}

// loadStored loads a stored definition document of a chain.
func (e *Engine) loadStored(name string, src []byte) (*chain.Config, error) {
	opts := e.loadOpts
	opts.Stored = true
	cfg, err := loader.LoadBytes("stored definition of "+name, src, opts)
	if err != nil {
		return nil, fmt.Errorf("loading the definition of chain %q the run started with: %w: %w", name, errNoDefinition, err)
	}
	if cfg.Chains[name] == nil {
		return nil, fmt.Errorf("the stored definition does not hold chain %q: %w", name, errNoDefinition)
	}
	return cfg, nil
}

func (e *Engine) addWorker(r *runner) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return false
	}
	e.workers[r] = true
	return true
}

func (e *Engine) removeWorker(r *runner) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.workers, r)
}

// WorkHeld reports how many handed items this engine's worker runners hold.
func (e *Engine) WorkHeld() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for r := range e.workers {
		n += int(r.workHeld.Load())
	}
	return n
}

// workersOf returns the worker runners running items of a run.
func (e *Engine) workersOf(runID string) []*runner {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []*runner
	for r := range e.workers {
		if r.run.ID == runID {
			out = append(out, r)
		}
	}
	return out
}
