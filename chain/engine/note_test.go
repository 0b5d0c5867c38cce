package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
)

// TestNote appends notes to a run waiting at an approval step, whose
// runner takes them, and to the same run once it has ended, straight in the
// store; each is in the run's log once, in order, with its data.
func TestNote(t *testing.T) {
	h := approvalHarness(t, "0", "fail", "fail")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	run, err := h.eng.Start(ctx, "restart", engine.Input{Payload: json.RawMessage(`{"host":"db-1"}`)})
	if err != nil {
		t.Fatal(err)
	}
	waitWaiting(t, h, run.ID)
	if err := h.eng.Note(ctx, run.ID, "while waiting", json.RawMessage(`{"n":1}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := h.eng.Signal(engine.WithActor(ctx, "alice"), run.ID, "ask", "approve", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := h.eng.Wait(ctx, run.ID); err != nil {
		t.Fatal(err)
	}
	if err := h.eng.Note(ctx, run.ID, "after the end", json.RawMessage(`{"n":2}`)); err != nil {
		t.Fatal(err)
	}
	evs, err := h.store.Events(ctx, run.ID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var notes []string
	for i, ev := range evs {
		if ev.Seq != uint64(i+1) {
			t.Errorf("event %d has seq %d", i, ev.Seq)
		}
		if ev.Type == store.EventNote {
			notes = append(notes, ev.Message+" "+string(ev.Data))
		}
	}
	if want := []string{`while waiting {"n":1}`, `after the end {"n":2}`}; !slices.Equal(notes, want) {
		t.Errorf("notes %q, want %q", notes, want)
	}
	if last := evs[len(evs)-1]; last.Type != store.EventNote {
		t.Errorf("the last event is %s", last.Type)
	}
	if got := h.storedRun(run.ID); got.Status != store.RunSucceeded || got.Seq != uint64(len(evs)) {
		t.Errorf("after the notes the run is %s at seq %d, with %d events", got.Status, got.Seq, len(evs))
	}
	if err := h.eng.Note(ctx, "01nosuchrun0000000000000000", "x", nil); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a note on no run: %v", err)
	}
}
