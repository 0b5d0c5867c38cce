package redis_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/backup"
	"github.com/chaingate/gateway/chain/store/internal/storetest"
	"github.com/chaingate/gateway/chain/store/redis"
)

func restoreInto(t *testing.T, data []byte, s *redis.Store) (store.SnapshotInfo, error) {
	t.Helper()
	r, err := backup.NewReader(bytes.NewReader(data))
	if err != nil {
		return store.SnapshotInfo{}, err
	}
	return redis.Restore(context.Background(), r, s)
}

// leftovers lists the keys a restore into prefix wrote outside it.
func leftovers(t *testing.T, prefix string) []string {
	t.Helper()
	keys, err := rawClient(t).Keys(context.Background(), "chaingate-restore:*:"+prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// TestBackupRoundTrip backs a store up and restores it under another
// prefix: everything reads back the same, a damaged run stays damaged,
// the idempotency keys keep their expiry and no lease comes along. Once
// with every key read whole, once with every key read a page at a time.
func TestBackupRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name   string
		bigKey int
	}{{"whole", 1000}, {"paged", 2}} {
		t.Run(tc.name, func(t *testing.T) {
			defer redis.SetBigKey(tc.bigKey)()
			ctx := context.Background()
			src, srcPrefix := newStore(t)
			filled := storetest.Fill(t, src)
			damaged := storetest.NewRun("fill", time.Now().UTC())
			create(t, src, damaged, nil)
			if err := rawClient(t).HSet(ctx, srcPrefix+"run:"+damaged.ID, "h", `{"id": "`+damaged.ID+`", "status": 7`).Err(); err != nil {
				t.Fatal(err)
			}
			if _, err := src.AcquireLease(ctx, filled.Unfinished[0], "gateway-a", time.Hour); err != nil {
				t.Fatal(err)
			}
			want := storetest.Contents(t, src, filled)
			var buf bytes.Buffer
			info, err := src.Snapshot(ctx, &buf)
			if err != nil {
				t.Fatal(err)
			}
			if info.Kind != "redis" || info.Runs != 4 || info.Unfinished != 1 {
				t.Errorf("snapshot info %+v", info)
			}
			dst, dstPrefix := newStore(t)
			if info, err := restoreInto(t, buf.Bytes(), dst); err != nil || info.Runs != 4 || info.Unfinished != 1 {
				t.Fatalf("restoring: %+v %v", info, err)
			}
			got := storetest.Contents(t, dst, filled)
			// The damaged run's error names its key, under the new prefix.
			got["damaged"] = bytes.ReplaceAll(got["damaged"], []byte(dstPrefix), []byte(srcPrefix))
			storetest.Same(t, want, got)
			if !strings.Contains(string(got["damaged"]), damaged.ID) {
				t.Errorf("the damaged run is not listed as damaged: %s", got["damaged"])
			}
			if _, err := dst.AcquireLease(ctx, filled.Unfinished[0], "gateway-b", time.Minute); err != nil {
				t.Errorf("the restored run came with a lease: %v", err)
			}
			if keys := leftovers(t, dstPrefix); len(keys) > 0 {
				t.Errorf("the restore left keys behind: %v", keys)
			}
			storetest.LapsingBound(t, dst, filled)
			time.Sleep(time.Until(filled.LapsingClaimed.Add(storetest.LapsingTTL + 100*time.Millisecond)))
			for key, run := range filled.Keys {
				got, err := dst.KeyRun(ctx, key)
				if key == filled.Lapsing {
					run = ""
				}
				if err != nil || got != run {
					t.Errorf("key %s after its TTL: bound to %q (%v), want %q", key, got, err, run)
				}
			}
		})
	}
}

// TestBackupOfARunThatChanges backs up a run too large to read at once
// while it is committed to without a pause: the copy taken a page at a
// time is dropped, and the run copied again from one moment. The run
// restored is one its commits left: its counter step, its record and its
// events agree.
func TestBackupOfARunThatChanges(t *testing.T) {
	defer redis.SetBigKey(20)()
	ctx := context.Background()
	src, srcPrefix := newStore(t)
	run := storetest.NewRun("busy", time.Now().UTC())
	create(t, src, run, nil)
	for i := range 10 {
		b := stepBatch(run, "")
		b.Steps = nil
		for j := range 50 {
			b.Steps = append(b.Steps, &store.StepRecord{Key: fmt.Sprintf("loop[%d]", i*50+j), Name: "loop", Status: store.StepSucceeded, Body: json.RawMessage(`{"ok":true}`)})
		}
		if err := src.Commit(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	base := run.Seq
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() {
		for k := 1; !stop.Load(); k++ {
			b := stepBatch(run, "counter")
			b.Steps[0].Attempts = k
			if err := src.Commit(ctx, b); err != nil {
				t.Error(err)
				return
			}
		}
	})
	defer func() { stop.Store(true); wg.Wait() }()
	// Each try reads the run in 27 pages while it changes every commit: a
	// try that copies it page by page to the end is as good, but tells
	// nothing about the copy taken again.
	var data []byte
	for try := 0; try < 20 && data == nil; try++ {
		var buf bytes.Buffer
		if _, err := src.Snapshot(ctx, &buf); err != nil {
			t.Fatal(err)
		}
		if dropped(t, buf.Bytes()) {
			data = buf.Bytes()
		}
	}
	if data == nil {
		t.Fatal("the run never changed while it was being read, in 20 backups")
	}
	dst, _ := newStore(t)
	if _, err := restoreInto(t, data, dst); err != nil {
		t.Fatal(err)
	}
	got, err := dst.Run(ctx, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	steps, err := dst.Steps(ctx, run.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	evs, err := dst.Events(ctx, run.ID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	counter := 0
	for _, st := range steps {
		if st.Key == "counter" {
			counter = st.Attempts
		}
	}
	if len(steps) != 501 && !(counter == 0 && len(steps) == 500) {
		t.Errorf("%d step records", len(steps))
	}
	if got.Seq != base+uint64(counter) || uint64(len(evs)) != got.Seq {
		t.Errorf("the run restored is no moment of it: record at seq %d, %d events, counter at %d (seq %d before it counted)", got.Seq, len(evs), counter, base)
	}
	// The restored run takes commits where it stands.
	if err := dst.Commit(ctx, stepBatch(got, "after")); err != nil {
		t.Errorf("committing to the restored run: %v", err)
	}
	// Nor is any of the copies Redis made for the backups left.
	if keys, err := rawClient(t).Keys(ctx, srcPrefix+"backup:*").Result(); err != nil || len(keys) > 0 {
		t.Errorf("scratch keys: %v %v", keys, err)
	}
}

// dropped reports whether a backup copied a run again.
func dropped(t *testing.T, data []byte) bool {
	t.Helper()
	r, err := backup.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for {
		tag, _, err := r.Next()
		if err != nil {
			return found
		}
		found = found || tag == 'X'
	}
}

// TestRestoreRefuses checks what a restore refuses, and that a refused
// restore leaves nothing behind, under the prefix or beside it.
func TestRestoreRefuses(t *testing.T) {
	ctx := context.Background()
	src, _ := newStore(t)
	storetest.Fill(t, src)
	var buf bytes.Buffer
	if _, err := src.Snapshot(ctx, &buf); err != nil {
		t.Fatal(err)
	}
	data := buf.Bytes()
	other := func(h backup.Header) []byte {
		var out bytes.Buffer
		w, err := backup.NewWriter(&out, h)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Close(backup.Trailer{}); err != nil {
			t.Fatal(err)
		}
		return out.Bytes()
	}
	tests := []struct {
		name  string
		data  []byte
		taken bool
		want  error
		says  string
	}{
		{name: "a prefix that holds keys", data: data, taken: true, says: "holds keys already"},
		{name: "a file cut short", data: data[:len(data)-10], want: backup.ErrTruncated},
		{name: "a damaged file", data: func() []byte { d := bytes.Clone(data); d[len(d)/2] ^= 1; return d }(), want: backup.ErrDamaged},
		{name: "a later backup format", data: append([]byte("chaingate-backup 2\n"), data[len("chaingate-backup 1\n"):]...), want: backup.ErrVersion},
		{name: "a later key layout", data: other(backup.Header{Kind: "redis", Format: "2"}), says: "layout 2, and this gateway reads layout 1"},
		{name: "a bolt backup", data: other(backup.Header{Kind: "bolt", Format: "3"}), says: "holds a bolt store"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dst, prefix := newStore(t)
			if tc.taken {
				if _, err := dst.ClaimKey(ctx, "k", "r", time.Hour); err != nil {
					t.Fatal(err)
				}
			}
			_, err := restoreInto(t, tc.data, dst)
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("got %v; want %v saying %q", err, tc.want, tc.says)
			}
			// What an empty store writes of itself when opened aside.
			var keys []string
			all, _ := rawClient(t).Keys(ctx, prefix+"*").Result()
			for _, k := range all {
				if !strings.HasPrefix(k, prefix+"meta:") {
					keys = append(keys, k)
				}
			}
			if want := map[bool]int{true: 1, false: 0}[tc.taken]; len(keys) != want {
				t.Errorf("keys under the prefix after a refused restore: %v", keys)
			}
			if keys := leftovers(t, prefix); len(keys) > 0 {
				t.Errorf("the refused restore left keys behind: %v", keys)
			}
		})
	}
}
