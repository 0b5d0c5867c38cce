package ops

import (
	"context"

	"github.com/chaingate/gateway/gateway/api"
)

// Pause implements Ops.
func (l *Local) Pause(ctx context.Context, kind, name, reason string) (*api.Pause, error) {
	return l.door().Pause(ctx, kind, name, reason)
}

// Resume implements Ops.
func (l *Local) Resume(ctx context.Context, kind, name string) (*api.Pause, error) {
	return l.door().Resume(ctx, kind, name)
}

// Pauses implements Ops.
func (l *Local) Pauses(ctx context.Context) ([]*api.Pause, error) { return l.door().Pauses(ctx) }
