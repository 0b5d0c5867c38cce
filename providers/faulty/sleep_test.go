package faulty

import (
	"context"
	"errors"
	"os"
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
			// Only the context can have ended an hour's sleep.
			if d := time.Since(start); d > 30*time.Minute {
				t.Errorf("returned after %v", d)
			}
		})
	}
}

// Each sleep's file descriptor is closed, however it ends.
func TestSleepKeepsNoDescriptor(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("file descriptors are counted in /proc/self/fd")
	}
	count := func() int {
		fds, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(fds)
	}
	before := count()
	for range 50 {
		if err := sleep(context.Background(), time.Microsecond); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_ = sleep(ctx, time.Hour)
	}
	if after := count(); after != before {
		t.Errorf("%d descriptors open after 100 sleeps, %d before", after, before)
	}
}
