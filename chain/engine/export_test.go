package engine

import "time"

// Pending reports how many step records the runner holds unwritten, asked
// on the runner's own goroutine; -1 once it has stopped.
func (w *ItemRunner) Pending() int { return w.r.pending() }

// Pending reports how many step records the runner of run id holds
// unwritten; -1 when no runner here advances it.
func (e *Engine) Pending(id string) int {
	e.mu.Lock()
	r := e.runners[id]
	e.mu.Unlock()
	if r == nil {
		return -1
	}
	return r.pending()
}

func (r *runner) pending() int {
	got := make(chan int, 1)
	select {
	case r.inbox <- outcome{do: func(r *runner) { got <- len(r.dirty) }}:
	case <-r.done:
		return -1
	}
	select {
	case n := <-got:
		return n
	case <-r.done:
		return -1
	}
}

// SetClock sets the clock answers to approval steps are timed by; call it
// before the engine takes answers.
func (e *Engine) SetClock(now func() time.Time) { e.now = now }
