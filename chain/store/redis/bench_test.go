package redis_test

import (
	"context"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/storetest"
)

func benchRun(b *testing.B, s store.Store) *store.Run {
	run := storetest.NewRun("c", time.Now())
	run.Seq = 1
	if err := s.Commit(context.Background(), &store.Batch{Run: run, Create: true, Events: []store.Event{{Seq: 1, Type: store.EventRunStarted}}}); err != nil {
		b.Fatal(err)
	}
	return run
}

// BenchmarkCommit is one commit at a time: one round trip to Redis each.
func BenchmarkCommit(b *testing.B) {
	s, _ := newStore(b)
	ctx := context.Background()
	run := benchRun(b, s)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if err := s.Commit(ctx, stepBatch(run, "s"+string(rune('a'+i%26)))); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkCommitParallel has many runs committing at once, as under load.
func BenchmarkCommitParallel(b *testing.B) {
	s, _ := newStore(b)
	ctx := context.Background()
	b.ReportAllocs()
	b.SetParallelism(64)
	b.RunParallel(func(pb *testing.PB) {
		run := benchRun(b, s)
		i := 0
		for pb.Next() {
			if err := s.Commit(ctx, stepBatch(run, "s"+string(rune('a'+i%26)))); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}
