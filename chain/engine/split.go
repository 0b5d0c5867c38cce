package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/internal/jsonx"
	"github.com/chaingate/gateway/internal/textx"
)

// DefaultSplitConcurrency is how many items a split runs at once when it
// does not set max_concurrency.
const DefaultSplitConcurrency = 100

// split is a running split step. Only the items in flight are in memory:
// each finished item is written as one record (STEP[INDEX]) and dropped, and
// the split's result is streamed from those records when every item is done.
type split struct {
	step     *chain.Step
	key      string
	rec      *store.StepRecord // the split's own record, with its progress
	owner    *seq              // the list holding the split step
	place    placement         // where the items run
	total    int
	width    int // digits of the item index in keys, so they sort in order
	deadline time.Time

	cursor   int   // the next never-started item
	ready    []int // items to start before cursor moves on (resume)
	active   map[int]*seq
	dirty    []*seq
	advances []advance // raises of rec.Split.Next not yet durable

	joining    bool
	joinAfter  uint64
	reportedAt time.Time
	reported   int
}

// advance records that items below next may start once batch is durable.
type advance struct {
	next  int
	batch uint64
}

func (sp *split) limit() int {
	if n := sp.step.Split.MaxConcurrency; n > 0 {
		return n
	}
	return DefaultSplitConcurrency
}

func (sp *split) processed() int {
	st := sp.rec.Split
	return st.Succeeded + st.Failed + st.Skipped
}

func (sp *split) itemKey(i int) string {
	return sp.key + "[" + pad(i, sp.width) + "]"
}

// ItemKey is the key of item i's slot record in a split of total items
// whose own record is splitKey.
func ItemKey(splitKey string, i, total int) string {
	return splitKey + "[" + pad(i, indexWidth(total)) + "]"
}

// keyPrefix is where an item's records live: each level of its lineage as
// SPLIT[INDEX], outermost first.
func keyPrefix(lineage []Frame) string {
	var b strings.Builder
	for _, f := range lineage {
		b.WriteString(f.Split)
		b.WriteByte('[')
		b.WriteString(pad(f.Index, indexWidth(f.Total)))
		b.WriteString("]/")
	}
	return b.String()
}

// indexWidth is the digits an item index takes in keys, so they sort in
// item order.
func indexWidth(total int) int { return len(strconv.Itoa(max(total-1, 0))) }

func pad(i, width int) string {
	s := strconv.Itoa(i)
	if len(s) < width {
		s = strings.Repeat("0", width-len(s)) + s
	}
	return s
}

// renderItems renders a split's items template to its array. Items that
// are an array of the run's payload, as `<<origin.payload.hosts>>` names
// them, are indexed in the payload's raw JSON instead of decoded.
func (r *runner) renderItems(s *chain.Step, sc *scope) (ItemList, *store.ErrorInfo) {
	if ref, ok := s.Split.Items.SinglePath(); ok && ref.Root == "origin" && len(ref.Path) > 1 && ref.Path[0] == "payload" {
		raw := r.run.Origin.Payload
		if arr, found := rawPath(raw, ref.Path[1:]); found {
			if items, ok := indexItems(raw, arr); ok {
				if errInfo := r.checkItemCount(s, items.Len()); errInfo != nil {
					return nil, errInfo
				}
				return items, nil
			}
		}
	}
	v, err := s.Split.Items.Render(sc)
	if err != nil {
		return nil, &store.ErrorInfo{Message: fmt.Sprintf("rendering items of split %q: %v", s.Name, err), Code: "template"}
	}
	var items []any
	switch x := v.(type) {
	case []any:
		items = x
	case []map[string]any:
		items = make([]any, len(x))
		for i, m := range x {
			items[i] = m
		}
	default:
		return nil, &store.ErrorInfo{Message: fmt.Sprintf("items of split %q rendered to %s, not an array", s.Name, typeName(v)), Code: "not_an_array"}
	}
	if errInfo := r.checkItemCount(s, len(items)); errInfo != nil {
		return nil, errInfo
	}
	return valueItems(items), nil
}

func (r *runner) checkItemCount(s *chain.Step, n int) *store.ErrorInfo {
	if limit := r.e.limits.MaxSplitItems; n > limit {
		return &store.ErrorInfo{
			Message: fmt.Sprintf("items of split %q has %d elements, above max_split_items (%d)", s.Name, n, limit), Code: "too_many_items",
		}
	}
	return nil
}

func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case int64, float64, json.Number:
		return "a number"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("a %T", v)
}

// progressSplit runs a split step: starts items up to its concurrency,
// advances the ones with news, and joins when all are done.
func (r *runner) progressSplit(now time.Time, q *seq, s *chain.Step, rec *store.StepRecord, sc *scope) ([]launch, bool) {
	sp := r.splits[rec.Key]
	if sp == nil {
		if r.creating {
			// Opened in the run's first pass, once the run exists: handed
			// to workers, its items would be attached in the run's name
			// before that, and the hand-off goes on while its decision is
			// written.
			return nil, false
		}
		if rec.Status == store.StepPending && rec.NotBefore.After(now) {
			return nil, false
		}
		if sp = r.openSplit(now, q, s, rec, sc); sp == nil {
			return nil, true
		}
	}
	if !sp.deadline.IsZero() && !now.Before(sp.deadline) {
		r.finishSplit(sp, store.StepTimedOut, fmt.Sprintf("split timed out after %s", sp.deadline.Sub(rec.StartedAt).Round(time.Second)))
		return nil, true
	}
	if sp.joining {
		if r.ackedSeq < sp.joinAfter {
			return nil, false
		}
		r.joinSplit(sp)
		return nil, true
	}
	return sp.place.progress(r, sp, now)
}

// joinWhenDone joins the split once every item has its record, and that
// record is durable.
func (r *runner) joinWhenDone(sp *split, out []launch) ([]launch, bool) {
	if sp.processed() != sp.total {
		return out, false
	}
	// Every item's record is written before the results are read back
	// from the store.
	sp.joining = true
	sp.joinAfter = r.nextBatch - 1
	if r.hasChanges() && sp.place.readsStore() {
		sp.joinAfter = r.nextBatch
	}
	if r.ackedSeq >= sp.joinAfter {
		r.joinSplit(sp)
		return out, true
	}
	return out, false
}

// openSplit starts a split, or takes one up again after a restart.
func (r *runner) openSplit(now time.Time, q *seq, s *chain.Step, rec *store.StepRecord, sc *scope) *split {
	items, errInfo := r.renderItems(s, sc)
	if errInfo != nil {
		r.finishStep(q, rec, store.StepFailed, errInfo)
		return nil
	}
	sp := &split{step: s, key: rec.Key, rec: rec, owner: q, place: &localItems{items: items}, total: items.Len(), width: indexWidth(items.Len()), active: map[int]*seq{}}
	if rec.Status == store.StepPending {
		distributed, errInfo := r.distribute(s, items.Len())
		if errInfo != nil {
			r.finishStep(q, rec, store.StepFailed, errInfo)
			return nil
		}
		rec.Status = store.StepRunning
		rec.Attempts = 1
		rec.StartedAt = now
		rec.NotBefore = time.Time{}
		rec.Split = &store.SplitState{Total: items.Len()}
		var handed *handedItems
		if distributed {
			rec.Split.Distributed, rec.Split.Gen = true, 1
			handed = &handedItems{items: items}
			sp.place = handed
		}
		if t := s.Split.TimeoutSeconds; t > 0 {
			rec.Deadline = now.Add(time.Duration(t) * time.Second)
		}
		for _, b := range []time.Time{q.bound(), r.run.Deadline} {
			if !b.IsZero() && (rec.Deadline.IsZero() || b.Before(rec.Deadline)) {
				rec.Deadline = b
			}
		}
		r.put(rec)
		if handed != nil {
			handed.attachAfter = r.nextBatch
		}
		if !q.inItem() {
			r.event(store.EventStepStarted, rec.Key, 1, "split over "+textx.Count(items.Len(), "item", "items"))
		}
		if distributed {
			// Told with the decision, in its batch: a commit of its own
			// would be one more write while the items go out.
			r.event(store.EventSplitFanoutStarted, rec.Key, 0, "handing "+textx.Count(items.Len(), "item", "items")+" to workers")
		}
	} else {
		// The items render the same from the same persisted inputs; a
		// different count means the definition or data changed under it.
		if rec.Split == nil {
			r.finishStep(q, rec, store.StepFailed, &store.ErrorInfo{
				Message: fmt.Sprintf("split %q was stored as started without its progress; it cannot resume", s.Name), Code: "corrupt_state",
			})
			return nil
		}
		if rec.Split.Total != items.Len() {
			r.finishStep(q, rec, store.StepFailed, &store.ErrorInfo{
				Message: fmt.Sprintf("split %q now renders %d items, not the %d it started with", s.Name, items.Len(), rec.Split.Total), Code: "items_changed",
			})
			return nil
		}
		if rec.Split.Distributed {
			// What the workers did is taken up where the store says; the
			// items finished in an earlier hand-off are not handed out.
			sp.place = &handedItems{items: items}
		} else {
			done := r.doneItems[rec.Key]
			for i := 0; i < rec.Split.Next; i++ {
				if !done.has(i) {
					sp.ready = append(sp.ready, i)
				}
			}
			sp.cursor = rec.Split.Next
			delete(r.doneItems, rec.Key)
		}
	}
	sp.deadline = rec.Deadline
	if !sp.deadline.IsZero() {
		r.addTimer(sp.deadline, rec.Key)
	}
	r.splits[rec.Key] = sp
	return sp
}

// nextItem picks the next item to start: those a restart found started
// but unfinished first, then the ones never started, in order.
func (sp *split) nextItem() (int, bool) {
	if len(sp.ready) > 0 {
		i := sp.ready[0]
		sp.ready = sp.ready[1:]
		return i, true
	}
	if sp.cursor < sp.total {
		sp.cursor++
		return sp.cursor - 1, true
	}
	return 0, false
}

// startItem sets up item i.
func (r *runner) startItem(sp *split, i int) *seq {
	sp.place.starting(r, sp, i)
	lineage := append(append([]Frame(nil), sp.owner.lineage...), Frame{Split: sp.step.Name, Index: i, Total: sp.total})
	q := &seq{
		steps:   sp.step.Split.Steps,
		prefix:  keyPrefix(lineage),
		cursor:  sp.step.Split.Steps[0].Name,
		vars:    make(map[string]any, len(sp.owner.vars)+len(sp.step.Split.Steps)),
		split:   sp,
		index:   i,
		item:    sp.place.value(i),
		lineage: lineage,
	}
	for k, v := range sp.owner.vars {
		q.vars[k] = v
	}
	// Raises already durable cover their items; dropping them keeps this
	// search short over a split of a million items.
	for len(sp.advances) > 0 && sp.advances[0].batch <= r.ackedSeq {
		sp.advances = sp.advances[1:]
	}
	for _, a := range sp.advances {
		if i < a.next {
			q.ack = a.batch
			break
		}
	}
	sp.active[i] = q
	return q
}

// endItem records how an item ended, in its slot's record, and drops it
// from memory.
func (r *runner) endItem(q *seq, status store.StepStatus, result json.RawMessage, info *store.ErrorInfo) {
	sp := q.split
	q.status, q.err = status, info
	rec := &store.StepRecord{Key: sp.itemKey(q.index), Name: sp.step.Name, Status: status, FinishedAt: r.e.clock.Now().UTC()}
	st := sp.rec.Split
	switch status {
	case store.StepSucceeded:
		st.Succeeded++
		rec.Body = result
		if len(rec.Body) == 0 {
			rec.Body = json.RawMessage("null")
		}
		// The slot now holds the last step's body; that step's own record
		// would only repeat it, so it is not written. A million-item split
		// writes half as much.
		if n := len(q.path); n > 0 {
			last := q.prefix + q.path[n-1]
			if lr := r.dirty[last]; lr != nil && lr.Status == store.StepSucceeded && lr.Split == nil && lr.Child == "" && !q.written[last] {
				delete(r.dirty, last)
			}
		}
	case store.StepFailed:
		st.Failed++
		rec.Error = info
		rec.Body, _ = jsonx.Marshal(map[string]any{"error": info})
	default:
		st.Skipped++
		rec.Body = json.RawMessage("null")
	}
	r.put(rec)
	sp.place.ended(r, sp)
	r.forgetItem(q)
	delete(r.recs, rec.Key)
	delete(sp.active, q.index)
	r.markDirty(sp.owner)
}

// forgetItem drops what an item held in memory; its records stay in the
// pending batch until written.
func (r *runner) forgetItem(q *seq) {
	for _, k := range q.keys {
		if c := r.calls[k]; c != nil {
			c.stop()
			delete(r.calls, k)
		}
		if sp := r.splits[k]; sp != nil {
			sp.place.stop(r, sp, store.StepCancelled)
		}
		delete(r.recs, k)
		delete(r.seqOf, k)
		delete(r.payloads, k)
		delete(r.owner, k)
		delete(r.groups, k)
		delete(r.splits, k)
	}
	q.keys = nil
}

// tooManyFailures ends the split once more items failed than it tolerates.
func (r *runner) tooManyFailures(sp *split) bool {
	tolerated := sp.step.Split.Tolerated(sp.total)
	if sp.rec.Split.Failed <= tolerated {
		return false
	}
	r.finishSplit(sp, store.StepFailed, fmt.Sprintf("%s failed, more than the %d tolerated", textx.Count(sp.rec.Split.Failed, "item", "items"), tolerated))
	return true
}

// reportProgress appends a progress event at most twice a second.
func (r *runner) reportProgress(sp *split, now time.Time) {
	n := sp.processed()
	if n == sp.reported || (now.Sub(sp.reportedAt) < 500*time.Millisecond && n < sp.total) {
		return
	}
	sp.reported, sp.reportedAt = n, now
	st := sp.rec.Split
	r.event(store.EventStepProgress, sp.key, 0, fmt.Sprintf("%d/%d items (%d succeeded, %d failed, %d skipped)", n, st.Total, st.Succeeded, st.Failed, st.Skipped))
	r.events[len(r.events)-1].Data, _ = jsonx.Marshal(map[string]int{
		"processed": n, "total": st.Total, "succeeded": st.Succeeded, "failed": st.Failed, "skipped": st.Skipped,
	})
}

var errBodyTooLarge = errors.New("body too large")

// joinSample is how many results the join reads before it sizes its buffer.
const joinSample = 1024

// joinSplit reads every item's record back in item order and makes the
// split's body {results, succeeded, failed, skipped, total}.
func (r *runner) joinSplit(sp *split) {
	limit := r.e.limits.MaxBodyBytes
	var buf bytes.Buffer
	buf.WriteString(`{"results":[`)
	start := buf.Len() - 1
	n := 0
	prefix := sp.key + "["
	_, handed := sp.place.(*handedItems)
	err := sp.place.results(r, sp, func(rec *store.StepRecord) error {
		if strings.Contains(rec.Key[len(prefix):], "/") {
			return nil // a step inside an item, not an item's slot
		}
		if handed && rec.Status != store.StepSucceeded {
			// The workers' results live on in the body alone, which does
			// not say which items failed or were skipped: their slots do,
			// for a redrive of the split.
			slot := *rec
			r.put(&slot)
			delete(r.recs, slot.Key)
		}
		if n > 0 {
			buf.WriteByte(',')
		}
		buf.Write(rec.Body)
		n++
		if buf.Len() > limit {
			return errBodyTooLarge
		}
		if n == joinSample && sp.total > n {
			// Items tend to be alike: sized from the first results, the
			// buffer grows once instead of doubling through copies that
			// would add up to twice the body at a million items.
			rest := int64(buf.Len()) / int64(n) * int64(sp.total-n) * 17 / 16
			buf.Grow(int(min(rest, int64(limit+1-buf.Len()))))
		}
		return nil
	})
	switch {
	case errors.Is(err, errBodyTooLarge):
		r.finishSplit(sp, store.StepFailed, fmt.Sprintf("the results of split %q exceed max_body_bytes (%d); return less from each item or raise the limit", sp.step.Name, limit))
		return
	case err != nil:
		r.finishSplit(sp, store.StepFailed, fmt.Sprintf("reading the results of split %q: %v", sp.step.Name, err))
		return
	case n != sp.total:
		r.finishSplit(sp, store.StepFailed, fmt.Sprintf("split %q has results for %d of %d items", sp.step.Name, n, sp.total))
		return
	}
	buf.WriteByte(']')
	results := json.RawMessage(buf.Bytes()[start:buf.Len()])
	st := sp.rec.Split
	fmt.Fprintf(&buf, `,"succeeded":%d,"failed":%d,"skipped":%d,"total":%d}`, st.Succeeded, st.Failed, st.Skipped, st.Total)

	rec := sp.rec
	rec.Status = store.StepSucceeded
	rec.Body = buf.Bytes()
	rec.FinishedAt = r.e.clock.Now().UTC()
	r.put(rec)
	delete(r.splits, sp.key)
	sp.place.stop(r, sp, store.StepSucceeded)
	// Counts read cheaply; results are decoded only if something reads them.
	sp.owner.vars[sp.step.Name] = stepValue(rec, map[string]any{
		"results": &lazyJSON{raw: results}, "succeeded": int64(st.Succeeded), "failed": int64(st.Failed),
		"skipped": int64(st.Skipped), "total": int64(st.Total),
	})
	if !sp.owner.inItem() {
		r.event(store.EventStepSucceeded, sp.key, 1, fmt.Sprintf("%s: %d succeeded, %d failed, %d skipped", textx.Count(st.Total, "item", "items"), st.Succeeded, st.Failed, st.Skipped))
	}
}

// finishSplit ends a split that failed or timed out: items in flight are
// cancelled, and its body keeps the counts.
func (r *runner) finishSplit(sp *split, status store.StepStatus, msg string) {
	for _, item := range sp.active {
		r.abandonItem(item, msg)
	}
	delete(r.splits, sp.key)
	sp.place.stop(r, sp, status)
	st := sp.rec.Split
	rec := sp.rec
	rec.Status = status
	rec.Body, _ = jsonx.Marshal(map[string]int{"succeeded": st.Succeeded, "failed": st.Failed, "skipped": st.Skipped, "total": st.Total})
	code, typ := "split_failed", store.EventStepFailed
	if status == store.StepTimedOut {
		code, typ = "timeout", store.EventStepTimedOut
	}
	rec.Error = &store.ErrorInfo{Message: msg, Code: code}
	rec.FinishedAt = r.e.clock.Now().UTC()
	r.put(rec)
	r.setStepVar(sp.owner, rec, decodeJSON(rec.Body))
	r.event(typ, sp.key, rec.Attempts, msg)
}

// abandonItem cancels whatever an unfinished item has pending or in flight,
// nested groups and splits included.
func (r *runner) abandonItem(q *seq, msg string) {
	for _, k := range q.keys {
		if sp := r.splits[k]; sp != nil {
			for _, inner := range sp.active {
				r.abandonItem(inner, msg)
			}
		}
		if rec := r.recs[k]; rec != nil && !rec.Status.Final() {
			r.abandon(rec, store.StepCancelled, msg)
		}
	}
	q.status = store.StepCancelled
	r.forgetItem(q)
}

// markDirty notes that a list has news, and so does every list enclosing
// it, up to the run's own.
func (r *runner) markDirty(q *seq) {
	for q != nil && q.split != nil && !q.dirty && q.status == "" {
		q.dirty = true
		q.split.dirty = append(q.split.dirty, q)
		q = q.split.owner
	}
}
