package faulty

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

func TestSleep(t *testing.T) {
	for _, d := range []time.Duration{0, time.Nanosecond, time.Millisecond, 10 * time.Millisecond, 25 * time.Millisecond} {
		start := time.Now()
		if err := sleep(context.Background(), d); err != nil {
			t.Fatalf("sleep(%v): %v", d, err)
		}
		if got := time.Since(start); got < d {
			t.Errorf("sleep(%v) returned after %v, early", d, got)
		}
	}
}

func TestSleepEndsWithTheContext(t *testing.T) {
	for name, ctx := range map[string]func() (context.Context, context.CancelFunc){
		"cancelled while sleeping": func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(20*time.Millisecond, cancel)
			return ctx, cancel
		},
		"cancelled before": func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx, cancel
		},
		"deadline": func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 20*time.Millisecond)
		},
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := ctx()
			defer cancel()
			start := time.Now()
			err := sleep(ctx, time.Hour)
			if err == nil || !errors.Is(err, ctx.Err()) {
				t.Errorf("sleep = %v, want the context's error %v", err, ctx.Err())
			}
			// Only the context can have ended an hour's sleep this soon.
			if d := time.Since(start); d > 30*time.Second {
				t.Errorf("returned after %v", d)
			}
		})
	}
}

// timerfds counts this process's open timerfds.
func timerfds(t *testing.T) int {
	t.Helper()
	fds, err := filepath.Glob("/proc/self/fd/*")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, fd := range fds {
		if target, err := os.Readlink(fd); err == nil && target == "anon_inode:[timerfd]" {
			n++
		}
	}
	return n
}

// On Linux sleeps wait on one timerfd, however many there are and however
// they end.
func TestSleepOnATimerfd(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("timerfds are Linux's")
	}
	ctx, cancel := context.WithCancel(context.Background())
	slept := make(chan error, 10)
	for range 10 {
		go func() { slept <- sleep(ctx, time.Hour) }()
	}
	c, err := theClock()
	if err != nil {
		t.Fatal(err)
	}
	waiting := func() int {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.sleepers)
	}
	for end := time.Now().Add(30 * time.Second); waiting() != 10; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%d sleepers on the timerfd, want 10", waiting())
		}
	}
	if n := timerfds(t); n != 1 {
		t.Errorf("%d timerfds open during ten sleeps, want 1", n)
	}
	cancel()
	for range 10 {
		if err := <-slept; !errors.Is(err, context.Canceled) {
			t.Errorf("sleep = %v, want context.Canceled", err)
		}
	}
	for range 50 {
		if err := sleep(context.Background(), time.Microsecond); err != nil {
			t.Fatal(err)
		}
	}
	if n := timerfds(t); n != 1 {
		t.Errorf("%d timerfds open after the sleeps ended, want the one", n)
	}
	if n := waiting(); n != 0 {
		t.Errorf("%d sleepers left on the timerfd after every sleep ended", n)
	}
}

// Sleepers due in any order each wake once they are due, not before.
func TestSleepersInAnyOrder(t *testing.T) {
	start := time.Now()
	ds := []time.Duration{30, 5, 20, 1, 25, 10, 15, 1}
	woke := make(chan time.Duration, len(ds))
	for _, ms := range ds {
		go func() {
			d := ms * time.Millisecond
			if err := sleep(context.Background(), d); err != nil {
				t.Error(err)
			}
			if got := time.Since(start); got < d {
				t.Errorf("a sleep of %v ended after %v", d, got)
			}
			woke <- d
		}()
	}
	for range ds {
		<-woke
	}
}
