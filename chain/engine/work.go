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
	// Linger bounds how long results wait for those of the calls still out
	// before they are committed together; default DefaultWorkLinger.
	Linger time.Duration
	// Finished is told of each item whose slot record is durable in the
	// sink, or that was dropped because the split is over (dropped set).
	// It runs on the runner's goroutine and must not block.
	Finished func(index int, dropped bool)
}

// ItemRunner runs the items of one split that a worker was handed.
type ItemRunner struct {
	r *runner
	w *workerItems
}

// workerItems runs, in this process as a worker, the items of a split
// handed to it: it is both the split's placement and its runner's role.
type workerItems struct {
	sp    *split
	items map[int]any
	queue []int
	opts  WorkOptions
	// checkAt is when the items' deadlines are next looked at.
	checkAt time.Time
	// over is set once the split is over: what is held is dropped.
	over atomic.Bool
	// held counts the items held, for other goroutines.
	held atomic.Int64
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
	if opts.Linger <= 0 {
		opts.Linger = DefaultWorkLinger
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
	w := &workerItems{items: map[int]any{}, opts: opts}
	w.sp = &split{
		step: s, key: ws.Key, owner: owner, total: ws.Total, width: indexWidth(ws.Total), deadline: ws.Deadline,
		rec:    &store.StepRecord{Key: ws.Key, Name: s.Name, Status: store.StepRunning, Split: &store.SplitState{Total: ws.Total}},
		active: map[int]*seq{}, place: w,
	}
	r.role, r.sink = w, sink
	r.splits[ws.Key] = w.sp
	if !e.addWorker(r, w) {
		return nil, ErrClosed
	}
	e.wg.Add(1)
	e.act.Begin()
	go func() {
		defer e.wg.Done()
		defer e.act.End()
		r.loop()
		e.removeWorker(r)
	}()
	return &ItemRunner{r: r, w: w}, nil
}

// Add hands items to the runner. Items it runs already are left alone.
func (w *ItemRunner) Add(items []WorkItem) error {
	if w.r.give(outcome{do: func(r *runner) { w.w.take(r, items) }}, nil) {
		return nil
	}
	return w.Err()
}

// Cancel drops every item: the split is over. Each is reported to Finished
// as dropped.
func (w *ItemRunner) Cancel() {
	w.w.over.Store(true)
	// Were the inbox full, the runner drops what it holds when it next
	// advances all the same.
	w.r.e.act.Begin()
	select {
	case w.r.inbox <- outcome{do: func(r *runner) { w.w.drop(r, w.w.heldItems()) }}:
	default:
		w.r.e.act.End()
	}
}

// Drop stops the given items where they are, cancelling their calls in
// flight and recording nothing more for them: this worker no longer holds
// them. Each is reported to Finished as dropped.
func (w *ItemRunner) Drop(indexes []int) {
	w.r.give(outcome{do: func(r *runner) { w.w.drop(r, indexes) }}, nil)
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
func (w *workerItems) take(r *runner, items []WorkItem) {
	for _, it := range items {
		if _, held := w.items[it.Index]; held || it.Index < 0 || it.Index >= w.sp.total {
			continue
		}
		if json.Valid(it.Value) {
			w.items[it.Index] = &lazyJSON{raw: it.Value}
		} else {
			w.items[it.Index] = string(it.Value)
		}
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
	w.held.Store(int64(len(w.items)))
}

// drop forgets items without writing anything about them, and reports
// them finished: the split is over.
func (w *workerItems) drop(r *runner, indexes []int) {
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
	w.held.Store(int64(len(w.items)))
}

// advance moves the worker's items along and returns the calls to start.
func (w *workerItems) advance(r *runner, now time.Time) []launch {
	sp := w.sp
	due := r.dueTimers(now)
	for _, key := range due {
		r.timerDue(key, now)
	}
	if w.over.Load() || (!sp.deadline.IsZero() && !now.Before(sp.deadline)) || (!r.run.Deadline.IsZero() && !now.Before(r.run.Deadline)) {
		// The split is over, or its time is: the run that owns it records
		// that; what is left here is dropped.
		w.drop(r, w.heldItems())
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
					Message: fmt.Sprintf("item %d of split %q took longer than %s (item_timeout_seconds)", q.index, sp.step.Name, w.opts.ItemTimeout), Code: "timeout",
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
	out, _ := w.progress(r, sp, now)
	w.held.Store(int64(len(w.items)))
	return out
}

// progress advances the items with news and starts held ones up to the
// worker's concurrency. The split joins in the run that owns it.
func (w *workerItems) progress(r *runner, sp *split, now time.Time) ([]launch, bool) {
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
	return out, false
}

func (w *workerItems) value(i int) any { return w.items[i] }

// A worker's runner writes its items' slots; the split's own record, its
// results and its end are the run's.
func (w *workerItems) starting(*runner, *split, int)          {}
func (w *workerItems) ended(*runner, *split)                  {}
func (w *workerItems) durable(uint64)                         {}
func (w *workerItems) stop(*runner, *split, store.StepStatus) {}
func (w *workerItems) detach()                                {}

func (w *workerItems) results(*runner, *split, func(*store.StepRecord) error) error {
	return errors.New("a worker does not join the splits it runs items of")
}

func (w *workerItems) readsStore() bool { return true }

func (w *workerItems) heldItems() []int {
	out := make([]int, 0, len(w.items))
	for i := range w.items {
		out = append(out, i)
	}
	return out
}

// acked tells the worker which items' slots a durable batch held. An item
// stays held until then, so that a second delivery of it is not run again
// meanwhile.
func (w *workerItems) acked(_ *runner, c *commit) {
	for _, rec := range c.batch.Steps {
		if splitKey, i, ok := itemSlot(rec.Key); ok && splitKey == w.sp.key {
			if _, held := w.items[i]; held {
				delete(w.items, i)
				w.opts.Finished(i, false)
			}
		}
	}
	w.held.Store(int64(len(w.items)))
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

func (e *Engine) addWorker(r *runner, w *workerItems) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return false
	}
	e.workers[r] = w
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
	for _, w := range e.workers {
		n += int(w.held.Load())
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
