package bolt_test

import (
	"bufio"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/bolt"
	"github.com/chaingate/gateway/chain/store/internal/storetest"
)

// helperEnv makes the test binary act as a second process holding a store.
const helperEnv = "BOLT_TEST_HELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(helper(mode, os.Getenv("BOLT_TEST_PATH")))
	}
	os.Exit(m.Run())
}

// helper opens the store, commits runs when asked, reports each, then waits
// to be killed. In mode "move" it logs to stdout as it opens the store.
func helper(mode, path string) int {
	var opts bolt.Options
	if mode == "move" {
		opts.Logger = slog.New(slog.NewJSONHandler(os.Stdout, nil))
	}
	s, err := bolt.Open(path, opts)
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	if mode == "commit" {
		for i := 0; ; i++ {
			run := storetest.NewRun("c", time.Now().UTC())
			run.Seq = 1
			err := s.Commit(context.Background(), &store.Batch{Run: run, Create: true,
				Events: []store.Event{{Seq: 1, Type: store.EventRunStarted, Time: time.Now()}}})
			if err != nil {
				fmt.Println("error:", err)
				return 1
			}
			fmt.Println("committed", run.ID)
		}
	}
	fmt.Println("ready")
	// Sleep rather than block forever: the runtime would end a process
	// whose goroutines are all blocked.
	time.Sleep(time.Hour)
	return 0
}

func open(t *testing.T, path string) store.Store {
	t.Helper()
	s, err := bolt.Open(path, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// startRun commits a new run with payload as its origin's payload.
func startRun(t *testing.T, s store.Store, payload []byte) *store.Run {
	t.Helper()
	run := storetest.NewRun("c", time.Now().UTC())
	if payload != nil {
		run.Origin.Payload = payload
	}
	run.Seq = 1
	err := s.Commit(context.Background(), &store.Batch{Run: run, Create: true, Events: []store.Event{{Seq: 1, Type: store.EventRunStarted, Time: time.Now()}}})
	if err != nil {
		t.Fatal(err)
	}
	return run
}

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Factory{
		Open: func(t *testing.T) store.Store {
			return open(t, filepath.Join(t.TempDir(), "gateway.db"))
		},
		Reopen: func(t *testing.T, s store.Store) store.Store {
			path := s.(*bolt.Store).Path()
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			return open(t, path)
		},
		Damage: func(t *testing.T, s store.Store, runID string) store.Store {
			path := s.(*bolt.Store).Path()
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			db, err := bbolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			err = db.Update(func(tx *bbolt.Tx) error {
				return tx.Bucket([]byte("runs")).Put([]byte(runID+"\x00h"), []byte(`{"id": "`+runID+`", "status": 7`))
			})
			if cerr := db.Close(); err != nil || cerr != nil {
				t.Fatal(err, cerr)
			}
			return open(t, path)
		},
	})
}

func startHelper(t *testing.T, mode, path string) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, "BOLT_TEST_PATH="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd, bufio.NewScanner(out)
}

func TestSecondProcessGetsInUse(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gateway.db")
	_, lines := startHelper(t, "hold", path)
	if !lines.Scan() || lines.Text() != "ready" {
		t.Fatalf("helper did not open the store: %q", lines.Text())
	}
	start := time.Now()
	_, err := bolt.Open(path, bolt.Options{LockTimeout: 200 * time.Millisecond})
	if !errors.Is(err, store.ErrInUse) {
		t.Fatalf("got %v, want ErrInUse", err)
	}
	if !strings.Contains(err.Error(), path) {
		t.Errorf("error does not name the file: %v", err)
	}
	// Without the lock timeout, Open would wait as long as the holder lives.
	if waited := time.Since(start); waited > 30*time.Second {
		t.Errorf("open waited %v for the lock", waited)
	}
}

// TestSurvivesKill checks that every commit the writer reported done is
// there after the writer is killed with SIGKILL.
func TestSurvivesKill(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gateway.db")
	cmd, lines := startHelper(t, "commit", path)
	var committed []string
	for lines.Scan() && len(committed) < 200 {
		id, ok := strings.CutPrefix(lines.Text(), "committed ")
		if !ok {
			t.Fatalf("helper: %s", lines.Text())
		}
		committed = append(committed, id)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	s := open(t, path)
	for _, id := range committed {
		if _, err := s.Run(context.Background(), id); err != nil {
			t.Fatalf("run %s reported committed before kill -9: %v", id, err)
		}
	}
}

// TestRefusesAnotherFormat opens a file laid out by an earlier version of
// the store: it is refused with a reason, not misread as empty.
func TestRefusesAnotherFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucket([]byte("runs"))
		if err != nil {
			return err
		}
		return b.Put([]byte("01run\x00h"), []byte(`{}`))
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = db.Close()
	if _, err := bolt.Open(path, bolt.Options{}); err == nil || !strings.Contains(err.Error(), "store format 1") {
		t.Fatalf("opening a format 1 file: %v", err)
	}
	s, err := bolt.Open(filepath.Join(t.TempDir(), "new.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
}

// TestExpiredKeysAreSwept checks that idempotency keys past their TTL do
// not stay in the file for ever: later claims remove them.
func TestExpiredKeysAreSwept(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gw.db")
	s, err := bolt.Open(path, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 10 {
		if _, err := s.ClaimKey(ctx, fmt.Sprintf("old-%d", i), store.NewID(), time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(5 * time.Millisecond)
	if _, err := s.ClaimKey(ctx, "new", store.NewID(), time.Hour); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_ = db.View(func(tx *bbolt.Tx) error {
		for _, name := range []string{"idempotency_keys", "idempotency_expiry"} {
			if n := tx.Bucket([]byte(name)).Stats().KeyN; n != 1 {
				t.Errorf("%s holds %d keys, want only the live one", name, n)
			}
		}
		return nil
	})
}

// TestFreelistIsWritten keeps the free page list in the file, so that
// opening a big store reads that list instead of every page of the file.
func TestFreelistIsWritten(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gw.db")
	s := open(t, path)
	// Records written, then deleted: their pages are free.
	ctx := context.Background()
	run := startRun(t, s, nil)
	var keys []string
	for i := range 200 {
		keys = append(keys, fmt.Sprintf("s%03d", i))
	}
	for _, del := range []bool{false, true} {
		b := &store.Batch{Run: run}
		for _, k := range keys {
			if del {
				b.DeleteSteps = append(b.DeleteSteps, k)
			} else {
				b.Steps = append(b.Steps, &store.StepRecord{Key: k, Name: k, Status: store.StepSucceeded, Body: []byte(`"` + strings.Repeat("x", 1000) + `"`)})
			}
		}
		if err := s.Commit(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Each of the two meta pages: a 16-byte page header, then magic,
	// version, page size and flags (4 bytes each), the root bucket (16),
	// the freelist's page, the high water mark and the transaction id.
	type meta struct{ freelist, txid uint64 }
	read := func(off int) meta {
		m := data[off+16:]
		return meta{freelist: binary.LittleEndian.Uint64(m[32:]), txid: binary.LittleEndian.Uint64(m[48:])}
	}
	pageSize := int(binary.LittleEndian.Uint32(data[16+8:]))
	current := slices.MaxFunc([]meta{read(0), read(pageSize)}, func(a, b meta) int { return cmp.Compare(a.txid, b.txid) })
	if current.freelist == math.MaxUint64 {
		t.Error("the store's last commit left no free page list: opening it reads the whole file")
	}
}

// TestApartValuesLeaveNoTrace checks the file itself: a large body kept
// apart from its record goes when the record is rewritten small or deleted,
// and a large payload sits apart from its origin.
func TestApartValuesLeaveNoTrace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gw.db")
	s := open(t, path)
	ctx := context.Background()
	large := []byte(`"` + strings.Repeat("x", 100<<10) + `"`)
	run := startRun(t, s, large)
	big := func(key string) *store.StepRecord {
		return &store.StepRecord{Key: key, Name: key, Status: store.StepSucceeded, Body: large}
	}
	if err := s.Commit(ctx, &store.Batch{Run: run, Steps: []*store.StepRecord{big("a"), big("b[0]"), big("c")}}); err != nil {
		t.Fatal(err)
	}
	small := &store.StepRecord{Key: "a", Name: "a", Status: store.StepRunning}
	if err := s.Commit(ctx, &store.Batch{Run: run, Steps: []*store.StepRecord{small}, DeleteSteps: []string{"b[0]"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var apart []string
	err = db.View(func(tx *bbolt.Tx) error {
		for _, bucket := range []string{"runs", "run_origins"} {
			err := tx.Bucket([]byte(bucket)).ForEach(func(k, v []byte) error {
				if k[len(k)-1] == 0 {
					apart = append(apart, fmt.Sprintf("%s:%q:%d", bucket, k[len(run.ID):], len(v)))
				}
				return nil
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`[runs:"\x00sc\x00":%d run_origins:"\x00":%d]`, len(large), len(large))
	if got := fmt.Sprint(apart); got != want {
		t.Errorf("values kept apart: %s, want %s", got, want)
	}
}

// TestEmptyOriginIsDamaged reads a run whose origin was emptied by hand: the
// run is damaged, and reading it says so rather than failing the process.
func TestEmptyOriginIsDamaged(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gw.db")
	s := open(t, path)
	run := startRun(t, s, nil)
	_ = s.Close()
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bbolt.Tx) error { return tx.Bucket([]byte("run_origins")).Put([]byte(run.ID), []byte{}) })
	_ = db.Close()
	if err != nil {
		t.Fatal(err)
	}
	s = open(t, path)
	if _, err := s.Run(context.Background(), run.ID); !errors.Is(err, store.ErrDamaged) {
		t.Errorf("reading a run with an empty origin: %v, want ErrDamaged", err)
	}
}

// finishedRun commits a run that ended with n step records.
func finishedRun(t *testing.T, s store.Store, n int) *store.Run {
	t.Helper()
	ctx := context.Background()
	run := startRun(t, s, []byte(`{}`))
	var recs []*store.StepRecord
	for i := range n {
		recs = append(recs, &store.StepRecord{Key: fmt.Sprintf("split[%d]", i), Status: store.StepSucceeded})
	}
	run.Status, run.FinishedAt = store.RunSucceeded, time.Now().UTC()
	run.Seq++
	if err := s.Commit(ctx, &store.Batch{Run: run, Steps: recs, Events: []store.Event{{Seq: run.Seq, Type: store.EventRunSucceeded, Time: time.Now()}}}); err != nil {
		t.Fatal(err)
	}
	return run
}

// TestDeletionResumesAfterRestart leaves a run deleted from every index
// but with its records still in the file, as a gateway stopped in the
// middle of deleting it does: the next open takes its records out.
func TestDeletionResumesAfterRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gw.db")
	s := open(t, path)
	run := finishedRun(t, s, 3000)
	kept := finishedRun(t, s, 10)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		return errors.Join(tx.Bucket([]byte("runs")).Delete([]byte(run.ID+"\x00h")), tx.Bucket([]byte("deleting")).Put([]byte(run.ID), nil))
	})
	if err := errors.Join(err, db.Close()); err != nil {
		t.Fatal(err)
	}
	s = open(t, path)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		recs, err := s.Steps(context.Background(), run.ID, "")
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d records of the deleted run are left", len(recs))
		}
	}
	if recs, err := s.Steps(context.Background(), kept.ID, ""); err != nil || len(recs) != 10 {
		t.Errorf("the other run's records: %d %v", len(recs), err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err = bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_ = db.View(func(tx *bbolt.Tx) error {
		if k, _ := tx.Bucket([]byte("deleting")).Cursor().First(); k != nil {
			t.Errorf("the deletion is still marked: %s", k)
		}
		if k, _ := tx.Bucket([]byte("runs")).Cursor().Seek([]byte(run.ID)); k != nil && strings.HasPrefix(string(k), run.ID) {
			t.Errorf("a record of the deleted run is left: %q", k)
		}
		return nil
	})
}

// TestIndexesRunsThatEndedBefore opens a file whose runs ended before the
// finished index existed: they are indexed when it opens.
func TestIndexesRunsThatEndedBefore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gw.db")
	s := open(t, path)
	run := finishedRun(t, s, 1)
	running := startRun(t, s, []byte(`{}`))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		return errors.Join(tx.Bucket([]byte("meta")).Delete([]byte("finished_index")),
			tx.DeleteBucket([]byte("finished")), tx.DeleteBucket([]byte("finished_by_run")))
	})
	if err := errors.Join(err, db.Close()); err != nil {
		t.Fatal(err)
	}
	s = open(t, path)
	var ids []string
	err = s.FinishedRuns(context.Background(), store.RunSucceeded, func(r *store.Run) (bool, error) {
		ids = append(ids, r.ID)
		return true, nil
	})
	if err != nil || !slices.Equal(ids, []string{run.ID}) || slices.Contains(ids, running.ID) {
		t.Errorf("finished runs after the upgrade: %v %v", ids, err)
	}
}
