package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/internal/jsonx"
	"github.com/chaingate/gateway/internal/textx"
)

// ReplayMode says how a dead-lettered failure runs again.
type ReplayMode string

const (
	// ReplayResume runs the failed run again from the step that failed,
	// keeping every result it already had.
	ReplayResume ReplayMode = "resume"
	// ReplayRestart starts a new run of the chain with the same origin.
	ReplayRestart ReplayMode = "restart"
)

// ReplayDefinition says which definition a resumed run carries on with.
type ReplayDefinition string

const (
	// ReplayCurrent resumes on the chain as the running config defines it,
	// so a fix to a provider's config or a step's payload applies, provided
	// the steps the run already took are still there as the same kind.
	ReplayCurrent ReplayDefinition = "current"
	// ReplayPinned resumes on the definition the run started with.
	ReplayPinned ReplayDefinition = "pinned"
)

// ReplayOptions says how a dead-lettered failure runs again. The zero
// value resumes the run on the current definition.
type ReplayOptions struct {
	Mode       ReplayMode
	Definition ReplayDefinition
}

// Check reports options that do not name a known mode and definition, or
// that do not go together.
func (o ReplayOptions) Check() error {
	switch o.Mode {
	case ReplayResume, ReplayRestart, "":
	default:
		return fmt.Errorf("%w: unknown mode %q (want resume or restart)", ErrNotReplayable, o.Mode)
	}
	switch o.Definition {
	case ReplayCurrent, "":
	case ReplayPinned:
		if o.Mode == ReplayRestart {
			return fmt.Errorf("%w: a restart is a new run and always runs the current definition; use definition current, or mode resume", ErrNotReplayable)
		}
	default:
		return fmt.Errorf("%w: unknown definition %q (want current or pinned)", ErrNotReplayable, o.Definition)
	}
	return nil
}

// ErrNotReplayable is returned for an entry whose run cannot be resumed.
var ErrNotReplayable = errors.New("cannot replay")

// Replay runs a dead-lettered failure again and removes its entry. It
// returns the run that carries on: the same run for resume, a new one for
// restart.
func (e *Engine) Replay(ctx context.Context, entryID string, opts ReplayOptions) (*store.Run, error) {
	if err := opts.Check(); err != nil {
		return nil, fmt.Errorf("replaying: %w", err)
	}
	entry, err := e.store.DLQ(ctx, entryID)
	if err != nil {
		return nil, fmt.Errorf("replaying: %w", err)
	}
	return e.replay(ctx, entry, opts)
}

func (e *Engine) replay(ctx context.Context, entry *store.DLQEntry, opts ReplayOptions) (*store.Run, error) {
	what := "replaying entry " + entry.ID
	if entry.Kind == store.DLQDelivery {
		return nil, fmt.Errorf("%s: it holds a trigger delivery, which its trigger takes again, not a run", what)
	}
	old, err := e.store.Run(ctx, entry.RunID)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	var run *store.Run
	if opts.Mode == ReplayRestart {
		run, err = e.restart(ctx, old, entry.ID)
	} else {
		run, err = e.resumeFrom(ctx, old.ID, reopen{step: entry.Step, entryID: entry.ID, current: opts.Definition != ReplayPinned})
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if err := e.store.DeleteDLQ(ctx, entry.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		e.log.Warn("removing a replayed dead-letter entry", "entry", entry.ID, "err", err)
	}
	return run, nil
}

// ReplayRun runs a run that ended without success again, whether or not a
// dead-letter entry holds its failure: resume carries on from the
// top-level step it stopped at, restart starts a new run with its origin.
// When the run's failure was dead-lettered, this is that entry's replay,
// and the entry goes.
func (e *Engine) ReplayRun(ctx context.Context, runID string, opts ReplayOptions) (*store.Run, error) {
	what := "replaying run " + runID
	if err := opts.Check(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	run, err := e.store.Run(ctx, runID)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if !run.Status.Final() {
		return nil, fmt.Errorf("%s: %w: it is %s; cancel it first", what, ErrNotReplayable, run.Status)
	}
	if run.ParentRun != "" {
		return nil, fmt.Errorf("%s: %w: it is a sub-chain of run %s; replay that run", what, ErrNotReplayable, run.ParentRun)
	}
	if opts.Mode == ReplayRestart {
		if entry, err := e.runEntry(ctx, run); err != nil || entry != nil {
			if err != nil {
				return nil, fmt.Errorf("%s: %w", what, err)
			}
			return e.replay(ctx, entry, opts)
		}
		if run, err = e.restart(ctx, run, ""); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		return run, nil
	}
	if run.Status == store.RunSucceeded {
		return nil, fmt.Errorf("%s: %w: it succeeded; replay it with mode restart", what, ErrNotReplayable)
	}
	entry, err := e.runEntry(ctx, run)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if entry != nil {
		return e.replay(ctx, entry, opts)
	}
	if len(run.Path) == 0 {
		return nil, fmt.Errorf("%s: %w: it took no step; replay it with mode restart", what, ErrNotReplayable)
	}
	if run, err = e.resumeFrom(ctx, run.ID, reopen{step: replayStep(run), current: opts.Definition != ReplayPinned}); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return run, nil
}

// runEntry finds the dead-letter entry that holds a run's failure: one of
// the run's own entries for the top-level step it stopped at. Entries for
// items a split tolerated are not the run's failure.
func (e *Engine) runEntry(ctx context.Context, run *store.Run) (*store.DLQEntry, error) {
	if len(run.Path) == 0 {
		return nil, nil
	}
	last := replayStep(run)
	f := store.DLQFilter{Chain: run.Chain, Since: run.CreatedAt, Limit: 500}
	for {
		page, err := e.store.ListDLQ(ctx, f)
		if err != nil {
			return nil, fmt.Errorf("finding the run's dead-letter entry: %w", err)
		}
		for _, entry := range page {
			if entry.RunID == run.ID && topStep(entry.Step) == last {
				return entry, nil
			}
		}
		if len(page) < f.Limit {
			return nil, nil
		}
		f.After = page[len(page)-1].ID
	}
}

// topStep is the top-level step a step key lies in.
func topStep(key string) string {
	if i := strings.IndexAny(key, "/["); i >= 0 {
		return key[:i]
	}
	return key
}

func (e *Engine) restart(ctx context.Context, old *store.Run, entryID string) (*store.Run, error) {
	meta := map[string]any{}
	if len(old.Origin.Metadata) > 0 {
		_ = json.Unmarshal(old.Origin.Metadata, &meta)
	}
	meta["replay_of"] = old.ID
	if entryID != "" {
		meta["dead_letter_entry"] = entryID
	}
	if who := by(ctx); who != "" {
		meta["replayed_by"] = who[len(" by "):]
	}
	mb, _ := jsonx.Marshal(meta)
	return e.Start(ctx, old.Chain, Input{Payload: old.Origin.Payload, Metadata: mb, OriginID: old.Origin.ID, StartedBy: store.StartedByReplay})
}

// reopen says where and how resumeFrom reopens a run.
type reopen struct {
	// step is the top-level step to reopen, or a key inside it; entryID
	// names the dead-letter entry being replayed, if any.
	step, entryID string
	// current carries on with the running config's definition of the
	// chain when it differs from the pinned one.
	current bool
	// redrive reopens a split that ended, whatever became of the run: its
	// failed items run again (and its skipped ones, with skipped), and
	// the steps after it run again on its new results.
	redrive, skipped bool
}

// resumeFrom reopens a run that ended at the top-level step o names.
// That step's failed parts are cleared so they run again; what succeeded
// stays: a parallel group keeps its succeeded sub-steps, a split its
// finished items.
func (e *Engine) resumeFrom(ctx context.Context, runID string, o reopen) (*store.Run, error) {
	step, entryID, current := o.step, o.entryID, o.current
	if !e.reserve(runID) {
		return nil, fmt.Errorf("%w: run %s is running", ErrNotReplayable, runID)
	}
	defer e.unreserve(runID)
	lease, err := e.leaseEnded(ctx, runID)
	if err != nil {
		return nil, err
	}
	started := false
	defer func() {
		if !started {
			_ = e.store.ReleaseLease(context.WithoutCancel(ctx), lease)
		}
	}()
	run, err := e.store.Run(ctx, runID)
	if err != nil {
		return nil, err
	}
	switch {
	case o.redrive && !run.Status.Final():
		return nil, fmt.Errorf("%w: run %s is %s; a split is redriven once its run has ended", ErrNotReplayable, run.ID, run.Status)
	case !o.redrive && (!run.Status.Final() || run.Status == store.RunSucceeded):
		hint := "replay it with mode restart"
		if entryID != "" {
			hint += ", or delete the entry"
		}
		return nil, fmt.Errorf("%w: run %s is %s; %s", ErrNotReplayable, run.ID, run.Status, hint)
	}
	if err := e.dropCancelRequest(ctx, runID); err != nil {
		return nil, err
	}
	def, _, err := e.definition(ctx, run.Chain, run.ChainHash)
	if err != nil {
		return nil, err
	}
	top := topStep(step)
	s := def.Step(top)
	at := slices.Index(run.Path, top)
	if s == nil || s.Parent != nil || at < 0 {
		return nil, fmt.Errorf("%w: step %q is not on the path run %s took", ErrNotReplayable, top, run.ID)
	}
	if o.redrive && (s.Kind != chain.KindSplit || top != step) {
		return nil, fmt.Errorf("%w: step %q is not a split at the top level of chain %q; only such a split is redriven", ErrNotReplayable, step, run.Chain)
	}
	var switchTo *store.Definition
	if cur := e.config().Chains[run.Chain]; current && (cur == nil || cur.Hash != run.ChainHash) {
		if switchTo, err = e.switchDefinition(ctx, def, cur, run, top, at); err != nil {
			return nil, err
		}
		def, s = cur, cur.Step(top)
	}

	now := e.clock.Now().UTC()
	if def.TimeoutSeconds > 0 {
		run.Deadline = now.Add(time.Duration(def.TimeoutSeconds) * time.Second)
	}
	b := &store.Batch{Run: run, Lease: &lease, Definition: switchTo}
	scan := store.StepScan{Prefix: top}
	after := map[string]bool{}
	if o.redrive {
		// The steps after the split read its results: they run again.
		scan = store.StepScan{}
		for _, name := range run.Path[at+1:] {
			after[name] = true
		}
	}
	rerun := 0
	// A distributed split that succeeded kept its items' results in its
	// body, and slots only for the items that did not succeed.
	var results json.RawMessage
	var split *store.StepRecord
	slots := map[int]bool{}
	err = e.store.ForEachStep(ctx, run.ID, scan, func(rec *store.StepRecord) error {
		if o.redrive && topStep(rec.Key) != top {
			if after[topStep(rec.Key)] {
				b.DeleteSteps = append(b.DeleteSteps, rec.Key)
			}
			return nil
		}
		if _, i, slot := itemSlot(rec.Key); slot && strings.HasPrefix(rec.Key, top+"[") {
			slots[i] = true
			switch {
			case rec.Status == store.StepSkipped && o.skipped:
				b.DeleteSteps = append(b.DeleteSteps, rec.Key)
				rerun++
				return nil
			case rec.Status != store.StepSucceeded && rec.Status != store.StepSkipped:
				rerun++
			}
		}
		switch {
		case rec.Key == top:
			if o.redrive && rec.Split != nil && rec.Split.Distributed && rec.Status == store.StepSucceeded {
				results, split = rec.Body, rec
			}
			switch s.Kind {
			case chain.KindParallel, chain.KindSplit:
				// The step resumes with a fresh deadline and what it kept.
				rec.Status = store.StepRunning
				rec.Error = nil
				rec.Body = nil
				rec.FinishedAt = time.Time{}
				rec.Deadline = replayDeadline(s, now, run)
				if rec.Split != nil {
					rec.Split.Failed = 0
					if o.skipped {
						rec.Split.Skipped = 0
					}
					if rec.Split.Distributed {
						// What is left goes to the workers under a hand-off
						// of its own; the finished items' slots stay.
						rec.Split.Gen++
						rec.Split.Imported = 0
					}
				}
				b.Steps = append(b.Steps, rec)
			default:
				b.DeleteSteps = append(b.DeleteSteps, rec.Key)
			}
		case !strings.HasPrefix(rec.Key, top+"/") && !strings.HasPrefix(rec.Key, top+"["):
			// Another step whose name starts with the same letters.
		case rec.Status == store.StepSucceeded || rec.Status == store.StepSkipped:
			// Kept, unless it sits inside a split item being run again,
			// which the item's own slot decides below.
			if _, _, ok := itemSlot(rec.Key); !ok && inRerunItem(b.DeleteSteps, rec.Key) {
				b.DeleteSteps = append(b.DeleteSteps, rec.Key)
			}
		default:
			b.DeleteSteps = append(b.DeleteSteps, rec.Key)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if split != nil {
		kept, err := keptResults(top, split, results, slots, now)
		if err != nil {
			return nil, err
		}
		b.Steps = append(b.Steps, kept...)
	}
	if o.redrive && rerun == 0 {
		what := "failed"
		if o.skipped {
			what = "failed or skipped"
		}
		return nil, fmt.Errorf("%w: split %q of run %s has no %s item to run again", ErrNotReplayable, top, run.ID, what)
	}
	if err := e.reopenPhase(ctx, def, run, s, at, now, b); err != nil {
		return nil, err
	}
	run.Status = store.RunRunning
	run.Error = nil
	run.Body, run.BodyStep = nil, ""
	run.FinishedAt = time.Time{}
	run.Cursor = top
	run.Path = run.Path[:at]
	run.Seq++
	msg := fmt.Sprintf("replaying from step %q", top)
	if o.redrive {
		verb := "run"
		if rerun == 1 {
			verb = "runs"
		}
		msg = fmt.Sprintf("redriving split %q: %s %s again, the others keep their results", top, textx.Count(rerun, "item", "items"), verb)
	}
	if entryID != "" {
		msg += fmt.Sprintf(" (dead-letter entry %s)", entryID)
	}
	msg += by(ctx)
	if switchTo != nil {
		msg += fmt.Sprintf(" on the current definition (%.12s, was %.12s)", switchTo.Hash, run.ChainHash)
		run.ChainHash = switchTo.Hash
	}
	b.Events = []store.Event{{RunID: run.ID, Chain: run.Chain, Seq: run.Seq, Time: now, Type: store.EventRunReplayed, Step: step, Message: msg}}
	if err := e.store.Commit(ctx, b); err != nil {
		return nil, err
	}
	e.onEvent(b.Events[0])
	started, err = e.resumeLeased(ctx, run.ID, lease)
	if err != nil {
		return nil, err
	}
	snapshot := *run
	return &snapshot, nil
}

// leaseEnded takes the lease of a run to reopen it. The gateway that
// advanced the run gives its lease back a moment after the run's end is
// durable, so a run that has ended is waited for, up to notePatience,
// rather than refused as another gateway's.
func (e *Engine) leaseEnded(ctx context.Context, runID string) (store.Lease, error) {
	deadline := time.Now().Add(notePatience)
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 250*time.Millisecond) {
		lease, err := e.store.AcquireLease(ctx, runID, e.owner, e.leaseTTL)
		if !errors.Is(err, store.ErrLeaseHeld) || time.Now().After(deadline) {
			return lease, err
		}
		if run, rerr := e.store.RunHeader(ctx, runID); rerr != nil || !run.Status.Final() {
			return lease, err
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return store.Lease{}, fmt.Errorf("waiting for the gateway that advanced run %s to let go of it: %w", runID, ctx.Err())
		}
	}
}

// switchDefinition checks that a failed run can carry on with cur, the
// running config's definition of its chain, in place of pinned, the one it
// started with: every step it has recorded, the steps on its path before
// top and top itself must be in cur as the same kind of step in the same
// place, so the results it keeps mean what they meant. It returns the
// definition to store with the run.
func (e *Engine) switchDefinition(ctx context.Context, pinned, cur *chain.Chain, run *store.Run, top string, at int) (*store.Definition, error) {
	if cur == nil {
		return nil, fmt.Errorf("%w: chain %q is no longer in the config; replay with definition pinned", ErrNotReplayable, run.Chain)
	}
	seen := map[string]bool{}
	check := func(key string) error {
		var parent string
		for _, part := range strings.Split(key, "/") {
			name, _, _ := strings.Cut(part, "[")
			if !seen[parent+"/"+name] {
				if err := sameStep(pinned, cur, name, parent); err != nil {
					return err
				}
				seen[parent+"/"+name] = true
			}
			parent = name
		}
		return nil
	}
	for _, name := range run.Path[:at+1] {
		if err := check(name); err != nil {
			return nil, err
		}
	}
	err := e.store.ForEachStep(ctx, run.ID, store.StepScan{}, func(rec *store.StepRecord) error {
		return check(rec.Key)
	})
	if err != nil {
		return nil, err
	}
	src, err := e.source(e.config(), cur.Name)
	if err != nil {
		return nil, fmt.Errorf("encoding the current definition: %w", err)
	}
	return &store.Definition{Hash: cur.Hash, Source: src}, nil
}

// sameStep reports how step name, under parent ("" at top level), differs
// between the pinned and the current definition, if it does in a way that
// keeps a recorded result from carrying over.
func sameStep(pinned, cur *chain.Chain, name, parent string) error {
	was, now := pinned.Step(name), cur.Step(name)
	if was == nil {
		return nil
	}
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("%w on the current definition: %s; fix the config, or replay with definition pinned", ErrNotReplayable, fmt.Sprintf(format, args...))
	}
	if now == nil {
		return refuse("step %q, which the run has taken, is no longer in chain %q", name, cur.Name)
	}
	if now.Kind != was.Kind {
		return refuse("step %q was a %s step and is now a %s step", name, was.Kind, now.Kind)
	}
	nowParent := ""
	if now.Parent != nil {
		nowParent = now.Parent.Name
	}
	if nowParent != parent {
		where := func(p string) string {
			if p == "" {
				return "at the top level"
			}
			return fmt.Sprintf("inside %q", p)
		}
		return refuse("step %q was %s and is now %s", name, where(parent), where(nowParent))
	}
	return nil
}

// inRerunItem reports whether key sits under a split item slot already
// marked for deletion, whose steps therefore all run again.
func inRerunItem(deleted []string, key string) bool {
	for i := len(deleted) - 1; i >= 0; i-- {
		if _, _, ok := itemSlot(deleted[i]); ok && strings.HasPrefix(key, deleted[i]+"/") {
			return true
		}
	}
	return false
}

// replayDeadline is a fresh deadline for a group or split being run again.
func replayDeadline(s *chain.Step, now time.Time, run *store.Run) time.Time {
	var d time.Time
	switch {
	case s.Parallel != nil:
		d = now.Add(time.Duration(s.Parallel.TimeoutSeconds) * time.Second)
	case s.Split != nil && s.Split.TimeoutSeconds > 0:
		d = now.Add(time.Duration(s.Split.TimeoutSeconds) * time.Second)
	}
	if !run.Deadline.IsZero() && (d.IsZero() || run.Deadline.Before(d)) {
		return run.Deadline
	}
	return d
}

// RedriveOptions says which items of a split that ended run again.
type RedriveOptions struct {
	// Skipped runs the skipped items again too, not only the failed ones.
	Skipped bool
	// Definition is the one the run carries on with (ReplayOptions').
	Definition ReplayDefinition
}

// Redrive runs again the failed items of a top-level split of a run that
// ended (and its skipped items, with opts.Skipped), keeping every other
// item's recorded result, then carries on with the steps after the split,
// which run again on its new results: a split of 20,000 items with 201
// failures makes 201 calls, not 20,000. The run's dead-letter entries for
// the items run again go.
func (e *Engine) Redrive(ctx context.Context, runID, step string, opts RedriveOptions) (*store.Run, error) {
	what := fmt.Sprintf("redriving split %q of run %s", step, runID)
	if err := (ReplayOptions{Definition: opts.Definition}).Check(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	run, err := e.store.RunHeader(ctx, runID)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if run.ParentRun != "" {
		return nil, fmt.Errorf("%s: %w: it is a sub-chain of run %s", what, ErrNotReplayable, run.ParentRun)
	}
	redriven, err := e.resumeFrom(ctx, runID, reopen{step: step, current: opts.Definition != ReplayPinned, redrive: true, skipped: opts.Skipped})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	e.dropItemEntries(ctx, run, step)
	return redriven, nil
}

// dropItemEntries removes a run's dead-letter entries for the items of a
// split being run again: their failures are no longer the last word.
func (e *Engine) dropItemEntries(ctx context.Context, run *store.Run, split string) {
	f := store.DLQFilter{Chain: run.Chain, Since: run.CreatedAt, Limit: 500}
	for {
		page, err := e.store.ListDLQ(ctx, f)
		if err != nil {
			e.log.Warn("listing the dead-letter entries of a redriven split's items; they stay", "run", run.ID, "step", split, "err", err)
			return
		}
		for _, entry := range page {
			if entry.RunID != run.ID || !strings.HasPrefix(entry.Step, split+"[") {
				continue
			}
			if err := e.store.DeleteDLQ(ctx, entry.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
				e.log.Warn("removing the dead-letter entry of a redriven item", "entry", entry.ID, "err", err)
			}
		}
		if len(page) < f.Limit {
			return
		}
		f.After = page[len(page)-1].ID
	}
}

// keptResults are the slots of a distributed split's succeeded items, made
// from its body's results, for the items that have none: on a redrive they
// keep their results, and only the others are handed out again.
func keptResults(key string, split *store.StepRecord, body json.RawMessage, slots map[int]bool, at time.Time) ([]*store.StepRecord, error) {
	var b struct {
		Results []json.RawMessage `json:"results"`
	}
	if err := json.Unmarshal(body, &b); err != nil || len(b.Results) != split.Split.Total {
		return nil, fmt.Errorf("%w: the results of split %q cannot be read back to keep them (%d of %d, %v)", ErrNotReplayable, key, len(b.Results), split.Split.Total, err)
	}
	var out []*store.StepRecord
	for i, res := range b.Results {
		if slots[i] {
			continue
		}
		out = append(out, &store.StepRecord{Key: ItemKey(key, i, split.Split.Total), Name: split.Name, Status: store.StepSucceeded, Body: res, FinishedAt: at})
	}
	return out, nil
}
