package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

const pruneUsage = `Usage: gateway-load prune --gateway PATH [flags]

Measures what deleting a large run costs the runs going on beside it. It
serves a gateway on a fresh store (--store bolt, or redis), runs one split
of --items items to its end, then starts runs of a three-step chain at
--rate a second for --duration and records how long each took from POST to
its end: once alone, once while the split's run is deleted (DELETE
/v1/runs/ID) at the start of the window, and once after. It prints the
latencies, how long the deletion took and what it freed.

`

// pruneConfig serves the split and the small chain; STATE is the load's
// store.
const pruneConfig = `
[gateway]
state = "STATE"
shutdown_grace_seconds = 5
[gateway.limits]
max_request_bytes = 268435456
max_split_items = 10000000
max_body_bytes = 268435456

[[providers]]
name = "echo"
type = "echo"

[[chains]]
name = "big"
[[chains.steps]]
name = "loop"
[chains.steps.split]
items = "<<origin.payload.items>>"
max_concurrency = 256
[[chains.steps.split.steps]]
name = "echo"
provider = "echo"
payload_template = { i = "<<item>>" }
` + smallChain

func runPrune(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gateway-load prune", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, pruneUsage); fs.PrintDefaults() }
	gatewayBin := fs.String("gateway", "", "the gateway binary (go build -o /tmp/gateway ./cmd/gateway)")
	items := fs.Int("items", 1_000_000, "items in the split whose run is deleted")
	rate := fs.Int("rate", 64, "small runs started a second")
	duration := fs.Duration("duration", 20*time.Second, "how long each window of small runs lasts")
	kind := fs.String("store", "bolt", "bolt or redis")
	redisAddr := fs.String("redis", "127.0.0.1:6379", "Redis address, for --store redis")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if *gatewayBin == "" || *items < 1 || *rate < 1 || *duration <= 0 || (*kind != "bolt" && *kind != "redis") {
		fmt.Fprintln(stderr, "gateway-load prune: give --gateway; --items, --rate and --duration are positive; --store is bolt or redis")
		return exitUsage
	}
	dir, err := os.MkdirTemp("", "gateway-load-prune-")
	if err != nil {
		fmt.Fprintln(stderr, "gateway-load prune:", err)
		return exitFailed
	}
	defer os.RemoveAll(dir)
	st := newLoadStore(*kind, *redisAddr, dir)
	defer st.close()
	cfg := filepath.Join(dir, "load.toml")
	if err := os.WriteFile(cfg, []byte(strings.ReplaceAll(pruneConfig, "STATE", st.url())), 0o644); err != nil {
		fmt.Fprintln(stderr, "gateway-load prune:", err)
		return exitFailed
	}
	gw, err := startProc(ctx, *gatewayBin, dir, "gateway", "serve", "--config", cfg, "--listen", "127.0.0.1:0", "--no-worker", "--log-level", "warn")
	if err != nil {
		fmt.Fprintln(stderr, "gateway-load prune:", err)
		return exitFailed
	}
	defer gw.stop()

	if _, err := runOnce(ctx, gw.url, "small", []byte(`{}`)); err != nil {
		fmt.Fprintln(stderr, "gateway-load prune:", err)
		return exitFailed
	}
	began := time.Now()
	bigID, err := startRun(gw.url, "big", splitPayload(*items, "int"))
	if err == nil {
		err = waitEnd(ctx, gw.url, bigID)
	}
	if err != nil {
		fmt.Fprintln(stderr, "gateway-load prune:", err)
		return exitFailed
	}
	fmt.Fprintf(stdout, "a split of %d items ran in %s; %s\n", *items, time.Since(began).Round(time.Millisecond), st.size(ctx))

	alone := drivePaced(ctx, gw.url, *rate, *duration, nil)
	var deleted struct {
		took  time.Duration
		freed string
		err   error
	}
	during := drivePaced(ctx, gw.url, *rate, *duration, func() {
		start := time.Now()
		req, _ := http.NewRequestWithContext(ctx, http.MethodDelete, gw.url+"/v1/runs/"+bigID, nil)
		resp, err := http.DefaultClient.Do(req)
		deleted.took = time.Since(start)
		if err != nil {
			deleted.err = err
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var res struct {
			Freed struct {
				Records int   `json:"records"`
				Bytes   int64 `json:"bytes"`
			} `json:"freed"`
		}
		if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &res) != nil {
			deleted.err = fmt.Errorf("%s %.200s", resp.Status, body)
			return
		}
		deleted.freed = fmt.Sprintf("%d records, %d MiB", res.Freed.Records, res.Freed.Bytes>>20)
	})
	if deleted.err != nil {
		fmt.Fprintln(stderr, "gateway-load prune: deleting the split's run:", deleted.err)
		return exitFailed
	}
	fmt.Fprintf(stdout, "deleting its run took %s and freed %s; %s\n", deleted.took.Round(time.Millisecond), deleted.freed, st.size(ctx))
	after := drivePaced(ctx, gw.url, *rate, *duration, nil)
	for _, ph := range []struct {
		name string
		l    latencies
	}{{"alone", alone}, {"while deleting", during}, {"after", after}} {
		fmt.Fprintf(stdout, "%-15s %d runs of 3 steps at %d/s: POST to end p50 %s  p99 %s  max %s  (%d failed)\n",
			ph.name, len(ph.l.ok), *rate, ms(ph.l.pct(50)), ms(ph.l.pct(99)), ms(ph.l.pct(100)), ph.l.failed)
	}
	if p := alone.pct(99); p > 0 {
		fmt.Fprintf(stdout, "p99 while deleting / alone: %.2f\n", float64(during.pct(99))/float64(p))
	}
	return exitOK
}

// latencies are the runs of a window.
type latencies struct {
	ok     []time.Duration
	failed int
}

func (l latencies) pct(p float64) time.Duration {
	if len(l.ok) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(l.ok))
	i := min(len(s)-1, int(float64(len(s))*p/100))
	return s[i]
}

// drivePaced starts a small run every 1/rate for d, calls at (when set) as
// the window opens, and waits for every run and for at to end.
func drivePaced(ctx context.Context, server string, rate int, d time.Duration, at func()) latencies {
	var (
		mu  sync.Mutex
		l   latencies
		wg  sync.WaitGroup
		end = time.Now().Add(d)
	)
	if at != nil {
		wg.Go(at)
	}
	t := time.NewTicker(time.Second / time.Duration(rate))
	defer t.Stop()
	for time.Now().Before(end) && ctx.Err() == nil {
		<-t.C
		wg.Go(func() {
			took, err := runOnce(ctx, server, "small", []byte(`{}`))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				l.failed++
				return
			}
			l.ok = append(l.ok, took)
		})
	}
	wg.Wait()
	return l
}

// startRun starts a run and returns its id.
func startRun(server, chainName string, payload []byte) (string, error) {
	resp, err := http.Post(server+"/v1/chains/"+chainName+"/runs", "application/json", bytes.NewReader(payload))
	if err != nil {
		return "", fmt.Errorf("starting the run: %w", err)
	}
	defer resp.Body.Close()
	var started struct {
		ID string `json:"id"`
	}
	if resp.StatusCode != http.StatusAccepted || json.NewDecoder(resp.Body).Decode(&started) != nil {
		return "", fmt.Errorf("starting the run: %s", resp.Status)
	}
	return started.ID, nil
}

// waitEnd waits for a run to end, reading its record every second.
func waitEnd(ctx context.Context, server, id string) error {
	for {
		resp, err := http.Get(server + "/v1/runs/" + id + "?items=false")
		if err != nil {
			return err
		}
		var v struct {
			Status string `json:"status"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		switch v.Status {
		case "succeeded":
			return nil
		case "failed", "cancelled", "timed_out":
			return fmt.Errorf("run %s ended %s", id, v.Status)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
