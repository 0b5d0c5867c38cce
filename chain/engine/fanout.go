package engine

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/internal/jsonx"
	"github.com/chaingate/gateway/internal/textx"
	"github.com/chaingate/gateway/templates"
)

// A distributed split hands its items to workers instead of running them
// here. The run's record of the split says so before a single item goes
// out; the items then travel over a broker and their results meet in a
// barrier (package fanout implements both). The run parks on the split: it
// holds no item in memory, follows the counts as they are reported, takes
// in the dead-letter entries and events the items produce, and once every
// item has a result joins as a local split does, reading the results in
// item order from the barrier. A split that does not succeed first takes
// the results that are in into its store, as the slot records a local
// split keeps, so that a replay runs only the rest. A restart takes the
// hand-off up again where the store says it was.

// Fanout hands the items of distributed splits to workers.
type Fanout interface {
	// Threshold is how many items make a split in auto mode distributed.
	Threshold() int
	// Attach hands a split's items to workers, or takes up a hand-off
	// begun before a restart, and reports what the workers did to news,
	// one report at a time: the next comes after Imported. news must not
	// block for long.
	Attach(job *FanoutJob, news func(*FanoutNews)) FanoutHandle
}

// FanoutJob is a split handed to workers.
type FanoutJob struct {
	// Work is what a worker needs to run an item.
	Work *WorkSplit
	// Items are the rendered items, in order.
	Items ItemList
	// Gen numbers the hand-off: a replay hands what is left over again
	// under a new one.
	Gen int
	// Imported counts the results of this hand-off the run holds already.
	Imported int
	// Tolerated is how many items may fail before the split does.
	Tolerated int
	// MaxInFlight bounds the items out at once, when the split sets
	// max_concurrency; 0 leaves it to the fan-out's own bound.
	MaxInFlight int
	// Held says the decision to hand the items out is not durable yet: they
	// wait for Release. Whatever a decision that never became durable left
	// under the hand-off's name is replaced.
	Held bool
	// Fence is the run's lease fence: a gateway that lost the run does not
	// replace what the one that took it over handed out.
	Fence uint64
	// Seed reads the slot records the run holds from an earlier hand-off
	// (a replay's): those items are not handed out again. Nil when there
	// are none.
	Seed func(fn func(*store.StepRecord) error) error
}

// FanoutState is where a hand-off stands.
type FanoutState string

const (
	// FanoutOpen: items are out.
	FanoutOpen FanoutState = "open"
	// FanoutComplete: every item has a result.
	FanoutComplete FanoutState = "complete"
	// FanoutFailed: more items failed than the split tolerates.
	FanoutFailed FanoutState = "failed"
	// FanoutGone: the hand-off's state vanished (Redis was flushed, or it
	// expired), so the results still out can never come back.
	FanoutGone FanoutState = "gone"
)

// FanoutNews is what the workers did since the last report.
type FanoutNews struct {
	// Succeeded, Failed and Skipped count the items with a result.
	Succeeded, Failed, Skipped int
	// DLQ and Events are what the items parked and logged on the workers.
	DLQ    []*store.DLQEntry
	Events []store.Event
	// Imported is how far into the log of DLQ entries and events the run
	// is once these are in.
	Imported int
	// Published is how many items are out.
	Published int
	State     FanoutState
	// Message says why the state is failed or gone.
	Message string
	// Records are slot records of finished items, sent after Salvage;
	// Salvaged marks the last of them.
	Records  []*store.StepRecord
	Salvaged bool
}

// FanoutHandle is a run's side of one hand-off.
type FanoutHandle interface {
	// Release says the decision to hand the items out is durable: the
	// items of a job attached Held may go out.
	Release()
	// Imported says the news up to n is durable in the run's store.
	Imported(n int)
	// Results calls fn with every item's slot record, in item order, once
	// every item has one. fn must not keep the record.
	Results(ctx context.Context, fn func(*store.StepRecord) error) error
	// Salvage sends the slot records of the items with a result as news,
	// the last with Salvaged set, for a split that will not succeed.
	Salvage()
	// End says the split is over for the run, with the status its record
	// has now durably: workers drop what is left of it, and the
	// hand-off's state is removed.
	End(status store.StepStatus)
	// Detach stops the reports and leaves the hand-off as it is, for this
	// gateway after a restart, or another one, to take up.
	Detach()
}

// handedItems is the run's side of a split whose items workers run.
type handedItems struct {
	// items are the rendered items, until every one is out.
	items ItemList
	h     FanoutHandle
	// attachAfter is the batch recording that the split is distributed;
	// nothing goes out before it is durable, and held is set until the
	// handle is told it is.
	attachAfter uint64
	held        bool
	state       FanoutState
	message     string
	published   int
	enqReported int
	enqAt       time.Time
	// imports are news taken in and not yet durable.
	imports []importAck
	// A split that will not succeed salvages its results first: why it
	// ends, and until when it waits for them.
	ending     store.StepStatus
	endMessage string
	salvageBy  time.Time
	salvaged   bool
}

type importAck struct {
	batch uint64
	n     int
}

// distribute decides where a new split's items run.
func (r *runner) distribute(s *chain.Step, n int) (bool, *store.ErrorInfo) {
	// An item a worker runs runs its nested splits itself; an empty split
	// has nothing to hand out.
	if r.onWorker() || n == 0 || r.e.localSplits {
		return false, nil
	}
	if keyedItems(s) {
		// Items whose steps take concurrency keys run here (stepslots.go).
		return false, nil
	}
	switch s.Split.Mode {
	case chain.SplitLocal:
		return false, nil
	case chain.SplitDistributed:
		if r.e.fanout == nil {
			return false, &store.ErrorInfo{
				Message: fmt.Sprintf("split %q is distributed, but this gateway has no [gateway.fanout] to hand its items to", s.Name), Code: "no_broker",
			}
		}
		return true, nil
	}
	return r.e.fanout != nil && n >= r.e.fanout.Threshold(), nil
}

// progress follows a distributed split, and joins once every item has a
// result. The hand-off is attached as soon as the split is decided, so
// that its state is made in Redis while the decision is written; its items
// go out once that is durable (durable releases them).
func (f *handedItems) progress(r *runner, sp *split, now time.Time) ([]launch, bool) {
	if f.h == nil {
		if r.e.fanout == nil {
			r.finishSplit(sp, store.StepFailed, fmt.Sprintf("split %q was handed to workers, but this gateway has no [gateway.fanout] to follow it", sp.step.Name))
			return nil, true
		}
		f.attach(r, sp)
	}
	if f.state == FanoutGone {
		r.finishSplit(sp, store.StepFailed, f.message)
		return nil, true
	}
	if f.ending == "" {
		tolerated := sp.step.Split.Tolerated(sp.total)
		switch {
		case !sp.deadline.IsZero() && !now.Before(sp.deadline):
			f.ending, f.endMessage = store.StepTimedOut, fmt.Sprintf("split timed out after %s", sp.deadline.Sub(sp.rec.StartedAt).Round(time.Second))
		case sp.rec.Split.Failed > tolerated:
			f.ending, f.endMessage = store.StepFailed, fmt.Sprintf("%s failed, more than the %d tolerated", textx.Count(sp.rec.Split.Failed, "item", "items"), tolerated)
		case f.state == FanoutFailed:
			f.ending, f.endMessage = store.StepFailed, f.message
		}
		if f.ending != "" {
			f.salvageBy = now.Add(salvageWait)
			r.addTimer(f.salvageBy, sp.key)
			f.h.Salvage()
		}
	}
	if f.ending != "" {
		if !f.salvaged && now.Before(f.salvageBy) {
			return nil, false
		}
		if !f.salvaged {
			r.log.Warn("the results of a split that did not succeed could not all be kept; a replay runs its items again", "split", sp.key)
		}
		r.finishSplit(sp, f.ending, f.endMessage)
		return nil, true
	}
	f.reportEnqueued(r, sp, now)
	r.reportProgress(sp, now)
	return r.joinWhenDone(sp, nil)
}

// The items run on workers: none is started, ended or read here.
func (f *handedItems) value(int) any                 { return nil }
func (f *handedItems) starting(*runner, *split, int) {}
func (f *handedItems) ended(*runner, *split)         {}

// results reads the items' slot records from the barrier, in item order.
func (f *handedItems) results(_ *runner, _ *split, fn func(*store.StepRecord) error) error {
	return f.h.Results(context.Background(), fn)
}

// readsStore is false: the results are read from the barrier.
func (f *handedItems) readsStore() bool { return false }

// salvageWait bounds how long a split that will not succeed waits for its
// results to be taken into the store.
const salvageWait = 30 * time.Second

// attach hands the split's items out, or takes the hand-off up again.
func (f *handedItems) attach(r *runner, sp *split) {
	st := sp.rec.Split
	job := &FanoutJob{
		Work:      r.workSplit(sp),
		Items:     f.items,
		Gen:       st.Gen,
		Imported:  st.Imported,
		Tolerated: sp.step.Split.Tolerated(sp.total),
		Held:      r.ackedSeq < f.attachAfter,
		Fence:     r.leaseFence(),
	}
	f.held = job.Held
	if n := sp.step.Split.MaxConcurrency; n > 0 {
		job.MaxInFlight = n
	}
	if r.doneItems[sp.key] != nil {
		delete(r.doneItems, sp.key)
		st, id, prefix := r.e.store, r.run.ID, sp.key+"["
		job.Seed = func(fn func(*store.StepRecord) error) error {
			return st.ForEachStep(context.Background(), id, store.StepScan{Prefix: prefix}, func(rec *store.StepRecord) error {
				if _, _, ok := itemSlot(rec.Key); !ok {
					return nil
				}
				return fn(rec)
			})
		}
	}
	key := sp.key
	f.h = r.e.fanout.Attach(job, func(n *FanoutNews) {
		r.give(outcome{key: key, attempt: -1, news: n}, nil)
	})
	f.state = FanoutOpen
}

// fanNews takes in what the workers of a split did.
func (r *runner) fanNews(key string, n *FanoutNews) {
	sp := r.splits[key]
	if sp == nil {
		return // the split ended meanwhile
	}
	f, ok := sp.place.(*handedItems)
	if !ok || f.h == nil {
		return
	}
	st := sp.rec.Split
	st.Succeeded, st.Failed, st.Skipped = n.Succeeded, n.Failed, n.Skipped
	for _, rec := range n.Records {
		r.put(rec)
		// Like a local item's, the slot is written and not kept.
		delete(r.recs, rec.Key)
	}
	f.salvaged = f.salvaged || n.Salvaged
	r.dlq = append(r.dlq, n.DLQ...)
	for _, ev := range n.Events {
		r.run.Seq++
		ev.RunID, ev.Chain, ev.Seq = r.run.ID, r.run.Chain, r.run.Seq
		r.events = append(r.events, ev)
	}
	st.Imported = max(st.Imported, n.Imported)
	r.put(sp.rec)
	f.imports = append(f.imports, importAck{batch: r.nextBatch, n: n.Imported})
	f.state, f.message = n.State, n.Message
	f.published = max(f.published, n.Published)
	if f.published == sp.total {
		// Every item is out: only a restart, which renders them again,
		// would hand one out again.
		f.items = nil
	}
	r.markDirty(sp.owner)
}

// durable passes on which news is durable now.
func (f *handedItems) durable(seq uint64) {
	if f.h == nil {
		return
	}
	if f.held && seq >= f.attachAfter {
		f.held = false
		f.h.Release()
	}
	for len(f.imports) > 0 && f.imports[0].batch <= seq {
		f.h.Imported(f.imports[0].n)
		f.imports = f.imports[1:]
	}
}

// stop ends the hand-off once the split's final record is durable:
// workers drop what is left of it, and its state is removed.
func (f *handedItems) stop(r *runner, sp *split, status store.StepStatus) {
	if f.h == nil {
		return
	}
	if status == store.StepSucceeded && !sp.owner.inItem() {
		st := sp.rec.Split
		r.event(store.EventSplitFaninCompleted, sp.key, 0, fmt.Sprintf("every result is back from the workers: %d succeeded, %d failed, %d skipped", st.Succeeded, st.Failed, st.Skipped))
	}
	h := f.h
	f.h = nil
	r.whenDurable(func() { h.End(status) }, h.Detach)
}

// detach lets go of the hand-off as the runner stops.
func (f *handedItems) detach() {
	if f.h != nil {
		f.h.Detach()
		f.h = nil
	}
}

// reportEnqueued appends an event on how many items are out, at most
// twice a second.
func (f *handedItems) reportEnqueued(r *runner, sp *split, now time.Time) {
	if f.published == f.enqReported || (now.Sub(f.enqAt) < 500*time.Millisecond && f.published < sp.total) {
		return
	}
	f.enqReported, f.enqAt = f.published, now
	r.event(store.EventSplitItemsEnqueued, sp.key, 0, fmt.Sprintf("%d/%d items handed to workers", f.published, sp.total))
	r.events[len(r.events)-1].Data, _ = jsonx.Marshal(map[string]int{"published": f.published, "total": sp.total})
}

// WorkSplit is what a worker needs to run the items of a split: the run's
// identity and origin, the definition, and the results of the steps the
// items may read.
type WorkSplit struct {
	Run        *store.Run `json:"run"`
	Definition []byte     `json:"definition"`
	// Key is the split step's record key, Step its name.
	Key  string `json:"key"`
	Step string `json:"step"`
	// Lineage is where the split sits: the items enclosing it, outermost
	// first; empty at the run's top level.
	Lineage []Frame `json:"lineage,omitempty"`
	// Prev names the step prev reads for an item's first step.
	Prev string `json:"prev,omitempty"`
	// Records are the finished steps the items may read.
	Records  []*store.StepRecord `json:"records,omitempty"`
	Total    int                 `json:"total"`
	Deadline time.Time           `json:"deadline,omitzero"`
}

// readsOrigin reports whether steps, nested ones included, may read the
// run's origin: a template's path from origin, or a condition naming it
// (conditions are told apart by their text, which errs on reading it).
func readsOrigin(steps []*chain.Step) bool {
	reads := false
	fromOrigin := func(t *templates.Template) {
		if t == nil {
			return
		}
		for _, ref := range t.Refs() {
			reads = reads || ref.Root == "origin"
		}
	}
	named := func(c fmt.Stringer) {
		reads = reads || strings.Contains(c.String(), "origin")
	}
	chain.WalkSteps(steps, func(s *chain.Step) {
		fromOrigin(s.Payload)
		fromOrigin(s.Input)
		if s.Split != nil {
			fromOrigin(s.Split.Items)
		}
		if s.When != nil {
			named(s.When)
		}
		for _, b := range s.Branches {
			named(b.Cond)
		}
	})
	return reads
}

// workSplit describes sp for the workers its items go to.
func (r *runner) workSplit(sp *split) *WorkSplit {
	run := &store.Run{
		ID: r.run.ID, Chain: r.run.Chain, ChainHash: r.run.ChainHash, Status: store.RunRunning,
		Origin: r.run.Origin, Deadline: r.run.Deadline, CreatedAt: r.run.CreatedAt,
	}
	if !readsOrigin(sp.step.Split.Steps) {
		// Every worker would read, and hold, a payload its items never look
		// at: the array a split of a million items goes over, say.
		run.Origin.Payload, run.Origin.Metadata = nil, nil
	}
	src, err := r.e.source(r.cfg, r.run.Chain)
	if err != nil {
		// The config the run holds made this document once already.
		r.log.Error("encoding the definition for workers", "err", err)
	}
	ws := &WorkSplit{Run: run, Definition: src, Key: sp.key, Step: sp.step.Name, Lineage: sp.owner.lineage, Total: sp.total, Deadline: sp.deadline}
	for q := sp.owner; q != nil; {
		if n := len(q.path); n > 0 {
			ws.Prev = q.path[n-1]
			break
		}
		if q.split == nil {
			break
		}
		q = q.split.owner
	}
	prefixes := []string{""}
	for i := range sp.owner.lineage {
		prefixes = append(prefixes, keyPrefix(sp.owner.lineage[:i+1]))
	}
	for _, rec := range r.recs {
		if rec.Status.Final() && visibleFrom(rec.Key, prefixes) {
			ws.Records = append(ws.Records, rec)
		}
	}
	return ws
}

// visibleFrom reports whether a record belongs to one of the lists whose
// key prefixes are given: it is directly in one, not inside a deeper item.
func visibleFrom(key string, prefixes []string) bool {
	for _, p := range prefixes {
		if rest, ok := strings.CutPrefix(key, p); ok && !store.IsItemKey(rest) {
			return true
		}
	}
	return false
}
