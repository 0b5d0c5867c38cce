package bolt_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/backup"
	"github.com/chaingate/gateway/chain/store/bolt"
	"github.com/chaingate/gateway/chain/store/internal/storetest"
)

// restore restores a backup into path.
func restore(t *testing.T, data []byte, path string) (store.SnapshotInfo, error) {
	t.Helper()
	r, err := backup.NewReader(bytes.NewReader(data))
	if err != nil {
		return store.SnapshotInfo{}, err
	}
	return bolt.Restore(context.Background(), r, path)
}

// TestBackupRoundTrip backs a store up while it is open and once it is
// closed, restores each backup into a new file, and reads everything back
// the same; the idempotency keys keep their expiry.
func TestBackupRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		take func(t *testing.T, s *bolt.Store, w *bytes.Buffer) (store.SnapshotInfo, error)
	}{
		{"from the gateway holding it", func(t *testing.T, s *bolt.Store, w *bytes.Buffer) (store.SnapshotInfo, error) {
			return s.Snapshot(context.Background(), w)
		}},
		{"from the file", func(t *testing.T, s *bolt.Store, w *bytes.Buffer) (store.SnapshotInfo, error) {
			path := s.Path()
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			return bolt.SnapshotFile(context.Background(), path, w, 0)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			src := open(t, filepath.Join(dir, "gw.db")).(*bolt.Store)
			filled := storetest.Fill(t, src)
			want := storetest.Contents(t, src, filled)
			var buf bytes.Buffer
			info, err := tc.take(t, src, &buf)
			if err != nil {
				t.Fatal(err)
			}
			if info.Kind != "bolt" || info.Runs != 3 || info.Unfinished != 1 {
				t.Errorf("snapshot info %+v", info)
			}
			if h, tr, err := backup.Check(bytes.NewReader(buf.Bytes())); err != nil || h.Kind != "bolt" || h.Format != "4" || tr.Runs != 3 {
				t.Fatalf("the backup: %+v %+v %v", h, tr, err)
			}
			dst := filepath.Join(dir, "restored", "gw.db")
			if info, err := restore(t, buf.Bytes(), dst); err != nil || info.Runs != 3 || info.Unfinished != 1 {
				t.Fatalf("restoring: %+v %v", info, err)
			}
			restored := open(t, dst)
			storetest.Same(t, want, storetest.Contents(t, restored, filled))
			if ids, err := restored.UnfinishedRuns(context.Background()); err != nil || len(ids) != 1 || ids[0] != filled.Unfinished[0] {
				t.Errorf("unfinished runs after the restore: %v %v", ids, err)
			}
			storetest.LapsingBound(t, restored, filled)
			time.Sleep(time.Until(filled.LapsingClaimed.Add(storetest.LapsingTTL + 100*time.Millisecond)))
			for key, run := range filled.Keys {
				got, err := restored.KeyRun(context.Background(), key)
				if key == filled.Lapsing {
					run = ""
				}
				if err != nil || got != run {
					t.Errorf("key %s after its TTL: bound to %q (%v), want %q", key, got, err, run)
				}
			}
			entries, _ := os.ReadDir(filepath.Dir(dst))
			if len(entries) != 1 {
				t.Errorf("the restore left files beside the store: %v", entries)
			}
		})
	}
}

// backupOf returns a backup of a store holding what Fill puts in.
func backupOf(t *testing.T) []byte {
	t.Helper()
	s := open(t, filepath.Join(t.TempDir(), "gw.db")).(*bolt.Store)
	storetest.Fill(t, s)
	var buf bytes.Buffer
	if _, err := s.Snapshot(context.Background(), &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// rewrite returns a bolt backup with another header around data's frames.
func rewrite(t *testing.T, data []byte, h backup.Header) []byte {
	t.Helper()
	r, err := backup.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	w, err := backup.NewWriter(&out, h)
	if err != nil {
		t.Fatal(err)
	}
	for {
		tag, p, err := r.Next()
		if err != nil {
			break
		}
		if err := w.Frame(tag, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(backup.Trailer{}); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// headerOnly is a whole bolt backup, header and end frame, that holds no
// data frame.
func headerOnly(t *testing.T) []byte {
	t.Helper()
	return withData(t, nil)
}

// withData is a whole bolt backup whose file is data.
func withData(t *testing.T, data []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	w, err := backup.NewWriter(&out, backup.Header{Kind: "bolt", Format: "3", Created: time.Now().UTC()})
	if err != nil {
		t.Fatal(err)
	}
	if len(data) > 0 {
		if err := w.Frame('D', data); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(backup.Trailer{}); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// TestRestoreRefuses checks what a restore refuses, and that a refused
// restore leaves nothing behind.
func TestRestoreRefuses(t *testing.T) {
	data := backupOf(t)
	tests := []struct {
		name   string
		data   []byte
		target func(t *testing.T, path string)
		want   error
		says   string
	}{
		{name: "a store with runs", data: data, target: func(t *testing.T, path string) {
			s := open(t, path)
			startRun(t, s, nil)
			_ = s.Close()
		}, says: "not empty"},
		{name: "a store a gateway holds", data: data, target: func(t *testing.T, path string) {
			_, lines := startHelper(t, "hold", path)
			if !lines.Scan() || lines.Text() != "ready" {
				t.Fatalf("helper: %q", lines.Text())
			}
		}, want: store.ErrInUse},
		{name: "a file cut short", data: data[:len(data)/2], want: backup.ErrTruncated},
		{name: "a damaged file", data: func() []byte { d := bytes.Clone(data); d[len(d)/2] ^= 1; return d }(), want: backup.ErrDamaged},
		{name: "a later backup format", data: append([]byte("chaingate-backup 2\n"), data[len("chaingate-backup 1\n"):]...), want: backup.ErrVersion},
		{name: "a later store format", data: rewrite(t, data, backup.Header{Kind: "bolt", Format: "5"}), says: "format 5, and this gateway reads formats 2, 3 and 4"},
		{name: "a Redis backup", data: rewrite(t, data, backup.Header{Kind: "redis", Format: "1"}), says: "holds a redis store"},
		{name: "a header and no data", data: headerOnly(t), want: backup.ErrDamaged, says: "it holds no store file: nothing comes between its header and its end frame"},
		{name: "a few bytes of data", data: withData(t, []byte("not a bolt file")), says: "checking the restored file: it is not a store file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "gw.db")
			if tc.target != nil {
				tc.target(t, path)
			}
			before, _ := os.ReadDir(dir)
			_, err := restore(t, tc.data, path)
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("got %v; want %v saying %q", err, tc.want, tc.says)
			}
			if after, _ := os.ReadDir(dir); len(after) != len(before) {
				t.Errorf("the refused restore left %v in the directory, which held %v", after, before)
			}
		})
	}
}

// TestRestoreIntoEmptyStore restores over a store file that holds nothing,
// as a gateway started once and stopped leaves it.
func TestRestoreIntoEmptyStore(t *testing.T) {
	data := backupOf(t)
	path := filepath.Join(t.TempDir(), "gw.db")
	s := open(t, path)
	_ = s.Close()
	if info, err := restore(t, data, path); err != nil || info.Runs != 3 {
		t.Fatalf("%+v %v", info, err)
	}
	if page, err := open(t, path).ListRuns(context.Background(), store.RunFilter{}); err != nil || len(page.Runs) != 3 {
		t.Fatalf("%v %v", page.Runs, err)
	}
}

func TestSnapshotFileRefusesAHeldFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gw.db")
	_, lines := startHelper(t, "hold", path)
	if !lines.Scan() || lines.Text() != "ready" {
		t.Fatalf("helper: %q", lines.Text())
	}
	_, err := bolt.SnapshotFile(context.Background(), path, &bytes.Buffer{}, 100*time.Millisecond)
	if !errors.Is(err, store.ErrInUse) || !strings.Contains(err.Error(), "--server") {
		t.Fatalf("got %v", err)
	}
	if _, err := bolt.SnapshotFile(context.Background(), filepath.Join(t.TempDir(), "none.db"), &bytes.Buffer{}, 0); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a file that is not there: %v", err)
	}
}

// TestCompact frees most of a file by deleting what filled it, compacts
// it, and reads everything back the same from a file that shrank.
func TestCompact(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "gw.db")
	s := open(t, path)
	filled := storetest.Fill(t, s)
	var ids []string
	payload := json.RawMessage(`"` + strings.Repeat("x", 20<<10) + `"`)
	for range 500 {
		d := &store.DLQEntry{ID: store.NewID(), Kind: store.DLQDelivery, Chain: "c", Payload: payload, CreatedAt: time.Now().UTC()}
		if err := s.AddDLQ(ctx, d); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, d.ID)
	}
	for _, id := range ids {
		if err := s.DeleteDLQ(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	want := storetest.Contents(t, s, filled)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	info, err := bolt.Compact(ctx, path, 0)
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(path); info.After != st.Size() || info.After*2 > info.Before {
		t.Errorf("compacted from %d to %d bytes (the file has %d)", info.Before, info.After, st.Size())
	}
	storetest.Same(t, want, storetest.Contents(t, open(t, path), filled))
	if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 1 {
		t.Errorf("files beside the store: %v", entries)
	}
}

func TestCompactRefuses(t *testing.T) {
	dir := t.TempDir()
	held := filepath.Join(dir, "held.db")
	_, lines := startHelper(t, "hold", held)
	if !lines.Scan() || lines.Text() != "ready" {
		t.Fatalf("helper: %q", lines.Text())
	}
	if _, err := bolt.Compact(context.Background(), held, 100*time.Millisecond); !errors.Is(err, store.ErrInUse) {
		t.Errorf("a file a gateway holds: %v", err)
	}
	if _, err := bolt.Compact(context.Background(), filepath.Join(dir, "none.db"), 0); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a file that is not there: %v", err)
	}
	other := filepath.Join(dir, "other.db")
	db, err := bbolt.Open(other, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = db.Update(func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucket([]byte("meta"))
		if err != nil {
			return err
		}
		return b.Put([]byte("format"), []byte("9"))
	})
	_ = db.Close()
	if _, err := bolt.Compact(context.Background(), other, 0); err == nil || !strings.Contains(err.Error(), "store format 9") {
		t.Errorf("a file of a later format: %v", err)
	}
}

// TestOpenFindsAReplacedFile has a gateway wait for the lock of a file
// that is then replaced, as a compaction or a restore replaces it: it opens
// the new file, not the old one it was waiting on.
func TestOpenFindsAReplacedFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "gw.db")
	s := open(t, path)
	_ = s.Close()
	next := filepath.Join(dir, "next.db")
	n := open(t, next)
	run := startRun(t, n, nil)
	_ = n.Close()

	holder, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	opened := make(chan store.Store, 1)
	go func() {
		s, err := bolt.Open(path, bolt.Options{LockTimeout: time.Minute})
		if err != nil {
			t.Error(err)
		}
		opened <- s
	}()
	// Long enough for Open to have the old file and wait for its lock.
	time.Sleep(300 * time.Millisecond)
	if err := os.Rename(next, path); err != nil {
		t.Fatal(err)
	}
	_ = holder.Close()
	got := <-opened
	if got == nil {
		return
	}
	defer got.Close()
	if _, err := got.Run(context.Background(), run.ID); err != nil {
		t.Fatalf("the store opened is not the file now at the path: %v", err)
	}
}

// TestBackupOfAnOlderFile backs up files of older layouts: a file of
// format 2 or 3 is backed up as it is, and restored as it is; opened, it
// answers as it did. A format 1 file is refused with its format named, not
// misread.
func TestBackupOfAnOlderFile(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"2", "3"} {
		older := format3File(t)
		setFormat(t, older, f)
		var buf bytes.Buffer
		if _, err := bolt.SnapshotFile(context.Background(), older, &buf, 0); err != nil {
			t.Fatal(err)
		}
		if h, tr, err := backup.Check(bytes.NewReader(buf.Bytes())); err != nil || h.Format != f || tr.Runs != 9 {
			t.Fatalf("the backup of a format %s file: %+v %+v %v", f, h, tr, err)
		}
		restored := filepath.Join(dir, "restored"+f+".db")
		if info, err := restore(t, buf.Bytes(), restored); err != nil || info.Runs != 9 || info.Unfinished != 2 {
			t.Fatalf("restoring the format %s file: %+v %v", f, info, err)
		}
		sameAsFormat3(t, open(t, restored))
	}

	one := filepath.Join(dir, "one.db")
	db, err := bbolt.Open(one, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = db.Update(func(tx *bbolt.Tx) error {
		_, err := tx.CreateBucket([]byte("runs"))
		return err
	})
	_ = db.Close()
	if _, err := bolt.SnapshotFile(context.Background(), one, &bytes.Buffer{}, 0); err == nil || !strings.Contains(err.Error(), "store format 1") {
		t.Errorf("backing up a format 1 file: %v", err)
	}
}

// setFormat writes a file's layout version.
func setFormat(t *testing.T, path, format string) {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bbolt.Tx) error { return tx.Bucket([]byte("meta")).Put([]byte("format"), []byte(format)) })
	if cerr := db.Close(); err != nil || cerr != nil {
		t.Fatal(err, cerr)
	}
}
