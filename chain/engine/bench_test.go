package engine_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/bolt"
	"github.com/chaingate/gateway/chain/store/redis"
	"github.com/chaingate/gateway/internal/testutil"
	"github.com/chaingate/gateway/internal/testutil/redistest"
	"github.com/chaingate/gateway/plugins/host"
	"github.com/chaingate/gateway/providers"
)

// tenEchoSteps is a chain of ten echo steps, each reading the one before.
func tenEchoSteps() string {
	var b strings.Builder
	b.WriteString("[[chains]]\nname = \"ten\"\n")
	for i := range 10 {
		fmt.Fprintf(&b, "[[chains.steps]]\nname = \"s%d\"\nprovider = \"echo\"\n", i)
		if i == 0 {
			b.WriteString("payload_template = { alert = \"<<origin.payload.alert>>\", n = 0 }\n")
		} else {
			b.WriteString("payload_template = { alert = \"<<prev.body.alert>>\", text = \"step <<prev.body.n>> done\", n = " + fmt.Sprint(i) + " }\n")
		}
	}
	return b.String()
}

// stepClock measures the time between consecutive durable step completions
// of one run: the engine's decision, the durable commit, and the plugin
// round trip.
type stepClock struct {
	mu    sync.Mutex
	last  map[string]time.Time
	spans []time.Duration
}

func (c *stepClock) observe(ev store.Event) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	switch ev.Type {
	case store.EventRunStarted:
		c.last[ev.RunID] = now
	case store.EventStepSucceeded:
		c.spans = append(c.spans, now.Sub(c.last[ev.RunID]))
		c.last[ev.RunID] = now
	case store.EventRunSucceeded:
		delete(c.last, ev.RunID)
	}
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(float64(len(s)-1)*p)]
}

// BenchmarkSequentialRun runs a 10-step echo chain at a time and reports the
// per-step latency percentiles against the floor measured in the same run:
// between runs, a bare durable commit of a step's records on a second bbolt
// file in the same folder, and a bare call to the same plugin process.
// x-floor is the step's p50 over the sum of those two p50s. commit-µs and
// call-µs are the p50s of the run's own commits and calls, as the engine
// saw them.
func BenchmarkSequentialRun(b *testing.B) {
	clock := &stepClock{last: map[string]time.Time{}}
	commits := &commitTimer{}
	calls := &callSpans{}
	h := newBenchHarness(b, tenEchoSteps(), clock.observe, withObserver(calls),
		wrapStore(func(s store.Store) store.Store { commits.Store = s; return commits }))
	floor, err := bolt.Open(filepath.Join(b.TempDir(), "floor.db"), bolt.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer floor.Close()
	ctx := context.Background()
	h.runOnce(ctx, b) // start the plugin process outside the timing
	echo := h.pm.Provider(host.Spec{Name: "echo", Builtin: "echo"})
	floorRun := &store.Run{ID: store.NewID(), Chain: "ten", Status: store.RunRunning, Seq: 1,
		Origin: store.Origin{Payload: []byte(`{"alert":"disk-full"}`)}, CreatedAt: time.Now(), UpdatedAt: time.Now()}
	if err := floor.Commit(ctx, &store.Batch{Run: floorRun, Create: true, Events: []store.Event{{Seq: 1, Type: store.EventRunStarted}}}); err != nil {
		b.Fatal(err)
	}
	req := providers.Request{ActionType: "post", Payload: []byte(`{"alert":"disk-full","text":"step 3 done","n":4}`), DedupKey: floorRun.ID + "/s", Attempt: 1}
	var bareCommits, bareCalls []time.Duration
	clock.spans, commits.spans, calls.spans = nil, nil, nil
	for b.Loop() {
		h.runOnce(ctx, b)
		b.StopTimer()
		for i := range 10 {
			floorRun.Seq++
			batch := &store.Batch{Run: floorRun, Steps: []*store.StepRecord{{Key: "s" + strconv.Itoa(i), Name: "s", Status: store.StepSucceeded,
				DedupKey: req.DedupKey, Attempts: 1, Body: req.Payload}},
				Events: []store.Event{{Seq: floorRun.Seq, Time: time.Now(), Type: store.EventStepSucceeded, Step: "s"}}}
			start := time.Now()
			if err := floor.Commit(ctx, batch); err != nil {
				b.Fatal(err)
			}
			bareCommits = append(bareCommits, time.Since(start))
			start = time.Now()
			if _, err := echo.Execute(ctx, req); err != nil {
				b.Fatal(err)
			}
			bareCalls = append(bareCalls, time.Since(start))
		}
		b.StartTimer()
	}
	b.StopTimer()
	step := percentile(clock.spans, 0.5)
	bare := percentile(bareCommits, 0.5) + percentile(bareCalls, 0.5)
	b.ReportMetric(float64(step.Microseconds()), "p50-step-µs")
	b.ReportMetric(float64(percentile(clock.spans, 0.99).Microseconds()), "p99-step-µs")
	b.ReportMetric(float64(percentile(bareCommits, 0.5).Microseconds()), "floor-commit-µs")
	b.ReportMetric(float64(percentile(bareCalls, 0.5).Microseconds()), "floor-call-µs")
	b.ReportMetric(float64(percentile(commits.spanList(), 0.5).Microseconds()), "commit-µs")
	b.ReportMetric(float64(percentile(calls.spanList(), 0.5).Microseconds()), "call-µs")
	b.ReportMetric(step.Seconds()/bare.Seconds(), "x-floor")
}

// commitTimer times the engine's commits.
type commitTimer struct {
	store.Store
	mu    sync.Mutex
	spans []time.Duration
}

func (c *commitTimer) Commit(ctx context.Context, batch *store.Batch) error {
	start := time.Now()
	err := c.Store.Commit(ctx, batch)
	c.mu.Lock()
	c.spans = append(c.spans, time.Since(start))
	c.mu.Unlock()
	return err
}

func (c *commitTimer) spanList() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.spans)
}

// callSpans keeps how long each provider call took, as the engine saw it.
type callSpans struct {
	mu    sync.Mutex
	spans []time.Duration
}

func (c *callSpans) CallStarted(string) {}

func (c *callSpans) CallEnded(_ string, took time.Duration, _ error) {
	c.mu.Lock()
	c.spans = append(c.spans, took)
	c.mu.Unlock()
}

func (c *callSpans) spanList() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.spans)
}

// BenchmarkConcurrentRuns keeps many 10-step runs in flight and reports
// durable steps per second, and the CPU each step costs in the gateway
// process (engine, store, gRPC client) and in the plugin process.
func BenchmarkConcurrentRuns(b *testing.B) {
	for _, conc := range []int{64, 256} {
		b.Run(fmt.Sprintf("runs=%d", conc), func(b *testing.B) {
			concurrentRuns(b, newBenchHarness(b, tenEchoSteps(), nil), conc)
		})
	}
}

// BenchmarkRedisRuns is the sequential and the concurrent runs over the
// Redis store (the test Redis, on a prefix of its own): the step's p50 and
// the p50 of its commits, one run at a time, and steps/s with 64 and 256
// runs in flight.
func BenchmarkRedisRuns(b *testing.B) {
	open := func(b *testing.B) store.Store {
		st, err := redis.OpenURL(context.Background(), redistest.Open(b), nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = st.Close() })
		return st
	}
	b.Run("sequential", func(b *testing.B) {
		clock := &stepClock{last: map[string]time.Time{}}
		commits := &commitTimer{}
		h := newBenchHarness(b, tenEchoSteps(), clock.observe, sharing(open(b)),
			wrapStore(func(s store.Store) store.Store { commits.Store = s; return commits }))
		ctx := context.Background()
		h.runOnce(ctx, b)
		clock.spans, commits.spans = nil, nil
		for b.Loop() {
			h.runOnce(ctx, b)
		}
		b.ReportMetric(float64(percentile(clock.spans, 0.5).Microseconds()), "p50-step-µs")
		b.ReportMetric(float64(percentile(clock.spans, 0.99).Microseconds()), "p99-step-µs")
		b.ReportMetric(float64(percentile(commits.spanList(), 0.5).Microseconds()), "commit-µs")
	})
	for _, conc := range []int{64, 256} {
		b.Run(fmt.Sprintf("runs=%d", conc), func(b *testing.B) {
			concurrentRuns(b, newBenchHarness(b, tenEchoSteps(), nil, sharing(open(b))), conc)
		})
	}
}

func concurrentRuns(b *testing.B, h *benchHarness, conc int) {
	ctx := context.Background()
	h.runOnce(ctx, b)
	work := make(chan struct{})
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for range work {
				h.runOnce(ctx, b)
			}
		})
	}
	selfStart, childStart := testutil.CPUTimes()
	b.ResetTimer()
	start := time.Now()
	n := 0
	for b.Loop() {
		work <- struct{}{}
		n++
	}
	close(work)
	wg.Wait()
	b.StopTimer()
	elapsed := time.Since(start)
	// The plugin process's CPU is counted once it has exited and been reaped.
	_ = h.pm.Close()
	self, child := testutil.CPUTimes()
	steps := float64(n * 10)
	b.ReportMetric(steps/elapsed.Seconds(), "steps/s")
	b.ReportMetric(float64((self-selfStart).Microseconds())/steps, "gateway-cpu-µs/step")
	b.ReportMetric(float64((child-childStart).Microseconds())/steps, "plugin-cpu-µs/step")
}

type benchHarness struct {
	*harness
}

// newBenchHarness keeps no events unless onEvent does: the test harness's
// own record of them grows with every step and would be timed too.
func newBenchHarness(b *testing.B, config string, onEvent func(store.Event), options ...harnessOption) *benchHarness {
	if onEvent == nil {
		onEvent = func(store.Event) {}
	}
	return &benchHarness{newHarness(b, config, append(options, onEvents(onEvent))...)}
}

// callTimer adds up how long provider calls take, from the engine's start
// of each to its end.
type callTimer struct {
	n, total atomic.Int64
}

func (c *callTimer) CallStarted(string) {}

func (c *callTimer) CallEnded(_ string, took time.Duration, _ error) {
	c.n.Add(1)
	c.total.Add(int64(took))
}

func (h *benchHarness) runOnce(ctx context.Context, b *testing.B) {
	run, err := h.eng.Start(ctx, "ten", engine.Input{Payload: []byte(`{"alert":"disk-full"}`)})
	if err != nil {
		b.Fatal(err)
	}
	final, err := h.eng.Wait(ctx, run.ID)
	if err != nil || final.Status != store.RunSucceeded {
		b.Fatalf("run: %v %+v", err, final)
	}
}

// BenchmarkParallel10k runs one group of 10,000 faulty sub-steps that each
// sleep 10 ms, 100 at a time: ideally 1.0 s. It reports the wall time of the
// group and the process's peak resident memory, and splits a slot's time
// between the calls (the plugin's 10 ms and the round trip to it) and what
// the engine spends between one call's end and the next call's start.
func BenchmarkParallel10k(b *testing.B) {
	const subs, sleepMS, conc = 10000, 10, 100
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "[[chains]]\nname = \"big\"\n[[chains.steps]]\nname = \"group\"\n[chains.steps.parallel]\nmax_concurrency = %d\n", conc)
	for i := range subs {
		fmt.Fprintf(&cfg, "[[chains.steps.parallel.steps]]\nname = \"s%05d\"\nprovider = \"faulty\"\npayload_template = { sleep_ms = %d }\n", i, sleepMS)
	}
	calls := &callTimer{}
	h := newBenchHarness(b, cfg.String(), func(store.Event) {}, withObserver(calls))
	ctx := context.Background()
	// Start the plugin process outside the timing.
	if _, err := h.pm.Provider(host.Spec{Name: "faulty", Builtin: "faulty"}).Describe(ctx); err != nil {
		b.Fatal(err)
	}
	resetPeakRSS()
	selfStart, childStart := testutil.CPUTimes()
	var walls []time.Duration
	for b.Loop() {
		start := time.Now()
		run, err := h.eng.Start(ctx, "big", engine.Input{})
		if err != nil {
			b.Fatal(err)
		}
		final, err := h.eng.Wait(ctx, run.ID)
		if err != nil || final.Status != store.RunSucceeded {
			b.Fatalf("run: %v %+v", err, final)
		}
		walls = append(walls, time.Since(start))
	}
	ideal := time.Duration(subs/conc*sleepMS) * time.Millisecond
	_ = h.pm.Close()
	self, child := testutil.CPUTimes()
	n := float64(subs * len(walls))
	b.ReportMetric(float64((self-selfStart).Microseconds())/n, "gateway-cpu-µs/call")
	b.ReportMetric(float64((child-childStart).Microseconds())/n, "plugin-cpu-µs/call")
	var all time.Duration
	for _, w := range walls {
		all += w
	}
	slot := conc * all.Seconds() / n
	call := time.Duration(calls.total.Load() / calls.n.Load()).Seconds()
	b.ReportMetric(call*1e3, "call-ms")
	b.ReportMetric((slot-call)*1e3, "between-calls-ms")
	b.ReportMetric(percentile(walls, 0.5).Seconds(), "wall-s")
	b.ReportMetric(percentile(walls, 0.5).Seconds()/ideal.Seconds(), "x-ideal")
	b.ReportMetric(float64(peakRSS())/(1<<20), "peak-rss-MiB")
}

// sampleAnon reports the largest anonymous resident memory seen, sampled
// every 50 ms until stop is closed.
func sampleAnon(stop <-chan struct{}, peak chan<- int64) {
	var max int64
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		if v := statusKB("RssAnon:") << 10; v > max {
			max = v
		}
		select {
		case <-stop:
			peak <- max
			return
		case <-t.C:
		}
	}
}

func statusKB(field string) int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, field); ok {
			var kb int64
			fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kb)
			return kb
		}
	}
	return 0
}

// resetPeakRSS starts a new peak resident-memory measurement (Linux).
func resetPeakRSS() { _ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

// peakRSS returns the peak resident memory since resetPeakRSS, in bytes.
func peakRSS() int64 { return statusKB("VmHWM:") << 10 }

// BenchmarkResume1000 measures a restart: a store holds 1,000 unfinished
// runs, each stopped with a parallel group's sub-steps in flight (as a
// kill -9 leaves them); a new engine opens it and resumes them. It reports
// the time from opening the store until the plugin has received the first
// call dispatched again, and all of them (read from faulty's record file).
func BenchmarkResume1000(b *testing.B) {
	const runs, subs = 1000, 3
	dir := b.TempDir()
	rec := filepath.Join(dir, "calls.jsonl")
	cfg := "[[chains]]\nname = \"held\"\n[[chains.steps]]\nname = \"group\"\n[chains.steps.parallel]\n"
	for i := range subs {
		cfg += fmt.Sprintf("[[chains.steps.parallel.steps]]\nname = \"s%d\"\nprovider = \"faulty\"\npayload_template = { hang = true, record = %q }\n", i, rec)
	}
	db := filepath.Join(dir, "gateway.db")
	ctx := context.Background()
	for range b.N {
		b.StopTimer()
		_ = os.Remove(db)
		_ = os.Remove(rec)
		h := newHarness(b, cfg, atStore(db), onEvents(func(store.Event) {}))
		for range runs {
			if _, err := h.eng.Start(ctx, "held", engine.Input{}); err != nil {
				b.Fatal(err)
			}
		}
		for lines(rec) < runs*subs {
			time.Sleep(10 * time.Millisecond)
		}
		h.close()

		b.StartTimer()
		start := time.Now()
		h2 := newHarness(b, cfg, atStore(db), onEvents(func(store.Event) {}))
		if _, err := h2.eng.Resume(ctx); err != nil {
			b.Fatal(err)
		}
		var first time.Duration
		for n := lines(rec); n < 2*runs*subs; n = lines(rec) {
			if n > runs*subs && first == 0 {
				first = time.Since(start)
			}
			time.Sleep(time.Millisecond)
		}
		all := time.Since(start)
		b.StopTimer()
		b.ReportMetric(float64(first.Milliseconds()), "ms-to-first-redispatch")
		b.ReportMetric(float64(all.Milliseconds()), "ms-to-all-redispatched")
		h2.close()
		b.StartTimer()
	}
}

// lines counts the lines in a file; 0 if it does not exist.
func lines(path string) int {
	data, _ := os.ReadFile(path)
	return bytes.Count(data, []byte("\n"))
}

// BenchmarkSplit runs a split over n items with one echo step per item,
// 256 at a time, and reports items per second and the process's peak
// resident memory.
func BenchmarkSplit(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprintf("items=%d", n), func(b *testing.B) {
			if n > 100_000 && testing.Short() {
				b.Skip("a million items take a while; run without -short")
			}
			cfg := fmt.Sprintf(`
[gateway.limits]
max_split_items = %d
max_body_bytes = %d
[[chains]]
name = "big"
[[chains.steps]]
name = "loop"
[chains.steps.split]
items = "<<origin.payload.items>>"
max_concurrency = 256
[[chains.steps.split.steps]]
name = "work"
provider = "echo"
payload_template = { i = "<<item>>" }
`, n, 64<<20)
			h := newBenchHarness(b, cfg, func(store.Event) {})
			var payload bytes.Buffer
			payload.WriteString(`{"items":[`)
			for i := range n {
				if i > 0 {
					payload.WriteByte(',')
				}
				payload.WriteString(strconv.Itoa(i))
			}
			payload.WriteString(`]}`)
			ctx := context.Background()
			if _, err := h.pm.Provider(host.Spec{Name: "echo", Builtin: "echo"}).Describe(ctx); err != nil {
				b.Fatal(err)
			}
			runtime.GC()
			resetPeakRSS()
			stop := make(chan struct{})
			anon := make(chan int64)
			go sampleAnon(stop, anon)
			var total time.Duration
			for b.Loop() {
				start := time.Now()
				run, err := h.eng.Start(ctx, "big", engine.Input{Payload: payload.Bytes()})
				if err != nil {
					b.Fatal(err)
				}
				final, err := h.eng.Wait(ctx, run.ID)
				if err != nil || final.Status != store.RunSucceeded {
					b.Fatalf("run: %v %+v", err, final)
				}
				total += time.Since(start)
			}
			close(stop)
			b.ReportMetric(float64(n*b.N)/total.Seconds(), "items/s")
			// Peak RSS counts the pages of the store file mapped in; the
			// anonymous part is the process's own memory.
			b.ReportMetric(float64(peakRSS())/(1<<20), "peak-rss-MiB")
			b.ReportMetric(float64(<-anon)/(1<<20), "peak-anon-MiB")
		})
	}
}

// BenchmarkKeyedRun runs the 10-step chain one run at a time, without a
// concurrency key and with one: the difference per run is what taking and
// giving back a key's slot costs. "handoff" keeps two runs of one key in
// flight, so each run waits in the queue for the one before it: the time
// per run adds the handoff from one holder to the next.
func BenchmarkKeyedRun(b *testing.B) {
	keyed := strings.Replace(tenEchoSteps(), "name = \"ten\"\n", "name = \"ten\"\nconcurrency = { key = \"host/<<origin.payload.alert>>\" }\n", 1)
	for _, tc := range []struct {
		name, config string
		inFlight     int
	}{{"unkeyed", tenEchoSteps(), 1}, {"keyed", keyed, 1}, {"handoff", keyed, 2}} {
		b.Run(tc.name, func(b *testing.B) {
			h := newBenchHarness(b, tc.config, func(store.Event) {})
			ctx := context.Background()
			h.runOnce(ctx, b)
			b.ResetTimer()
			for b.Loop() {
				var wg sync.WaitGroup
				for range tc.inFlight {
					wg.Go(func() {
						run, err := h.eng.Start(ctx, "ten", engine.Input{Payload: []byte(`{"alert":"disk-full"}`)})
						if err == nil {
							run, err = h.eng.Wait(ctx, run.ID)
						}
						if err != nil || run.Status != store.RunSucceeded {
							b.Errorf("run: %v %+v", err, run)
						}
					})
				}
				wg.Wait()
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*tc.inFlight), "µs/run")
		})
	}
}
