package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/chaingate/gateway/chain/store"
)

// notePatience bounds how long Note waits for a run another gateway
// advances to be let go of.
const notePatience = 3 * time.Second

// Note appends an event of type store.EventNote to a run's log, from
// outside its steps: a later notification of the alert group that started
// it, say. A run this engine advances gets it from its runner; a run no
// gateway advances, a finished one included, is written under a lease of
// the note's own. While another gateway advances the run, Note waits up to
// notePatience for it and then fails with store.ErrLeaseHeld.
func (e *Engine) Note(ctx context.Context, runID, msg string, data json.RawMessage) error {
	what := fmt.Sprintf("noting on run %s", runID)
	deadline := time.Now().Add(notePatience)
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 250*time.Millisecond) {
		if r := e.active(runID); r != nil {
			taken := make(chan struct{})
			if r.give(outcome{do: func(r *runner) { r.note(msg, data); close(taken) }}, ctx) {
				select {
				case <-taken:
					return nil
				case <-r.done:
					// It stopped before reading the note: the store takes it.
				case <-ctx.Done():
					return fmt.Errorf("%s: %w", what, ctx.Err())
				}
			} else if ctx.Err() != nil {
				return fmt.Errorf("%s: %w", what, ctx.Err())
			}
		}
		err := e.noteStored(ctx, runID, msg, data)
		if !errors.Is(err, store.ErrLeaseHeld) && !errors.Is(err, errTaken) {
			if err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %w", what, err)
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, ctx.Err())
		}
	}
}

// note appends a note to the run's pending events.
func (r *runner) note(msg string, data json.RawMessage) {
	r.event(store.EventNote, "", 0, msg)
	r.events[len(r.events)-1].Data = data
}

// noteStored appends a note straight to a run no runner here advances.
func (e *Engine) noteStored(ctx context.Context, runID, msg string, data json.RawMessage) error {
	if !e.reserve(runID) {
		return errTaken
	}
	defer e.unreserve(runID)
	lease, err := e.store.AcquireLease(ctx, runID, e.owner, e.leaseTTL)
	if err != nil {
		return err
	}
	defer func() { _ = e.store.ReleaseLease(context.WithoutCancel(ctx), lease) }()
	run, err := e.store.RunHeader(ctx, runID)
	if err != nil {
		return err
	}
	run.Seq++
	ev := store.Event{RunID: run.ID, Chain: run.Chain, Seq: run.Seq, Time: e.clock.Now().UTC(), Type: store.EventNote, Message: msg, Data: data}
	if err := e.store.Commit(ctx, &store.Batch{Run: run, Events: []store.Event{ev}, Lease: &lease}); err != nil {
		return err
	}
	e.onEvent(ev)
	return nil
}
