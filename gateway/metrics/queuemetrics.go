package metrics

import (
	"context"
	"time"

	"github.com/chaingate/gateway/gateway"
	"github.com/prometheus/client_golang/prometheus"
)

// registerQueues adds the metric of concurrency keys' queues, read from
// the store when scraped: every gateway sharing a store reports the same
// queues, as they do the dead-letter queue's depth.
func (m *Metrics) registerQueues(gw *gateway.Gateway) {
	m.gauge("chaingate_runs_queued", prometheus.GaugeValue, "Runs waiting in a concurrency key's queue, by key; keys held with none waiting read 0. The store's count: every gateway sharing it reports the same.", []string{"key"}, func() []sample {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		slots, err := gw.Engine.Slots(ctx)
		if err != nil {
			return nil
		}
		out := make([]sample, 0, len(slots))
		for _, s := range slots {
			out = append(out, sample{labels: []string{s.Key}, value: float64(len(s.Queue))})
		}
		return out
	})
}
