package redis_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/backup"
	"github.com/chaingate/gateway/chain/store/internal/storetest"
	"github.com/chaingate/gateway/chain/store/redis"
	"github.com/chaingate/gateway/internal/testutil/redistest"
)

// benchRuns is how many runs the backup benchmark's store holds.
const benchRuns = 5000

// BenchmarkBackup backs up a store of 5,000 runs and restores the backup
// under a new prefix; it reports the backup's size.
func BenchmarkBackup(b *testing.B) {
	ctx := context.Background()
	s := openURL(b, redistest.Open(b))
	storetest.FillRuns(b, s, benchRuns)
	var data []byte
	b.Run("backup", func(b *testing.B) {
		for b.Loop() {
			var buf bytes.Buffer
			if _, err := s.Snapshot(ctx, &buf); err != nil {
				b.Fatal(err)
			}
			data = buf.Bytes()
		}
		b.ReportMetric(float64(len(data))/(1<<20), "MB")
	})
	b.Run("restore", func(b *testing.B) {
		for b.Loop() {
			dst := openURL(b, redistest.Open(b))
			r, err := backup.NewReader(bytes.NewReader(data))
			if err != nil {
				b.Fatal(err)
			}
			if info, err := redis.Restore(ctx, r, dst); err != nil || info.Runs != benchRuns {
				b.Fatal(info, err)
			}
		}
	})
}

// BenchmarkListRunsByLabel finds one run by its instance label among
// 100,000, the oldest (the whole index read) and the middle one.
func BenchmarkListRunsByLabel(b *testing.B) {
	s := openURL(b, redistest.Open(b))
	const n = 100_000
	storetest.FillLabeled(b, s, n)
	for _, i := range []int{n / 2, 0} {
		b.Run(fmt.Sprintf("instance=host-%d", i), func(b *testing.B) {
			f := store.RunFilter{Labels: map[string]string{"instance": fmt.Sprintf("host-%d:9100", i)}, Limit: 1, NoOrigins: true}
			for b.Loop() {
				page, err := s.ListRuns(context.Background(), f)
				if err != nil || len(page.Runs) != 1 {
					b.Fatalf("%v %d", err, len(page.Runs))
				}
			}
		})
	}
}
