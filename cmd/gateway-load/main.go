// Command gateway-load drives a gateway's API with run requests and reports
// how many runs per second finish and how long each took from POST to its
// end.
//
//	gateway-load --server http://127.0.0.1:8080 --chain three-echo --concurrency 64 --duration 20s
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	server := flag.String("server", "http://127.0.0.1:8080", "gateway API")
	token := flag.String("token", os.Getenv("CHAINGATE_TOKEN"), "API bearer token")
	chain := flag.String("chain", "", "chain to start")
	payload := flag.String("payload", `{"alert_name":"load","severity":"critical"}`, "run payload")
	concurrency := flag.Int("concurrency", 64, "requests in flight")
	duration := flag.Duration("duration", 20*time.Second, "how long to drive load")
	warmup := flag.Duration("warmup", 2*time.Second, "load driven before measuring")
	flag.Parse()
	if *chain == "" {
		fmt.Fprintln(os.Stderr, "gateway-load: --chain is required")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: *concurrency}}
	url := strings.TrimRight(*server, "/") + "/v1/chains/" + *chain + "/runs?wait=60s"
	var (
		mu        sync.Mutex
		latencies []time.Duration
		failed    atomic.Int64
		measuring atomic.Bool
	)
	start := time.Now()
	end := start.Add(*warmup + *duration)
	var wg sync.WaitGroup
	for range *concurrency {
		wg.Go(func() {
			for ctx.Err() == nil && time.Now().Before(end) {
				t0 := time.Now()
				ok := post(ctx, client, url, *token, *payload)
				took := time.Since(t0)
				if !measuring.Load() {
					continue
				}
				if !ok {
					failed.Add(1)
					continue
				}
				mu.Lock()
				latencies = append(latencies, took)
				mu.Unlock()
			}
		})
	}
	time.Sleep(*warmup)
	measuring.Store(true)
	measured := time.Now()
	wg.Wait()
	elapsed := time.Since(measured)
	slices.Sort(latencies)
	pct := func(p float64) time.Duration {
		if len(latencies) == 0 {
			return 0
		}
		return latencies[int(float64(len(latencies)-1)*p)]
	}
	fmt.Printf("runs finished: %d in %s (%.0f runs/s), failed or unfinished: %d\n", len(latencies), elapsed.Round(time.Millisecond), float64(len(latencies))/elapsed.Seconds(), failed.Load())
	fmt.Printf("POST to run end: p50 %s  p90 %s  p99 %s  max %s\n", pct(0.5), pct(0.9), pct(0.99), pct(1))
}

// post starts a run and waits for it to end; it reports whether it ended
// successfully within the wait.
func post(ctx context.Context, c *http.Client, url, token, payload string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(payload))
	if err != nil {
		return false
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var out struct {
		Status string `json:"status"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return false
	}
	return resp.StatusCode == http.StatusOK && out.Status == "succeeded"
}
