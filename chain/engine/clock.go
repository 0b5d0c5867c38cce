package engine

import "time"

// Clock is what the engine reads the time of a run from and waits on: step
// and run deadlines, retry backoff, delays, approval deadlines and what
// records say happened when. Leases and store retries keep the system's
// clock, since other gateways read them.
type Clock interface {
	Now() time.Time
	// NewTimer returns a timer that is not set.
	NewTimer() Timer
}

// Timer wakes one goroutine at a time it is set to.
type Timer interface {
	// C receives once the time the timer was last set to has come.
	C() <-chan time.Time
	// Set makes C receive at at, in place of any earlier setting.
	Set(at time.Time)
	// Stop unsets the timer.
	Stop()
}

// Activity is implemented by a Clock that moves time on by itself once
// nothing in the engine is under way (a test runner's virtual clock): the
// engine calls Begin before it hands work to a goroutine (a call, a commit,
// a message to a run) and End once that work is taken up or dropped, and
// a run's goroutine holds one unit whenever it is not waiting. A timer the
// clock fires begins a unit for the goroutine it wakes.
type Activity interface {
	Begin()
	End()
}

// SystemClock is the system's clock.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// NewTimer returns a timer on the system's clock.
func (SystemClock) NewTimer() Timer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return systemTimer{t}
}

type systemTimer struct{ t *time.Timer }

func (s systemTimer) C() <-chan time.Time { return s.t.C }
func (s systemTimer) Set(at time.Time)    { s.t.Reset(time.Until(at)) }
func (s systemTimer) Stop()               { s.t.Stop() }

type noActivity struct{}

func (noActivity) Begin() {}
func (noActivity) End()   {}

// Clock is the clock runs read time from.
func (e *Engine) Clock() Clock { return e.clock }
