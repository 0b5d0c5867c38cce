package engine

// Pending reports how many step records the runner holds unwritten, asked
// on the runner's own goroutine; -1 once it has stopped.
func (w *ItemRunner) Pending() int {
	got := make(chan int, 1)
	select {
	case w.r.inbox <- outcome{do: func(r *runner) { got <- len(r.dirty) }}:
	case <-w.r.done:
		return -1
	}
	select {
	case n := <-got:
		return n
	case <-w.r.done:
		return -1
	}
}
