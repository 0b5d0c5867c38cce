package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/chaingate/gateway/cmd/gateway/internal/gcfloor"
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/gateway/metrics"
	"github.com/chaingate/gateway/internal/textx"
)

const workerHelp = `Usage: gateway worker --config PATH... [--listen ADDR]

Runs the items that distributed splits hand out over RabbitMQ
([gateway.fanout]), with the same engine and plugins as a gateway, until
SIGTERM. Any number of workers, on any machines, share the work; an item
whose worker dies is delivered to another. A worker keeps nothing of its
own: what items record, and the sub-chain runs they start, are kept in
[gateway.fanout]'s Redis, where the next worker of an item finds them.
--listen serves /healthz and /metrics.

It prints one line on stdout once it is connected, has started the plugins
its items call, and takes items:
  gateway worker: ready, running up to N items at once and holding up to
  P messages of up to B items (OWNER)

`

func cmdWorker(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("worker", stdout, stderr, workerHelp)
	sf := newServiceFlags("worker", fs)
	state := fs.String("state", "", "no longer used: items' runs are kept in [gateway.fanout]'s Redis")
	listen := fs.String("listen", "", "address to serve /healthz and /metrics on (default: none)")
	logger, cfg, stop, code, ok := sf.start(args, stderr)
	if !ok {
		return code
	}
	defer stop()
	if cfg.Gateway.Fanout == nil {
		fmt.Fprintln(stderr, "gateway worker: the config has no [gateway.fanout]: there is no broker to take items from")
		return exitUsage
	}
	if *state != "" {
		fmt.Fprintf(stderr, "gateway worker: --state %s is not used: what items record, and the sub-chain runs they start, are kept in [gateway.fanout]'s Redis, where the next worker of an item finds them\n", *state)
	}
	var l net.Listener
	if *listen != "" {
		if err := checkListen(*listen); err != nil {
			fmt.Fprintln(stderr, "gateway worker:", err)
			return exitUsage
		}
		var err error
		if l, err = net.Listen("tcp", *listen); err != nil {
			fmt.Fprintln(stderr, "gateway worker:", err)
			return exitUsage
		}
	}
	metrics := metrics.NewMetrics()
	gw, err := gateway.Open(ctx, gateway.Options{Config: cfg, ItemsOnly: true, Logger: logger, Observer: metrics, FanoutMetrics: metrics, LogOutcomes: true})
	if err != nil {
		fmt.Fprintln(stderr, "gateway worker:", err)
		return exitUsage
	}
	defer func() {
		if err := gw.Close(); err != nil {
			logger.Error("closing the worker", "err", err)
		}
	}()
	if l != nil {
		metrics.Register(gw)
		srv := &http.Server{Handler: workerHandler(metrics), ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(l) }()
		defer srv.Close()
		fmt.Fprintf(stdout, "gateway worker: metrics on http://%s/metrics\n", l.Addr())
	}
	tuneWorkerGC()
	fo := cfg.Gateway.Fanout
	logger.Info("working split items", "owner", gw.Engine.Owner(), "concurrency", fo.WorkerConcurrency, "prefetch", fo.Prefetch)
	// Connected to the broker and Redis by now, and with the plugins its
	// items call started: say so, for scripts that start workers and wait
	// for them.
	gw.WarmItemProviders(ctx)
	fmt.Fprintf(stdout, "gateway worker: ready, running up to %s at once and holding up to %s of up to %s (%s)\n",
		textx.Count(fo.WorkerConcurrency, "item", "items"), textx.Count(fo.Prefetch, "message", "messages"), textx.Count(fo.BatchSize, "item", "items"), gw.Engine.Owner())
	if err := gw.WorkItems(ctx); err != nil {
		logger.Error("working split items failed", "err", err)
		return exitFailed
	}
	logger.Info("stopped")
	return exitOK
}

// A worker's heap is what its items hold in flight, a few tens of MiB, and
// collecting it each time it doubled, with the allocation that paid for
// it, took over a quarter of the worker's CPU: a worker lets it grow five
// times over instead, under a soft limit that
// keeps one whose items read a large run context from growing with it.
// GOGC or GOMEMLIMIT in the environment leaves the runtime's own defaults.
const (
	workerGCPercent   = 400
	workerMemoryLimit = 512 << 20
)

func tuneWorkerGC() {
	if gcfloor.OperatorChose() {
		return
	}
	debug.SetGCPercent(workerGCPercent)
	debug.SetMemoryLimit(workerMemoryLimit)
}

func workerHandler(m *metrics.Metrics) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"status":"ok"}`+"\n")
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_ = m.Write(w)
	})
	return mux
}
