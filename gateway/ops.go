package gateway

import (
	"bytes"
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
	"github.com/chaingate/gateway/internal/textx"
)

// Ops are what operators do with runs and the dead-letter queue. The HTTP
// API serves them, the web console (gateway/console) acts through them, and
// the command line runs them either through the API (Client) or straight on
// a store (Local).
type Ops interface {
	// StartRun starts a run of a chain with a payload (one JSON value;
	// empty means {}), as POST /v1/chains/{name}/runs does: the run is
	// started by "api", and who started it is the context's actor, in the
	// gateway's log. A start under an idempotency key an earlier start
	// took returns that start's run rather than starting another.
	StartRun(ctx context.Context, chainName string, payload json.RawMessage, opts StartOptions) (*Run, error)
	ListRuns(ctx context.Context, f store.RunFilter) (RunPage, error)
	Run(ctx context.Context, id string, items bool) (*RunView, error)
	// RunHeader reads a run without its origin or its steps: what it is
	// and where it stands, for following a run whose payload may be tens
	// of MB.
	RunHeader(ctx context.Context, id string) (*Run, error)
	// Step reads one step record of a run, a step inside a split's item
	// too, without reading the others; store.ErrNotFound when the run has
	// none under key (it has not started, or there is no such step).
	Step(ctx context.Context, id, key string) (*Step, error)
	// CancelRun cancels a run, whichever gateway sharing the store
	// advances it: that gateway ends it.
	CancelRun(ctx context.Context, id string) error
	// DeleteRun removes a run that has ended, and its dead-letter entries.
	DeleteRun(ctx context.Context, id string) (*DeleteResult, error)
	// PruneRuns removes the runs that ended before opts.OlderThan, as
	// retention would: keeping those with a dead-letter entry, a parent
	// or an idempotency key still there.
	PruneRuns(ctx context.Context, opts PruneOptions) (*PruneResult, error)
	// Signal answers a waiting approval step: approve or reject, with a
	// comment; who answers is the context's actor.
	Signal(ctx context.Context, id, step, decision, comment string) (*engine.Decision, error)
	// ReplayRun runs a run that ended without success again, from the step
	// it stopped at or from the start, whether or not its failure was
	// dead-lettered.
	ReplayRun(ctx context.Context, id string, opts engine.ReplayOptions) (*Run, error)
	// RedriveSplit runs again the failed (or failed and skipped) items of a
	// top-level split of a run that ended, keeping the others' results,
	// then the steps after it.
	RedriveSplit(ctx context.Context, id, step string, opts engine.RedriveOptions) (*Run, error)
	// Events calls fn with the run's events after the given sequence
	// number; with follow, it goes on with new ones until the run ends or
	// ctx is done.
	Events(ctx context.Context, id string, after uint64, follow bool, fn func(Event) error) error
	DAG(ctx context.Context, id string) (*DAG, error)
	// SplitItems pages through the finished items of the split whose
	// record key is split, those with status only when status is set.
	SplitItems(ctx context.Context, id, split, status string, offset, limit int) (*ItemPage, error)
	// ListDLQ lists a page of the entries f selects, those after f.After
	// when it is set; ListAllDLQ reads on, page after page.
	ListDLQ(ctx context.Context, f store.DLQFilter) ([]*DLQEntry, error)
	// Pause pauses a trigger or schedule (kind PauseTrigger or
	// PauseSchedule) on every gateway sharing the store; Resume lifts the
	// pause (nil when there was none); Pauses lists them.
	Pause(ctx context.Context, kind, name, reason string) (*Pause, error)
	Resume(ctx context.Context, kind, name string) (*Pause, error)
	Pauses(ctx context.Context) ([]*Pause, error)
	DLQEntry(ctx context.Context, id string) (*DLQEntry, error)
	// Replay runs a dead-letter entry again, and returns the run carrying
	// on: for a delivery, the run its first alert started or found, one
	// without an ID when each of its alerts was skipped.
	Replay(ctx context.Context, id string, opts engine.ReplayOptions) (*Run, error)
	ReplayMany(ctx context.Context, f store.DLQFilter, opts engine.ReplayOptions, concurrency int) (*BulkReplay, error)
	DeleteDLQ(ctx context.Context, id string) error
	PurgeDLQ(ctx context.Context, f store.DLQFilter) (int, error)
}

// StartOptions are what a run is started with besides its chain and
// payload.
type StartOptions struct {
	// Labels say what the run is about.
	Labels map[string]string
	// IdempotencyKey is the Idempotency-Key POST /v1/chains/{name}/runs
	// takes: the starts of a chain that carry the same key within
	// idempotencyTTL start one run, however many are sent at once. Empty
	// starts a run each time.
	IdempotencyKey string
}

// RunView is a run with its step records.
type RunView struct {
	*Run
	Steps map[string]*Step `json:"steps"`
	// DistributedSplits are the keys of the run's splits whose items were
	// handed to workers.
	DistributedSplits []string `json:"distributed_splits"`
}

// distributedSplit reports whether rec is a split handed to workers.
func distributedSplit(rec *store.StepRecord) bool {
	return rec.Split != nil && rec.Split.Distributed && !store.IsItemKey(rec.Key)
}

// BulkReplay reports a replay of many dead-letter entries.
type BulkReplay struct {
	Replayed []ReplayedEntry `json:"replayed"`
	Failed   []FailedEntry   `json:"failed"`
}

// ReplayedEntry is one entry that was replayed, and the run carrying on.
type ReplayedEntry struct {
	Entry string `json:"entry"`
	Run   string `json:"run"`
}

// FailedEntry is one entry that could not be replayed, and why.
type FailedEntry struct {
	Entry string `json:"entry"`
	Error string `json:"error"`
}

// DAG is a run's steps with their status, shaped as its chain is.
type DAG struct {
	Run   string       `json:"run"`
	Chain string       `json:"chain"`
	Nodes []*DAGNode   `json:"nodes"`
	Edges []chain.Edge `json:"edges"`
	// Handlers are the chain's on_failure and finally lists.
	Handlers []*DAGHandler `json:"handlers,omitempty"`
}

// DAGHandler is one of a chain's handler lists in a DAG.
type DAGHandler struct {
	Phase string       `json:"phase"`
	Nodes []*DAGNode   `json:"nodes"`
	Edges []chain.Edge `json:"edges"`
}

// DAGNode is one step of a DAG.
type DAGNode struct {
	Name     string     `json:"name"`
	Kind     string     `json:"kind"`
	Provider string     `json:"provider,omitempty"`
	Status   string     `json:"status"`
	Attempts int        `json:"attempts,omitempty"`
	Error    *ErrorInfo `json:"error,omitempty"`
	Join     string     `json:"join,omitempty"`
	Split    *Split     `json:"split,omitempty"`
	ChildRun string     `json:"child_run,omitempty"`
	Children []*DAGNode `json:"children,omitempty"`
}

// Local runs Ops on a gateway's own store and engine.
type Local struct {
	GW  *Gateway
	Hub *Hub // optional: live events from this gateway without polling
}

var _ Ops = (*Local)(nil)

// StartRun implements Ops, through the path the API's start takes: a key
// is claimed where the API claims it, so a key sent to either starts one
// run.
func (l *Local) StartRun(ctx context.Context, chainName string, payload json.RawMessage, opts StartOptions) (*Run, error) {
	if len(bytes.TrimSpace(payload)) == 0 {
		payload = json.RawMessage(`{}`)
	}
	if err := ParseJSON(payload, nil); err != nil {
		return nil, badRequest("invalid_json", "the run's payload must be one JSON value: %v", err)
	}
	if err := checkLabels(opts.Labels); err != nil {
		return nil, err
	}
	in := engine.Input{Payload: payload, StartedBy: store.StartedByAPI, Labels: opts.Labels}
	id, status, replayed, err := l.GW.startKeyed(ctx, chainName, startKeyPrefix(chainName), opts.IdempotencyKey, idempotencyTTL, in)
	if err != nil {
		return nil, err
	}
	if replayed {
		return l.RunHeader(ctx, id)
	}
	l.GW.Log.Info("run started", "chain", chainName, "run", id, "by", engine.Actor(ctx))
	return &Run{ID: id, Chain: chainName, Status: status, StartedBy: store.StartedByAPI, Labels: opts.Labels}, nil
}

// checkLabels refuses labels a run's start through the API would refuse.
func checkLabels(labels map[string]string) error {
	if len(labels) > MaxLabels {
		return badRequest("invalid_parameter", "label: %d labels, at most %d", len(labels), MaxLabels)
	}
	for k, v := range labels {
		switch {
		case k == "" || strings.Contains(k, "="):
			return badRequest("invalid_parameter", "label %q: a label is KEY=VALUE, its key neither empty nor holding =", textx.Short(k, 40))
		case len(k) > MaxLabelKeyBytes || len(v) > MaxLabelValueSize:
			return badRequest("invalid_parameter", "label %q: a label's key is at most %d bytes and its value %d", textx.Short(k+"="+v, 40), MaxLabelKeyBytes, MaxLabelValueSize)
		}
	}
	return nil
}

// ListRuns implements Ops.
func (l *Local) ListRuns(ctx context.Context, f store.RunFilter) (RunPage, error) {
	page, err := l.GW.Store.ListRuns(ctx, f)
	if err != nil {
		return RunPage{}, err
	}
	return apiRunPage(page), nil
}

// Run implements Ops.
func (l *Local) Run(ctx context.Context, id string, items bool) (*RunView, error) {
	run, err := l.GW.Store.Run(ctx, id)
	if err != nil {
		return nil, err
	}
	v := &RunView{Run: apiRun(run), Steps: map[string]*Step{}, DistributedSplits: []string{}}
	err = l.GW.Store.ForEachStep(ctx, id, store.StepScan{SkipItems: !items}, func(rec *store.StepRecord) error {
		v.Steps[rec.Key] = apiStep(rec)
		if distributedSplit(rec) {
			v.DistributedSplits = append(v.DistributedSplits, rec.Key)
		}
		return nil
	})
	return v, err
}

// RunHeader implements Ops.
func (l *Local) RunHeader(ctx context.Context, id string) (*Run, error) {
	run, err := l.GW.Store.RunHeader(ctx, id)
	if err != nil {
		return nil, err
	}
	return apiRun(run), nil
}

// DeleteResult says what deleting a run removed.
type DeleteResult struct {
	Run string `json:"run"`
	// DeadLetters are the run's dead-letter entries, removed with it.
	DeadLetters []string `json:"dead_letters"`
	Freed       Freed    `json:"freed"`
}

// DeleteRun implements Ops.
func (l *Local) DeleteRun(ctx context.Context, id string) (*DeleteResult, error) {
	run, err := l.GW.Store.RunHeader(ctx, id)
	if err != nil && !errors.Is(err, store.ErrDamaged) {
		return nil, err
	}
	if err == nil && !run.Status.Final() {
		return nil, fmt.Errorf("deleting run %s: it is %s; cancel it first: %w", id, run.Status, store.ErrUnfinished)
	}
	entries, err := l.allDLQ(ctx, store.DLQFilter{})
	if err != nil {
		return nil, err
	}
	res := &DeleteResult{Run: id, DeadLetters: []string{}}
	freed, err := l.GW.Store.DeleteRun(ctx, id)
	if err != nil {
		return nil, err
	}
	res.Freed = Freed{Records: freed.Records, Bytes: freed.Bytes}
	for _, e := range entries {
		if e.RunID != id {
			continue
		}
		if err := l.GW.Store.DeleteDLQ(ctx, e.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
			return res, fmt.Errorf("deleting run %s's dead-letter entry %s: %w", id, e.ID, err)
		}
		res.DeadLetters = append(res.DeadLetters, e.ID)
	}
	l.GW.Log.Info("run deleted", "run", id, "dead_letters", len(res.DeadLetters), "freed_records", freed.Records, "freed_bytes", freed.Bytes, "by", engine.Actor(ctx))
	return res, nil
}

// PruneRuns implements Ops.
func (l *Local) PruneRuns(ctx context.Context, opts PruneOptions) (*PruneResult, error) {
	return l.GW.Prune(ctx, opts)
}

// CancelRun implements Ops.
func (l *Local) CancelRun(ctx context.Context, id string) error {
	return l.GW.Engine.Cancel(ctx, id)
}

// eventPoll is how often a followed run's events are read from the store
// when they may come from another gateway.
const eventPoll = 250 * time.Millisecond

// heldPoll is how often a followed run this gateway advances is read from
// the store all the same.
const heldPoll = 2 * time.Second

// Events implements Ops.
func (l *Local) Events(ctx context.Context, id string, after uint64, follow bool, fn func(Event) error) error {
	if _, err := l.GW.Store.RunHeader(ctx, id); err != nil {
		return err
	}
	return l.events(ctx, id, after, follow, func(ev store.Event) error {
		if ev.Seq == 0 {
			return nil
		}
		return fn(EventOf(ev))
	})
}

// events is Events for a run known to exist, calling fn with a zero Event
// whenever it has delivered what there is and waits for more, so that a
// stream writes a batch of events at once and sends heartbeats while the
// run is quiet.
func (l *Local) events(ctx context.Context, id string, after uint64, follow bool, fn func(store.Event) error) error {
	return l.eventsPaced(ctx, id, after, follow, 0, fn)
}

// eventsPaced is events, delivering news at most once per pace: news that
// finds the follower quiet goes at once, news that follows close behind
// gathers until pace has passed since the last delivery, so a busy run's
// commits go out together.
func (l *Local) eventsPaced(ctx context.Context, id string, after uint64, follow bool, pace time.Duration, fn func(store.Event) error) error {
	var w *Watch
	if follow && l.Hub != nil {
		w = l.Hub.Watch(id)
		defer w.Close()
	}
	fromStore := true
	var delivered time.Time
	for {
		var evs []store.Event
		if !fromStore {
			var whole bool
			evs, whole = l.Hub.since(id, after)
			fromStore = !whole
		}
		if fromStore {
			var err error
			if evs, err = l.GW.Store.Events(ctx, id, after, 0); err != nil {
				return err
			}
		}
		// The last event decides: a run that failed and was replayed from
		// the dead-letter queue has an end event in its history but goes on.
		ended := false
		for _, ev := range evs {
			if err := fn(ev); err != nil {
				return err
			}
			after = ev.Seq
			ended = runEnded(ev.Type)
		}
		if !follow || ended {
			return nil
		}
		if len(evs) > 0 {
			// What there is has been delivered: a stream sends it now.
			if err := fn(store.Event{}); err != nil {
				return err
			}
			delivered = time.Now()
		}
		if len(evs) == 0 && fromStore {
			// A run that ended elsewhere with no event to say so, as a
			// damaged or hand-edited one might.
			if run, err := l.GW.Store.RunHeader(ctx, id); err == nil && run.Status.Final() {
				return nil
			}
		}
		// Wait for news: an event here, or a poll for other gateways'. A
		// run this gateway advances publishes every event here, so its
		// store is read only now and then, in case it is taken over.
		poll := eventPoll
		if w != nil && l.GW.Engine.Advancing(id) {
			poll = heldPoll
		}
		wait := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			wait.Stop()
			return ctx.Err()
		case <-wait.C:
			fromStore = true
			if err := fn(store.Event{}); err != nil {
				return err
			}
		case <-watchC(w):
			wait.Stop()
			fromStore = w == nil
			if d := time.Until(delivered.Add(pace)); d > 0 {
				t := time.NewTimer(d)
				select {
				case <-ctx.Done():
					t.Stop()
					return ctx.Err()
				case <-t.C:
				}
			}
		}
	}
}

// watchC is the watch's wake-ups, or none without a watch. The events
// themselves are read from the store, which has them in order.
func watchC(w *Watch) <-chan struct{} {
	if w == nil {
		return nil
	}
	return w.C
}

func runEnded(t store.EventType) bool {
	switch t {
	case store.EventRunSucceeded, store.EventRunFailed, store.EventRunCancelled, store.EventRunTimedOut, store.EventRunSkipped:
		return true
	}
	return false
}

// DAG implements Ops.
func (l *Local) DAG(ctx context.Context, id string) (*DAG, error) {
	v, err := l.Run(ctx, id, false)
	if err != nil {
		return nil, err
	}
	def, err := l.GW.Engine.Definition(ctx, v.Chain, v.ChainHash)
	if err != nil {
		return nil, err
	}
	return v.DAG(def), nil
}

// DAG is the run's steps with their status, shaped as def, the chain the
// run started with, is. It reads the step records the view holds, so that
// a page showing a run and its graph reads them once.
func (v *RunView) DAG(def *chain.Chain) *DAG {
	g := def.Graph()
	d := &DAG{Run: v.ID, Chain: v.Chain, Nodes: dagNodes(g.Nodes, "", v.Steps), Edges: g.Edges}
	for _, h := range g.Handlers {
		d.Handlers = append(d.Handlers, &DAGHandler{Phase: h.Phase, Nodes: dagNodes(h.Nodes, "", v.Steps), Edges: h.Edges})
	}
	return d
}

func dagNodes(nodes []*chain.Node, prefix string, steps map[string]*Step) []*DAGNode {
	out := make([]*DAGNode, 0, len(nodes))
	for _, n := range nodes {
		d := &DAGNode{Name: n.Name, Kind: n.Kind, Provider: n.Provider, Join: n.Join, Status: "not_started"}
		if st := steps[prefix+n.Name]; st != nil {
			d.Status, d.Attempts, d.Error, d.Split, d.ChildRun = st.Status, st.Attempts, st.Error, st.Split, st.Child
		}
		if n.Kind == "parallel" {
			d.Children = dagNodes(n.Children, prefix+n.Name+"/", steps)
		}
		out = append(out, d)
	}
	return out
}

// Step implements Ops.
func (l *Local) Step(ctx context.Context, id, key string) (*Step, error) {
	var found *Step
	err := l.GW.Store.ForEachStep(ctx, id, store.StepScan{Prefix: key, Exact: true}, func(r *store.StepRecord) error {
		found = apiStep(r)
		return nil
	})
	if err == nil && found == nil {
		err = fmt.Errorf("%w: run %s has no record of step %q", store.ErrNotFound, id, key)
	}
	return found, err
}

// SplitItems implements Ops. It reads the split's slot records in item
// order, keeping only the page asked for.
func (l *Local) SplitItems(ctx context.Context, id, split, status string, offset, limit int) (*ItemPage, error) {
	var rec *store.StepRecord
	err := l.GW.Store.ForEachStep(ctx, id, store.StepScan{Prefix: split, SkipItems: !store.IsItemKey(split)}, func(r *store.StepRecord) error {
		if r.Key == split {
			rec = r
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if rec == nil || rec.Split == nil {
		return nil, fmt.Errorf("%w: run %s has no split %q", store.ErrNotFound, id, split)
	}
	page := &ItemPage{Split: split, Total: rec.Split.Total, Counts: map[string]int{}, Status: status, Offset: offset, Items: []*Item{}}
	prefix := split + "["
	err = l.GW.Store.ForEachStep(ctx, id, store.StepScan{Prefix: prefix}, func(r *store.StepRecord) error {
		idx, ok := strings.CutSuffix(r.Key[len(prefix):], "]")
		i, err := strconv.Atoi(idx)
		if !ok || err != nil {
			return nil // a step inside an item, not its slot
		}
		page.Counts[string(r.Status)]++
		if status != "" && string(r.Status) != status {
			return nil
		}
		if page.Matched >= offset && len(page.Items) < limit {
			page.Items = append(page.Items, &Item{Index: i, Key: r.Key, Status: string(r.Status), Body: validJSON(r.Body), Error: apiErrorInfo(r.Error)})
		}
		page.Matched++
		return nil
	})
	if err != nil || len(page.Items) == 0 {
		return page, err
	}
	indexes := make([]int, len(page.Items))
	for i, it := range page.Items {
		indexes[i] = it.Index
		err := l.GW.Store.ForEachStep(ctx, id, store.StepScan{Prefix: it.Key + "/"}, func(r *store.StepRecord) error {
			it.Attempts = max(it.Attempts, r.Attempts)
			return nil
		})
		if err != nil {
			return nil, err
		}
		it.Attempts = max(it.Attempts, 1)
	}
	// Inputs are the items template's, rendered again; secrets it reads are
	// hidden as everywhere else.
	if inputs, err := l.GW.Engine.SplitItemValues(ctx, id, split, indexes); err == nil {
		for _, it := range page.Items {
			if in, ok := inputs[it.Index]; ok {
				it.Input = validJSON(l.GW.Redactor.JSON(in))
			}
		}
	}
	return page, nil
}

// ListDLQ implements Ops.
func (l *Local) ListDLQ(ctx context.Context, f store.DLQFilter) ([]*DLQEntry, error) {
	entries, err := l.GW.Store.ListDLQ(ctx, f)
	if err != nil {
		return nil, err
	}
	out := make([]*DLQEntry, len(entries))
	for i, e := range entries {
		out[i] = apiDLQEntry(e)
	}
	return out, nil
}

// DLQEntry implements Ops.
func (l *Local) DLQEntry(ctx context.Context, id string) (*DLQEntry, error) {
	e, err := l.GW.Store.DLQ(ctx, id)
	if err != nil {
		return nil, err
	}
	return apiDLQEntry(e), nil
}

// Replay implements Ops. A parked delivery is delivered again, through
// its trigger as configured now; the run is that of its first alert, or
// has no id when no alert of it asked for one (each was skipped).
func (l *Local) Replay(ctx context.Context, id string, opts engine.ReplayOptions) (*Run, error) {
	run, _, err := l.replay(ctx, id, opts)
	return run, err
}

// replay is Replay, and for a delivery what each of its alerts did.
func (l *Local) replay(ctx context.Context, id string, opts engine.ReplayOptions) (*Run, []TriggerResult, error) {
	e, err := l.GW.Store.DLQ(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	return l.replayEntry(ctx, e, opts)
}

func (l *Local) replayEntry(ctx context.Context, e *store.DLQEntry, opts engine.ReplayOptions) (*Run, []TriggerResult, error) {
	if e.Kind != store.DLQDelivery {
		run, err := l.GW.Engine.Replay(ctx, e.ID, opts)
		if err != nil {
			return nil, nil, err
		}
		return apiRun(run), nil, nil
	}
	id, results, err := l.GW.redeliver(ctx, e)
	if err != nil {
		return nil, nil, err
	}
	if id == "" {
		return &Run{}, results, nil
	}
	run, err := l.GW.Store.RunHeader(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	return apiRun(run), results, nil
}

// Signal implements Ops.
func (l *Local) Signal(ctx context.Context, id, step, decision, comment string) (*engine.Decision, error) {
	return l.GW.Engine.Signal(ctx, id, step, decision, comment)
}

// ReplayRun implements Ops.
func (l *Local) ReplayRun(ctx context.Context, id string, opts engine.ReplayOptions) (*Run, error) {
	run, err := l.GW.Engine.ReplayRun(ctx, id, opts)
	if err != nil {
		return nil, err
	}
	return apiRun(run), nil
}

// RedriveSplit implements Ops.
func (l *Local) RedriveSplit(ctx context.Context, id, step string, opts engine.RedriveOptions) (*Run, error) {
	run, err := l.GW.Engine.Redrive(ctx, id, step, opts)
	if err != nil {
		return nil, err
	}
	return apiRun(run), nil
}

// ReplayMany implements Ops: it replays every entry the filter selects, at
// most concurrency at a time.
func (l *Local) ReplayMany(ctx context.Context, f store.DLQFilter, opts engine.ReplayOptions, concurrency int) (*BulkReplay, error) {
	if err := opts.Check(); err != nil {
		return nil, fmt.Errorf("replaying: %w", err)
	}
	entries, err := l.allDLQ(ctx, f)
	if err != nil {
		return nil, err
	}
	if concurrency <= 0 {
		concurrency = 4
	}
	res := &BulkReplay{Replayed: []ReplayedEntry{}, Failed: []FailedEntry{}}
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		sem = make(chan struct{}, concurrency)
	)
	for _, e := range entries {
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func(e *store.DLQEntry) {
			defer func() { <-sem; wg.Done() }()
			run, _, err := l.replayEntry(ctx, e, opts)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				res.Failed = append(res.Failed, FailedEntry{Entry: e.ID, Error: err.Error()})
				return
			}
			res.Replayed = append(res.Replayed, ReplayedEntry{Entry: e.ID, Run: run.ID})
		}(e)
	}
	wg.Wait()
	return res, ctx.Err()
}

// allDLQ lists every entry a filter selects, past the store's page limit.
func (l *Local) allDLQ(ctx context.Context, f store.DLQFilter) ([]*store.DLQEntry, error) {
	return allPages(f, func(f store.DLQFilter) ([]*store.DLQEntry, error) { return l.GW.Store.ListDLQ(ctx, f) },
		func(e *store.DLQEntry) string { return e.ID })
}

// ListAllDLQ lists every entry a filter selects through ops, up to f.Limit
// when it is set: a page is at most MaxPageLimit entries, wherever ops
// reads them.
func ListAllDLQ(ctx context.Context, ops Ops, f store.DLQFilter) ([]*DLQEntry, error) {
	return allPages(f, func(f store.DLQFilter) ([]*DLQEntry, error) { return ops.ListDLQ(ctx, f) },
		func(e *DLQEntry) string { return e.ID })
}

// allPages lists every entry f selects with list, a page at a time, each
// page after the last entry of the one before (id says an entry's id).
func allPages[E any](f store.DLQFilter, list func(store.DLQFilter) ([]E, error), id func(E) string) ([]E, error) {
	limit := f.Limit
	var out []E
	for {
		f.Limit = dlqPage
		if limit > 0 {
			f.Limit = min(dlqPage, limit-len(out))
		}
		page, err := list(f)
		if err != nil {
			return nil, err
		}
		out = append(out, page...)
		if len(page) < f.Limit || (limit > 0 && len(out) == limit) {
			return out, nil
		}
		f.After = id(page[len(page)-1])
	}
}

// dlqPage is how many entries a bulk operation reads at a time: as many
// as the API lists at once.
const dlqPage = MaxPageLimit

// DeleteDLQ implements Ops.
func (l *Local) DeleteDLQ(ctx context.Context, id string) error {
	return l.GW.Store.DeleteDLQ(ctx, id)
}

// PurgeDLQ implements Ops: it deletes every entry the filter selects.
func (l *Local) PurgeDLQ(ctx context.Context, f store.DLQFilter) (int, error) {
	entries, err := l.allDLQ(ctx, f)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range entries {
		err := l.GW.Store.DeleteDLQ(ctx, e.ID)
		switch {
		case errors.Is(err, store.ErrNotFound):
		case err != nil:
			return n, fmt.Errorf("purging entry %s: %w", e.ID, err)
		default:
			n++
		}
	}
	return n, nil
}
