package gateway

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
)

// StartKeyed starts a run of chainName. With a key, the run's creation
// binds prefix+key to it for ttl, in the same commit: a key already bound
// answers with its run, which is then replayed rather than started again.
// Requests with one key arriving together, here or on gateways sharing the
// store, all answer with the one run the first of them created; those
// arriving here while it starts wait for it rather than start and be
// refused.
func (gw *Gateway) StartKeyed(ctx context.Context, chainName, prefix, key string, ttl time.Duration, in engine.Input) (id, status string, replayed bool, err error) {
	if key == "" {
		run, err := gw.Engine.StartWithID(ctx, chainName, in, store.NewID())
		if err != nil {
			return "", "", false, err
		}
		return run.ID, string(run.Status), false, nil
	}
	in.Key = prefix + key
	if err := store.CheckKey(in.Key); err != nil {
		return "", "", false, err
	}
	for {
		ks, first, err := gw.starting.join(ctx, in.Key)
		if err != nil {
			return "", "", false, fmt.Errorf("waiting for the start of the run key %q names: %w", in.Key, err)
		}
		if !first {
			if ks.err == nil {
				return ks.id, ks.status, true, nil
			}
			// That start failed: this request tries its own.
			continue
		}
		in.KeyUntil = time.Now().Add(ttl).UTC()
		// What those waiting see if this start ends without an answer (a
		// bug that panics): they then make starts of their own.
		ks.err = errStartUnanswered
		func() {
			defer gw.starting.leave(in.Key, ks)
			ks.id, ks.status, replayed, ks.err = gw.startUnderKey(ctx, chainName, in)
		}()
		return ks.id, ks.status, replayed, ks.err
	}
}

var errStartUnanswered = errors.New("the start of the key's run ended without an answer")

// startUnderKey starts a run whose creation claims in.Key, or answers
// with the run the key is bound to.
func (gw *Gateway) startUnderKey(ctx context.Context, chainName string, in engine.Input) (id, status string, replayed bool, err error) {
	// A request arriving after the key's run was created finds it by a
	// read, without a start of its own that the store would refuse.
	id, err = gw.Store.KeyRun(ctx, in.Key)
	if err != nil {
		return "", "", false, err
	}
	bound := id != ""
	if !bound {
		id = store.NewID()
	}
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 250*time.Millisecond) {
		if bound {
			existing, err := gw.Store.RunHeader(ctx, id)
			if err == nil {
				return id, string(existing.Status), true, nil
			}
			if !errors.Is(err, store.ErrNotFound) {
				return "", "", false, err
			}
			// The key is bound to a run that is not there (deleted since,
			// or its start never finished): this request starts it under
			// that id.
		}
		run, err := gw.Engine.StartWithID(ctx, chainName, in, id)
		var kb *store.KeyBoundError
		switch {
		case err == nil:
			return id, string(run.Status), false, nil
		case errors.As(err, &kb):
			// Another gateway created the key's run first. A binding that
			// lapsed before it could be read names none: start afresh.
			bound = kb.Run != ""
			if bound {
				id = kb.Run
			} else {
				id = store.NewID()
			}
		case errors.Is(err, store.ErrExists):
			bound = true
		case errors.Is(err, store.ErrLeaseHeld):
			// Another gateway is creating it: wait for the run to appear,
			// or for that start to fail and let go of the lease.
			bound = true
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

// keyedStarts are the keyed starts under way in this process, so that
// requests with one key arriving together make one start between them.
type keyedStarts struct {
	mu    sync.Mutex
	under map[string]*keyedStart
}

// keyedStart is one start under way, and once done what it came to.
type keyedStart struct {
	done       chan struct{}
	id, status string
	err        error
	// waiting counts the requests that joined it (under keyedStarts.mu),
	// so a test knows they wait.
	waiting int
}

// join returns the start under way for key, or registers a new one that
// the caller makes (first) and then leaves. A caller that is not first
// has waited for that start to end.
func (k *keyedStarts) join(ctx context.Context, key string) (ks *keyedStart, first bool, err error) {
	k.mu.Lock()
	if cur := k.under[key]; cur != nil {
		cur.waiting++
		k.mu.Unlock()
		select {
		case <-cur.done:
			return cur, false, nil
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}
	if k.under == nil {
		k.under = map[string]*keyedStart{}
	}
	ks = &keyedStart{done: make(chan struct{})}
	k.under[key] = ks
	k.mu.Unlock()
	return ks, true, nil
}

// leave ends the start ks of key, waking those waiting for it.
func (k *keyedStarts) leave(key string, ks *keyedStart) {
	k.mu.Lock()
	delete(k.under, key)
	k.mu.Unlock()
	close(ks.done)
}
