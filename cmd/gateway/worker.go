package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/gateway"
)

const workerHelp = `Usage: gateway worker --config PATH... [--state URL] [--listen ADDR]

Runs the items that distributed splits hand out over RabbitMQ
([gateway.fanout]), with the same engine and plugins as a gateway, until
SIGTERM. Any number of workers, on any machines, share the work; an item
whose worker dies is delivered to another. --state is where the sub-chain
runs that items start are kept: [gateway].state when it is a shared
redis:// store, else bolt://./data/worker.db (give each worker on one
machine its own). --listen serves /healthz and /metrics.

`

func cmdWorker(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("worker", stdout, stderr, workerHelp)
	var configs stringList
	fs.Var(&configs, "config", "config file or directory (repeatable)")
	state := fs.String("state", "", "store for sub-chain runs items start (default [gateway].state if redis://, else bolt://./data/worker.db)")
	listen := fs.String("listen", "", "address to serve /healthz and /metrics on (default: none)")
	logLevel := fs.String("log-level", "info", logLevelUsage)
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the process to this file until it stops (for go tool pprof)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return parseExit(err)
	}
	if len(pos) != 0 || len(configs) == 0 {
		fmt.Fprintln(stderr, "gateway worker: takes no arguments and needs at least one --config")
		fs.Usage()
		return exitUsage
	}
	stopProfile, err := startCPUProfile(*cpuProfile)
	if err != nil {
		fmt.Fprintf(stderr, "gateway worker: %v\n", err)
		return exitUsage
	}
	defer stopProfile()
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(stderr, "gateway worker: bad --log-level %q\n", *logLevel)
		return exitUsage
	}
	logger := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	cfg, err := gateway.LoadConfig(configs)
	if err != nil {
		printConfigError(stderr, err)
		return exitUsage
	}
	if cfg.Gateway.Fanout == nil {
		fmt.Fprintln(stderr, "gateway worker: the config has no [gateway.fanout]: there is no broker to take items from")
		return exitUsage
	}
	if *state == "" {
		*state = "bolt://./data/worker.db"
		if gateway.StateFile(cfg.Gateway.State) == "" && cfg.Gateway.State != "" {
			*state = cfg.Gateway.State
		}
	}
	var l net.Listener
	if *listen != "" {
		if err := checkListen(*listen); err != nil {
			fmt.Fprintln(stderr, "gateway worker:", err)
			return exitUsage
		}
		if l, err = net.Listen("tcp", *listen); err != nil {
			fmt.Fprintln(stderr, "gateway worker:", err)
			return exitUsage
		}
	}
	metrics := gateway.NewMetrics()
	gw, err := gateway.Open(ctx, gateway.Options{Config: cfg, State: *state, Logger: logger, Observer: metrics, FanoutMetrics: metrics, LogOutcomes: true})
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
	// Sub-chain runs that items started and a dead worker left are taken up
	// here, as a gateway takes up its runs.
	go adoptRuns(ctx, gw.Engine, logger, time.Duration(cfg.Gateway.LeaseTTLSeconds)*time.Second)
	logger.Info("working split items", "owner", gw.Engine.Owner(), "concurrency", cfg.Gateway.Fanout.WorkerConcurrency)
	if err := gw.Worker().Run(ctx); err != nil {
		logger.Error("working split items failed", "err", err)
		return exitFailed
	}
	logger.Info("stopped")
	return exitOK
}

func workerHandler(m *gateway.Metrics) http.Handler {
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

// adoptRuns resumes the unfinished runs of the worker's store, then keeps
// taking over those whose lease lapses.
func adoptRuns(ctx context.Context, eng *engine.Engine, log *slog.Logger, ttl time.Duration) {
	if ttl <= 0 {
		ttl = engine.DefaultLeaseTTL
	}
	t := time.NewTicker(min(ttl/4, time.Second))
	defer t.Stop()
	for {
		if _, err := eng.Adopt(ctx); err != nil && ctx.Err() == nil && !errors.Is(err, engine.ErrClosed) {
			log.Warn("taking up unfinished sub-chain runs", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
