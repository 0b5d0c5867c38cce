package bolt_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/bolt"
	"github.com/chaingate/gateway/chain/store/internal/storetest"
)

// stepBatch is what the engine commits for one step: the run record, the
// step's record and one event.
func stepBatch(run *store.Run, i int) *store.Batch {
	run.Seq++
	return &store.Batch{
		Run: run,
		Steps: []*store.StepRecord{{Key: "s" + string(rune('a'+i%26)), Name: "s", Status: store.StepSucceeded,
			DedupKey: run.ID + "/s", Attempts: 1, Body: json.RawMessage(`{"alert":"disk-full","text":"step done","n":3}`)}},
		Events: []store.Event{{Seq: run.Seq, Time: time.Now(), Type: store.EventStepSucceeded, Step: "s"}},
	}
}

func benchStore(b *testing.B) *bolt.Store {
	s, err := bolt.Open(filepath.Join(b.TempDir(), "gw.db"), bolt.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}

// BenchmarkCommit is one durable commit at a time.
func BenchmarkCommit(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	run := storetest.NewRun("c", time.Now())
	run.Seq = 1
	if err := s.Commit(ctx, &store.Batch{Run: run, Create: true, Events: []store.Event{{Seq: 1, Type: store.EventRunStarted}}}); err != nil {
		b.Fatal(err)
	}
	i := 0
	for b.Loop() {
		if err := s.Commit(ctx, stepBatch(run, i)); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkCommitParallel has many runs committing at once, as under load;
// their commits share transactions.
func BenchmarkCommitParallel(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	b.SetParallelism(64)
	b.RunParallel(func(pb *testing.PB) {
		run := storetest.NewRun("c", time.Now())
		run.Seq = 1
		if err := s.Commit(ctx, &store.Batch{Run: run, Create: true, Events: []store.Event{{Seq: 1, Type: store.EventRunStarted}}}); err != nil {
			b.Fatal(err)
		}
		i := 0
		for pb.Next() {
			if err := s.Commit(ctx, stepBatch(run, i)); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}

// BenchmarkCommitLargeOrigin commits steps of a run started with a 1 MiB
// payload, such as a split over a large inventory.
func BenchmarkCommitLargeOrigin(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	run := storetest.NewRun("c", time.Now())
	run.Origin.Payload = json.RawMessage(`{"pad":"` + strings.Repeat("x", 1<<20) + `"}`)
	run.Seq = 1
	if err := s.Commit(ctx, &store.Batch{Run: run, Create: true, Events: []store.Event{{Seq: 1, Type: store.EventRunStarted}}}); err != nil {
		b.Fatal(err)
	}
	i := 0
	for b.Loop() {
		if err := s.Commit(ctx, stepBatch(run, i)); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
