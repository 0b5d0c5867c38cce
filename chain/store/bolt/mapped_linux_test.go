package bolt_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/internal/storetest"
)

// mappedRSS is how much of the file at path the process has resident
// through its mappings, from /proc/self/smaps.
func mappedRSS(t *testing.T, path string) int {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skipf("reading /proc/self/smaps: %v", err)
	}
	defer f.Close()
	kib, in := 0, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		// A mapping's header, then its fields ("Rss: 12 kB"); an anonymous
		// mapping's header has no path.
		if fields := strings.Fields(line); len(fields) > 0 && !strings.HasSuffix(fields[0], ":") {
			in = len(fields) >= 6 && fields[len(fields)-1] == path
			continue
		}
		if n, ok := strings.CutPrefix(line, "Rss:"); ok && in {
			v, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(n), "kB")))
			kib += v
		}
	}
	return kib << 10
}

// writeItems commits items records of 2 KB, 2,000 to a batch, as a split's
// slots.
func writeItems(t *testing.T, s store.Store, run *store.Run, items int, create bool, body []byte) {
	t.Helper()
	for from := 0; from < items; from += 2000 {
		b := &store.Batch{Run: run, Create: create && from == 0}
		for i := from; i < min(from+2000, items); i++ {
			b.Steps = append(b.Steps, &store.StepRecord{Key: fmt.Sprintf("loop[%05d]", i), Name: "loop", Status: store.StepSucceeded, Body: body})
		}
		if err := s.Commit(context.Background(), b); err != nil {
			t.Fatal(err)
		}
	}
}

// A long scan hands the file's pages back as it goes: joining a million
// items' records must not leave the whole file resident.
func TestLongScanHandsTheFileBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := open(t, path)
	run := storetest.NewRun("c", time.Now().UTC())
	body := []byte(`"` + strings.Repeat("x", 2000) + `"`)
	const items = 16000 // 32 MB of records
	writeItems(t, s, run, items, true, body)
	for pass := range 2 {
		n := 0
		err := s.ForEachStep(context.Background(), run.ID, store.StepScan{Prefix: "loop["}, func(rec *store.StepRecord) error {
			if want := fmt.Sprintf("loop[%05d]", n); rec.Key != want || !bytes.Equal(rec.Body, body) {
				return fmt.Errorf("record %d: key %q, body of %d bytes; want %q and the body written", n, rec.Key, len(rec.Body), want)
			}
			n++
			return nil
		})
		if err != nil || n != items {
			t.Fatalf("pass %d: read %d records, err %v", pass, n, err)
		}
		// The scan alone went through 32 MB.
		if rss := mappedRSS(t, path); rss > 8<<20 {
			t.Errorf("pass %d: %d MiB of the store file resident after the scan, want under 8", pass, rss>>20)
		}
	}
}

// Commits hand the pages they went through back too: rewriting records all
// over the file reads every leaf they sit in.
func TestCommitsHandTheFileBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := open(t, path)
	run := storetest.NewRun("c", time.Now().UTC())
	const items = 16000
	writeItems(t, s, run, items, true, []byte(`"`+strings.Repeat("x", 2000)+`"`))
	writeItems(t, s, run, items, false, []byte(`"`+strings.Repeat("y", 2000)+`"`)) // 64 MB written in all
	// The writer hands pages back after it answers; one more commit waits
	// for that.
	writeItems(t, s, run, 1, false, []byte(`"z"`))
	if rss := mappedRSS(t, path); rss > 8<<20 {
		t.Errorf("%d MiB of the store file resident after writing 64 MB, want under 8", rss>>20)
	}
}
