// Package metrics is what the gateway counts and measures, as Prometheus
// metrics: runs, steps, provider calls, trigger deliveries, schedules,
// retention, approvals, queues and distributed splits.
//
// It is the gateway's own package, with no compatibility promise.
package metrics

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/expfmt"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/providers/limits"
)

// Metrics are the gateway's Prometheus metrics, on a registry of their own
// with the Go runtime's and the process's. They are fed by run events and
// provider calls; DLQ depth, plugin restarts and providers' limits are
// read when scraped.
type Metrics struct {
	reg         *prometheus.Registry
	runsStarted *prometheus.CounterVec
	runsEnded   *prometheus.CounterVec
	runTimes    *prometheus.HistogramVec
	calls       *prometheus.CounterVec
	inFlight    *prometheus.GaugeVec
	latency     *prometheus.HistogramVec
	published   prometheus.Counter
	done        *prometheus.CounterVec
	fanInFlight prometheus.Gauge
	redelivered prometheus.Counter
	poisoned    prometheus.Counter
	deliveries  *prometheus.CounterVec
	ticks       *prometheus.CounterVec
	pruned      *prometheus.CounterVec
	prunedDLQ   prometheus.Counter
	freed       *prometheus.CounterVec
	oldestKept  prometheus.Gauge
	refused     *prometheus.CounterVec
	denied      *prometheus.CounterVec
	auditLost   prometheus.Counter

	// series holds each provider's call series, looked up once: resolving
	// label values on every call was a measurable share of a worker's CPU.
	series sync.Map // provider name → *callSeries

	// Failure routes (metrics_failure.go).
	failureRoutes, handlerPhases *prometheus.CounterVec
}

// callSeries are one provider's series of the call metrics.
type callSeries struct {
	inFlight   prometheus.Gauge
	ok, failed prometheus.Counter
	latency    prometheus.Observer
}

func (m *Metrics) callSeries(provider string) *callSeries {
	if s, ok := m.series.Load(provider); ok {
		return s.(*callSeries)
	}
	s, _ := m.series.LoadOrStore(provider, &callSeries{
		inFlight: m.inFlight.WithLabelValues(provider),
		ok:       m.calls.WithLabelValues(provider, "ok"),
		failed:   m.calls.WithLabelValues(provider, "error"),
		latency:  m.latency.WithLabelValues(provider),
	})
	return s.(*callSeries)
}

// sample is one series of a metric read when scraped: its label values,
// in the order of the metric's label names, and its value.
type sample struct {
	labels []string
	value  float64
}

// stepBuckets are the latency buckets of a provider call, in seconds.
var stepBuckets = []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// runBuckets are the buckets of a run's duration, in seconds: from a chain
// of quick calls to one that waited a day for a person.
var runBuckets = []float64{0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 1800, 3600, 7200, 21600, 86400}

// NewMetrics returns empty metrics.
func NewMetrics() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		runsStarted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chaingate_runs_started_total", Help: "Runs started, by chain.",
		}, []string{"chain"}),
		runsEnded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chaingate_runs_finished_total", Help: "Runs finished, by chain and final status.",
		}, []string{"chain", "status"}),
		runTimes: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "chaingate_run_duration_seconds", Help: "How long runs took from start to end, by chain and final status.", Buckets: runBuckets,
		}, []string{"chain", "status"}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chaingate_provider_calls_total", Help: "Provider calls, by provider and result (ok or error).",
		}, []string{"provider", "result"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "chaingate_steps_in_flight", Help: "Provider calls in flight, by provider.",
		}, []string{"provider"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "chaingate_step_duration_seconds", Help: "Provider call latency, by provider.", Buckets: stepBuckets,
		}, []string{"provider"}),
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chaingate_fanout_items_published_total", Help: "Items of distributed splits this gateway handed to the broker.",
		}),
		done: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chaingate_fanout_items_done_total", Help: "Results of distributed splits' items this gateway took in, by result.",
		}, []string{"result"}),
		fanInFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "chaingate_fanout_items_in_flight", Help: "Items of this gateway's distributed splits handed out and not yet done.",
		}),
		redelivered: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chaingate_fanout_items_redelivered_total", Help: "Items a worker here was handed again after another delivery of them went unacknowledged.",
		}),
		poisoned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chaingate_fanout_items_poisoned_total", Help: "Items a worker here parked as poison: their message outlived max_redeliveries.",
		}),
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chaingate_trigger_deliveries_total",
			Help: "What triggers did with each alert, alert group or body they took, by trigger and outcome (started, deduplicated, skipped, resolved, parked, queued, failed), and each request they refused (refused).",
		}, []string{"trigger", "outcome"}),
		ticks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chaingate_schedule_ticks_total",
			Help: "Schedule ticks, by schedule and outcome (started, deduplicated, caught_up, missed, failed).",
		}, []string{"schedule", "outcome"}),
		pruned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chaingate_retention_runs_pruned_total", Help: "Runs retention removed, by the status they ended with.",
		}, []string{"status"}),
		prunedDLQ: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chaingate_retention_dead_letters_pruned_total", Help: "Dead-letter entries retention removed.",
		}),
		freed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chaingate_retention_freed_total", Help: "What removing runs gave back to the store: records (the embedded store's records, Redis's keys) and bytes (Redis's estimate for its keys).",
		}, []string{"unit"}),
		oldestKept: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "chaingate_retention_oldest_kept_timestamp_seconds", Help: "When the oldest run retention kept ended, as of the last pass (Unix time).",
		}),
		auditLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chaingate_audit_entries_lost_total", Help: "Audit entries the store could not keep, for actions that happened: each is also logged as an error.",
		}),
		denied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chaingate_denied_total", Help: "Requests the authorization seam refused, by action, kind of target and kind of subject (token, person, slack, trigger).",
		}, []string{"action", "target", "subject"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chaingate_api_refused_total", Help: "API connections and requests refused by the per-address and server limits, by reason.",
		}, []string{"reason"}),
	}
	m.reg.MustRegister(m.runsStarted, m.runsEnded, m.runTimes, m.calls, m.inFlight, m.latency,
		m.published, m.done, m.fanInFlight, m.redelivered, m.poisoned, m.deliveries, m.ticks, m.refused, m.denied, m.auditLost, m.pruned, m.prunedDLQ, m.freed, m.oldestKept,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.registerFailureRoutes()
	return m
}

// Event counts runs starting and ending.
func (m *Metrics) Event(ev store.Event) {
	switch ev.Type {
	case store.EventRunStarted:
		m.runsStarted.WithLabelValues(ev.Chain).Inc()
	case store.EventRunSucceeded, store.EventRunFailed, store.EventRunCancelled, store.EventRunTimedOut, store.EventRunSkipped:
		status := strings.TrimPrefix(string(ev.Type), "run_")
		m.runsEnded.WithLabelValues(ev.Chain, status).Inc()
		// A run's id holds when it was created, on whichever gateway.
		if created, ok := store.IDTime(ev.RunID); ok {
			m.runTimes.WithLabelValues(ev.Chain, status).Observe(max(ev.Time.Sub(created).Seconds(), 0))
		}
	case store.EventFailureRouted, store.EventHandlersStarted:
		m.failureEvent(ev)
	}
}

// Pruned implements PruneObserver.
func (m *Metrics) Pruned(status string, runs int, freed store.Freed) {
	m.pruned.WithLabelValues(status).Add(float64(runs))
	m.freed.WithLabelValues("records").Add(float64(freed.Records))
	m.freed.WithLabelValues("bytes").Add(float64(freed.Bytes))
}

// DeadLettersPruned implements PruneObserver.
func (m *Metrics) DeadLettersPruned(n int) { m.prunedDLQ.Add(float64(n)) }

// OldestKept implements PruneObserver.
func (m *Metrics) OldestKept(ended time.Time) { m.oldestKept.Set(float64(ended.Unix())) }

// Delivered implements DoorObserver.
func (m *Metrics) Delivered(trigger, outcome string) {
	m.deliveries.WithLabelValues(trigger, outcome).Inc()
}

// Ticked implements DoorObserver.
func (m *Metrics) Ticked(schedule, outcome string, n int) {
	m.ticks.WithLabelValues(schedule, outcome).Add(float64(n))
}

// CallStarted implements engine.Observer.
func (m *Metrics) CallStarted(provider string) {
	m.callSeries(provider).inFlight.Inc()
}

// CallEnded implements engine.Observer.
func (m *Metrics) CallEnded(provider string, took time.Duration, err error) {
	s := m.callSeries(provider)
	s.inFlight.Dec()
	if err != nil {
		s.failed.Inc()
	} else {
		s.ok.Inc()
	}
	s.latency.Observe(took.Seconds())
}

// ItemsPublished implements fanout.Metrics.
func (m *Metrics) ItemsPublished(n int) { m.published.Add(float64(n)) }

// ItemsDone implements fanout.Metrics.
func (m *Metrics) ItemsDone(result string, n int) { m.done.WithLabelValues(result).Add(float64(n)) }

// ItemsRedelivered implements fanout.Metrics.
func (m *Metrics) ItemsRedelivered(n int) { m.redelivered.Add(float64(n)) }

// ItemsInFlight implements fanout.Metrics.
func (m *Metrics) ItemsInFlight(delta int) { m.fanInFlight.Add(float64(delta)) }

// AuditLost counts an audit entry the store could not keep.
func (m *Metrics) AuditLost() { m.auditLost.Inc() }

// Denied counts a request the authorization seam refused.
func (m *Metrics) Denied(action, target, subject string) {
	m.denied.WithLabelValues(action, target, subject).Inc()
}

// Refused counts a connection or request the API's limits refused.
func (m *Metrics) Refused(reason string) { m.refused.WithLabelValues(reason).Inc() }

// ItemsPoisoned implements fanout.Metrics.
func (m *Metrics) ItemsPoisoned(n int) { m.poisoned.Add(float64(n)) }

// readAtScrape is a metric whose series are read when scraped.
type readAtScrape struct {
	desc *prometheus.Desc
	typ  prometheus.ValueType
	read func() []sample
}

func (c *readAtScrape) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *readAtScrape) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.read() {
		ch <- prometheus.MustNewConstMetric(c.desc, c.typ, s.value, s.labels...)
	}
}

// gauge registers a metric read when scraped; a name registered again
// replaces the earlier one.
func (m *Metrics) gauge(name string, typ prometheus.ValueType, help string, labels []string, read func() []sample) {
	c := &readAtScrape{desc: prometheus.NewDesc(name, help, labels, nil), typ: typ, read: read}
	m.reg.Unregister(c)
	m.reg.MustRegister(c)
}

// Write writes every metric in the Prometheus text format.
func (m *Metrics) Write(w io.Writer) error {
	families, err := m.reg.Gather()
	if err != nil {
		return fmt.Errorf("gathering metrics: %w", err)
	}
	for _, f := range families {
		if _, err := expfmt.MetricFamilyToText(w, f); err != nil {
			return fmt.Errorf("writing metrics: %w", err)
		}
	}
	return nil
}

// Register adds the gauges the gateway reads when scraped.
func (m *Metrics) Register(gw *gateway.Gateway) {
	m.gauge("chaingate_dlq_depth", prometheus.GaugeValue, "Entries in the dead-letter queue.", nil, func() []sample {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		n, err := gw.Store.CountDLQ(ctx)
		if err != nil {
			return nil
		}
		return []sample{{value: float64(n)}}
	})
	m.gauge("chaingate_plugin_restarts_total", prometheus.CounterValue, "Plugin processes launched again after one exited, by provider.", []string{"provider"}, func() []sample {
		var out []sample
		for _, name := range gw.Engine.ProviderNames() {
			out = append(out, sample{labels: []string{name}, value: float64(gw.Plugins.Restarts(name))})
		}
		return out
	})
	m.gauge("chaingate_runs_active", prometheus.GaugeValue, "Runs this gateway is advancing.", nil, func() []sample {
		return []sample{{value: float64(gw.Engine.Active())}}
	})
	m.gauge("chaingate_runs_waiting", prometheus.GaugeValue, "Runs this gateway advances that wait on a person (status waiting: an approval step asked).", nil, func() []sample {
		return []sample{{value: float64(gw.Engine.Approvals().Waiting)}}
	})
	m.gauge("chaingate_fanout_worker_items", prometheus.GaugeValue, "Items of distributed splits this process holds as a worker, running or queued.", nil, func() []sample {
		n := gw.Engine.WorkHeld()
		if gw.Items != nil && gw.Items != gw.Engine {
			n += gw.Items.WorkHeld()
		}
		return []sample{{value: float64(n)}}
	})
	m.registerLimits(gw.Limits)
	m.registerApprovals(gw)
	m.registerQueues(gw)
}

// registerLimits adds the metrics of providers' limits. A provider has a
// series while it has the limit the series is about, and keeps a counter's
// series once it has counted something.
func (m *Metrics) registerLimits(ls *limits.Set) {
	provider := []string{"provider"}
	per := func(read func(limits.Stats) (float64, bool)) func() []sample {
		return func() []sample {
			var out []sample
			for _, s := range ls.Stats() {
				if v, show := read(s); show {
					out = append(out, sample{labels: []string{s.Name}, value: v})
				}
			}
			return out
		}
	}
	counter, gauge := prometheus.CounterValue, prometheus.GaugeValue
	m.gauge("chaingate_provider_rate_limited_total", counter, "Provider calls that waited for a rate limit token or were refused one, by provider.", provider,
		per(func(s limits.Stats) (float64, bool) { return s.RateLimited, s.Paced || s.RateLimited > 0 }))
	m.gauge("chaingate_provider_rate_limit_wait_seconds_total", counter, "Time provider calls spent waiting for rate limit tokens, by provider.", provider,
		per(func(s limits.Stats) (float64, bool) { return s.WaitSeconds, s.Paced || s.WaitSeconds > 0 }))
	m.gauge("chaingate_provider_concurrency_in_use", gauge, "Provider calls holding one of the provider's max_concurrency slots, by provider.", provider,
		per(func(s limits.Stats) (float64, bool) { return float64(s.InUse), s.Capped }))
	m.gauge("chaingate_provider_concurrency_waiting", gauge, "Provider calls waiting for one of the provider's max_concurrency slots, by provider.", provider,
		per(func(s limits.Stats) (float64, bool) { return float64(s.Waiting), s.Capped }))
	m.gauge("chaingate_provider_concurrency_limit", gauge, "A provider's max_concurrency, by provider.", provider,
		per(func(s limits.Stats) (float64, bool) { return float64(s.MaxCalls), s.Capped }))
	m.gauge("chaingate_provider_circuit_state", gauge, "A provider's circuit breaker: 0 closed, 1 open, 2 half-open; by provider.", provider,
		per(func(s limits.Stats) (float64, bool) { return float64(s.Circuit), s.Breaker }))
	m.gauge("chaingate_provider_circuit_opened_total", counter, "Times a provider's circuit opened, by provider.", provider,
		per(func(s limits.Stats) (float64, bool) { return s.Opened, s.Breaker || s.Opened > 0 }))
	m.gauge("chaingate_provider_calls_rejected_total", counter, "Provider calls refused without being made, by provider and reason (circuit_open, rate_limited).", []string{"provider", "reason"}, func() []sample {
		var out []sample
		for _, s := range ls.Stats() {
			if s.Breaker || s.RefusedOpen > 0 {
				out = append(out, sample{labels: []string{s.Name, "circuit_open"}, value: s.RefusedOpen})
			}
			if s.Paced || s.RefusedRate > 0 {
				out = append(out, sample{labels: []string{s.Name, "rate_limited"}, value: s.RefusedRate})
			}
		}
		return out
	})
}

// MetricSample is one series of a metric, now: its labels by name, and
// its value.
type MetricSample struct {
	Labels map[string]string
	Value  float64
}

// Samples reads the series of the metric called name, now.
func (m *Metrics) Samples(name string) []MetricSample {
	families, err := m.reg.Gather()
	if err != nil {
		return nil
	}
	var out []MetricSample
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, mt := range f.GetMetric() {
			v := MetricSample{Labels: map[string]string{}}
			for _, l := range mt.GetLabel() {
				v.Labels[l.GetName()] = l.GetValue()
			}
			switch {
			case mt.Counter != nil:
				v.Value = mt.Counter.GetValue()
			case mt.Gauge != nil:
				v.Value = mt.Gauge.GetValue()
			case mt.Untyped != nil:
				v.Value = mt.Untyped.GetValue()
			}
			out = append(out, v)
		}
	}
	return out
}
