package bolt_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/bolt"
)

// testdata/format3.db.gz is a store file written in format 3, the layout
// before run headers moved beside their records: nine runs (succeeded,
// failed with a dead letter, running, one with a payload and a body kept
// apart, one under an idempotency key), and testdata/format3.golden.json
// is what that store answered about them.

// format3File writes the format 3 file to a new path and returns it.
func format3File(t testing.TB) string {
	t.Helper()
	f, err := os.Open("testdata/format3.db.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "format3.db")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// sameAsFormat3 checks that s answers what the format 3 store did.
func sameAsFormat3(t *testing.T, s store.Store) {
	t.Helper()
	want, err := os.ReadFile("testdata/format3.golden.json")
	if err != nil {
		t.Fatal(err)
	}
	got, err := readAll(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		_ = os.WriteFile(filepath.Join(t.TempDir(), "got.json"), got, 0o600)
		t.Fatalf("the store answers otherwise than the format 3 store did:\n%s", firstDiff(want, got))
	}
}

func firstDiff(want, got []byte) string {
	w, g := strings.Split(string(want), "\n"), strings.Split(string(got), "\n")
	for i := range max(len(w), len(g)) {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			return fmt.Sprintf("line %d: want %q, got %q", i+1, wl, gl)
		}
	}
	return "no line differs"
}

// fileLayout reads a store file's format mark, and whether it still has
// the bucket of headers of format 3.
func fileLayout(t *testing.T, path string) (format string, oldHeaders int) {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	oldHeaders = -1
	_ = db.View(func(tx *bbolt.Tx) error {
		format = string(tx.Bucket([]byte("meta")).Get([]byte("format")))
		if b := tx.Bucket([]byte("run_headers")); b != nil {
			oldHeaders = b.Stats().KeyN
		}
		return nil
	})
	return format, oldHeaders
}

// TestOpensAnOlderFormat opens files of formats 2 and 3: their headers
// move beside their records, the file is marked format 4, and the store
// answers about every run as it did, before and after a reopen. A run that
// was under way goes on, and an id in use is still refused. A file from
// before the index of finished runs has it built from the moved headers.
func TestOpensAnOlderFormat(t *testing.T) {
	for _, from := range []string{"2", "3", "3 without the index of finished runs"} {
		t.Run("format "+from, func(t *testing.T) {
			ctx := context.Background()
			path := format3File(t)
			switch from {
			case "2":
				setFormat(t, path, from)
			case "3 without the index of finished runs":
				dropFinishedIndex(t, path)
			}
			var logs bytes.Buffer
			s, err := bolt.Open(path, bolt.Options{Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			sameAsFormat3(t, s)
			if !strings.Contains(logs.String(), `"msg":"moved run headers beside their records","runs":9`) {
				t.Errorf("the move was not logged with its count:\n%s", logs.String())
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if f, old := fileLayout(t, path); f != "4" || old != -1 {
				t.Fatalf("after the move the file is format %q with %d old headers left", f, old)
			}
			reopened := open(t, path)
			sameAsFormat3(t, reopened)
			run, err := reopened.Run(ctx, "01format3run03")
			if err != nil {
				t.Fatal(err)
			}
			run.Seq++
			run.Status, run.FinishedAt = store.RunSucceeded, time.Now().UTC()
			if err := reopened.Commit(ctx, &store.Batch{Run: run, Events: []store.Event{{Seq: run.Seq, Type: store.EventRunSucceeded, Time: run.FinishedAt}}}); err != nil {
				t.Fatalf("finishing the run under way: %v", err)
			}
			if got, err := reopened.Run(ctx, run.ID); err != nil || got.Status != store.RunSucceeded || got.Seq != run.Seq {
				t.Fatalf("the run after its last commit: %+v %v", got, err)
			}
			again := &store.Run{ID: "01format3run01", Chain: "disk-full", Status: store.RunRunning, Seq: 1, CreatedAt: time.Now()}
			if err := reopened.Commit(ctx, &store.Batch{Run: again, Create: true, Events: []store.Event{{Seq: 1, Type: store.EventRunStarted}}}); !errors.Is(err, store.ErrExists) {
				t.Fatalf("creating a run under a moved run's id: %v", err)
			}
		})
	}
}

// dropFinishedIndex makes the file at path one from before the index of
// finished runs.
func dropFinishedIndex(t *testing.T, path string) {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		return errors.Join(tx.DeleteBucket([]byte("finished")), tx.DeleteBucket([]byte("finished_by_run")), tx.Bucket([]byte("meta")).Delete([]byte("finished_index")))
	})
	if err := errors.Join(err, db.Close()); err != nil {
		t.Fatal(err)
	}
}

// TestMoveResumes opens a file whose move was cut short after its first
// transaction: marked format 4, with some headers moved and the rest in
// the old bucket. The open finishes the move.
func TestMoveResumes(t *testing.T) {
	path := format3File(t)
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		old, runs := tx.Bucket([]byte("run_headers")), tx.Bucket([]byte("runs"))
		c := old.Cursor()
		for i, k := 0, []byte(nil); i < 4; i++ {
			var v []byte
			k, v = c.First()
			if err := errors.Join(runs.Put(append(bytes.Clone(k), 0, 'h'), bytes.Clone(v)), c.Delete()); err != nil {
				return err
			}
		}
		return tx.Bucket([]byte("meta")).Put([]byte("format"), []byte("4"))
	})
	if err := errors.Join(err, db.Close()); err != nil {
		t.Fatal(err)
	}
	if f, old := fileLayout(t, path); f != "4" || old != 5 {
		t.Fatalf("the file cut short is format %q with %d old headers", f, old)
	}
	s := open(t, path)
	sameAsFormat3(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if f, old := fileLayout(t, path); f != "4" || old != -1 {
		t.Fatalf("after the open the file is format %q with %d old headers left", f, old)
	}
}

// readAll is everything a store answers about its runs, through the
// store's own API, as indented JSON: what a change of layout must leave
// as it was. Values above 4 KiB are given by size and digest.
func readAll(ctx context.Context, s store.Store) ([]byte, error) {
	type runView struct {
		Run    *store.Run
		Steps  []*store.StepRecord
		Events []store.Event
	}
	var view struct {
		Listed     []string
		Runs       []runView
		Unfinished []string
		Finished   map[store.RunStatus][]string
		DLQ        []*store.DLQEntry
		Keys       map[string]string
		Definition string
	}
	page, err := s.ListRuns(ctx, store.RunFilter{Limit: 1000})
	if err != nil {
		return nil, err
	}
	for _, r := range page.Runs {
		view.Listed = append(view.Listed, r.ID)
		run, err := s.Run(ctx, r.ID)
		if err != nil {
			return nil, err
		}
		steps, err := s.Steps(ctx, r.ID, "")
		if err != nil {
			return nil, err
		}
		events, err := s.Events(ctx, r.ID, 0, 0)
		if err != nil {
			return nil, err
		}
		view.Runs = append(view.Runs, runView{Run: run, Steps: steps, Events: events})
	}
	if view.Unfinished, err = s.UnfinishedRuns(ctx); err != nil {
		return nil, err
	}
	slices.Sort(view.Unfinished)
	view.Finished = map[store.RunStatus][]string{}
	for _, st := range []store.RunStatus{store.RunSucceeded, store.RunFailed, store.RunCancelled, store.RunTimedOut, store.RunSkipped} {
		err := s.FinishedRuns(ctx, st, func(r *store.Run) (bool, error) {
			view.Finished[st] = append(view.Finished[st], r.ID)
			return true, nil
		})
		if err != nil {
			return nil, err
		}
	}
	if view.DLQ, err = s.ListDLQ(ctx, store.DLQFilter{}); err != nil {
		return nil, err
	}
	view.Keys = map[string]string{}
	for _, k := range []string{"alertmanager:fp-1", "alertmanager:fp-none"} {
		if view.Keys[k], err = s.KeyRun(ctx, k); err != nil {
			return nil, err
		}
	}
	def, err := s.Definition(ctx, "abc")
	if err != nil {
		return nil, err
	}
	view.Definition = string(def)
	out, err := json.MarshalIndent(view, "", "  ")
	if err != nil {
		return nil, err
	}
	return digestLarge(out), nil
}

// digestLarge replaces each JSON string above 4 KiB in doc by its size and
// digest.
func digestLarge(doc []byte) []byte {
	var out bytes.Buffer
	for {
		i := bytes.IndexByte(doc, '"')
		if i < 0 {
			out.Write(doc)
			return out.Bytes()
		}
		j := i + 1
		for j < len(doc) && doc[j] != '"' {
			if doc[j] == '\\' {
				j++
			}
			j++
		}
		out.Write(doc[:i])
		if s := doc[i : j+1]; len(s) > 4096 {
			fmt.Fprintf(&out, `"%d bytes, sha256 %x"`, len(s), sha256.Sum256(s))
		} else {
			out.Write(s)
		}
		doc = doc[j+1:]
	}
}

// TestMoveSurvivesKill kills a gateway with kill -9 while it moves the
// headers of a format 3 file of 60,009 runs, after the first part of the
// move is written. The next open finishes the move, and every run is there.
func TestMoveSurvivesKill(t *testing.T) {
	const extra = 60000
	path := format3File(t)
	ids := addFormat3Runs(t, path, extra)
	cmd, lines := startHelper(t, "move", path)
	killed := false
	for lines.Scan() {
		if strings.Contains(lines.Text(), `"msg":"moving run headers: part written"`) {
			if err := cmd.Process.Kill(); err != nil { // SIGKILL: kill -9
				t.Fatal(err)
			}
			killed = true
			break
		}
	}
	_ = cmd.Wait()
	if !killed {
		t.Fatalf("the gateway ended its move without logging a part written: %v", lines.Err())
	}
	f, old := fileLayout(t, path)
	t.Logf("killed in the move: the file is format %s with %d headers still to move", f, old)
	if f != "4" {
		t.Fatalf("a file part moved is marked format %q", f)
	}
	s := open(t, path)
	ctx := context.Background()
	for _, id := range append(ids, "01format3run01", "01format3run03", "01format3run09") {
		if run, err := s.RunHeader(ctx, id); err != nil || run.ID != id {
			t.Fatalf("run %s after the move: %+v %v", id, run, err)
		}
	}
	if u, err := s.UnfinishedRuns(ctx); err != nil || len(u) != 2 {
		t.Fatalf("unfinished runs after the move: %v %v", u, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if f, old := fileLayout(t, path); f != "4" || old != -1 {
		t.Fatalf("after the open the file is format %q with %d old headers left", f, old)
	}
}

// addFormat3Runs adds n finished runs to the format 3 file at path, each a
// header in the bucket of headers and an entry in the listing index, and
// returns their ids.
func addFormat3Runs(t testing.TB, path string, n int) []string {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	created := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	ids := make([]string, 0, n)
	err = db.Update(func(tx *bbolt.Tx) error {
		headers, index := tx.Bucket([]byte("run_headers")), tx.Bucket([]byte("run_index"))
		for i := range n {
			id := fmt.Sprintf("01bulk%08d", i)
			ids = append(ids, id)
			at := created.Add(time.Duration(i) * time.Second)
			h := fmt.Sprintf(`{"id":%q,"chain":"disk-full","chain_hash":"abc","status":"succeeded","path":null,"created_at":%q,"updated_at":%q,"seq":1}`,
				id, at.Format(time.RFC3339Nano), at.Format(time.RFC3339Nano))
			key := binary.BigEndian.AppendUint64(nil, uint64(at.UnixNano()))
			if err := errors.Join(headers.Put([]byte(id), []byte(h)), index.Put(append(key, id...), nil)); err != nil {
				return err
			}
		}
		return nil
	})
	if err := errors.Join(err, db.Close()); err != nil {
		t.Fatal(err)
	}
	return ids
}

// BenchmarkMoveHeaders opens a format 3 file of 100,009 runs: the time of
// an open that moves every header.
func BenchmarkMoveHeaders(b *testing.B) {
	const extra = 100000
	src := format3File(b)
	addFormat3Runs(b, src, extra)
	data, err := os.ReadFile(src)
	if err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(b.TempDir(), "moved.db")
	for b.Loop() {
		b.StopTimer()
		if err := os.WriteFile(path, data, 0o600); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		s, err := bolt.Open(path, bolt.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(len(data))/(1<<20), "file-MiB")
}
