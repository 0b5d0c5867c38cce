//go:build !linux

package faulty

import (
	"context"
	"time"
)

func sleep(ctx context.Context, d time.Duration) error { return sleepOnTimer(ctx, d) }
