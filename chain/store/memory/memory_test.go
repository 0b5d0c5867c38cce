package memory_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/internal/storetest"
	"github.com/chaingate/gateway/chain/store/memory"
)

func open(t testing.TB) *memory.Store {
	s := memory.New()
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// Nothing survives closing it, and no byte of it can be damaged: the
// suite leaves Reopen and Damage out.
func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Factory{
		Open: func(t *testing.T) store.Store { return open(t) },
	})
}

// TestRecordsAreCopies changes what was committed and what was read back,
// as the engine and callers do: the store's own records stay as written.
func TestRecordsAreCopies(t *testing.T) {
	ctx := context.Background()
	s := open(t)
	run := storetest.NewRun("c", time.Now().UTC())
	run.Path = []string{"a"}
	run.Seq = 1
	step := &store.StepRecord{Key: "a", Name: "a", Status: store.StepSucceeded, Body: json.RawMessage(`{"n":1}`),
		Error: &store.ErrorInfo{Message: "m"}, Split: &store.SplitState{Total: 2}}
	events := []store.Event{{Seq: 1, Type: store.EventRunStarted, Data: json.RawMessage(`{"d":1}`)}}
	entry := &store.DLQEntry{ID: store.NewID(), RunID: run.ID, Payload: json.RawMessage(`{"p":1}`), Headers: map[string]string{"h": "1"}}
	err := s.Commit(ctx, &store.Batch{Run: run, Create: true, Steps: []*store.StepRecord{step}, Events: events, DLQ: []*store.DLQEntry{entry}})
	if err != nil {
		t.Fatal(err)
	}
	if events[0].RunID != "" {
		t.Errorf("the batch's event was changed: %+v", events[0])
	}

	run.Path[0], run.Origin.Payload[2] = "x", 'X'
	step.Body[2], step.Error.Message, step.Split.Total = 'X', "x", 9
	events[0].Data[2] = 'X'
	entry.Payload[2], entry.Headers["h"] = 'X', "x"
	check := func(when string) {
		t.Helper()
		got, err := s.Run(ctx, run.ID)
		if err != nil || got.Path[0] != "a" || string(got.Origin.Payload) != `{"alert":"disk"}` {
			t.Errorf("%s: the run reads %+v (%v)", when, got, err)
		}
		steps, err := s.Steps(ctx, run.ID, "")
		if err != nil || len(steps) != 1 || string(steps[0].Body) != `{"n":1}` || steps[0].Error.Message != "m" || steps[0].Split.Total != 2 {
			t.Errorf("%s: the step reads %+v (%v)", when, steps, err)
		}
		evs, err := s.Events(ctx, run.ID, 0, 0)
		if err != nil || len(evs) != 1 || string(evs[0].Data) != `{"d":1}` || evs[0].RunID != run.ID {
			t.Errorf("%s: the event reads %+v (%v)", when, evs, err)
		}
		d, err := s.DLQ(ctx, entry.ID)
		if err != nil || string(d.Payload) != `{"p":1}` || d.Headers["h"] != "1" {
			t.Errorf("%s: the dead-letter entry reads %+v (%v)", when, d, err)
		}
	}
	check("after changing what was committed")

	got, _ := s.Run(ctx, run.ID)
	got.Path[0], got.Origin.Payload[2] = "y", 'Y'
	steps, _ := s.Steps(ctx, run.ID, "")
	steps[0].Body[2], steps[0].Error.Message, steps[0].Split.Total = 'Y', "y", 7
	evs, _ := s.Events(ctx, run.ID, 0, 0)
	evs[0].Data[2] = 'Y'
	d, _ := s.DLQ(ctx, entry.ID)
	d.Payload[2], d.Headers["h"] = 'Y', "y"
	check("after changing what was read")
}

// TestReadsBesideCommits reads runs while they are committed to, for the
// race detector: reads copy records after letting the lock go.
func TestReadsBesideCommits(t *testing.T) {
	ctx := context.Background()
	s := open(t)
	const runs, commits = 8, 50
	var wg sync.WaitGroup
	for range runs {
		run := storetest.NewRun("c", time.Now().UTC())
		run.Seq = 1
		if err := s.Commit(ctx, &store.Batch{Run: run, Create: true, Events: []store.Event{{Seq: 1, Type: store.EventRunStarted}}}); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			for i := range commits {
				if err := s.Commit(ctx, stepBatch(run, i)); err != nil {
					t.Error(err)
					return
				}
			}
			run.Status, run.FinishedAt = store.RunSucceeded, time.Now().UTC()
			if err := s.Commit(ctx, &store.Batch{Run: run}); err != nil {
				t.Error(err)
			}
		})
		wg.Go(func() {
			for range commits {
				if _, err := s.Run(ctx, run.ID); err != nil {
					t.Error(err)
				}
				if _, err := s.Steps(ctx, run.ID, "s"); err != nil {
					t.Error(err)
				}
				if _, err := s.Events(ctx, run.ID, 0, 0); err != nil {
					t.Error(err)
				}
				if _, err := s.ListRuns(ctx, store.RunFilter{}); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	n := 0
	err := s.FinishedRuns(ctx, store.RunSucceeded, func(run *store.Run) (bool, error) {
		n++
		_, err := s.DeleteRun(ctx, run.ID)
		return true, err
	})
	if err != nil || n != runs {
		t.Errorf("deleted %d runs of %d: %v", n, runs, err)
	}
}

// stepBatch is what the engine commits for one step: the run record, the
// step's record and one event.
func stepBatch(run *store.Run, i int) *store.Batch {
	run.Seq++
	key := fmt.Sprintf("s%03d", i)
	return &store.Batch{
		Run: run,
		Steps: []*store.StepRecord{{Key: key, Name: "s", Status: store.StepSucceeded,
			DedupKey: run.ID + "/" + key, Attempts: 1, Body: json.RawMessage(`{"alert":"disk-full","text":"step done","n":3}`)}},
		Events: []store.Event{{Seq: run.Seq, Time: time.Now(), Type: store.EventStepSucceeded, Step: key}},
	}
}

// BenchmarkCommit creates a run and commits ten steps to it, as a short
// chain's test case does.
func BenchmarkCommit(b *testing.B) {
	s := open(b)
	ctx := context.Background()
	for b.Loop() {
		run := storetest.NewRun("c", time.Now())
		run.Seq = 1
		if err := s.Commit(ctx, &store.Batch{Run: run, Create: true, Events: []store.Event{{Seq: 1, Type: store.EventRunStarted}}}); err != nil {
			b.Fatal(err)
		}
		for i := range 10 {
			if err := s.Commit(ctx, stepBatch(run, i)); err != nil {
				b.Fatal(err)
			}
		}
	}
}
