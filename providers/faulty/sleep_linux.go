package faulty

import (
	"context"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// sleep waits d, or until ctx ends, and returns ctx's error then. It waits
// on a timerfd, which the kernel makes readable when it is due: Go's own
// timers wake a process whose goroutines are all waiting at millisecond
// ticks (its poller's timeout is in milliseconds), so a hundred calls
// sleeping 10 ms would end late, a millisecond's worth at a time, in
// bunches. A real provider's call ends when its answer arrives, and the
// poller hears of that at once; a sleep that stands for one should too.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return fmt.Errorf("creating a timerfd: %w", err)
	}
	f := os.NewFile(uintptr(fd), "timerfd")
	defer f.Close()
	due := unix.ItimerSpec{Value: unix.NsecToTimespec(d.Nanoseconds())}
	if err := unix.TimerfdSettime(fd, 0, &due, nil); err != nil {
		return fmt.Errorf("arming a timerfd: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { _ = f.SetReadDeadline(time.Now()) })
	defer stop()
	var expirations [8]byte
	if _, err := f.Read(expirations[:]); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("waiting on a timerfd: %w", err)
	}
	return nil
}
