package chaintest

import (
	"sync"
	"time"

	"github.com/chaingate/gateway/chain/engine"
)

// virtualClock is a case's time. It moves only when nothing in the engine
// is under way (engine.Activity counts what is): then it jumps to the
// earliest time a run, a slow mock or an approval answer waits for, and
// wakes whatever waits for that time. Retries, backoff, timeouts and
// deadlines so take no time at all, and happen in the same order in every
// run of the case.
type virtualClock struct {
	mu     sync.Mutex
	idle   *sync.Cond
	now    time.Time
	busy   int
	timers map[*virtualTimer]struct{}
}

func newVirtualClock(start time.Time) *virtualClock {
	c := &virtualClock{now: start, timers: map[*virtualTimer]struct{}{}}
	c.idle = sync.NewCond(&c.mu)
	return c
}

func (c *virtualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *virtualClock) NewTimer() engine.Timer {
	return &virtualTimer{c: c, ch: make(chan time.Time, 1)}
}

func (c *virtualClock) Begin() {
	c.mu.Lock()
	c.busy++
	c.mu.Unlock()
}

func (c *virtualClock) End() {
	c.mu.Lock()
	c.busy--
	if c.busy < 0 {
		panic("chaintest: the engine ended more activity than it began")
	}
	if c.busy == 0 {
		c.idle.Broadcast()
	}
	c.mu.Unlock()
}

// settle waits until nothing is under way, or stop closes.
func (c *virtualClock) settle(stop <-chan struct{}) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.busy > 0 {
		select {
		case <-stop:
			return false
		default:
		}
		c.idle.Wait()
	}
	return true
}

// next is the earliest time a timer is set to; ok is false with none set.
func (c *virtualClock) next() (at time.Time, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for t := range c.timers {
		if !ok || t.at.Before(at) {
			at, ok = t.at, true
		}
	}
	return at, ok
}

// advance moves the clock to at (never back) and fires every timer due by
// then; each wakes its goroutine with a unit of activity.
func (c *virtualClock) advance(at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if at.After(c.now) {
		c.now = at
	}
	for t := range c.timers {
		if t.at.After(c.now) {
			continue
		}
		delete(c.timers, t)
		c.busy++
		t.ch <- c.now
	}
}

type virtualTimer struct {
	c  *virtualClock
	ch chan time.Time
	at time.Time
}

func (t *virtualTimer) C() <-chan time.Time { return t.ch }

func (t *virtualTimer) Set(at time.Time) {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	t.at = at
	t.c.timers[t] = struct{}{}
}

func (t *virtualTimer) Stop() {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	delete(t.c.timers, t)
}

// sleep waits d on the clock for a goroutine holding a unit of activity
// (a mocked call): it gives the unit up while it waits, and the timer
// that wakes it hands one back. It reports false when ctx ended first.
func (c *virtualClock) sleep(done <-chan struct{}, d time.Duration) bool {
	t := c.NewTimer().(*virtualTimer)
	t.Set(c.Now().Add(d))
	c.End()
	select {
	case <-t.ch:
		return true
	case <-done:
		t.c.mu.Lock()
		_, pending := t.c.timers[t]
		delete(t.c.timers, t)
		if pending {
			// Not fired: this goroutine takes a unit again itself.
			t.c.busy++
		}
		t.c.mu.Unlock()
		return false
	}
}
