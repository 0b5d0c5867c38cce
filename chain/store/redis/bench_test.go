package redis_test

import (
	"context"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/internal/storetest"
	"github.com/chaingate/gateway/internal/testutil/redistest"
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

// BenchmarkCommitDurability prices what makes a commit survive a Redis
// restart, each on a Redis of its own: nothing (allow_volatile), an
// append-only file written every second or on every write, and a WAIT for
// one replica instead.
func BenchmarkCommitDurability(b *testing.B) {
	setups := []struct {
		name  string
		start func(b *testing.B) string
	}{
		{"volatile", func(b *testing.B) string {
			return redistest.Start(b).URL("prefix=b:&allow_volatile=true")
		}},
		{"aof-everysec", func(b *testing.B) string {
			return redistest.Start(b, "--appendonly", "yes", "--appendfsync", "everysec").URL("prefix=b:")
		}},
		{"aof-always", func(b *testing.B) string {
			return redistest.Start(b, "--appendonly", "yes", "--appendfsync", "always").URL("prefix=b:")
		}},
		{"wait-1-replica", func(b *testing.B) string {
			primary, _ := startReplicated(b)
			return primary.URL("prefix=b:&wait_replicas=1")
		}},
	}
	for _, setup := range setups {
		for _, parallel := range []bool{false, true} {
			name := setup.name + "/serial"
			if parallel {
				name = setup.name + "/parallel-64"
			}
			b.Run(name, func(b *testing.B) {
				s := openURL(b, setup.start(b))
				ctx := context.Background()
				commit := func(run *store.Run, i int) {
					if err := s.Commit(ctx, stepBatch(run, "s"+string(rune('a'+i%26)))); err != nil {
						b.Fatal(err)
					}
				}
				if !parallel {
					run := benchRun(b, s)
					i := 0
					for b.Loop() {
						commit(run, i)
						i++
					}
					return
				}
				b.SetParallelism(64)
				b.RunParallel(func(pb *testing.PB) {
					run := benchRun(b, s)
					for i := 0; pb.Next(); i++ {
						commit(run, i)
					}
				})
			})
		}
	}
}
