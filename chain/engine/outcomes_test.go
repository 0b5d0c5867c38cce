package engine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/store"
)

// logLines collects JSON log records, safe for concurrent writers.
type logLines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logLines) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

func (l *logLines) records(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.buf.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// TestFailuresAreLogged checks that a service's log says, once it is
// durable, what an operator alerting on logs must see: the step that used
// up its retries, the dead-letter entry, and the run that failed, each with
// run, chain, step and error.
func TestFailuresAreLogged(t *testing.T) {
	var logs logLines
	h := newHarness(t, `
[[chains]]
name = "pager"
[[chains.steps]]
name = "ok"
provider = "echo"
[[chains.steps]]
name = "page"
provider = "faulty"
payload_template = { fail_retryable = "routing key rejected" }
retry = { max_retries = 1, backoff_ms = 1 }
on_failure = "dlq"
`, atStore(filepath.Join(t.TempDir(), "gw.db")), withLogger(logs.logger()))
	res := h.run("pager", `{}`)
	if res.Status != store.RunFailed {
		t.Fatalf("run %s", res.Status)
	}
	entries, _ := h.store.ListDLQ(context.Background(), store.DLQFilter{})
	if len(entries) != 1 {
		t.Fatalf("dlq: %+v", entries)
	}
	want := []map[string]any{
		{"level": "WARN", "msg": "step failed", "step": "page", "attempts": 2.0},
		{"level": "WARN", "msg": "failure parked in the dead-letter queue", "step": "page", "entry": entries[0].ID},
		{"level": "ERROR", "msg": "run failed", "step": "page"},
	}
	recs := logs.records(t)
	for _, w := range want {
		found := false
		for _, r := range recs {
			if r["msg"] != w["msg"] {
				continue
			}
			found = true
			if r["run"] != res.ID || r["chain"] != "pager" || !strings.Contains(r["err"].(string), "routing key rejected") {
				t.Errorf("%q: run, chain or err missing: %v", w["msg"], r)
			}
			for k, v := range w {
				if r[k] != v {
					t.Errorf("%q: %s = %v, want %v", w["msg"], k, r[k], v)
				}
			}
		}
		if !found {
			t.Errorf("no %q line in the log:\n%s", w["msg"], logs.buf.String())
		}
	}
	for _, r := range recs {
		if r["step"] == "ok" {
			t.Errorf("a step that succeeded was logged: %v", r)
		}
	}
}

// renewAfterRelease makes a lease renewal reach the store just after the
// run it renews has finished and given its lease back, as happens when the
// keeper lists a run just before it finishes: the run's last commit waits
// for a renewal to come in, and that renewal waits for the release.
type renewAfterRelease struct {
	store.Store
	final        atomic.Bool
	renewArrived chan struct{}
	arriveOnce   sync.Once
	released     chan struct{}
	releaseOnce  sync.Once
	lost         atomic.Int32
}

func (s *renewAfterRelease) Commit(ctx context.Context, b *store.Batch) error {
	err := s.Store.Commit(ctx, b)
	if err == nil && b.Run.Status.Final() {
		s.final.Store(true)
		select {
		case <-s.renewArrived:
		case <-time.After(10 * time.Second):
		}
	}
	return err
}

func (s *renewAfterRelease) RenewLease(ctx context.Context, l store.Lease, ttl time.Duration) (store.Lease, error) {
	if s.final.Load() {
		s.arriveOnce.Do(func() { close(s.renewArrived) })
		select {
		case <-s.released:
		case <-ctx.Done():
			return store.Lease{}, ctx.Err()
		}
	}
	renewed, err := s.Store.RenewLease(ctx, l, ttl)
	if errors.Is(err, store.ErrLeaseLost) {
		s.lost.Add(1)
	}
	return renewed, err
}

func (s *renewAfterRelease) ReleaseLease(ctx context.Context, l store.Lease) error {
	err := s.Store.ReleaseLease(ctx, l)
	s.releaseOnce.Do(func() { close(s.released) })
	return err
}

// TestNoLostLeaseWarningAfterRunEnds checks that a renewal refused because
// the run had just finished and released its lease is not reported as a
// lease lost to another gateway.
func TestNoLostLeaseWarningAfterRunEnds(t *testing.T) {
	var logs logLines
	var wrapped *renewAfterRelease
	h := newHarness(t, `
[[chains]]
name = "c"
[[chains.steps]]
name = "one"
provider = "echo"
`, atStore(filepath.Join(t.TempDir(), "gw.db")), withLogger(logs.logger()), withLeaseTTL(3*time.Second), wrapStore(func(st store.Store) store.Store {
		wrapped = &renewAfterRelease{Store: st, renewArrived: make(chan struct{}), released: make(chan struct{})}
		return wrapped
	}))
	if res := h.run("c", `{}`); res.Status != store.RunSucceeded {
		t.Fatalf("run %s", res.Status)
	}
	// The held renewal goes out once the lease is back; wait for its
	// refusal to be handled.
	deadline := time.Now().Add(10 * time.Second)
	for wrapped.lost.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if wrapped.lost.Load() == 0 {
		t.Fatal("no renewal was refused after the run ended; the test did not exercise the race")
	}
	h.close()
	if strings.Contains(logs.buf.String(), "lease") {
		t.Errorf("a finished run's refused renewal was logged:\n%s", logs.buf.String())
	}
}
