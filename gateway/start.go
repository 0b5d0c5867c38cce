package gateway

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
)

// StartKeyed starts a run of chainName. With a key, it first binds
// prefix+key to the new run for ttl: a key already bound answers with its
// run, which is then replayed rather than started again. Requests with one
// key arriving together, here or on gateways sharing the store, all answer
// with the one run the first of them bound.
func (gw *Gateway) StartKeyed(ctx context.Context, chainName, prefix, key string, ttl time.Duration, in engine.Input) (id, status string, replayed bool, err error) {
	id, status = store.NewID(), string(store.RunRunning)
	if key != "" {
		in.KeyUntil = time.Now().Add(ttl).UTC()
	}
	if key == "" {
		run, err := gw.Engine.StartWithID(ctx, chainName, in, id)
		if err != nil {
			return "", "", false, err
		}
		return id, string(run.Status), false, nil
	}
	bound, err := gw.Store.ClaimKey(ctx, prefix+key, id, ttl)
	if err != nil {
		return "", "", false, err
	}
	if bound != "" {
		id = bound
	}
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 250*time.Millisecond) {
		if bound != "" {
			existing, err := gw.Store.RunHeader(ctx, id)
			if err == nil {
				return id, string(existing.Status), true, nil
			}
			if !errors.Is(err, store.ErrNotFound) {
				return "", "", false, err
			}
		}
		// The run is not there yet: the request that bound the key is
		// starting it, or its start failed and this request starts it,
		// which is then no replay.
		run, err := gw.Engine.StartWithID(ctx, chainName, in, id)
		switch {
		case err == nil:
			return id, string(run.Status), false, nil
		case errors.Is(err, store.ErrExists):
			bound = id
		case errors.Is(err, store.ErrLeaseHeld):
			// Another gateway is creating it: wait for the run to appear,
			// or for that start to fail and let go of the lease.
			bound = id
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return "", "", false, fmt.Errorf("waiting for run %s, which another gateway is starting: %w", id, ctx.Err())
			}
		default:
			return "", "", false, err
		}
	}
}
