package engine

import (
	"context"
	"time"

	"github.com/chaingate/gateway/chain/store"
)

// localItems runs a split's items in this process, up to the split's
// concurrency at a time. Only the items in flight are in memory: each
// finished item is written as its slot record and dropped.
type localItems struct {
	items ItemList
}

func (l *localItems) value(i int) any { return l.items.At(i) }

func (l *localItems) progress(r *runner, sp *split, now time.Time) ([]launch, bool) {
	var out []launch
	for len(sp.dirty) > 0 {
		item := sp.dirty[len(sp.dirty)-1]
		sp.dirty = sp.dirty[:len(sp.dirty)-1]
		if item.status == "" {
			ls, _ := r.advanceSeq(now, item)
			out = append(out, ls...)
		}
	}
	if r.tooManyFailures(sp) {
		return nil, true
	}
	for len(sp.active) < sp.limit() {
		i, ok := sp.nextItem()
		if !ok {
			break
		}
		item := r.startItem(sp, i)
		ls, _ := r.advanceSeq(now, item)
		out = append(out, ls...)
	}
	if r.tooManyFailures(sp) {
		return nil, true
	}
	r.reportProgress(sp, now)
	return r.joinWhenDone(sp, out)
}

// starting makes sure the split's record says items up to i may have
// started (Next > i) before i's first call goes out; Next is raised a
// chunk at a time so that this costs one small write per chunk.
func (l *localItems) starting(r *runner, sp *split, i int) {
	st := sp.rec.Split
	if i >= st.Next {
		st.Next = min(sp.total, i+max(sp.limit(), 64))
		r.put(sp.rec)
		sp.advances = append(sp.advances, advance{next: st.Next, batch: r.nextBatch})
	}
}

// ended writes the split's counts with the item's slot.
func (l *localItems) ended(r *runner, sp *split) { r.put(sp.rec) }

func (l *localItems) results(r *runner, sp *split, fn func(*store.StepRecord) error) error {
	return r.sink.ForEachStep(context.Background(), sp.key+"[", fn)
}

func (l *localItems) readsStore() bool                       { return true }
func (l *localItems) durable(uint64)                         {}
func (l *localItems) stop(*runner, *split, store.StepStatus) {}
func (l *localItems) detach()                                {}
