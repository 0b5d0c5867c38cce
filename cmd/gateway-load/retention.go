package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

const retentionUsage = `Usage: gateway-load retention --gateway PATH [flags]

Serves a gateway on a fresh store (--store bolt, or redis) with a schedule
that starts a three-step run every second, its payload --pad bytes, and
[gateway.retention] keeping succeeded runs --keep ("0": for ever), and
prints, every --every for --duration, how many
runs the store holds, how many retention pruned, and the store's size: the
bbolt file's, or Redis's used_memory.

`

const retentionConfig = `
[gateway]
state = "STATE"
[gateway.retention]
succeeded = "KEEP"
interval = "INTERVAL"

[[providers]]
name = "echo"
type = "echo"

[[schedules]]
name = "tick"
chain = "small"
every = "1s"
payload = { pad = "PAD" }
` + smallChain

func runRetention(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gateway-load retention", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, retentionUsage); fs.PrintDefaults() }
	gatewayBin := fs.String("gateway", "", "the gateway binary (go build -o /tmp/gateway ./cmd/gateway)")
	kind := fs.String("store", "bolt", "bolt or redis")
	redisAddr := fs.String("redis", "127.0.0.1:6379", "Redis address, for --store redis")
	keep := fs.String("keep", "60s", "how long succeeded runs are kept")
	interval := fs.String("interval", "1m", "how often retention prunes")
	duration := fs.Duration("duration", 10*time.Minute, "how long to serve")
	every := fs.Duration("every", 30*time.Second, "how often to print a line")
	pad := fs.Int("pad", 0, "bytes of padding in each run's payload, so that runs weigh what real ones do")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if *gatewayBin == "" || *duration <= 0 || *every <= 0 || (*kind != "bolt" && *kind != "redis") {
		fmt.Fprintln(stderr, "gateway-load retention: give --gateway; --duration and --every are positive; --store is bolt or redis")
		return exitUsage
	}
	dir, err := os.MkdirTemp("", "gateway-load-retention-")
	if err != nil {
		fmt.Fprintln(stderr, "gateway-load retention:", err)
		return exitFailed
	}
	defer os.RemoveAll(dir)
	st := newLoadStore(*kind, *redisAddr, dir)
	defer st.close()
	cfg := filepath.Join(dir, "load.toml")
	text := strings.NewReplacer("STATE", st.url(), "KEEP", *keep, "INTERVAL", *interval, "PAD", strings.Repeat("x", *pad)).Replace(retentionConfig)
	if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
		fmt.Fprintln(stderr, "gateway-load retention:", err)
		return exitFailed
	}
	gw, err := startProc(ctx, *gatewayBin, dir, "gateway", "serve", "--config", cfg, "--listen", "127.0.0.1:0", "--no-worker", "--log-level", "warn")
	if err != nil {
		fmt.Fprintln(stderr, "gateway-load retention:", err)
		return exitFailed
	}
	defer gw.stop()
	fmt.Fprintf(stdout, "a run every second with a payload of %d bytes, succeeded runs kept %s, pruned every %s, on %s\n", *pad, *keep, *interval, *kind)
	start := time.Now()
	t := time.NewTicker(*every)
	defer t.Stop()
	for time.Since(start) < *duration {
		select {
		case <-ctx.Done():
			return exitFailed
		case <-t.C:
		}
		runs, err := countRuns(ctx, gw.url)
		if err != nil {
			fmt.Fprintln(stderr, "gateway-load retention:", err)
			return exitFailed
		}
		started, pruned := metricSum(gw.url, "chaingate_runs_started_total"), metricSum(gw.url, "chaingate_retention_runs_pruned_total")
		fmt.Fprintf(stdout, "%6s  runs kept %5d  started %6.0f  pruned %6.0f  %s\n", time.Since(start).Round(time.Second), runs, started, pruned, st.size(ctx))
	}
	return exitOK
}

// countRuns pages through a gateway's runs list and counts them.
func countRuns(ctx context.Context, server string) (int, error) {
	n, cursor := 0, ""
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, server+"/v1/runs?limit=1000&cursor="+cursor, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err
		}
		var page struct {
			Runs []json.RawMessage `json:"runs"`
			Next string            `json:"next_cursor"`
		}
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		if err != nil {
			return 0, fmt.Errorf("listing runs: %w", err)
		}
		n += len(page.Runs)
		if page.Next == "" {
			return n, nil
		}
		cursor = page.Next
	}
}

// metricSum sums a metric's series on a gateway; 0 when it has none.
func metricSum(server, name string) float64 {
	resp, err := http.Get(server + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, name); ok && (strings.HasPrefix(rest, "{") || strings.HasPrefix(rest, " ")) {
			if v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64); err == nil {
				sum += v
			}
		}
	}
	return sum
}
