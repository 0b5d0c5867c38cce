package faulty

import (
	"container/heap"
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// sleep waits d, or until ctx ends, and returns ctx's error then.
//
// It waits on a timerfd, which the kernel makes readable when it is due:
// Go's own timers wake a process whose goroutines are all waiting at
// millisecond ticks (its poller's timeout is in milliseconds), so a
// hundred calls sleeping 10 ms would end late, a millisecond's worth at a
// time, in bunches. A real provider's call ends when its answer arrives,
// and the poller hears of that at once; a sleep that stands for one should
// too. One timerfd, armed for the earliest sleep, serves them all: one per
// sleep cost the plugin a dozen system calls a call.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	c, err := theClock()
	if err != nil {
		return err
	}
	s := c.add(time.Now().Add(d))
	select {
	case <-s.done:
		return c.failure()
	case <-ctx.Done():
		c.remove(s)
		return ctx.Err()
	}
}

// clock wakes sleepers when they are due, from one timerfd.
type clock struct {
	f        *os.File
	fd       int
	mu       sync.Mutex
	sleepers sleepers
	err      error // once set, the clock wakes no one on time
}

type sleeper struct {
	due   time.Time
	done  chan struct{}
	index int // in the heap; -1 once out of it
}

var (
	clockOnce sync.Once
	clockOne  *clock
	clockErr  error
)

func theClock() (*clock, error) {
	clockOnce.Do(func() {
		fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
		if err != nil {
			clockErr = fmt.Errorf("creating a timerfd: %w", err)
			return
		}
		clockOne = &clock{f: os.NewFile(uintptr(fd), "timerfd"), fd: fd}
		go clockOne.run()
	})
	return clockOne, clockErr
}

func (c *clock) add(due time.Time) *sleeper {
	s := &sleeper{due: due, done: make(chan struct{})}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		close(s.done)
		return s
	}
	heap.Push(&c.sleepers, s)
	if c.sleepers[0] == s {
		c.armLocked()
	}
	return s
}

// remove forgets a sleeper the context woke.
func (c *clock) remove(s *sleeper) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.index >= 0 {
		heap.Remove(&c.sleepers, s.index)
	}
}

func (c *clock) failure() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// armLocked sets the timerfd for the earliest sleeper. One removed early
// may leave it armed for no one: it then fires for nothing, once.
func (c *clock) armLocked() {
	var due unix.ItimerSpec
	if len(c.sleepers) > 0 {
		// Zero would disarm it.
		due.Value = unix.NsecToTimespec(max(time.Until(c.sleepers[0].due).Nanoseconds(), 1))
	}
	if err := unix.TimerfdSettime(c.fd, 0, &due, nil); err != nil {
		c.failLocked(fmt.Errorf("arming a timerfd: %w", err))
	}
}

func (c *clock) run() {
	var expirations [8]byte
	for {
		_, err := c.f.Read(expirations[:])
		c.mu.Lock()
		if err != nil {
			c.failLocked(fmt.Errorf("waiting on a timerfd: %w", err))
			c.mu.Unlock()
			return
		}
		now := time.Now()
		for len(c.sleepers) > 0 && !c.sleepers[0].due.After(now) {
			close(heap.Pop(&c.sleepers).(*sleeper).done)
		}
		c.armLocked()
		c.mu.Unlock()
	}
}

// failLocked wakes every sleeper, to find err.
func (c *clock) failLocked(err error) {
	if c.err == nil {
		c.err = err
	}
	for _, s := range c.sleepers {
		s.index = -1
		close(s.done)
	}
	c.sleepers = nil
}

// sleepers is a heap of sleepers, the earliest due first.
type sleepers []*sleeper

func (h sleepers) Len() int           { return len(h) }
func (h sleepers) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h sleepers) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}

func (h *sleepers) Push(x any) {
	s := x.(*sleeper)
	s.index = len(*h)
	*h = append(*h, s)
}

func (h *sleepers) Pop() any {
	old := *h
	s := old[len(old)-1]
	old[len(old)-1] = nil
	s.index = -1
	*h = old[:len(old)-1]
	return s
}
