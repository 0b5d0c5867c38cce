package server

import (
	"context"
	"net/http"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/gateway/events"
	"github.com/chaingate/gateway/gateway/metrics"
	"github.com/chaingate/gateway/providers/limits"
)

// The web console is a package of its own (gateway/console) that imports
// this one; a Server serves it once it is mounted, and is what it reads
// through: the operations the API serves, and what a page shows besides.

// MountConsole serves the web console under [gateway.ui] base_path, as
// console builds it for that path, unless the config turns the console
// off. The console imports this package, so it is handed in rather than
// built here; call it before Handler.
func (s *Server) MountConsole(console func(base string) http.Handler) {
	s.console = console
}

// Ops are the operations the API serves, on this gateway's store: the
// console acts through them too, so what it does is what the API does.
func (s *Server) Ops() api.Ops { return s.ops }

// Definition is the chain a run of name started with, by its hash: a run
// keeps its definition across reloads, so its graph is drawn from that one.
func (s *Server) Definition(ctx context.Context, name, hash string) (*chain.Chain, error) {
	return s.gw.Engine.Definition(ctx, name, hash)
}

// ProviderStats are each provider's calls in flight, circuit state and
// rate-limit waits now, shared by every run.
func (s *Server) ProviderStats() []limits.Stats { return s.gw.Limits.Stats() }

// Distributes reports whether the gateway hands split items to workers
// ([gateway.fanout]), whose counts are then worth showing.
func (s *Server) Distributes() bool { return s.gw.Fanout != nil }

// MetricSamples are the series of the metric called name, now, as
// GET /metrics would show them.
func (s *Server) MetricSamples(name string) []metrics.MetricSample { return s.metrics.Samples(name) }

// WatchRuns follows every run's status changes, on every gateway sharing
// the store, as GET /v1/events does; Close ends it.
func (s *Server) WatchRuns() *events.RunWatch { return s.hub.WatchRuns() }

// Stopping ends when the server begins to shut down: work a request left
// going in the background stops with it, and no run is started any more.
func (s *Server) Stopping() context.Context { return s.stopping }
