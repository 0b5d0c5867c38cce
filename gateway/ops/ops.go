// Package ops runs the operations on runs, dead letters and pauses (api.Ops)
// on a gateway's own store and engine: what the API serves, the console
// acts through, and the command line runs when it has the store at hand.
//
// It is the gateway's own package, with no compatibility promise.
package ops

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/gateway/audit"
	"github.com/chaingate/gateway/gateway/door"
	"github.com/chaingate/gateway/gateway/events"
	"github.com/chaingate/gateway/gateway/upkeep"
	"github.com/chaingate/gateway/internal/textx"
)

// Local runs Ops on a gateway's own store and engine.
type Local struct {
	GW  *gateway.Gateway
	Hub *events.Hub // optional: live events from this gateway without polling
	// Prunes is told what a prune by hand removed; optional.
	Prunes upkeep.Observer
	// Door replays deliveries and pauses triggers; without it, one that
	// tells no one.
	Door *door.Door
}

// OpenStore opens the store at state for Ops without a server: the command
// line's, when no gateway holds the store. A replay there also needs cfg's
// chains and providers. Close the gateway when done.
func OpenStore(ctx context.Context, cfg *chain.Config, state string, logger *slog.Logger) (*Local, error) {
	gw, err := gateway.Open(ctx, gateway.Options{Config: cfg, State: state, Logger: logger, Existing: true})
	if errors.Is(err, store.ErrInUse) {
		return nil, fmt.Errorf("%w; a gateway is running on it: reach it with --server", err)
	}
	if err != nil {
		return nil, err
	}
	return &Local{GW: gw}, nil
}

func (l *Local) door() *door.Door {
	if l.Door != nil {
		return l.Door
	}
	return door.New(l.GW, nil)
}

var _ api.Ops = (*Local)(nil)

// StartRun implements Ops, through the path the API's start takes: a key
// is claimed where the API claims it, so a key sent to either starts one
// run.
func (l *Local) StartRun(ctx context.Context, chainName string, payload json.RawMessage, opts api.StartOptions) (*api.Run, error) {
	if len(bytes.TrimSpace(payload)) == 0 {
		payload = json.RawMessage(`{}`)
	}
	if err := api.ParseJSON(payload, nil); err != nil {
		return nil, api.BadRequest("invalid_json", "the run's payload must be one JSON value: %v", err)
	}
	if err := checkLabels(opts.Labels); err != nil {
		return nil, err
	}
	in := engine.Input{Payload: payload, StartedBy: store.StartedByAPI, Labels: opts.Labels}
	id, status, replayed, err := l.GW.StartKeyed(ctx, chainName, StartKeyPrefix(chainName), opts.IdempotencyKey, IdempotencyTTL, in)
	if err != nil {
		return nil, err
	}
	audit.NoteRun(ctx, id)
	if replayed {
		return l.RunHeader(ctx, id)
	}
	l.GW.Log.Info("run started", "chain", chainName, "run", id, "by", engine.Actor(ctx))
	return &api.Run{ID: id, Chain: chainName, Status: status, StartedBy: store.StartedByAPI, Labels: opts.Labels}, nil
}

// checkLabels refuses labels a run's start through the API would refuse.
func checkLabels(labels map[string]string) error {
	if len(labels) > api.MaxLabels {
		return api.BadRequest("invalid_parameter", "label: %d labels, at most %d", len(labels), api.MaxLabels)
	}
	for k, v := range labels {
		switch {
		case k == "" || strings.Contains(k, "="):
			return api.BadRequest("invalid_parameter", "label %q: a label is KEY=VALUE, its key neither empty nor holding =", textx.Short(k, 40))
		case len(k) > api.MaxLabelKeyBytes || len(v) > api.MaxLabelValueSize:
			return api.BadRequest("invalid_parameter", "label %q: a label's key is at most %d bytes and its value %d", textx.Short(k+"="+v, 40), api.MaxLabelKeyBytes, api.MaxLabelValueSize)
		}
	}
	return nil
}

// ListRuns implements Ops.
func (l *Local) ListRuns(ctx context.Context, f store.RunFilter) (api.RunPage, error) {
	page, err := l.GW.Store.ListRuns(ctx, f)
	if err != nil {
		return api.RunPage{}, err
	}
	return api.RunPageOf(page), nil
}

// Run implements Ops.
func (l *Local) Run(ctx context.Context, id string, items bool) (*api.RunView, error) {
	return api.ReadRunView(ctx, l.GW.Store, id, items)
}

// RunHeader implements Ops.
func (l *Local) RunHeader(ctx context.Context, id string) (*api.Run, error) {
	run, err := l.GW.Store.RunHeader(ctx, id)
	if err != nil {
		return nil, err
	}
	return api.RunOf(run), nil
}

// DeleteRun implements Ops.
func (l *Local) DeleteRun(ctx context.Context, id string) (*api.DeleteResult, error) {
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
	res := &api.DeleteResult{Run: id, DeadLetters: []string{}}
	freed, err := l.GW.Store.DeleteRun(ctx, id)
	if err != nil {
		return nil, err
	}
	res.Freed = api.Freed{Records: freed.Records, Bytes: freed.Bytes}
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
func (l *Local) PruneRuns(ctx context.Context, opts api.PruneOptions) (*api.PruneResult, error) {
	return upkeep.NewRetention(l.GW, l.Prunes).Prune(ctx, opts)
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
func (l *Local) Events(ctx context.Context, id string, after uint64, follow bool, fn func(api.Event) error) error {
	if _, err := l.GW.Store.RunHeader(ctx, id); err != nil {
		return err
	}
	return l.StoreEvents(ctx, id, after, follow, func(ev store.Event) error {
		if ev.Seq == 0 {
			return nil
		}
		return fn(api.EventOf(ev))
	})
}

// StoreEvents is Events for a run known to exist, calling fn with a zero Event
// whenever it has delivered what there is and waits for more, so that a
// stream writes a batch of events at once and sends heartbeats while the
// run is quiet.
func (l *Local) StoreEvents(ctx context.Context, id string, after uint64, follow bool, fn func(store.Event) error) error {
	return l.StoreEventsPaced(ctx, id, after, follow, 0, fn)
}

// StoreEventsPaced is StoreEvents, delivering news at most once per pace: news that
// finds the follower quiet goes at once, news that follows close behind
// gathers until pace has passed since the last delivery, so a busy run's
// commits go out together.
func (l *Local) StoreEventsPaced(ctx context.Context, id string, after uint64, follow bool, pace time.Duration, fn func(store.Event) error) error {
	var w *events.Watch
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
			evs, whole = l.Hub.Since(id, after)
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
func watchC(w *events.Watch) <-chan struct{} {
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
func (l *Local) DAG(ctx context.Context, id string) (*api.DAG, error) {
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

// Step implements Ops.
func (l *Local) Step(ctx context.Context, id, key string) (*api.Step, error) {
	var found *api.Step
	err := l.GW.Store.ForEachStep(ctx, id, store.StepScan{Prefix: key, Exact: true}, func(r *store.StepRecord) error {
		found = api.StepOf(r)
		return nil
	})
	if err == nil && found == nil {
		err = fmt.Errorf("%w: run %s has no record of step %q", store.ErrNotFound, id, key)
	}
	return found, err
}

// SplitItems implements Ops. It reads the split's slot records in item
// order, keeping only the page asked for.
func (l *Local) SplitItems(ctx context.Context, id, split, status string, offset, limit int) (*api.ItemPage, error) {
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
	page := &api.ItemPage{Split: split, Total: rec.Split.Total, Counts: map[string]int{}, Status: status, Offset: offset, Items: []*api.Item{}}
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
			page.Items = append(page.Items, &api.Item{Index: i, Key: r.Key, Status: string(r.Status), Body: api.ValidJSON(r.Body), Error: api.ErrorInfoOf(r.Error)})
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
				it.Input = api.ValidJSON(l.GW.Redactor.JSON(in))
			}
		}
	}
	return page, nil
}

// ListDLQ implements Ops.
func (l *Local) ListDLQ(ctx context.Context, f store.DLQFilter) ([]*api.DLQEntry, error) {
	entries, err := l.GW.Store.ListDLQ(ctx, f)
	if err != nil {
		return nil, err
	}
	out := make([]*api.DLQEntry, len(entries))
	for i, e := range entries {
		out[i] = api.DLQEntryOf(e)
	}
	return out, nil
}

// DLQEntry implements Ops.
func (l *Local) DLQEntry(ctx context.Context, id string) (*api.DLQEntry, error) {
	e, err := l.GW.Store.DLQ(ctx, id)
	if err != nil {
		return nil, err
	}
	return api.DLQEntryOf(e), nil
}

// Replay implements Ops. A parked delivery is delivered again, through
// its trigger as configured now; the run is that of its first alert, or
// has no id when no alert of it asked for one (each was skipped).
func (l *Local) Replay(ctx context.Context, id string, opts engine.ReplayOptions) (*api.Run, error) {
	run, _, err := l.ReplayWithResults(ctx, id, opts)
	return run, err
}

// ReplayWithResults is Replay, and for a delivery what each of its alerts did.
func (l *Local) ReplayWithResults(ctx context.Context, id string, opts engine.ReplayOptions) (*api.Run, []api.TriggerResult, error) {
	e, err := l.GW.Store.DLQ(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	return l.replayEntry(ctx, e, opts)
}

func (l *Local) replayEntry(ctx context.Context, e *store.DLQEntry, opts engine.ReplayOptions) (*api.Run, []api.TriggerResult, error) {
	if e.Kind != store.DLQDelivery {
		run, err := l.GW.Engine.Replay(ctx, e.ID, opts)
		if err != nil {
			return nil, nil, err
		}
		audit.NoteRun(ctx, run.ID)
		return api.RunOf(run), nil, nil
	}
	id, results, err := l.door().Redeliver(ctx, e)
	if err != nil {
		return nil, nil, err
	}
	if id == "" {
		return &api.Run{}, results, nil
	}
	audit.NoteRun(ctx, id)
	run, err := l.GW.Store.RunHeader(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	return api.RunOf(run), results, nil
}

// Signal implements Ops.
func (l *Local) Signal(ctx context.Context, id, step, decision, comment string) (*engine.Decision, error) {
	d, err := l.GW.Engine.Signal(ctx, id, step, decision, comment)
	if err == nil {
		audit.NoteDetail(ctx, decision+" step "+step)
	}
	return d, err
}

// ReplayRun implements Ops.
func (l *Local) ReplayRun(ctx context.Context, id string, opts engine.ReplayOptions) (*api.Run, error) {
	run, err := l.GW.Engine.ReplayRun(ctx, id, opts)
	if err != nil {
		return nil, err
	}
	audit.NoteRun(ctx, run.ID)
	return api.RunOf(run), nil
}

// RedriveSplit implements Ops.
func (l *Local) RedriveSplit(ctx context.Context, id, step string, opts engine.RedriveOptions) (*api.Run, error) {
	run, err := l.GW.Engine.Redrive(ctx, id, step, opts)
	if err != nil {
		return nil, err
	}
	audit.NoteRun(ctx, run.ID)
	return api.RunOf(run), nil
}

// ReplayMany implements Ops: it replays every entry the filter selects, at
// most concurrency at a time.
func (l *Local) ReplayMany(ctx context.Context, f store.DLQFilter, opts engine.ReplayOptions, concurrency int) (*api.BulkReplay, error) {
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
	res := &api.BulkReplay{Replayed: []api.ReplayedEntry{}, Failed: []api.FailedEntry{}}
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
				res.Failed = append(res.Failed, api.FailedEntry{Entry: e.ID, Error: err.Error()})
				return
			}
			res.Replayed = append(res.Replayed, api.ReplayedEntry{Entry: e.ID, Run: run.ID})
		}(e)
	}
	wg.Wait()
	return res, ctx.Err()
}

// allDLQ lists every entry a filter selects, past the store's page limit.
func (l *Local) allDLQ(ctx context.Context, f store.DLQFilter) ([]*store.DLQEntry, error) {
	return api.AllPages(f, func(f store.DLQFilter) ([]*store.DLQEntry, error) { return l.GW.Store.ListDLQ(ctx, f) },
		func(e *store.DLQEntry) string { return e.ID })
}

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

// IdempotencyTTL is how long an Idempotency-Key keeps returning its run.
const IdempotencyTTL = 24 * time.Hour

// StartKeyPrefix is where a chain's start keys are claimed in the store:
// the same key given to two chains starts a run of each.
func StartKeyPrefix(chainName string) string { return "run/" + chainName + "/" }

// ListAudit implements api.Ops.
func (l *Local) ListAudit(ctx context.Context, f api.AuditFilter) (api.AuditPage, error) {
	return api.ListAuditIn(ctx, l.GW.Store, f)
}

// ExportAudit implements api.Ops.
func (l *Local) ExportAudit(ctx context.Context, f api.AuditFilter, fn func(*api.AuditEntry) error) error {
	return api.ExportAuditIn(ctx, l.GW.Store, f, fn)
}
