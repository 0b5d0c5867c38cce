package redis_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/internal/storetest"
	"github.com/chaingate/gateway/chain/store/redis"
	"github.com/chaingate/gateway/internal/testutil/redistest"
)

func openURL(t testing.TB, u string) *redis.Store {
	t.Helper()
	s, err := redis.OpenURL(context.Background(), u, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// newStore opens a store on a prefix of its own, and returns the prefix.
func newStore(t testing.TB) (*redis.Store, string) {
	t.Helper()
	u := redistest.Open(t)
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	return openURL(t, u), pu.Query().Get("prefix")
}

// rawClient talks to the test Redis directly, to see and break what the
// store wrote.
func rawClient(t testing.TB) *goredis.Client {
	c := goredis.NewClient(&goredis.Options{Addr: redistest.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestConformance(t *testing.T) {
	var mu sync.Mutex
	urls := map[store.Store]string{}
	storetest.Run(t, storetest.Factory{
		Open: func(t *testing.T) store.Store {
			u := redistest.Open(t)
			s := openURL(t, u)
			mu.Lock()
			urls[s] = u
			mu.Unlock()
			return s
		},
		Reopen: func(t *testing.T, s store.Store) store.Store {
			mu.Lock()
			u := urls[s]
			mu.Unlock()
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			return openURL(t, u)
		},
		Damage: func(t *testing.T, s store.Store, runID string) store.Store {
			mu.Lock()
			u := urls[s]
			mu.Unlock()
			pu, err := url.Parse(u)
			if err != nil {
				t.Fatal(err)
			}
			if err := rawClient(t).HSet(context.Background(), pu.Query().Get("prefix")+"run:"+runID, "h", `{"id": "`+runID+`", "status": 7`).Err(); err != nil {
				t.Fatal(err)
			}
			return s
		},
	})
}

func create(t testing.TB, s store.Store, run *store.Run, lease *store.Lease) {
	t.Helper()
	run.Seq++
	err := s.Commit(context.Background(), &store.Batch{Run: run, Create: true, Lease: lease,
		Events: []store.Event{{Seq: run.Seq, Time: time.Now().UTC(), Type: store.EventRunStarted}}})
	if err != nil {
		t.Fatalf("creating run: %v", err)
	}
}

// stepBatch is what the engine commits for one step: the run record, the
// step's record and one event.
func stepBatch(run *store.Run, key string) *store.Batch {
	run.Seq++
	run.UpdatedAt = time.Now().UTC()
	return &store.Batch{
		Run: run,
		Steps: []*store.StepRecord{{Key: key, Name: "s", Status: store.StepSucceeded,
			DedupKey: run.ID + "/" + key, Attempts: 1, Body: json.RawMessage(`{"alert":"disk-full","text":"step done","n":3}`)}},
		Events: []store.Event{{Seq: run.Seq, Time: time.Now().UTC(), Type: store.EventStepSucceeded, Step: key}},
	}
}

func TestConcurrentCommitsManyRuns(t *testing.T) {
	ctx := context.Background()
	s, _ := newStore(t)
	const runs, steps = 64, 30
	runsByIdx := make([]*store.Run, runs)
	var wg sync.WaitGroup
	errs := make(chan error, runs)
	for i := range runs {
		run := storetest.NewRun(fmt.Sprintf("c%d", i%4), time.Now().UTC())
		runsByIdx[i] = run
		wg.Go(func() {
			run.Seq = 1
			err := s.Commit(ctx, &store.Batch{Run: run, Create: true, Events: []store.Event{{Seq: 1, Type: store.EventRunStarted}}})
			for j := 0; err == nil && j < steps; j++ {
				b := stepBatch(run, fmt.Sprintf("s%02d", j))
				if j == steps-1 {
					run.Status = store.RunSucceeded
					b.DLQ = []*store.DLQEntry{{ID: store.NewID(), RunID: run.ID, Chain: run.Chain, Step: "s", CreatedAt: time.Now()}}
				}
				err = s.Commit(ctx, b)
			}
			if err != nil {
				errs <- fmt.Errorf("run %s: %w", run.ID, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, run := range runsByIdx {
		st, err := s.Steps(ctx, run.ID, "")
		if err != nil {
			t.Fatal(err)
		}
		ev, err := s.Events(ctx, run.ID, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(st) != steps || len(ev) != steps+1 || ev[steps].Seq != steps+1 {
			t.Fatalf("run %s: %d steps, %d events; want %d, %d", run.ID, len(st), len(ev), steps, steps+1)
		}
	}
	if ids, err := s.UnfinishedRuns(ctx); err != nil || len(ids) != 0 {
		t.Errorf("unfinished after every run finished: %v %v", ids, err)
	}
	if n, err := s.CountDLQ(ctx); err != nil || n != runs {
		t.Errorf("CountDLQ: %d %v, want %d", n, err, runs)
	}
	page, err := s.ListRuns(ctx, store.RunFilter{Chain: "c1", Status: store.RunSucceeded, Limit: 1000})
	if err != nil || len(page.Runs) != runs/4 {
		t.Errorf("runs of chain c1: %d %v, want %d", len(page.Runs), err, runs/4)
	}
}

// TestFencedTakeover has an old owner keep committing while its lease
// expires and a new owner takes the run over: once the new owner holds the
// lease, every commit of the old one fails with ErrLeaseLost, and the log
// is the old owner's events followed by the new owner's, never interleaved.
func TestFencedTakeover(t *testing.T) {
	ctx := context.Background()
	s, _ := newStore(t)
	const ttl = 300 * time.Millisecond
	run := storetest.NewRun("c", time.Now().UTC())
	la, err := s.AcquireLease(ctx, run.ID, "gw-a", ttl)
	if err != nil {
		t.Fatal(err)
	}
	create(t, s, run, &la)

	var (
		wg         sync.WaitGroup
		bDone      atomic.Bool
		aCommitted atomic.Int64
		aLost      atomic.Int64
		aErr, bErr error
		lb         store.Lease
	)
	wg.Go(func() {
		mine := *run
		for !bDone.Load() || aLost.Load() < 20 {
			b := stepBatch(&mine, "a")
			b.Lease = &la
			err := s.Commit(ctx, b)
			switch {
			case err == nil:
				aCommitted.Add(1)
			case errors.Is(err, store.ErrLeaseLost):
				aLost.Add(1)
				mine.Seq-- // the batch was not written
			default:
				aErr = err
				return
			}
		}
	})
	wg.Go(func() {
		// The old owner keeps committing until the new one is done.
		defer bDone.Store(true)
		for {
			l, err := s.AcquireLease(ctx, run.ID, "gw-b", ttl)
			if errors.Is(err, store.ErrLeaseHeld) {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			if err != nil {
				bErr = err
				return
			}
			lb = l
			break
		}
		cur, err := s.Run(ctx, run.ID)
		if err != nil {
			bErr = err
			return
		}
		for range 20 {
			b := stepBatch(cur, "b")
			b.Lease = &lb
			if err := s.Commit(ctx, b); err != nil {
				bErr = err
				return
			}
		}
	})
	wg.Wait()
	if aErr != nil || bErr != nil {
		t.Fatalf("old owner: %v; new owner: %v", aErr, bErr)
	}
	if aCommitted.Load() == 0 || aLost.Load() == 0 || lb.Fence <= la.Fence {
		t.Fatalf("old owner committed %d, lost %d; fences %d then %d", aCommitted.Load(), aLost.Load(), la.Fence, lb.Fence)
	}
	t.Logf("old owner: %d commits, then %d refused; fences %d then %d", aCommitted.Load(), aLost.Load(), la.Fence, lb.Fence)
	evs, err := s.Events(ctx, run.ID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := 1 + int(aCommitted.Load()) + 20; len(evs) != want {
		t.Fatalf("%d events, want %d", len(evs), want)
	}
	for i, ev := range evs {
		wantStep := "a"
		switch {
		case i == 0:
			wantStep = ""
		case i > int(aCommitted.Load()):
			wantStep = "b"
		}
		if ev.Seq != uint64(i+1) || ev.Step != wantStep {
			t.Fatalf("event %d: seq %d step %q, want step %q", i, ev.Seq, ev.Step, wantStep)
		}
	}
}

// pageCounter records the size of every script reply, to see
// ForEachStep read in pages.
type pageCounter struct {
	mu      sync.Mutex
	replies []int
}

func (h *pageCounter) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *pageCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

func (h *pageCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		err := next(ctx, cmd)
		if c, ok := cmd.(*goredis.Cmd); ok && strings.HasPrefix(c.Name(), "eval") {
			if vals, err := c.Slice(); err == nil {
				h.mu.Lock()
				h.replies = append(h.replies, len(vals))
				h.mu.Unlock()
			}
		}
		return err
	}
}

func TestForEachStepPages(t *testing.T) {
	ctx := context.Background()
	u := redistest.Open(t)
	pu, _ := url.Parse(u)
	c := rawClient(t)
	counter := &pageCounter{}
	c.AddHook(counter)
	s, err := redis.Open(ctx, redis.Options{Client: c, Prefix: pu.Query().Get("prefix"), Durability: redis.Durability{AllowVolatile: true}})
	if err != nil {
		t.Fatal(err)
	}
	run := storetest.NewRun("c", time.Now().UTC())
	create(t, s, run, nil)
	const n = 5000
	var keys []string
	for i := 0; i < n; i += 1000 {
		b := &store.Batch{Run: run}
		for j := i; j < i+1000; j++ {
			k := fmt.Sprintf("split[%d]", j) // unpadded, so key order is not numeric order
			keys = append(keys, k)
			b.Steps = append(b.Steps, &store.StepRecord{Key: k, Name: "split", Status: store.StepSucceeded})
		}
		if err := s.Commit(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	// Keys around the prefix's range, to check its ends.
	extra := []*store.StepRecord{{Key: "split"}, {Key: "split\\"}, {Key: "splits"}, {Key: "a"}}
	if err := s.Commit(ctx, &store.Batch{Run: run, Steps: extra}); err != nil {
		t.Fatal(err)
	}
	sort.Strings(keys)

	counter.mu.Lock()
	counter.replies = nil
	counter.mu.Unlock()
	var walked []string
	err = s.ForEachStep(ctx, run.ID, store.StepScan{Prefix: "split["}, func(st *store.StepRecord) error {
		walked = append(walked, st.Key)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(walked, keys) {
		t.Fatalf("walked %d keys, want %d in key order; first %v", len(walked), len(keys), walked[:min(5, len(walked))])
	}
	counter.mu.Lock()
	replies := counter.replies
	counter.mu.Unlock()
	// A page is its count and last key, then key/value pairs.
	if len(replies) < n/1000 || slices.Max(replies) > 2+2*1000 {
		t.Errorf("read in %d replies of up to %d values; want pages of at most 1000 records", len(replies), slices.Max(replies))
	}

	stop := errors.New("stop")
	count := 0
	err = s.ForEachStep(ctx, run.ID, store.StepScan{}, func(*store.StepRecord) error {
		if count++; count == 2500 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || count != 2500 {
		t.Errorf("stopping the walk: err %v after %d records", err, count)
	}
	all, err := s.Steps(ctx, run.ID, "")
	if err != nil || len(all) != n+len(extra) || all[0].Key != "a" {
		t.Errorf("all steps: %d, %v", len(all), err)
	}

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Errorf("the store closed a client it was given: %v", err)
	}
}

func TestStepPrefixWithTopBytes(t *testing.T) {
	ctx := context.Background()
	s, _ := newStore(t)
	run := storetest.NewRun("c", time.Now().UTC())
	create(t, s, run, nil)
	steps := []*store.StepRecord{{Key: "a\xff"}, {Key: "a\xff\xff"}, {Key: "a\xff\xffz"}, {Key: "b"}, {Key: "a"}}
	if err := s.Commit(ctx, &store.Batch{Run: run, Steps: steps}); err != nil {
		t.Fatal(err)
	}
	for prefix, want := range map[string]int{"a\xff": 3, "a\xff\xff": 2, "\xff": 0, "a": 4} {
		got, err := s.Steps(ctx, run.ID, prefix)
		if err != nil || len(got) != want {
			t.Errorf("prefix %q: %d steps, %v; want %d", prefix, len(got), err, want)
		}
	}
}

func TestScriptFlush(t *testing.T) {
	ctx := context.Background()
	s, _ := newStore(t)
	run := storetest.NewRun("c", time.Now().UTC())
	create(t, s, run, nil)
	if err := rawClient(t).ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, stepBatch(run, "a")); err != nil {
		t.Fatalf("commit after SCRIPT FLUSH: %v", err)
	}
	if got, err := s.Run(ctx, run.ID); err != nil || got.Seq != 2 {
		t.Fatalf("after SCRIPT FLUSH: %+v %v", got, err)
	}
	if _, err := s.AcquireLease(ctx, run.ID, "gw", time.Second); err != nil {
		t.Fatalf("lease after SCRIPT FLUSH: %v", err)
	}
}

// A client retrying a commit whose reply it lost must not be told the
// batch conflicts with itself.
func TestReplayedCommit(t *testing.T) {
	ctx := context.Background()
	s, _ := newStore(t)
	run := storetest.NewRun("c", time.Now().UTC())
	run.Seq = 1
	first := &store.Batch{Run: run, Create: true, Events: []store.Event{{Seq: 1, Type: store.EventRunStarted, Time: time.Now()}}}
	for range 2 {
		if err := s.Commit(ctx, first); err != nil {
			t.Fatalf("creating, then replaying the create: %v", err)
		}
	}
	b := stepBatch(run, "a")
	for range 2 {
		if err := s.Commit(ctx, b); err != nil {
			t.Fatalf("committing, then replaying: %v", err)
		}
	}
	if evs, _ := s.Events(ctx, run.ID, 0, 0); len(evs) != 2 {
		t.Fatalf("replays appended events: %d, want 2", len(evs))
	}
	// The same seqs with other content are a conflict, not a replay.
	other := *b
	other.Events = []store.Event{{Seq: 2, Type: store.EventStepFailed, Time: time.Now()}}
	if err := s.Commit(ctx, &other); !errors.Is(err, store.ErrConflict) {
		t.Errorf("another batch with the same seqs: got %v, want ErrConflict", err)
	}
	// So is replaying a batch that is no longer the last.
	if err := s.Commit(ctx, stepBatch(run, "b")); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, b); !errors.Is(err, store.ErrConflict) {
		t.Errorf("replaying an older batch: got %v, want ErrConflict", err)
	}
	again := *run
	again.Seq = 1
	if err := s.Commit(ctx, &store.Batch{Run: &again, Create: true,
		Events: []store.Event{{Seq: 1, Type: store.EventRunStarted, Time: time.Now()}}}); !errors.Is(err, store.ErrExists) {
		t.Errorf("creating an existing run anew: got %v, want ErrExists", err)
	}
}

func TestLeaseOnAnotherRun(t *testing.T) {
	ctx := context.Background()
	s, _ := newStore(t)
	run := storetest.NewRun("c", time.Now().UTC())
	other, err := s.AcquireLease(ctx, "other-run", "gw", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	run.Seq = 1
	err = s.Commit(ctx, &store.Batch{Run: run, Create: true, Lease: &other, Events: []store.Event{{Seq: 1, Type: store.EventRunStarted}}})
	if !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("commit under another run's lease: got %v, want ErrLeaseLost", err)
	}
	if _, err := s.AcquireLease(ctx, run.ID, "gw", 0); err == nil {
		t.Error("a lease with no TTL was granted")
	}
}

func TestClaimKeyRetried(t *testing.T) {
	ctx := context.Background()
	s, _ := newStore(t)
	for range 2 {
		if got, err := s.ClaimKey(ctx, "k", "run-1", time.Minute); err != nil || got != "" {
			t.Fatalf("claiming, then claiming again for the same run: %q %v", got, err)
		}
	}
	if got, err := s.ClaimKey(ctx, "k", "run-2", time.Minute); err != nil || got != "run-1" {
		t.Fatalf("claim for another run: %q %v, want run-1", got, err)
	}
}

// TestKeyLayout checks that a store writes only under its prefix, and only
// the documented keys.
func TestKeyLayout(t *testing.T) {
	ctx := context.Background()
	s, prefix := newStore(t)
	run := storetest.NewRun("c", time.Now().UTC())
	l, err := s.AcquireLease(ctx, run.ID, "gw", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	run.Seq = 1
	err = s.Commit(ctx, &store.Batch{Run: run, Create: true, Lease: &l,
		Definition: &store.Definition{Hash: "h", Source: []byte("src")},
		Steps:      []*store.StepRecord{{Key: "a"}},
		Events:     []store.Event{{Seq: 1, Type: store.EventRunStarted}},
		DLQ:        []*store.DLQEntry{{ID: "d1", RunID: run.ID}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.ClaimKey(ctx, "k", run.ID, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.PutDelivery(ctx, &store.Delivery{ID: "dv1", Trigger: "t", Body: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	run.Status, run.FinishedAt, run.Seq = store.RunSucceeded, time.Now().UTC(), 2
	if err := s.Commit(ctx, &store.Batch{Run: run, Lease: &l, Events: []store.Event{{Seq: 2, Type: store.EventRunSucceeded}}}); err != nil {
		t.Fatal(err)
	}
	keys, err := rawClient(t).Keys(ctx, prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		keys[i] = strings.ReplaceAll(strings.TrimPrefix(k, prefix), run.ID, "ID")
	}
	sort.Strings(keys)
	want := []string{"def:h", "dlq", "dlqids", "events:ID", "fence:ID", "finished:succeeded", "idem:k", "inbox", "inboxids", "lease:ID", "meta:finished", "run:ID", "runs", "stepkeys:ID", "steps:ID"}
	if !slices.Equal(keys, want) {
		t.Errorf("keys under the prefix: %v, want %v", keys, want)
	}
}

func TestMalformedData(t *testing.T) {
	ctx := context.Background()
	s, prefix := newStore(t)
	c := rawClient(t)
	run := storetest.NewRun("c", time.Now().UTC())
	create(t, s, run, nil)
	if err := s.Commit(ctx, &store.Batch{Run: run, Steps: []*store.StepRecord{{Key: "a"}}}); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range [][]any{
		{"HSET", prefix + "run:" + run.ID, "h", "{not json"},
		{"HSET", prefix + "steps:" + run.ID, "a", "[1]"},
		{"RPUSH", prefix + "events:" + run.ID, "nope"},
		{"SET", prefix + "lease:" + run.ID, "no-fence"},
		{"HSET", prefix + "dlq", "d", "{"},
		{"ZADD", prefix + "dlqids", 0, "d"},
	} {
		if err := c.Do(ctx, cmd...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	checks := map[string]error{}
	_, checks["Run"] = s.Run(ctx, run.ID)
	page, err := s.ListRuns(ctx, store.RunFilter{})
	if err != nil || len(page.Runs) != 0 || len(page.Damaged) != 1 || page.Damaged[0].ID != run.ID || !strings.Contains(page.Damaged[0].Error, prefix) {
		t.Errorf("ListRuns on malformed data: %+v, %v; want the run named under Damaged with its key", page, err)
	}
	_, checks["Steps"] = s.Steps(ctx, run.ID, "")
	_, checks["Events"] = s.Events(ctx, run.ID, 0, 0)
	_, checks["AcquireLease"] = s.AcquireLease(ctx, run.ID, "gw", time.Second)
	_, checks["DLQ"] = s.DLQ(ctx, "d")
	_, checks["ListDLQ"] = s.ListDLQ(ctx, store.DLQFilter{})
	for name, err := range checks {
		if err == nil || !strings.Contains(err.Error(), prefix) {
			t.Errorf("%s on malformed data: %v; want an error naming the key", name, err)
		}
	}
}

func TestOpenErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := redis.Open(ctx, redis.Options{Addr: "127.0.0.1:1"}); err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Errorf("unreachable Redis: %v, want an error naming the address", err)
	}
	if _, err := redis.OpenURL(ctx, "redis://:s3cret@[::1/0", nil); err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("malformed URL: %v, want an error without the password", err)
	}
	if _, err := redis.OpenURL(ctx, "redis://127.0.0.1:6379/0?bogus=1", nil); err == nil {
		t.Error("an unknown URL option was accepted")
	}
	cluster := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cluster.Close()
	if _, err := redis.Open(ctx, redis.Options{Client: cluster, Prefix: "gw:"}); err == nil || !strings.Contains(err.Error(), "hash tag") {
		t.Errorf("cluster client without a hash tag: %v", err)
	}
}

// TestRunFeed follows, from one store, the status changes another store on
// the same prefix commits: run events are heard, step events are not, a
// reconnection says what was heard may be incomplete, and closing the
// store ends the following.
func TestRunFeed(t *testing.T) {
	u := redistest.Open(t)
	name := fmt.Sprintf("feed-test-%d", time.Now().UnixNano())
	writer, follower := openURL(t, u), openURL(t, u+"&client_name="+name)
	ctx := context.Background()
	type heard struct {
		ev   store.Event
		lost bool
	}
	got := make(chan heard, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		follower.FollowRuns(ctx, func(ev store.Event, lost bool) { got <- heard{ev, lost} })
	}()
	next := func() heard {
		t.Helper()
		select {
		case h := <-got:
			return h
		case <-time.After(30 * time.Second):
			t.Fatal("nothing heard in 30 s")
			return heard{}
		}
	}
	if h := next(); !h.lost {
		t.Fatalf("following began with %+v, want a lost mark", h)
	}
	run := storetest.NewRun("c", time.Now().UTC())
	create(t, writer, run, nil)
	if err := writer.Commit(ctx, stepBatch(run, "a")); err != nil {
		t.Fatal(err)
	}
	run.Seq++
	run.Status = store.RunSucceeded
	if err := writer.Commit(ctx, &store.Batch{Run: run, Events: []store.Event{{Seq: run.Seq, Time: time.Now().UTC(), Type: store.EventRunSucceeded}}}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []store.EventType{store.EventRunStarted, store.EventRunSucceeded} {
		if h := next(); h.lost || h.ev.Type != want || h.ev.RunID != run.ID {
			t.Errorf("heard %+v, want %s of run %s", h, want, run.ID)
		}
	}

	// Redis cuts the follower's connection: it follows again and says so.
	raw := rawClient(t)
	list, err := raw.ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	killed := 0
	for line := range strings.Lines(list) {
		f := strings.Fields(line)
		if slices.Contains(f, "name="+name) && slices.Contains(f, "sub=1") {
			id, _ := strings.CutPrefix(f[0], "id=")
			if err := raw.Do(ctx, "CLIENT", "KILL", "ID", id).Err(); err != nil {
				t.Fatal(err)
			}
			killed++
		}
	}
	if killed != 1 {
		t.Fatalf("found %d following connections of the store in CLIENT LIST, want 1", killed)
	}
	if h := next(); !h.lost {
		t.Errorf("after a reconnection heard %+v, want a lost mark", h)
	}

	if err := follower.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("FollowRuns went on after the store closed")
	}
}

// TestDeleteRunLeavesNoKey deletes a run that ended: none of its keys is
// left under the prefix, nor its index entries.
func TestDeleteRunLeavesNoKey(t *testing.T) {
	ctx := context.Background()
	s, prefix := newStore(t)
	run := storetest.NewRun("c", time.Now().UTC())
	l, err := s.AcquireLease(ctx, run.ID, "gw", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	create(t, s, run, &l)
	run.Status, run.FinishedAt = store.RunSucceeded, time.Now().UTC()
	b := stepBatch(run, "split[0]")
	b.Run, b.Lease = run, &l
	if err := s.Commit(ctx, b); err != nil {
		t.Fatal(err)
	}
	freed, err := s.DeleteRun(ctx, run.ID)
	if err != nil || freed.Records < 4 || freed.Bytes <= 0 {
		t.Fatalf("deleting: %+v %v", freed, err)
	}
	keys, err := rawClient(t).Keys(ctx, prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		keys[i] = strings.TrimPrefix(k, prefix)
	}
	sort.Strings(keys)
	if want := []string{"meta:finished"}; !slices.Equal(keys, want) {
		t.Errorf("keys left under the prefix: %v, want %v", keys, want)
	}
}

// TestIndexesRunsThatEndedBefore opens a store whose runs ended before the
// finished indexes existed: the first gateway to open it indexes them.
func TestIndexesRunsThatEndedBefore(t *testing.T) {
	ctx := context.Background()
	u := redistest.Open(t)
	s := openURL(t, u)
	run := storetest.NewRun("c", time.Now().UTC())
	create(t, s, run, nil)
	run.Status, run.FinishedAt = store.RunFailed, time.Now().UTC()
	if err := s.Commit(ctx, stepBatch(run, "a")); err != nil {
		t.Fatal(err)
	}
	pu, _ := url.Parse(u)
	prefix := pu.Query().Get("prefix")
	c := rawClient(t)
	if err := c.Del(ctx, prefix+"meta:finished", prefix+"finished:failed").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.HDel(ctx, prefix+"run:"+run.ID, "f").Err(); err != nil {
		t.Fatal(err)
	}
	s2 := openURL(t, u)
	var ids []string
	err := s2.FinishedRuns(ctx, store.RunFailed, func(r *store.Run) (bool, error) {
		ids = append(ids, r.ID)
		return true, nil
	})
	if err != nil || !slices.Equal(ids, []string{run.ID}) {
		t.Errorf("failed runs after the upgrade: %v %v", ids, err)
	}
	if done, _ := c.Get(ctx, prefix+"meta:finished").Result(); done != "done" {
		t.Errorf("the index is marked %q", done)
	}
}
