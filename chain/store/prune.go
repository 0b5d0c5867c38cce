package store

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Retention removes runs that ended and dead-letter entries once they are
// past the time a policy keeps them. Whatever the policy, it never
// removes a run that has not ended, one with a dead-letter entry still
// there (the entry's own retention decides), a sub-chain's run while its
// parent is there, or a run whose idempotency key still holds, so that a
// repeat of what started it finds it rather than starting it again.

// PrunePolicy says what Prune removes.
type PrunePolicy struct {
	// Now is the time the policy's durations count back from.
	Now time.Time
	// Keep is how long a run that ended is kept, counted from its end; 0
	// keeps it for ever.
	Keep func(run *Run) time.Duration
	// Shortest is the shortest Keep gives any run that ended with status,
	// 0 when every run of it is kept for ever: runs are read in the order
	// they ended, and the reading stops at the first one that ended after
	// Now minus it.
	Shortest func(status RunStatus) time.Duration
	// KeepDeadLetter is how long a dead-letter entry is kept, counted from
	// when it was parked; nil removes none.
	KeepDeadLetter func(e *DLQEntry) time.Duration
	// Statuses are the outcomes whose runs may go; all four when empty.
	Statuses []RunStatus
	// Chain, when set, keeps the walk to that chain's runs.
	Chain string
	// DryRun removes nothing; Removed is called all the same.
	DryRun bool
	// Removed is told of each run removed (or that would be, in a dry
	// run), with what it freed; then, after each full batch of runs,
	// Batch is called and the prune pauses so that live runs' commits go
	// first.
	Removed func(run *Run, freed Freed)
	Batch   func()
	// BatchSize and Pause default to 100 runs and 20 ms.
	BatchSize int
	Pause     time.Duration
}

// PruneStats is what a prune did.
type PruneStats struct {
	Runs        int
	DeadLetters int
	Freed       Freed
	// Kept counts the runs past their time kept for a reason that still
	// holds: an open dead-letter entry, an idempotency key, a parent.
	KeptForDeadLetter, KeptForKey, KeptForParent int
	// OldestKept is when the oldest run kept ended; zero when none was
	// read.
	OldestKept time.Time
}

// Prune removes from s what the policy no longer keeps: dead-letter
// entries first, then runs.
func Prune(ctx context.Context, s Store, p PrunePolicy) (PruneStats, error) {
	if p.BatchSize <= 0 {
		p.BatchSize = 100
	}
	if p.Pause <= 0 {
		p.Pause = 20 * time.Millisecond
	}
	if len(p.Statuses) == 0 {
		p.Statuses = FinalRunStatuses
	}
	pr := &pruning{s: s, p: p, parents: map[string]bool{}}
	if err := pr.deadLetters(ctx); err != nil {
		return pr.stats, err
	}
	for _, status := range p.Statuses {
		if !status.Final() {
			return pr.stats, fmt.Errorf("pruning: status %q is not one a run ends with: %w", status, ErrInvalid)
		}
		if err := pr.runs(ctx, status); err != nil {
			return pr.stats, err
		}
	}
	return pr.stats, nil
}

type pruning struct {
	s       Store
	p       PrunePolicy
	stats   PruneStats
	openDLQ map[string]bool
	parents map[string]bool
	batch   int
}

// deadLetters removes the entries past their time, and notes the runs
// that still have one.
func (pr *pruning) deadLetters(ctx context.Context) error {
	pr.openDLQ = map[string]bool{}
	after := ""
	for {
		page, err := pr.s.ListDLQ(ctx, DLQFilter{After: after, Limit: 1000})
		if err != nil {
			return fmt.Errorf("pruning: reading the dead-letter queue: %w", err)
		}
		for _, e := range page {
			keep := time.Duration(0)
			if pr.p.KeepDeadLetter != nil {
				keep = pr.p.KeepDeadLetter(e)
			}
			if pr.p.KeepDeadLetter == nil || pr.p.DryRun || keep == 0 || e.CreatedAt.Add(keep).After(pr.p.Now) {
				if e.RunID != "" {
					pr.openDLQ[e.RunID] = true
				}
				continue
			}
			switch err := pr.s.DeleteDLQ(ctx, e.ID); {
			case errors.Is(err, ErrNotFound):
			case err != nil:
				return fmt.Errorf("pruning dead-letter entry %s: %w", e.ID, err)
			default:
				pr.stats.DeadLetters++
			}
		}
		if len(page) < 1000 {
			return nil
		}
		after = page[len(page)-1].ID
	}
}

// runs removes the runs that ended with status and are past their time.
func (pr *pruning) runs(ctx context.Context, status RunStatus) error {
	shortest := pr.p.Shortest(status)
	if shortest == 0 {
		return nil
	}
	stopAt := pr.p.Now.Add(-shortest)
	return pr.s.FinishedRuns(ctx, status, func(run *Run) (bool, error) {
		ended := run.FinishedAt
		if ended.IsZero() {
			ended = run.UpdatedAt
		}
		if ended.After(stopAt) {
			pr.kept(ended)
			return false, nil
		}
		if pr.p.Chain != "" && run.Chain != pr.p.Chain {
			return true, nil
		}
		if keep := pr.p.Keep(run); keep == 0 || ended.Add(keep).After(pr.p.Now) {
			pr.kept(ended)
			return true, nil
		}
		switch {
		case pr.openDLQ[run.ID]:
			pr.stats.KeptForDeadLetter++
		case run.KeyUntil.After(pr.p.Now):
			pr.stats.KeptForKey++
		case run.ParentRun != "" && pr.parentThere(ctx, run.ParentRun):
			pr.stats.KeptForParent++
		default:
			return true, pr.remove(ctx, run)
		}
		pr.kept(ended)
		return true, nil
	})
}

// remove deletes one run, or notes it in a dry run.
func (pr *pruning) remove(ctx context.Context, run *Run) error {
	var freed Freed
	if !pr.p.DryRun {
		var err error
		freed, err = pr.s.DeleteRun(ctx, run.ID)
		switch {
		case errors.Is(err, ErrNotFound), errors.Is(err, ErrUnfinished), errors.Is(err, ErrConflict):
			// Another gateway removed it, or a replay reopened it.
			return nil
		case err != nil:
			return fmt.Errorf("pruning run %s: %w", run.ID, err)
		}
	}
	pr.stats.Runs++
	pr.stats.Freed.Add(freed)
	if pr.p.Removed != nil {
		pr.p.Removed(run, freed)
	}
	if pr.batch++; pr.batch < pr.p.BatchSize {
		return nil
	}
	pr.batch = 0
	if pr.p.Batch != nil {
		pr.p.Batch()
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(pr.p.Pause):
		return nil
	}
}

// parentThere reports whether a sub-chain's parent run is there; one that
// cannot be read is taken as there.
func (pr *pruning) parentThere(ctx context.Context, id string) bool {
	if there, ok := pr.parents[id]; ok {
		return there
	}
	_, err := pr.s.RunHeader(ctx, id)
	there := !errors.Is(err, ErrNotFound)
	pr.parents[id] = there
	return there
}

// kept notes when a kept run ended, for the oldest kept.
func (pr *pruning) kept(ended time.Time) {
	if pr.stats.OldestKept.IsZero() || ended.Before(pr.stats.OldestKept) {
		pr.stats.OldestKept = ended
	}
}
