package main

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/gateway/events"
	"github.com/chaingate/gateway/gateway/metrics"
	"github.com/chaingate/gateway/gateway/server"
)

// serveGateway runs a gateway API with the token "right" on a loopback
// port, as gateway serve does, and returns its URL.
func serveGateway(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "gateway.toml")
	if err := os.WriteFile(cfgPath, []byte("[gateway.auth]\ntokens = [\"right\"]\n[gateway.limits]\nmax_connections_per_address = 8\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := gateway.LoadConfig([]string{cfgPath})
	if err != nil {
		t.Fatal(err)
	}
	hub, metrics := events.NewHub(), metrics.NewMetrics()
	gw, err := gateway.Open(context.Background(), gateway.Options{Config: cfg, State: filepath.Join(dir, "gw.db"), Logger: slog.New(slog.DiscardHandler),
		OnEvent: func(ev store.Event) { hub.Publish(ev) }})
	if err != nil {
		t.Fatal(err)
	}
	srv := server.NewServer(gw, hub, metrics, []string{cfgPath})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Run(ctx, l, time.Second) }()
	t.Cleanup(func() {
		stop()
		<-served
		_ = gw.Close()
	})
	return "http://" + l.Addr().String()
}

// TestFloodAndGuess: the flood's connections are refused and counted,
// its probes answered; guesses turn to 429 after ten, and the valid
// token from another address is still answered.
func TestFloodAndGuess(t *testing.T) {
	server := serveGateway(t)
	var out, errOut bytes.Buffer
	code := runFlood(context.Background(), []string{"--server", server, "--connections", "20", "--body-bytes", "1000", "--gap", "100ms",
		"--reconnect-delay", "50ms", "--duration", "2s", "--probe-every", "200ms"}, &out, &errOut)
	for _, want := range []string{"flood connections made: ", "401 ", "health probes from 127.0.0.1: 200 ", "probe answered in: "} {
		if code != exitOK || !strings.Contains(out.String(), want) {
			t.Errorf("flood: exit %d, output lacks %q:\n%s%s", code, want, out.String(), errOut.String())
		}
	}
	out.Reset()
	code = runGuess(context.Background(), []string{"--server", server, "--count", "15", "--concurrency", "1", "--token", "right"}, &out, &errOut)
	for _, want := range []string{"answers: 401 10, 429 5", "first 429 at guess 11, Retry-After ", "valid token from 127.0.0.1 afterwards: 200"} {
		if code != exitOK || !strings.Contains(out.String(), want) {
			t.Errorf("guess: exit %d, output lacks %q:\n%s%s", code, want, out.String(), errOut.String())
		}
	}
}

func TestFloodFlagChecks(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"flood", "--server", "127.0.0.1:8080"}, "is not an http:// URL"},
		{[]string{"flood", "--connections", "0"}, "--connections and --body-bytes must be at least 1"},
		{[]string{"flood", "--from", "nowhere"}, `"nowhere" is not an IP address`},
		{[]string{"guess", "--count", "0"}, "--count and --concurrency must be at least 1"},
	} {
		var out, errOut bytes.Buffer
		if code := run(context.Background(), tc.args, &out, &errOut); code != exitUsage || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%v: exit %d\n%s%s", tc.args, code, out.String(), errOut.String())
		}
	}
}
