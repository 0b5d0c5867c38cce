package bolt_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/backup"
	"github.com/chaingate/gateway/chain/store/bolt"
	"github.com/chaingate/gateway/chain/store/internal/storetest"
)

// benchRuns is how many runs the backup benchmarks' store holds.
const benchRuns = 5000

// BenchmarkBackup backs up a store of 5,000 runs to a file, synced, and
// restores the file into a new store; it reports the backup's size.
func BenchmarkBackup(b *testing.B) {
	ctx := context.Background()
	dir := b.TempDir()
	s, err := bolt.Open(filepath.Join(dir, "gw.db"), bolt.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	storetest.FillRuns(b, s, benchRuns)
	out := filepath.Join(dir, "gw.backup")
	b.Run("backup", func(b *testing.B) {
		for b.Loop() {
			f, err := os.Create(out)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := s.Snapshot(ctx, f); err != nil {
				b.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				b.Fatal(err)
			}
			_ = f.Close()
		}
		st, _ := os.Stat(out)
		b.ReportMetric(float64(st.Size())/(1<<20), "MB")
	})
	b.Run("restore", func(b *testing.B) {
		i := 0
		for b.Loop() {
			f, err := os.Open(out)
			if err != nil {
				b.Fatal(err)
			}
			r, err := backup.NewReader(f)
			if err != nil {
				b.Fatal(err)
			}
			if info, err := bolt.Restore(ctx, r, filepath.Join(dir, fmt.Sprintf("restored-%d.db", i))); err != nil || info.Runs != benchRuns {
				b.Fatal(info, err)
			}
			_ = f.Close()
			i++
		}
	})
}

// BenchmarkCompact compacts a store of 5,000 runs that also held 2,000
// dead-letter entries of 20 KiB, since deleted; it reports the file's
// size before and after.
func BenchmarkCompact(b *testing.B) {
	ctx := context.Background()
	dir := b.TempDir()
	full := filepath.Join(dir, "full.db")
	s, err := bolt.Open(full, bolt.Options{})
	if err != nil {
		b.Fatal(err)
	}
	storetest.FillRuns(b, s, benchRuns)
	payload := json.RawMessage(`"` + strings.Repeat("x", 20<<10) + `"`)
	var ids []string
	for range 2000 {
		d := &store.DLQEntry{ID: store.NewID(), Kind: store.DLQDelivery, Chain: "c", Payload: payload, CreatedAt: time.Now().UTC()}
		if err := s.AddDLQ(ctx, d); err != nil {
			b.Fatal(err)
		}
		ids = append(ids, d.ID)
	}
	for _, id := range ids {
		if err := s.DeleteDLQ(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
	_ = s.Close()
	path := filepath.Join(dir, "gw.db")
	var info bolt.CompactInfo
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		copyFile(b, full, path)
		b.StartTimer()
		if info, err = bolt.Compact(ctx, path, 0); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(info.Before)/(1<<20), "MB-before")
	b.ReportMetric(float64(info.After)/(1<<20), "MB-after")
}

func copyFile(b *testing.B, from, to string) {
	src, err := os.Open(from)
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	dst, err := os.Create(to)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		b.Fatal(err)
	}
	// Synced here, or the compaction's own syncs would wait for it.
	if err := dst.Sync(); err != nil {
		b.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkListRunsByLabel finds one run by its instance label among
// 100,000, the oldest (the whole index read) and the middle one.
func BenchmarkListRunsByLabel(b *testing.B) {
	s, err := bolt.Open(filepath.Join(b.TempDir(), "gw.db"), bolt.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
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
