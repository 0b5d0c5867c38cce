// Package upkeep keeps a gateway's store in shape: retention, which prunes
// what the config no longer keeps, on a timer and by hand, and the store's
// backup, restore and compaction.
//
// It is the gateway's own package, with no compatibility promise.
package upkeep

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/gateway/api"
)

// Observer is told what retention removed, for metrics.
type Observer interface {
	Pruned(status string, runs int, freed store.Freed)
	DeadLettersPruned(n int)
	OldestKept(ended time.Time)
}

type noObserver struct{}

func (noObserver) Pruned(string, int, store.Freed) {}
func (noObserver) DeadLettersPruned(int)           {}
func (noObserver) OldestKept(time.Time)            {}

// Retention prunes a gateway's store as its config says.
type Retention struct {
	*gateway.Gateway
	obs Observer
}

// NewRetention returns gw's retention, telling obs (nil: no one) what it
// removes.
func NewRetention(gw *gateway.Gateway, obs Observer) *Retention {
	if obs == nil {
		obs = noObserver{}
	}
	return &Retention{Gateway: gw, obs: obs}
}

// listedPruned bounds how many pruned run ids a result lists.
const listedPruned = 1000

// Run prunes, every [gateway.retention] interval, what retention
// no longer keeps, until ctx ends. Of gateways sharing a store, the one
// that claims a pass does it; the others skip it.
func (gw *Retention) Run(ctx context.Context) {
	for {
		interval := gw.Engine.Config().Gateway.Retention.Interval
		t := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		// The claim lapses by itself: the next pass, here or elsewhere,
		// comes an interval later.
		bound, err := gw.Store.ClaimKey(ctx, "retention/pass", gw.Engine.Owner()+"/"+store.NewID(), interval)
		if err != nil {
			gw.Log.Warn("claiming the retention pass", "err", err)
			continue
		}
		if bound != "" {
			continue
		}
		if _, err := gw.prune(ctx, nil); err != nil && ctx.Err() == nil {
			gw.Log.Error("pruning by retention", "err", err)
		}
		keep := gw.Engine.Config().Gateway.Retention.Audit
		if n, err := gw.Store.PruneAudit(ctx, time.Now().Add(-keep)); err != nil && ctx.Err() == nil {
			gw.Log.Error("pruning the audit log", "err", err)
		} else if n > 0 {
			gw.Log.Info("retention pruned the audit log", "entries", n, "older_than", keep.String())
		}
	}
}

// Prune removes what opts select: the runs that ended longer ago than
// OlderThan, with retention's exceptions.
func (gw *Retention) Prune(ctx context.Context, opts api.PruneOptions) (*api.PruneResult, error) {
	if opts.OlderThan <= 0 {
		return nil, api.BadRequest("invalid_parameter", "older_than must be a positive duration, e.g. 720h or 30d")
	}
	if opts.Status != "" && !opts.Status.Final() {
		return nil, api.BadRequest("invalid_parameter", "status %q is not one a run ends with (%s)", opts.Status, api.StatusList(store.FinalRunStatuses))
	}
	return gw.prune(ctx, &opts)
}

// prune removes what retention no longer keeps, dead-letter entries
// included, or, by hand, what opts select.
func (gw *Retention) prune(ctx context.Context, opts *api.PruneOptions) (*api.PruneResult, error) {
	cfg := gw.Engine.Config()
	ret := cfg.Gateway.Retention
	res := &api.PruneResult{Runs: map[string]int{}, IDs: []string{}}
	var batch struct {
		runs  int
		freed store.Freed
	}
	p := store.PrunePolicy{
		Now:      time.Now(),
		Keep:     func(run *store.Run) time.Duration { return ret.Keep(string(run.Status), runOverrides(cfg, run)...) },
		Shortest: func(status store.RunStatus) time.Duration { return shortestKeep(cfg, string(status)) },
		KeepDeadLetter: func(e *store.DLQEntry) time.Duration {
			if c := cfg.Chains[e.Chain]; c != nil {
				return ret.Keep("dead_letters", c.Retention)
			}
			return ret.Keep("dead_letters")
		},
		Removed: func(run *store.Run, freed store.Freed) {
			res.Runs[string(run.Status)]++
			if len(res.IDs) < listedPruned {
				res.IDs = append(res.IDs, run.ID)
			}
			batch.runs++
			batch.freed.Add(freed)
			if opts == nil || !opts.DryRun {
				gw.obs.Pruned(string(run.Status), 1, freed)
			}
		},
	}
	if opts != nil {
		older := opts.OlderThan
		p.Keep = func(*store.Run) time.Duration { return older }
		p.Shortest = func(store.RunStatus) time.Duration { return older }
		p.KeepDeadLetter = nil
		p.Chain, p.DryRun, res.DryRun = opts.Chain, opts.DryRun, opts.DryRun
		if opts.Status != "" {
			p.Statuses = []store.RunStatus{opts.Status}
		}
	}
	p.Batch = func() {
		if !p.DryRun {
			gw.Log.Info("retention pruned a batch", "runs", batch.runs, "freed_records", batch.freed.Records, "freed_bytes", batch.freed.Bytes)
		}
		batch.runs, batch.freed = 0, store.Freed{}
	}
	stats, err := store.Prune(ctx, gw.Store, p)
	res.DeadLetters = stats.DeadLetters
	res.Freed = api.Freed{Records: stats.Freed.Records, Bytes: stats.Freed.Bytes}
	res.Kept = api.PruneKept{DeadLetter: stats.KeptForDeadLetter, Key: stats.KeptForKey, Parent: stats.KeptForParent}
	res.OldestKept = stats.OldestKept
	if stats.DeadLetters > 0 {
		gw.obs.DeadLettersPruned(stats.DeadLetters)
	}
	if opts == nil && !stats.OldestKept.IsZero() {
		gw.obs.OldestKept(stats.OldestKept)
	}
	if (stats.Runs > 0 || stats.DeadLetters > 0) && !p.DryRun {
		args := []any{"runs", batch.runs, "dead_letters", stats.DeadLetters, "freed_records", batch.freed.Records, "freed_bytes", batch.freed.Bytes,
			"pass_runs", stats.Runs, "kept_for_dead_letter", stats.KeptForDeadLetter, "kept_for_key", stats.KeptForKey, "kept_for_parent", stats.KeptForParent}
		if !stats.OldestKept.IsZero() {
			args = append(args, "oldest_kept_ended", stats.OldestKept.UTC())
		}
		msg := "retention pruned"
		if opts != nil {
			msg = "pruned by hand"
			args = append(args, "older_than", opts.OlderThan.String(), "chain", opts.Chain, "status", string(opts.Status), "by", engine.Actor(ctx))
		}
		gw.Log.Info(msg, args...)
	}
	return res, err
}

// runOverrides are the retention tables over the gateway's for a run: its
// schedule's or trigger's, then its chain's.
func runOverrides(cfg *chain.Config, run *store.Run) []*chain.RetentionOverride {
	var out []*chain.RetentionOverride
	kind, name, _ := strings.Cut(run.StartedBy, ":")
	switch kind {
	case store.StartedBySchedule:
		if s := cfg.Schedules[name]; s != nil {
			out = append(out, s.Retention)
		}
	case store.StartedByTrigger:
		if t := cfg.Triggers[name]; t != nil {
			out = append(out, t.Retention)
		}
	}
	if c := cfg.Chains[run.Chain]; c != nil {
		out = append(out, c.Retention)
	}
	return out
}

// shortestKeep is the shortest time any retention table keeps a run that
// ended with status, 0 when every table keeps it for ever.
func shortestKeep(cfg *chain.Config, status string) time.Duration {
	all := []time.Duration{cfg.Gateway.Retention.Keep(status)}
	add := func(o *chain.RetentionOverride) {
		if o != nil {
			if d, ok := o.Keep[status]; ok {
				all = append(all, d)
			}
		}
	}
	for _, c := range cfg.Chains {
		add(c.Retention)
	}
	for _, s := range cfg.Schedules {
		add(s.Retention)
	}
	for _, t := range cfg.Triggers {
		add(t.Retention)
	}
	all = slices.DeleteFunc(all, func(d time.Duration) bool { return d == 0 })
	if len(all) == 0 {
		return 0
	}
	return slices.Min(all)
}
