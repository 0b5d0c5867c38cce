package engine

import (
	"context"
	"errors"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/chaingate/gateway/chain/store"
)

// A run is advanced by one engine at a time: the one holding its lease.
// Every commit carries the lease, and the store refuses a commit under a
// lease that lapsed or was taken over, so an engine that lost a run (a long
// pause, a partition) cannot write to it. The keeper renews the leases of
// the runs this engine advances; Adopt takes over the runs whose lease has
// lapsed, such as those of a gateway that died.

// keepLeases renews every active run's lease every third of the TTL, and
// stops the runners whose lease is lost.
func (e *Engine) keepLeases() {
	defer close(e.keeperDone)
	t := time.NewTicker(e.leaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-e.stopKeeper:
			return
		case <-t.C:
		}
		e.mu.Lock()
		rs := make([]*runner, 0, len(e.runners))
		for _, r := range e.runners {
			rs = append(rs, r)
		}
		e.mu.Unlock()
		// Renewals go out several at a time, so that a gateway with
		// thousands of runs on a store a millisecond away still renews
		// each well within its TTL.
		var g errgroup.Group
		g.SetLimit(renewConcurrency)
		for _, r := range rs {
			g.Go(func() error {
				e.renew(r)
				return nil
			})
		}
		_ = g.Wait()
	}
}

// renewConcurrency is how many lease renewals the keeper has in flight.
const renewConcurrency = 32

func (e *Engine) renew(r *runner) {
	r.leaseMu.Lock()
	l, released := r.lease, r.released
	r.leaseMu.Unlock()
	if l.Owner == "" || released {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.leaseTTL/3)
	defer cancel()
	renewed, err := e.store.RenewLease(ctx, l, e.leaseTTL)
	if !e.renewed(r, l, renewed, err) {
		return
	}
	e.takeCancelRequest(ctx, r, l.RunID)
}

// renewed records a renewal of lease l; it reports whether the run is
// still this engine's, under the renewed lease.
func (e *Engine) renewed(r *runner, l, renewed store.Lease, err error) bool {
	r.leaseMu.Lock()
	defer r.leaseMu.Unlock()
	if r.released || r.lease != l {
		// The run ended and gave its lease back while the renewal was out
		// (the keeper lists runs just before they finish), or the lease
		// moved on meanwhile: either way, nothing was lost.
		return false
	}
	switch {
	case errors.Is(err, store.ErrLeaseLost):
		r.leaseLost = true
		go r.stop()
		return false
	case err != nil:
		r.log.Warn("renewing the run's lease failed; retrying", "err", err)
		return false
	}
	r.lease = renewed
	return true
}

// leaseFirm reports whether the run's lease has half its TTL left or more,
// so that a call may go out ahead of the write recording it: no other
// gateway can take the run over before that write lands or fails.
func (r *runner) leaseFirm() bool {
	r.leaseMu.Lock()
	defer r.leaseMu.Unlock()
	if r.lease.Owner == "" {
		return !r.leaseLost
	}
	return !r.leaseLost && time.Until(r.lease.Expires) > r.e.leaseTTL/2
}

// Adopt takes over every unfinished run whose lease has lapsed and that no
// engine here advances, and returns the ids it took. A gateway sharing a
// store with others calls it periodically, so the runs of one that died
// resume elsewhere once their leases expire.
func (e *Engine) Adopt(ctx context.Context) ([]string, error) {
	return e.Resume(ctx)
}

// releaseLease gives a finished or stopped run's lease back, so another
// engine need not wait for it to expire.
func (e *Engine) releaseLease(r *runner) {
	r.leaseMu.Lock()
	l := r.lease
	r.released = true
	r.leaseMu.Unlock()
	if l.Owner == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.store.ReleaseLease(ctx, l); err != nil {
		e.log.Debug("releasing a run's lease", "run", l.RunID, "err", err)
	}
}

// leaseFence is the fence of the run's lease: later owners of the run hold
// higher ones.
func (r *runner) leaseFence() uint64 {
	r.leaseMu.Lock()
	defer r.leaseMu.Unlock()
	return r.lease.Fence
}
