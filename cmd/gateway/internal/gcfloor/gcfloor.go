// Package gcfloor keeps the garbage collector from running more often than
// a heap with some room needs.
//
// A gateway's live heap is a few megabytes while it allocates hundreds of
// megabytes a second (bbolt's pages, requests, step records): with the
// runtime's default target, twice the live heap, it collected some 70 times
// a second at 2,700 runs/s, and each collection's fixed cost (stopping the
// world twice, scanning every goroutine's stack) went with it. After every
// collection, the package sets GOGC so that the next one comes once the
// heap has grown by at least a set room, and never sooner than the default
// would: a heap whose live part is larger than the room (a split of a
// million items) is collected as it would be without it.
package gcfloor

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// maxPercent bounds the GOGC set for a nearly empty heap, and so how far
// a heap could outgrow its live part were the tuner ever to stop.
const maxPercent = 1000

var once sync.Once

// Start keeps, for the life of the process, each collection's target at
// least room bytes above the heap live after the last one. An operator's
// own choice is left alone: with GOGC or GOMEMLIMIT in the environment
// Start does nothing. Only the first call counts.
func Start(room uint64) {
	if OperatorChose() || room == 0 {
		return
	}
	once.Do(func() {
		t := &tuner{room: room, percent: 100, sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}}
		t.arm()
	})
}

// OperatorChose reports whether GOGC or GOMEMLIMIT is set in the
// environment: the operator's choice of the collector's settings, which
// the gateway's commands leave as they are.
func OperatorChose() bool {
	return os.Getenv("GOGC") != "" || os.Getenv("GOMEMLIMIT") != ""
}

type tuner struct {
	room    uint64
	percent int
	sample  []metrics.Sample
}

// sentinel is garbage whose finalizer runs once a collection has found it
// unreachable, that is after each collection; it holds a pointer, so it is
// never one of the tiny allocations that share a block and outlive their
// collection.
type sentinel struct{ t *tuner }

func (t *tuner) arm() {
	runtime.SetFinalizer(&sentinel{t: t}, func(s *sentinel) {
		s.t.adjust()
		s.t.arm()
	})
}

// adjust runs on the finalizer goroutine, one call at a time.
func (t *tuner) adjust() {
	metrics.Read(t.sample)
	if t.sample[0].Value.Kind() != metrics.KindUint64 {
		return
	}
	p := Percent(t.sample[0].Value.Uint64(), t.room)
	// A live heap that wobbles a little does not reset the pacer every
	// cycle.
	if d := p - t.percent; d > t.percent/8 || -d > t.percent/8 {
		debug.SetGCPercent(p)
		t.percent = p
	}
}

// Percent is the GOGC that puts the next collection room bytes above a live
// heap of live bytes, and never below the runtime's default of 100.
func Percent(live, room uint64) int {
	if live == 0 {
		return maxPercent
	}
	p := room * 100 / live
	return int(min(max(p, 100), maxPercent))
}
