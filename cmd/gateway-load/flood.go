package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const floodUsage = `Usage: gateway-load flood [flags]

Holds --connections connections to a gateway from the loopback address --from,
each announcing a POST body of --body-bytes and sending it a byte every --gap,
reconnecting --reconnect-delay after the gateway closes one. Meanwhile it
probes GET /healthz from --probe-from every --probe-every, on a new
connection each time, and prints how long the probes took and what the
flood's connections were answered. Run it against a gateway with tokens;
the flood sends none unless --token is given.

`

const guessUsage = `Usage: gateway-load guess [flags]

Sends --count requests with wrong bearer tokens from the loopback address
--from, --concurrency at a time, and prints what they were answered and how
fast; then, with --token, one request with that token from --check-from,
which must be answered as usual.

`

// dialerFrom dials from the local address from; any when empty.
func dialerFrom(from string) (*net.Dialer, error) {
	d := &net.Dialer{Timeout: 10 * time.Second}
	if from == "" {
		return d, nil
	}
	ip := net.ParseIP(from)
	if ip == nil {
		return nil, fmt.Errorf("%q is not an IP address", from)
	}
	d.LocalAddr = &net.TCPAddr{IP: ip}
	return d, nil
}

// serverAddr is the HOST:PORT of an http:// server URL.
func serverAddr(server string) (string, error) {
	u, err := url.Parse(server)
	if err != nil || u.Scheme != "http" || u.Host == "" {
		return "", fmt.Errorf("--server %q is not an http:// URL", server)
	}
	if u.Port() == "" {
		return u.Host + ":80", nil
	}
	return u.Host, nil
}

func runFlood(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gateway-load flood", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, floodUsage)
		fs.PrintDefaults()
	}
	server := fs.String("server", "http://127.0.0.1:8080", "gateway API")
	from := fs.String("from", "127.0.0.2", "loopback address the flood comes from")
	probeFrom := fs.String("probe-from", "127.0.0.1", "address the health probes come from")
	conns := fs.Int("connections", 1100, "flood connections held at once")
	bodyBytes := fs.Int("body-bytes", 100_000, "POST body each connection announces")
	gap := fs.Duration("gap", 3*time.Second, "between two bytes of a body")
	reconnect := fs.Duration("reconnect-delay", time.Second, "after the gateway closes a connection, before the next")
	path := fs.String("path", "/v1/chains/flood/runs", "path the flood posts to")
	token := fs.String("token", "", "bearer token the flood sends (none by default)")
	duration := fs.Duration("duration", 60*time.Second, "how long the flood lasts")
	probeEvery := fs.Duration("probe-every", 5*time.Second, "between two health probes")
	probeTimeout := fs.Duration("probe-timeout", 15*time.Second, "how long a probe waits for its answer")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	addr, err := serverAddr(*server)
	if err == nil && (*conns < 1 || *bodyBytes < 1 || *gap <= 0 || *reconnect < 0 || *duration <= 0 || *probeEvery <= 0 || *probeTimeout <= 0) {
		err = fmt.Errorf("--connections and --body-bytes must be at least 1; --gap, --duration, --probe-every and --probe-timeout positive")
	}
	var flooder, prober *net.Dialer
	if err == nil {
		flooder, err = dialerFrom(*from)
	}
	if err == nil {
		prober, err = dialerFrom(*probeFrom)
	}
	if err != nil {
		fmt.Fprintln(stderr, "gateway-load flood:", err)
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, *duration)
	defer cancel()

	head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n", *path, addr, *bodyBytes)
	if *token != "" {
		head += "Authorization: Bearer " + *token + "\r\n"
	}
	head += "\r\n"
	var (
		mu       sync.Mutex
		outcomes = map[string]int{}
		held     []time.Duration
		made     atomic.Int64
	)
	var wg sync.WaitGroup
	for range *conns {
		wg.Go(func() {
			for ctx.Err() == nil {
				outcome, took := floodOnce(ctx, flooder, addr, head, *bodyBytes, *gap, &made)
				mu.Lock()
				outcomes[outcome]++
				if outcome != "dial_failed" {
					held = append(held, took)
				}
				mu.Unlock()
				sleep(ctx, *reconnect)
			}
		})
	}

	client := &http.Client{Timeout: *probeTimeout, Transport: &http.Transport{DialContext: prober.DialContext, DisableKeepAlives: true}}
	var probes []time.Duration
	probeOutcomes := map[string]int{}
	tick := time.NewTicker(*probeEvery)
	for ctx.Err() == nil {
		t0 := time.Now()
		outcome := "error"
		resp, err := client.Get(strings.TrimRight(*server, "/") + "/healthz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			outcome = strconv.Itoa(resp.StatusCode)
		} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
			outcome = "no_answer"
		}
		took := time.Since(t0)
		if ctx.Err() != nil && outcome != "200" {
			break // cut by the end of the flood, not by the gateway
		}
		probeOutcomes[outcome]++
		if outcome == "200" {
			probes = append(probes, took)
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
	tick.Stop()
	wg.Wait()

	fmt.Fprintf(stdout, "flood: %d connections from %s, each a %d-byte POST %s sent a byte every %s, for %s\n", *conns, *from, *bodyBytes, *path, *gap, *duration)
	fmt.Fprintf(stdout, "flood connections made: %d; outcomes: %s\n", made.Load(), summary(outcomes))
	fmt.Fprintf(stdout, "flood connection held: %s\n", percentiles(held))
	fmt.Fprintf(stdout, "health probes from %s: %s\n", *probeFrom, summary(probeOutcomes))
	fmt.Fprintf(stdout, "probe answered in: %s\n", percentiles(probes))
	return exitOK
}

// floodOnce holds one flood connection until the gateway closes it, or
// the flood ends, and says how it went: the status it was answered (the
// body is sent on regardless, as a flood's client would), closed_unanswered,
// held_to_the_end, or dial_failed; and how long the connection lasted.
func floodOnce(ctx context.Context, d *net.Dialer, addr, head string, size int, gap time.Duration, made *atomic.Int64) (string, time.Duration) {
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "dial_failed", 0
	}
	made.Add(1)
	t0 := time.Now()
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	answered := make(chan string, 1)
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			answered <- "closed_unanswered"
			return
		}
		resp.Body.Close()
		answered <- strconv.Itoa(resp.StatusCode)
		_, _ = io.Copy(io.Discard, br)
	}()
	if _, err := io.WriteString(c, head); err == nil {
		tick := time.NewTicker(gap)
		defer tick.Stop()
	trickle:
		for sent := 0; sent < size; sent++ {
			select {
			case <-gone:
				break trickle
			case <-tick.C:
				if _, err := c.Write([]byte{' '}); err != nil {
					break trickle
				}
			}
		}
	}
	<-gone
	took := time.Since(t0)
	outcome := <-answered
	if ctx.Err() != nil && outcome == "closed_unanswered" {
		outcome = "held_to_the_end"
	}
	return outcome, took
}

// percentiles summarises durations: count, p50, p90, max.
func percentiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	slices.Sort(ds)
	at := func(p float64) time.Duration { return ds[int(float64(len(ds)-1)*p)].Round(time.Millisecond) }
	return fmt.Sprintf("%d: p50 %s  p90 %s  max %s", len(ds), at(0.5), at(0.9), at(1))
}

func runGuess(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gateway-load guess", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, guessUsage)
		fs.PrintDefaults()
	}
	server := fs.String("server", "http://127.0.0.1:8080", "gateway API")
	from := fs.String("from", "127.0.0.2", "loopback address the guesses come from")
	count := fs.Int("count", 200, "wrong tokens sent")
	concurrency := fs.Int("concurrency", 4, "guesses in flight")
	path := fs.String("path", "/v1/runs", "path each guess GETs")
	token := fs.String("token", "", "a valid token, tried from --check-from after the guesses")
	checkFrom := fs.String("check-from", "127.0.0.1", "address the valid token is tried from")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	_, err := serverAddr(*server)
	if err == nil && (*count < 1 || *concurrency < 1) {
		err = fmt.Errorf("--count and --concurrency must be at least 1")
	}
	var guesser, checker *net.Dialer
	if err == nil {
		guesser, err = dialerFrom(*from)
	}
	if err == nil {
		checker, err = dialerFrom(*checkFrom)
	}
	if err != nil {
		fmt.Fprintln(stderr, "gateway-load guess:", err)
		return exitUsage
	}
	target := strings.TrimRight(*server, "/") + *path
	ask := func(d *net.Dialer, tok string) (string, string) {
		c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
		if err != nil {
			return "error", ""
		}
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := c.Do(req)
		if err != nil {
			return "error", ""
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return strconv.Itoa(resp.StatusCode), resp.Header.Get("Retry-After")
	}
	var (
		mu         sync.Mutex
		outcomes   = map[string]int{}
		first429   = 0
		retryAfter string
		next       atomic.Int64
	)
	t0 := time.Now()
	var wg sync.WaitGroup
	for range *concurrency {
		wg.Go(func() {
			for {
				n := int(next.Add(1))
				if n > *count || ctx.Err() != nil {
					return
				}
				status, ra := ask(guesser, fmt.Sprintf("wrong-%d", n))
				mu.Lock()
				outcomes[status]++
				if status == "429" && (first429 == 0 || n < first429) {
					first429, retryAfter = n, ra
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(t0)
	fmt.Fprintf(stdout, "wrong tokens from %s: %d in %s; answers: %s\n", *from, *count, elapsed.Round(time.Millisecond), summary(outcomes))
	if first429 > 0 {
		fmt.Fprintf(stdout, "first 429 at guess %d, Retry-After %s s\n", first429, retryAfter)
	}
	if *token != "" {
		status, _ := ask(checker, *token)
		fmt.Fprintf(stdout, "valid token from %s afterwards: %s\n", *checkFrom, status)
	}
	return exitOK
}
