package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/cmd/gateway/internal/gcfloor"
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/gateway/console"
	"github.com/chaingate/gateway/gateway/events"
	"github.com/chaingate/gateway/gateway/local"
	"github.com/chaingate/gateway/gateway/metrics"
	"github.com/chaingate/gateway/gateway/server"
)

const serveHelp = `Usage: gateway serve --config PATH... [--listen ADDR] [--state URL]

Serves the HTTP API (see docs/api.md), resumes every unfinished run in the
store, and takes over runs other gateways sharing the store left behind.
--state is bolt://PATH for one gateway on its own embedded store, or
redis://HOST:PORT/DB for several gateways sharing their runs (see
docs/operations.md for what that Redis must be configured with).
With [gateway.fanout] it also runs the items of distributed splits, as
"gateway worker" does, unless --no-worker is given.
SIGHUP reloads the config (a config with errors is refused and the running
one stays); one sent during startup reloads once the gateway serves.
SIGTERM or Ctrl-C stops intake, lets calls in flight finish for up to
[gateway].shutdown_grace_seconds (default 30), and exits 0; a second one
cancels the calls still in flight and exits 130 at once (their runs stay
persisted and resume on the next start).

`

// defaultGrace is how long SIGTERM waits for calls in flight.
const defaultGrace = 30 * time.Second

// serveGCRoom is how far the gateway's heap grows between two collections
// at the least (gcfloor): its live heap is a few MiB, and at 64 requests in
// flight this took the start API from 2,640–2,790 to 2,860–3,140 runs/s for
// some 35 MiB more. GOGC or GOMEMLIMIT in the environment leaves the
// runtime's own defaults.
const serveGCRoom = 32 << 20

func cmdServe(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	// Caught before anything else: SIGHUP's default action ends the process,
	// and a supervisor may send one as soon as the process exists. A reload
	// asked for during startup waits until the gateway serves.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	// The first SIGTERM or SIGINT ends ctx and starts the drain; this
	// channel sees it too, and the second one ends the drain.
	term := make(chan os.Signal, 2)
	signal.Notify(term, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(term)

	fs := newFlagSet("serve", stdout, stderr, serveHelp)
	sf := newServiceFlags("serve", fs)
	listen := fs.String("listen", "", "address to serve on (default [gateway].listen, else 127.0.0.1:8080)")
	state := stateFlag(fs.FlagSet)
	noWorker := fs.Bool("no-worker", false, "with [gateway.fanout], only hand distributed splits' items out; leave running them to gateway worker processes")
	logger, cfg, stop, code, ok := sf.start(args, stderr)
	if !ok {
		return code
	}
	defer stop()
	gcfloor.Start(serveGCRoom)
	configs := sf.configs
	addr := *listen
	if addr == "" {
		addr = cfg.Gateway.Listen
	}
	if addr == "" {
		addr = server.DefaultListen
	}
	// Everything that can be refused is, before the store is opened.
	if err := checkListen(addr); err != nil {
		fmt.Fprintln(stderr, "gateway serve:", err)
		return exitUsage
	}
	if err := server.CheckAuth(cfg, addr); err != nil {
		fmt.Fprintln(stderr, "gateway serve:", err)
		return exitUsage
	}
	if !server.AuthConfigured(cfg) {
		logger.Warn("no API tokens configured: the API is open to anyone who can reach " + addr)
	}

	hub := events.NewHub()
	metrics := metrics.NewMetrics()
	gw, err := gateway.Open(ctx, gateway.Options{
		Config: cfg, State: *state, Logger: logger, Observer: metrics, FanoutMetrics: metrics, LogOutcomes: true,
		OnEvent: func(ev store.Event) { hub.Publish(ev); metrics.Event(ev) },
	})
	if err != nil {
		fmt.Fprintln(stderr, "gateway serve:", err)
		return exitUsage
	}
	defer func() {
		if err := gw.Close(); err != nil {
			logger.Error("closing the gateway", "err", err)
		}
	}()
	srv := server.NewServer(gw, hub, metrics, configs)
	srv.MountConsole(func(base string) http.Handler { return console.New(srv, base, logger.With("component", "console")) })
	if !*noWorker {
		srv.WorkItems()
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(stderr, "gateway serve:", err)
		return exitUsage
	}
	if gw.StoreFile != "" {
		stopControl, err := gateway.ServeControl(ctx, gateway.ControlPath(gw.StoreFile), gw.Engine, logger, local.ControlAudit(gw, logger))
		if err != nil {
			logger.Warn("gateway cancel will not reach this process", "err", err)
		} else {
			defer stopControl()
		}
	}
	fmt.Fprintf(stdout, "gateway: serving on http://%s\n", l.Addr())
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			select {
			case <-hup:
				_, _ = srv.Reload()
			case <-done:
				return
			}
		}
	}()
	var aborted atomic.Bool
	go func() {
		for n := 0; n < 2; {
			select {
			case <-term:
				n++
			case <-done:
				return
			}
		}
		aborted.Store(true)
		logger.Warn("second signal: cancelling the calls in flight instead of waiting; their runs stay persisted")
		srv.Abort()
	}()
	grace := time.Duration(cfg.Gateway.ShutdownGraceSeconds) * time.Second
	if grace <= 0 {
		grace = defaultGrace
	}
	if err := srv.Run(ctx, l, grace); err != nil {
		logger.Error("serving failed", "err", err)
		return exitFailed
	}
	if aborted.Load() {
		logger.Warn("stopped before the calls in flight finished; their runs resume on the next start")
		return exitInterrupt
	}
	logger.Info("stopped")
	return exitOK
}

// checkListen refuses an address no listener could take.
func checkListen(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		_, err = net.LookupPort("tcp", port)
	}
	if err != nil {
		return fmt.Errorf("bad listen address %q, want HOST:PORT such as 127.0.0.1:8080: %w", addr, err)
	}
	return nil
}
