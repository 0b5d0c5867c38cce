package gateway

import (
	"context"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/chaingate/gateway/chain/store"
)

// Metrics are the gateway's Prometheus metrics, written in the text
// exposition format. They are fed by run events and provider calls; DLQ
// depth and plugin restarts are read when scraped.
type Metrics struct {
	mu          sync.Mutex
	runsStarted map[string]float64    // chain
	runsEnded   map[[2]string]float64 // chain, status
	calls       map[[2]string]float64 // provider, result
	inFlight    map[string]float64    // provider
	latency     map[string]*histogram // provider
	fanout      fanoutCounts
	gauges      map[string]func() []sample // read at scrape
	gaugeHelp   map[string][2]string       // name → type, help
	gaugeOrder  []string
}

// fanoutCounts are what distributed splits did here.
type fanoutCounts struct {
	published, redelivered, poisoned, inFlight float64
	done                                       map[string]float64 // result
}

type sample struct {
	labels string
	value  float64
}

// stepBuckets are the latency buckets of a provider call, in seconds.
var stepBuckets = []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

type histogram struct {
	counts []float64 // per bucket, not cumulative
	sum    float64
	n      float64
}

// NewMetrics returns empty metrics.
func NewMetrics() *Metrics {
	return &Metrics{
		runsStarted: map[string]float64{},
		runsEnded:   map[[2]string]float64{},
		calls:       map[[2]string]float64{},
		inFlight:    map[string]float64{},
		latency:     map[string]*histogram{},
		fanout:      fanoutCounts{done: map[string]float64{}},
		gauges:      map[string]func() []sample{},
		gaugeHelp:   map[string][2]string{},
	}
}

// Event counts runs starting and ending.
func (m *Metrics) Event(ev store.Event) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch ev.Type {
	case store.EventRunStarted:
		m.runsStarted[ev.Chain]++
	case store.EventRunSucceeded, store.EventRunFailed, store.EventRunCancelled, store.EventRunTimedOut:
		m.runsEnded[[2]string{ev.Chain, strings.TrimPrefix(string(ev.Type), "run_")}]++
	}
}

// CallStarted implements engine.Observer.
func (m *Metrics) CallStarted(provider string) {
	m.mu.Lock()
	m.inFlight[provider]++
	m.mu.Unlock()
}

// CallEnded implements engine.Observer.
func (m *Metrics) CallEnded(provider string, took time.Duration, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.inFlight[provider]--
	m.calls[[2]string{provider, result}]++
	h := m.latency[provider]
	if h == nil {
		h = &histogram{counts: make([]float64, len(stepBuckets)+1)}
		m.latency[provider] = h
	}
	s := took.Seconds()
	i := sort.SearchFloat64s(stepBuckets, s)
	h.counts[i]++
	h.sum += s
	h.n++
}

// ItemsPublished implements fanout.Metrics.
func (m *Metrics) ItemsPublished(n int) {
	m.addFanout(func(c *fanoutCounts) { c.published += float64(n) })
}

// ItemsDone implements fanout.Metrics.
func (m *Metrics) ItemsDone(result string, n int) {
	m.addFanout(func(c *fanoutCounts) { c.done[result] += float64(n) })
}

// ItemsRedelivered implements fanout.Metrics.
func (m *Metrics) ItemsRedelivered(n int) {
	m.addFanout(func(c *fanoutCounts) { c.redelivered += float64(n) })
}

// ItemsInFlight implements fanout.Metrics.
func (m *Metrics) ItemsInFlight(delta int) {
	m.addFanout(func(c *fanoutCounts) { c.inFlight += float64(delta) })
}

// ItemsPoisoned implements fanout.Metrics.
func (m *Metrics) ItemsPoisoned(n int) {
	m.addFanout(func(c *fanoutCounts) { c.poisoned += float64(n) })
}

func (m *Metrics) addFanout(f func(*fanoutCounts)) {
	m.mu.Lock()
	f(&m.fanout)
	m.mu.Unlock()
}

// Gauge registers a gauge read when scraped.
func (m *Metrics) gauge(name, typ, help string, read func() []sample) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.gauges[name]; !ok {
		m.gaugeOrder = append(m.gaugeOrder, name)
	}
	m.gauges[name] = read
	m.gaugeHelp[name] = [2]string{typ, help}
}

// Write writes every metric in the Prometheus text format.
func (m *Metrics) Write(w io.Writer) error {
	m.mu.Lock()
	var b strings.Builder
	header(&b, "chaingate_runs_started_total", "counter", "Runs started, by chain.")
	for _, k := range sortedKeys(m.runsStarted) {
		fmt.Fprintf(&b, "chaingate_runs_started_total{chain=%s} %s\n", quote(k), num(m.runsStarted[k]))
	}
	header(&b, "chaingate_runs_finished_total", "counter", "Runs finished, by chain and final status.")
	for _, k := range sortedPairs(m.runsEnded) {
		fmt.Fprintf(&b, "chaingate_runs_finished_total{chain=%s,status=%s} %s\n", quote(k[0]), quote(k[1]), num(m.runsEnded[k]))
	}
	header(&b, "chaingate_provider_calls_total", "counter", "Provider calls, by provider and result (ok or error).")
	for _, k := range sortedPairs(m.calls) {
		fmt.Fprintf(&b, "chaingate_provider_calls_total{provider=%s,result=%s} %s\n", quote(k[0]), quote(k[1]), num(m.calls[k]))
	}
	header(&b, "chaingate_steps_in_flight", "gauge", "Provider calls in flight, by provider.")
	for _, k := range sortedKeys(m.inFlight) {
		fmt.Fprintf(&b, "chaingate_steps_in_flight{provider=%s} %s\n", quote(k), num(m.inFlight[k]))
	}
	header(&b, "chaingate_step_duration_seconds", "histogram", "Provider call latency, by provider.")
	for _, p := range sortedKeys(m.latency) {
		h := m.latency[p]
		cum := 0.0
		for i, le := range stepBuckets {
			cum += h.counts[i]
			fmt.Fprintf(&b, "chaingate_step_duration_seconds_bucket{provider=%s,le=%s} %s\n", quote(p), quote(num(le)), num(cum))
		}
		cum += h.counts[len(stepBuckets)]
		fmt.Fprintf(&b, "chaingate_step_duration_seconds_bucket{provider=%s,le=\"+Inf\"} %s\n", quote(p), num(cum))
		fmt.Fprintf(&b, "chaingate_step_duration_seconds_sum{provider=%s} %s\n", quote(p), num(h.sum))
		fmt.Fprintf(&b, "chaingate_step_duration_seconds_count{provider=%s} %s\n", quote(p), num(h.n))
	}
	f := &m.fanout
	header(&b, "chaingate_fanout_items_published_total", "counter", "Items of distributed splits this gateway handed to the broker.")
	fmt.Fprintf(&b, "chaingate_fanout_items_published_total %s\n", num(f.published))
	header(&b, "chaingate_fanout_items_done_total", "counter", "Results of distributed splits' items this gateway took in, by result.")
	for _, k := range sortedKeys(f.done) {
		fmt.Fprintf(&b, "chaingate_fanout_items_done_total{result=%s} %s\n", quote(k), num(f.done[k]))
	}
	header(&b, "chaingate_fanout_items_in_flight", "gauge", "Items of this gateway's distributed splits handed out and not yet done.")
	fmt.Fprintf(&b, "chaingate_fanout_items_in_flight %s\n", num(f.inFlight))
	header(&b, "chaingate_fanout_items_redelivered_total", "counter", "Items a worker here was handed again after another delivery of them went unacknowledged.")
	fmt.Fprintf(&b, "chaingate_fanout_items_redelivered_total %s\n", num(f.redelivered))
	header(&b, "chaingate_fanout_items_poisoned_total", "counter", "Items a worker here parked as poison: their message outlived max_redeliveries.")
	fmt.Fprintf(&b, "chaingate_fanout_items_poisoned_total %s\n", num(f.poisoned))
	order := append([]string(nil), m.gaugeOrder...)
	reads := make([]func() []sample, len(order))
	helps := make([][2]string, len(order))
	for i, name := range order {
		reads[i], helps[i] = m.gauges[name], m.gaugeHelp[name]
	}
	m.mu.Unlock()
	// Scrape-time reads run unlocked: they may touch the store.
	for i, name := range order {
		header(&b, name, helps[i][0], helps[i][1])
		for _, s := range reads[i]() {
			fmt.Fprintf(&b, "%s%s %s\n", name, s.labels, num(s.value))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// Register adds the gauges the gateway reads when scraped.
func (m *Metrics) Register(gw *Gateway) {
	m.gauge("chaingate_dlq_depth", "gauge", "Entries in the dead-letter queue.", func() []sample {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		n, err := gw.Store.CountDLQ(ctx)
		if err != nil {
			return nil
		}
		return []sample{{value: float64(n)}}
	})
	m.gauge("chaingate_plugin_restarts_total", "counter", "Plugin processes launched again after one exited, by provider.", func() []sample {
		var out []sample
		for _, name := range gw.Engine.ProviderNames() {
			out = append(out, sample{labels: "{provider=" + quote(name) + "}", value: float64(gw.Plugins.Restarts(name))})
		}
		return out
	})
	m.gauge("chaingate_runs_active", "gauge", "Runs this gateway is advancing.", func() []sample {
		return []sample{{value: float64(gw.Engine.Active())}}
	})
	m.gauge("chaingate_fanout_worker_items", "gauge", "Items of distributed splits this process holds as a worker, running or queued.", func() []sample {
		return []sample{{value: float64(gw.Engine.WorkHeld())}}
	})
	m.registerLimits(gw.limits)
}

// registerLimits adds the metrics of providers' limits. A provider has a
// series while it has the limit the series is about, and keeps a counter's
// series once it has counted something.
func (m *Metrics) registerLimits(ls *limits) {
	per := func(read func(limitStats) (float64, bool)) func() []sample {
		return func() []sample {
			var out []sample
			for _, s := range ls.stats() {
				if v, show := read(s); show {
					out = append(out, sample{labels: "{provider=" + quote(s.name) + "}", value: v})
				}
			}
			return out
		}
	}
	m.gauge("chaingate_provider_rate_limited_total", "counter", "Provider calls that waited for a rate limit token or were refused one, by provider.",
		per(func(s limitStats) (float64, bool) { return s.rateLimited, s.paced || s.rateLimited > 0 }))
	m.gauge("chaingate_provider_rate_limit_wait_seconds_total", "counter", "Time provider calls spent waiting for rate limit tokens, by provider.",
		per(func(s limitStats) (float64, bool) { return s.waitSeconds, s.paced || s.waitSeconds > 0 }))
	m.gauge("chaingate_provider_concurrency_in_use", "gauge", "Provider calls holding one of the provider's max_concurrency slots, by provider.",
		per(func(s limitStats) (float64, bool) { return float64(s.inUse), s.capped }))
	m.gauge("chaingate_provider_concurrency_waiting", "gauge", "Provider calls waiting for one of the provider's max_concurrency slots, by provider.",
		per(func(s limitStats) (float64, bool) { return float64(s.waiting), s.capped }))
	m.gauge("chaingate_provider_concurrency_limit", "gauge", "A provider's max_concurrency, by provider.",
		per(func(s limitStats) (float64, bool) { return float64(s.maxCalls), s.capped }))
	m.gauge("chaingate_provider_circuit_state", "gauge", "A provider's circuit breaker: 0 closed, 1 open, 2 half-open; by provider.",
		per(func(s limitStats) (float64, bool) { return float64(s.circuit), s.breaker }))
	m.gauge("chaingate_provider_circuit_opened_total", "counter", "Times a provider's circuit opened, by provider.",
		per(func(s limitStats) (float64, bool) { return s.opened, s.breaker || s.opened > 0 }))
	m.gauge("chaingate_provider_calls_rejected_total", "counter", "Provider calls refused without being made, by provider and reason (circuit_open, rate_limited).", func() []sample {
		var out []sample
		for _, s := range ls.stats() {
			if s.breaker || s.refusedOpen > 0 {
				out = append(out, sample{labels: "{provider=" + quote(s.name) + `,reason="circuit_open"}`, value: s.refusedOpen})
			}
			if s.paced || s.refusedRate > 0 {
				out = append(out, sample{labels: "{provider=" + quote(s.name) + `,reason="rate_limited"}`, value: s.refusedRate})
			}
		}
		return out
	})
}

func header(b *strings.Builder, name, typ, help string) {
	fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
}

func quote(s string) string { return strconv.Quote(s) }

func num(f float64) string {
	if math.IsInf(f, 1) {
		return "+Inf"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func sortedPairs(m map[[2]string]float64) [][2]string {
	out := make([][2]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i][0] != out[j][0] {
			return out[i][0] < out[j][0]
		}
		return out[i][1] < out[j][1]
	})
	return out
}
