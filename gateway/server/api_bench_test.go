package server_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chaingate/gateway/gateway"
)

// threeEchoConfig is cmd/gateway-load's three-echo chain: what the start
// API's load figure runs.
const threeEchoConfig = `
[[chains]]
name = "three-echo"
[[chains.steps]]
name = "one"
provider = "echo"
payload_template = { alert = "<<origin.payload.alert_name>>" }
[[chains.steps]]
name = "two"
provider = "echo"
payload_template = { prev = "<<prev.body.alert>>" }
[[chains.steps]]
name = "three"
provider = "echo"
payload_template = { done = "<<steps.two.body.prev>>" }
`

// threeEchoGateway is a gateway serving threeEchoConfig, logging only
// errors, as a gateway under load is run.
func threeEchoGateway(b *testing.B) *apiEnv {
	env := newAPIOn(b, "", "", quiet)
	cfg, err := os.ReadFile(env.cfg)
	if err != nil {
		b.Fatal(err)
	}
	env.write(string(cfg) + threeEchoConfig)
	if _, err := env.srv.Reload(); err != nil {
		b.Fatal(err)
	}
	return env
}

// BenchmarkRunAnswer reads a finished three-step run and writes it as
// GET /v1/runs/{id} answers, which is also what a start with ?wait=
// answers once the run ends: the store's reads, the view and the JSON,
// without the network.
func BenchmarkRunAnswer(b *testing.B) {
	env := threeEchoGateway(b)
	var res struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	code, _, body := env.call("POST", "/v1/chains/three-echo/runs?wait=60s", `{"alert_name": "DiskFull"}`, nil, &res)
	if code != http.StatusOK || res.Status != "succeeded" {
		b.Fatalf("run: %d %.300s", code, body)
	}
	h := env.srv.Handler()
	n := 0
	b.ReportAllocs()
	for b.Loop() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "http://127.0.0.1/v1/runs/"+res.ID, nil))
		if rec.Code != http.StatusOK {
			b.Fatalf("GET: %d %.300s", rec.Code, rec.Body)
		}
		n = rec.Body.Len()
	}
	b.ReportMetric(float64(n), "answer-bytes")
}

// BenchmarkStartAndWait starts three-step runs with ?wait= from 64
// goroutines, as cmd/gateway-load does over the network, and reports the
// gateway's work per run: the start, the engine, the store's commits, the
// plugin's calls and the answer. It runs under Go's default garbage
// collector, which collects more often than gateway serve's.
func BenchmarkStartAndWait(b *testing.B) {
	env := threeEchoGateway(b)
	h := env.srv.Handler()
	b.ReportAllocs()
	b.SetParallelism(32)
	before := cpuTime(b)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			rec := httptest.NewRecorder()
			req := httptest.NewRequest("POST", "http://127.0.0.1/v1/chains/three-echo/runs?wait=60s", strings.NewReader(`{"alert_name": "DiskFull"}`))
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"status":"succeeded"`) {
				b.Errorf("POST: %d %.300s", rec.Code, rec.Body)
				return
			}
		}
	})
	b.ReportMetric(float64((cpuTime(b)-before).Microseconds())/float64(b.N), "cpu-µs/run")
}

// cpuTime is the CPU time this process has used, in user and kernel mode:
// the gateway's own, without its plugins'.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// quiet logs only errors.
func quiet(o *gateway.Options) {
	o.Logger = slog.New(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelError}))
}
