// Command gateway-load drives a gateway's API with run requests and reports
// how many runs per second finish and how long each took from POST to its
// end, and the CPU each run cost the gateway (read from its /metrics) and
// the tool itself: on a machine the load keeps busy, the rate follows them.
//
//	gateway-load --server http://127.0.0.1:8080 --chain three-echo --concurrency 64 --duration 20s
//
// With --trigger NAME instead of --chain, each request posts one new firing
// alert in Alertmanager's webhook format to POST /v1/triggers/NAME, and
// the figure is alerts started per second.
//
// gateway-load split runs one large split distributed over workers, and
// locally, and reports items/s, peak RSS and CPU per process (split.go).
//
//	gateway-load split --gateway /tmp/gateway --items 100000 --workers 2
//
// gateway-load providers measures each HTTP-based provider against its
// local test server: called in-process, through its plugin, and in whole
// runs (providers.go).
//
//	gateway-load providers --gateway /tmp/gateway --concurrency 100
//
// gateway-load flood holds slow POSTs open against a gateway from one
// loopback address while probing its /healthz from another, and
// gateway-load guess sends wrong tokens (flood.go).
//
//	gateway-load flood --server http://127.0.0.1:8080 --connections 1100 --duration 60s
//	gateway-load guess --server http://127.0.0.1:8080 --count 200
//
// gateway-load door posts one notification of many alerts to a trigger, or
// the same alerts several times at once to one or more gateways, and checks
// what the gateway started (door.go).
//
//	gateway-load door --server http://127.0.0.1:8080 --alerts 13265
//	gateway-load door --server http://127.0.0.1:8080,http://127.0.0.1:8081 --keys 30 --copies 8
//
// gateway-load prune measures the runs going on while a large run is
// deleted (prune.go).
//
//	gateway-load prune --gateway /tmp/gateway --items 1000000 --rate 64
//
// gateway-load retention serves a one-second schedule under a short
// retention and prints how many runs the store holds, and its size, as time
// goes (retention.go).
//
//	gateway-load retention --gateway /tmp/gateway --keep 60s --duration 10m
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Exit codes.
const (
	exitOK     = 0
	exitFailed = 1 // no run succeeded
	exitUsage  = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Backoff after a request that failed, so a gateway that is down or refuses
// the token is not hammered; it doubles up to backoffMax.
const (
	backoffMin = 10 * time.Millisecond
	backoffMax = time.Second
)

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "split" {
		return runSplit(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "console" {
		return runConsole(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "providers" {
		return runProviders(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "flood" {
		return runFlood(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "guess" {
		return runGuess(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "door" {
		return runDoor(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "prune" {
		return runPrune(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "retention" {
		return runRetention(ctx, args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("gateway-load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	server := fs.String("server", "http://127.0.0.1:8080", "gateway API")
	token := fs.String("token", os.Getenv("CHAINGATE_TOKEN"), "API bearer token")
	chain := fs.String("chain", "", "chain to start")
	trigger := fs.String("trigger", "", "Alertmanager trigger to post a new firing alert to in each request, instead of --chain")
	payload := fs.String("payload", `{"alert_name":"load","severity":"critical"}`, "run payload")
	concurrency := fs.Int("concurrency", 64, "requests in flight, each on a connection of its own from one address: past the gateway's [gateway.limits] max_connections_per_address (default 128) they are refused")
	duration := fs.Duration("duration", 20*time.Second, "how long to measure")
	warmup := fs.Duration("warmup", 2*time.Second, "load driven before measuring")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	var problems []string
	if (*chain == "") == (*trigger == "") {
		problems = append(problems, "give --chain or --trigger")
	}
	if *concurrency < 1 {
		problems = append(problems, "--concurrency must be at least 1")
	}
	if *duration <= 0 {
		problems = append(problems, "--duration must be positive")
	}
	if *warmup < 0 {
		problems = append(problems, "--warmup must not be negative")
	}
	if !json.Valid([]byte(*payload)) {
		problems = append(problems, "--payload must be JSON")
	}
	if u, err := url.Parse(*server); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		problems = append(problems, fmt.Sprintf("--server %q is not an http:// or https:// URL", *server))
	}
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintln(stderr, "gateway-load:", p)
		}
		return exitUsage
	}

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: *concurrency}}
	target := strings.TrimRight(*server, "/") + "/v1/chains/" + url.PathEscape(*chain) + "/runs?wait=60s"
	var alerts atomic.Int64
	body := func() string { return *payload }
	if *trigger != "" {
		target = strings.TrimRight(*server, "/") + "/v1/triggers/" + url.PathEscape(*trigger)
		stamp := time.Now().UTC().Format(time.RFC3339)
		body = func() string { return fmt.Sprintf(alertGroup, alerts.Add(1), stamp) }
	}
	var (
		mu        sync.Mutex
		latencies []time.Duration
		outcomes  = map[string]int{}
		firstErr  error
		measuring atomic.Bool
	)
	end := time.Now().Add(*warmup + *duration)
	var wg sync.WaitGroup
	for range *concurrency {
		wg.Go(func() {
			delay := backoffMin
			for ctx.Err() == nil && time.Now().Before(end) {
				t0 := time.Now()
				outcome, err := post(ctx, client, target, *token, body())
				took := time.Since(t0)
				if ctx.Err() != nil {
					return
				}
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				if measuring.Load() {
					outcomes[outcome]++
					if outcome == "succeeded" || outcome == "started" {
						latencies = append(latencies, took)
					}
				}
				mu.Unlock()
				if err == nil {
					delay = backoffMin
					continue
				}
				sleep(ctx, min(delay, time.Until(end)))
				delay = min(2*delay, backoffMax)
			}
		})
	}
	sleep(ctx, *warmup)
	gwCPU0, gwCPUErr := gatewayCPU(ctx, client, *server, *token)
	ownCPU0 := ownCPU()
	measuring.Store(true)
	measured := time.Now()
	wg.Wait()
	elapsed := time.Since(measured)
	ownCPUUsed := ownCPU() - ownCPU0
	gwCPU1, err := gatewayCPU(ctx, client, *server, *token)
	if gwCPUErr == nil {
		gwCPUErr = err
	}

	slices.Sort(latencies)
	pct := func(p float64) time.Duration {
		if len(latencies) == 0 {
			return 0
		}
		return latencies[int(float64(len(latencies)-1)*p)]
	}
	if *trigger != "" {
		fmt.Fprintf(stdout, "alerts started: %d in %s (%.0f/s)\n", len(latencies), elapsed.Round(time.Millisecond), float64(len(latencies))/elapsed.Seconds())
		fmt.Fprintf(stdout, "POST to answer: p50 %s  p90 %s  p99 %s  max %s\n", pct(0.5), pct(0.9), pct(0.99), pct(1))
	} else {
		fmt.Fprintf(stdout, "runs succeeded: %d in %s (%.0f runs/s)\n", len(latencies), elapsed.Round(time.Millisecond), float64(len(latencies))/elapsed.Seconds())
		fmt.Fprintf(stdout, "POST to run end: p50 %s  p90 %s  p99 %s  max %s\n", pct(0.5), pct(0.9), pct(0.99), pct(1))
	}
	fmt.Fprintf(stdout, "outcomes: %s\n", summary(outcomes))
	if n := len(latencies); n > 0 {
		gw := "unknown (" + fmt.Sprint(gwCPUErr) + ")"
		if gwCPUErr == nil {
			gw = fmt.Sprintf("%.0f µs", (gwCPU1-gwCPU0).Seconds()*1e6/float64(n))
		}
		unit := "run"
		if *trigger != "" {
			unit = "alert"
		}
		fmt.Fprintf(stdout, "CPU per %s: the gateway %s (its plugins not counted), this load tool %.0f µs\n", unit, gw, ownCPUUsed.Seconds()*1e6/float64(n))
	}
	if firstErr != nil {
		fmt.Fprintln(stderr, "gateway-load: first error:", firstErr)
	}
	if len(latencies) == 0 {
		fmt.Fprintln(stderr, "gateway-load: no run succeeded")
		return exitFailed
	}
	return exitOK
}

// alertGroup is one firing alert as Alertmanager's webhook sends it; its
// fingerprint is the request's number, so each starts a run.
const alertGroup = `{"version":"4","groupKey":"{}:{alertname=\"Load\"}","status":"firing","receiver":"chaingate",` +
	`"groupLabels":{"alertname":"Load"},"commonLabels":{"alertname":"Load"},"commonAnnotations":{},"externalURL":"http://alertmanager:9093",` +
	`"alerts":[{"status":"firing","labels":{"alertname":"Load","instance":"host-%[1]d","severity":"critical"},` +
	`"annotations":{"summary":"load test"},"startsAt":"%[2]s","endsAt":"0001-01-01T00:00:00Z","generatorURL":"","fingerprint":"%[1]x"}]}`

// summary lists outcomes by count, most frequent first.
func summary(outcomes map[string]int) string {
	if len(outcomes) == 0 {
		return "none"
	}
	names := make([]string, 0, len(outcomes))
	for k := range outcomes {
		names = append(names, k)
	}
	slices.SortFunc(names, func(a, b string) int {
		if d := outcomes[b] - outcomes[a]; d != 0 {
			return d
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(names))
	for i, k := range names {
		parts[i] = fmt.Sprintf("%s %d", k, outcomes[k])
	}
	return strings.Join(parts, ", ")
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// post starts a run and waits for it to end. The outcome is the run's
// final status, "unfinished" when the wait ran out, or what went wrong
// ("error", "http_401", …), with an error saying why.
func post(ctx context.Context, c *http.Client, target, token, payload string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, strings.NewReader(payload))
	if err != nil {
		return "error", fmt.Errorf("building the request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return "error", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "error", fmt.Errorf("reading the answer: %w", err)
	}
	if resp.StatusCode >= 300 {
		return fmt.Sprintf("http_%d", resp.StatusCode), fmt.Errorf("POST answered %s: %.200s", resp.Status, strings.TrimSpace(string(body)))
	}
	var out struct {
		Status  string `json:"status"`
		Results []struct {
			Action string `json:"action"`
		} `json:"results"`
	}
	err = json.Unmarshal(body, &out)
	if err == nil && len(out.Results) > 0 {
		return out.Results[0].Action, nil
	}
	if err != nil || out.Status == "" {
		return "bad_answer", errors.Join(errors.New("the answer is not a run"), err)
	}
	if out.Status == "running" {
		return "unfinished", nil
	}
	return out.Status, nil
}

// gatewayCPU reads the CPU time the gateway process has used from its
// /metrics, where the Prometheus client counts it in hundredths of a
// second.
func gatewayCPU(ctx context.Context, c *http.Client, server, token string) (time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(server, "/")+"/metrics", nil)
	if err != nil {
		return 0, fmt.Errorf("building the request: %w", err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, fmt.Errorf("reading /metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("reading /metrics: %s", resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "process_cpu_seconds_total "); ok {
			secs, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return 0, fmt.Errorf("reading /metrics: process_cpu_seconds_total %q: %w", v, err)
			}
			return time.Duration(secs * float64(time.Second)), nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("reading /metrics: %w", err)
	}
	return 0, errors.New("/metrics has no process_cpu_seconds_total")
}

// ownCPU is the CPU time this process has used, in user and kernel mode.
func ownCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
