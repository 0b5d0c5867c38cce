package engine

import (
	"container/heap"
	"time"
)

// timer is a persisted wake-up: a step's NotBefore or a group's deadline.
// The heap only says when to wake; what is due is read from the records, so
// an entry that became stale costs one early wake-up and nothing else.
type timer struct {
	at  time.Time
	key string
}

type timerHeap []timer

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h timerHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)        { *h = append(*h, x.(timer)) }
func (h *timerHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	*h = old[:len(old)-1]
	return t
}

func (r *runner) addTimer(at time.Time, key string) {
	heap.Push(&r.timers, timer{at: at, key: key})
}

// dueTimers pops every timer that has come due and returns their keys.
func (r *runner) dueTimers(now time.Time) []string {
	var keys []string
	for len(r.timers) > 0 && !r.timers[0].at.After(now) {
		keys = append(keys, heap.Pop(&r.timers).(timer).key)
	}
	return keys
}

// nextWake is the earliest timer or the run's deadline.
func (r *runner) nextWake() time.Time {
	at := r.run.Deadline
	if len(r.timers) > 0 && (at.IsZero() || r.timers[0].at.Before(at)) {
		at = r.timers[0].at
	}
	return at
}
