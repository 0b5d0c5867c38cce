package engine

import (
	"time"

	"github.com/chaingate/gateway/chain/store"
)

// placement is where a split's items run. The split code (split.go) reads
// the same whatever the mode; each mode is one implementation: localItems
// in this process (local.go), handedItems on workers (fanout.go), and
// workerItems in this process as a worker (work.go). Running items
// somewhere else (another broker, a Kubernetes job) is one more.
type placement interface {
	// progress moves the items along: the calls to start, and whether the
	// split step has finished.
	progress(r *runner, sp *split, now time.Time) ([]launch, bool)
	// value is item i's value, for an item this runner runs.
	value(i int) any
	// starting is told that this runner starts item i, before its first
	// call may go out.
	starting(r *runner, sp *split, i int)
	// ended is told that an item this runner ran has its slot record in
	// the pending batch.
	ended(r *runner, sp *split)
	// results calls fn with every item's slot record, in item order, for
	// the join. fn must not keep the record.
	results(r *runner, sp *split, fn func(*store.StepRecord) error) error
	// readsStore reports whether results reads the run's store: then the
	// join waits until the items' records in the pending batch are durable;
	// otherwise the join goes into that batch, one commit instead of two.
	readsStore() bool
	// durable is told the batches up to seq are durable.
	durable(seq uint64)
	// stop ends the items with the split, whose final record, with
	// status, is in the pending batch.
	stop(r *runner, sp *split, status store.StepStatus)
	// detach lets the items be as they are, for a later runner to take
	// up: this one is stopping.
	detach()
}

// durableHook is work to do once a batch is durable, or to let go of if
// the runner stops first.
type durableHook struct {
	batch   uint64
	then    func()
	abandon func()
}

// whenDurable runs then once the pending batch is durable.
func (r *runner) whenDurable(then, abandon func()) {
	r.hooks = append(r.hooks, durableHook{batch: r.nextBatch, then: then, abandon: abandon})
}
