package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"html"
	"io"
	"math"
	"net/http"
	"net/http/cookiejar"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const consoleUsage = `Usage: gateway-load console --gateway PATH [flags]

Starts "gateway serve" with a chain of --steps steps of --step-ms each and keeps
--runs runs of it going, their starts spread over a run's length, first alone
and then with --followers consoles following them as the console's script does
(each opens a live run's page and follows its event stream to the run's end). It prints the step events per second and
the gateway's CPU (plugins apart) in each phase: the difference is what the
consoles cost.

`

// consoleConfig is the load's config; DIR is its directory and STEPS its
// steps.
const consoleConfig = `
[gateway]
state = "bolt://DIR/gateway.db"
shutdown_grace_seconds = 5

# Every console follows from this one loopback address.
[gateway.limits]
max_connections_per_address = 1024

[[providers]]
name = "slow"
type = "faulty"

[[chains]]
name = "ticker"
STEPS`

func runConsole(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gateway-load console", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, consoleUsage)
		fs.PrintDefaults()
	}
	gatewayBin := fs.String("gateway", "", "the gateway binary (go build -o /tmp/gateway ./cmd/gateway)")
	followers := fs.Int("followers", 200, "consoles following runs")
	runs := fs.Int("runs", 50, "runs kept going")
	steps := fs.Int("steps", 300, "steps in each run")
	stepMS := fs.Int("step-ms", 100, "how long each step's call takes")
	duration := fs.Duration("duration", 15*time.Second, "how long each phase is measured")
	profile := fs.String("profile", "", "write the gateway's CPU profile to this file")
	pages := fs.Bool("pages", true, "open each run's page before following it; false follows the stream alone, from its next event")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if *gatewayBin == "" || *followers < 1 || *runs < 1 || *steps < 1 || *stepMS < 1 || *duration <= 0 {
		fmt.Fprintln(stderr, "gateway-load console: --gateway is required; --followers, --runs, --steps and --step-ms must be at least 1, --duration positive")
		return exitUsage
	}
	dir, err := os.MkdirTemp("", "gateway-load-console-")
	if err != nil {
		fmt.Fprintln(stderr, "gateway-load console:", err)
		return exitFailed
	}
	defer os.RemoveAll(dir)
	var b strings.Builder
	for i := range *steps {
		fmt.Fprintf(&b, "[[chains.steps]]\nname = \"s%02d\"\nprovider = \"slow\"\npayload_template = { sleep_ms = %d }\n", i, *stepMS)
	}
	cfg := filepath.Join(dir, "load.toml")
	text := strings.ReplaceAll(strings.ReplaceAll(consoleConfig, "DIR", dir), "STEPS", b.String())
	if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
		fmt.Fprintln(stderr, "gateway-load console:", err)
		return exitFailed
	}
	serve := []string{"serve", "--config", cfg, "--listen", "127.0.0.1:0", "--log-level", "warn"}
	if *profile != "" {
		serve = append(serve, "--cpuprofile", *profile)
	}
	gw, err := startProc(ctx, *gatewayBin, dir, "gateway", serve...)
	if err != nil {
		fmt.Fprintln(stderr, "gateway-load console:", err)
		return exitFailed
	}
	defer gw.stop()

	load := &tickerLoad{url: gw.url, live: map[string]bool{}, pages: *pages}
	lctx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	// Runs start spread over a run's length, so as many end as start.
	runLength := time.Duration(*steps**stepMS) * time.Millisecond
	for i := range *runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sleep(lctx, runLength*time.Duration(i)/time.Duration(*runs))
			load.keepRunning(lctx)
		}()
	}
	defer func() { stopLoad(); wg.Wait() }()
	sleep(ctx, runLength+2*time.Second) // every run under way

	perRun := 2**steps + 2
	phase := func(name string) (cpuPct, eventsPerSec float64) {
		pid := gw.cmd.Process.Pid
		cpu0, done0, t0 := cpuTime(pid), load.done.Load(), time.Now()
		sleep(ctx, *duration)
		cpu1, done1, el := cpuTime(pid), load.done.Load(), time.Since(t0)
		cpuPct = 100 * (cpu1 - cpu0).Seconds() / el.Seconds()
		eventsPerSec = float64(done1-done0) * float64(perRun) / el.Seconds()
		fmt.Fprintf(stdout, "%-28s %6.0f step events/s, gateway CPU %5.1f %% of one core\n", name+":", eventsPerSec, cpuPct)
		return cpuPct, eventsPerSec
	}
	fmt.Fprintf(stdout, "%d runs of %d steps of %d ms kept going; each phase %s\n", *runs, *steps, *stepMS, *duration)
	base, _ := phase("no consoles")
	fctx, stopFollowers := context.WithCancel(ctx)
	var fwg sync.WaitGroup
	for i := range *followers {
		fwg.Add(1)
		go func() { defer fwg.Done(); load.follow(fctx, i) }()
	}
	sleep(ctx, 5*time.Second) // every console open
	with, _ := phase(fmt.Sprintf("%d consoles following", *followers))
	stopFollowers()
	fwg.Wait()
	fmt.Fprintf(stdout, "the consoles cost %.1f %% of one core (%d run pages opened, %d streams)\n",
		math.Max(with-base, 0), load.pagesOpen.Load(), load.streams.Load())
	return exitOK
}

// tickerLoad keeps runs going and lets followers find them.
type tickerLoad struct {
	url                string
	pages              bool
	done               atomic.Int64
	streams, pagesOpen atomic.Int64
	mu                 sync.Mutex
	live               map[string]bool
}

// keepRunning starts a run, waits for its end, and starts the next.
func (l *tickerLoad) keepRunning(ctx context.Context) {
	c := &http.Client{}
	for ctx.Err() == nil {
		var key [8]byte
		_, _ = rand.Read(key[:])
		id, err := l.start(ctx, c, hex.EncodeToString(key[:]), "")
		if err != nil {
			sleep(ctx, 100*time.Millisecond)
			continue
		}
		l.mu.Lock()
		l.live[id] = true
		l.mu.Unlock()
		// The same request again waits for the run's end.
		_, err = l.start(ctx, c, hex.EncodeToString(key[:]), "?wait=60s")
		l.mu.Lock()
		delete(l.live, id)
		l.mu.Unlock()
		if err == nil {
			l.done.Add(1)
		}
	}
}

func (l *tickerLoad) start(ctx context.Context, c *http.Client, key, query string) (string, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, l.url+"/v1/chains/ticker/runs"+query, strings.NewReader("{}"))
	req.Header.Set("Idempotency-Key", key)
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var out struct {
		ID string `json:"id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || out.ID == "" {
		return "", fmt.Errorf("starting a run: %d %v", resp.StatusCode, err)
	}
	return out.ID, nil
}

// pick returns a live run, the n-th in no particular order.
func (l *tickerLoad) pick(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	i := 0
	for id := range l.live {
		if i == n%max(len(l.live), 1) {
			return id
		}
		i++
	}
	return ""
}

// follow is one console: it opens a live run's page, follows the run's
// event stream from there to the run's end, as the page's script does,
// then opens another.
func (l *tickerLoad) follow(ctx context.Context, n int) {
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar} // one console session, as a browser keeps
	for ctx.Err() == nil {
		id := l.pick(n)
		if id == "" {
			sleep(ctx, 50*time.Millisecond)
			continue
		}
		stream := "/ui/runs/" + id + "/stream?after=now"
		if l.pages {
			var err error
			if stream, err = l.openPage(ctx, c, id); err != nil {
				sleep(ctx, 50*time.Millisecond)
				continue
			}
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, l.url+stream, nil)
		if resp, err := c.Do(req); err == nil {
			l.streams.Add(1)
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
			}
			resp.Body.Close()
		}
	}
}

var streamAttr = regexp.MustCompile(`data-stream="([^"]+)"`)

// openPage loads a run's page and returns its stream's address.
func (l *tickerLoad) openPage(ctx context.Context, c *http.Client, id string) (string, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, l.url+"/ui/runs/"+id, nil)
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	page, _ := io.ReadAll(resp.Body)
	l.pagesOpen.Add(1)
	m := streamAttr.FindSubmatch(page)
	if m == nil {
		return "", fmt.Errorf("run %s's page has no stream (%d)", id, resp.StatusCode)
	}
	return html.UnescapeString(string(m[1])), nil
}
