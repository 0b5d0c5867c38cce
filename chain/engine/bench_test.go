package engine_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
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
// per-step latency percentiles.
func BenchmarkSequentialRun(b *testing.B) {
	clock := &stepClock{last: map[string]time.Time{}}
	h := newBenchHarness(b, tenEchoSteps(), clock.observe)
	ctx := context.Background()
	h.runOnce(ctx, b) // start the plugin process outside the timing
	clock.spans = nil
	b.ResetTimer()
	for b.Loop() {
		h.runOnce(ctx, b)
	}
	b.StopTimer()
	b.ReportMetric(float64(percentile(clock.spans, 0.5).Microseconds()), "p50-step-µs")
	b.ReportMetric(float64(percentile(clock.spans, 0.99).Microseconds()), "p99-step-µs")
}

// BenchmarkConcurrentRuns keeps many 10-step runs in flight and reports
// durable steps per second, and the CPU each step costs in the gateway
// process (engine, store, gRPC client) and in the plugin process.
func BenchmarkConcurrentRuns(b *testing.B) {
	for _, conc := range []int{64, 256} {
		b.Run(fmt.Sprintf("runs=%d", conc), func(b *testing.B) {
			h := newBenchHarness(b, tenEchoSteps(), nil)
			ctx := context.Background()
			h.runOnce(ctx, b)
			work := make(chan struct{})
			var wg sync.WaitGroup
			for range conc {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range work {
						h.runOnce(ctx, b)
					}
				}()
			}
			selfStart, childStart := cpuTimes()
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
			self, child := cpuTimes()
			steps := float64(n * 10)
			b.ReportMetric(steps/elapsed.Seconds(), "steps/s")
			b.ReportMetric(float64((self-selfStart).Microseconds())/steps, "gateway-cpu-µs/step")
			b.ReportMetric(float64((child-childStart).Microseconds())/steps, "plugin-cpu-µs/step")
		})
	}
}

// cpuTimes returns the user+system CPU time of this process and of its
// reaped children.
func cpuTimes() (self, children time.Duration) {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru)
	children = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return self, children
}

type benchHarness struct {
	*harness
}

func newBenchHarness(b *testing.B, config string, onEvent func(store.Event)) *benchHarness {
	return &benchHarness{newHarnessTB(b, config, onEvent)}
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
