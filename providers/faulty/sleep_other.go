//go:build !linux

package faulty

import (
	"context"
	"time"
)

// sleep waits d, or until ctx ends, and returns ctx's error then.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
