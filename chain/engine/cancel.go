package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/chaingate/gateway/chain/store"
)

// Only the gateway holding a run's lease writes to the run, so a cancel
// sent to another gateway sharing the store is recorded as a request, a
// key of the run's: the holder reads it each time it renews the lease,
// and a gateway taking the run over reads it at its first renewal, then
// ends the run as a cancel of its own would. A replay of the run drops a
// request left from the run's last advance.

// cancelRequestTTL keeps a request until the run's holder, or the gateway
// taking it over, has read it, with time to spare.
const cancelRequestTTL = 24 * time.Hour

// cancelPrefix starts a request's value; who asked follows, as by says.
const cancelPrefix = "cancel"

func cancelKey(runID string) string { return "cancel/" + runID }

// Cancel stops a run: its in-flight provider calls are cancelled and it
// ends with status cancelled. A run no engine is advancing is cancelled in
// the store; one another gateway advances is cancelled by that gateway,
// within a third of the lease's TTL, once Cancel has recorded the request.
func (e *Engine) Cancel(ctx context.Context, id string) error {
	r := e.active(id)
	if r == nil {
		err := e.CancelStored(ctx, id)
		if errors.Is(err, store.ErrLeaseHeld) {
			return e.requestCancel(ctx, id)
		}
		return err
	}
	e.act.Begin()
	select {
	case r.cancelReq <- by(ctx):
	case <-r.done:
		e.act.End()
	case <-ctx.Done():
		e.act.End()
		return ctx.Err()
	}
	return nil
}

// requestCancel records a cancel of a run another gateway advances; the
// first request stands.
func (e *Engine) requestCancel(ctx context.Context, id string) error {
	run, err := e.store.RunHeader(ctx, id)
	if err != nil {
		return fmt.Errorf("cancelling run %s: %w", id, err)
	}
	if run.Status.Final() {
		return fmt.Errorf("cancelling run %s: %w (%s)", id, ErrFinished, run.Status)
	}
	if _, err := e.store.ClaimKey(ctx, cancelKey(id), cancelPrefix+by(ctx), cancelRequestTTL); err != nil {
		return fmt.Errorf("cancelling run %s: recording the cancel for the gateway advancing it: %w", id, err)
	}
	e.log.Info("cancel of a run another gateway advances recorded; that gateway ends it", "run", id, "by", Actor(ctx))
	return nil
}

// takeCancelRequest hands a run's runner the cancel another gateway
// recorded for it, if there is one.
func (e *Engine) takeCancelRequest(ctx context.Context, r *runner, id string) {
	v, err := e.store.KeyRun(ctx, cancelKey(id))
	if err != nil {
		r.log.Warn("reading whether another gateway asked to cancel the run; reading again at the next renewal", "err", err)
		return
	}
	who, ok := strings.CutPrefix(v, cancelPrefix)
	if !ok {
		return
	}
	e.act.Begin()
	select {
	case r.cancelReq <- who:
	default:
		// A cancel is already on its way.
		e.act.End()
	}
}

// dropCancelRequest forgets a cancel asked of a run's last advance, before
// a replay advances it again.
func (e *Engine) dropCancelRequest(ctx context.Context, id string) error {
	v, err := e.store.KeyRun(ctx, cancelKey(id))
	if err == nil && v != "" {
		err = e.store.ReleaseKey(ctx, cancelKey(id), v)
	}
	if err != nil {
		return fmt.Errorf("dropping a cancel asked of the run's last advance: %w", err)
	}
	return nil
}
