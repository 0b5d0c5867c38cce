package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

const doorUsage = `Usage: gateway-load door [flags]

Measures a gateway's door: what an Alertmanager trigger does with alerts
arriving together.

With --alerts N, it posts one notification holding N alerts and prints how
long the answer took, what it said of the alerts (started, queued, parked)
and how long the gateway took to start every alert it took.

With --keys K --copies C, it posts K notifications of one alert each, C
identical copies of each at once (as the members of an Alertmanager HA
pair do, C = 2), spread over the --server URLs in turn, and checks that
the copies of a key named one run (an answer "queued", kept to be started
after it, names none by design), that no answer was an error, and, whatever
else it found, that the gateway called each provider as many times per run
as the chain has steps (--steps).

`

// doorAlert is one Alertmanager alert, in the notification's alerts.
const doorAlert = `{"status":"firing","labels":{"alertname":"Door","instance":"host-%[1]d","severity":"critical"},` +
	`"annotations":{"summary":"door load"},"startsAt":"%[2]s","endsAt":"0001-01-01T00:00:00Z","generatorURL":"","fingerprint":"door-%[3]s-%[1]d"}`

func runDoor(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gateway-load door", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, doorUsage); fs.PrintDefaults() }
	servers := fs.String("server", "http://127.0.0.1:8080", "gateway API, or several comma-separated gateways sharing a store")
	token := fs.String("token", "", "bearer token: the API's, or the trigger's own")
	trigger := fs.String("trigger", "alerts", "Alertmanager trigger to post to")
	alerts := fs.Int("alerts", 0, "post one notification of this many alerts")
	keys := fs.Int("keys", 0, "post this many notifications of one alert each")
	copies := fs.Int("copies", 2, "identical copies of each notification sent at once")
	steps := fs.Int("steps", 3, "steps each run of the trigger's chain calls a provider for")
	inFlight := fs.Int("keys-at-once", 8, "keys whose copies are in flight at once: a gateway takes at most max_connections_per_address (default 128) connections from this one address")
	wait := fs.Duration("wait", 5*time.Minute, "how long to wait for the runs to start")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	var urls []string
	for _, s := range strings.Split(*servers, ",") {
		if u, err := url.Parse(s); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			fmt.Fprintf(stderr, "gateway-load door: --server %q is not an http:// or https:// URL\n", s)
			return exitUsage
		}
		urls = append(urls, strings.TrimRight(s, "/"))
	}
	if (*alerts > 0) == (*keys > 0) {
		fmt.Fprintln(stderr, "gateway-load door: give --alerts or --keys")
		return exitUsage
	}
	if *copies < 1 || *steps < 1 || *inFlight < 1 {
		fmt.Fprintln(stderr, "gateway-load door: --copies, --steps and --keys-at-once must be at least 1")
		return exitUsage
	}
	// Every request in flight keeps its connection for the next, as
	// Alertmanager's do: the default of two idle connections per host would
	// have most requests dial anew and measure that instead.
	client := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: *inFlight * *copies}}
	d := &doorLoad{urls: urls, token: *token, trigger: *trigger, client: client,
		stamp: time.Now().UTC().Format(time.RFC3339Nano), out: stdout}
	ctx, cancel := context.WithTimeout(ctx, *wait)
	defer cancel()
	var err error
	if *alerts > 0 {
		err = d.big(ctx, *alerts)
	} else {
		err = d.duplicates(ctx, *keys, *copies, *steps, *inFlight)
	}
	if err != nil {
		fmt.Fprintln(stderr, "gateway-load door:", err)
		return exitFailed
	}
	return exitOK
}

type doorLoad struct {
	urls    []string
	token   string
	trigger string
	client  *http.Client
	stamp   string
	out     io.Writer
}

// doorAnswer is what the gateway answers a trigger's delivery.
type doorAnswer struct {
	Results []struct {
		Action string `json:"action"`
		Run    string `json:"run"`
	} `json:"results"`
	TruncatedAlerts int `json:"truncated_alerts"`
}

// post sends a notification of alerts numbered from first to one gateway.
func (d *doorLoad) post(ctx context.Context, server string, first, n int) (int, doorAnswer, time.Duration, error) {
	var b strings.Builder
	b.WriteString(`{"version":"4","groupKey":"{}:{alertname=\"Door\"}","status":"firing","receiver":"chaingate","groupLabels":{"alertname":"Door"},"alerts":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, doorAlert, first+i, d.stamp, d.stamp)
	}
	b.WriteString("]}")
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, server+"/v1/triggers/"+url.PathEscape(d.trigger), strings.NewReader(b.String()))
	req.Header.Set("Content-Type", "application/json")
	if d.token != "" {
		req.Header.Set("Authorization", "Bearer "+d.token)
	}
	began := time.Now()
	resp, err := d.client.Do(req)
	if err != nil {
		return 0, doorAnswer{}, time.Since(began), err
	}
	defer resp.Body.Close()
	var a doorAnswer
	body, err := io.ReadAll(resp.Body)
	took := time.Since(began)
	if err == nil {
		err = json.Unmarshal(body, &a)
	}
	if err != nil {
		return resp.StatusCode, a, took, fmt.Errorf("reading the answer (%d): %w: %.200s", resp.StatusCode, err, body)
	}
	return resp.StatusCode, a, took, nil
}

// big posts one notification of n alerts and follows its runs starting.
func (d *doorLoad) big(ctx context.Context, n int) error {
	before, err := d.metric(ctx, d.urls[0], "chaingate_trigger_deliveries_total", `outcome="started"`)
	if err != nil {
		return err
	}
	began := time.Now()
	code, a, took, err := d.post(ctx, d.urls[0], 0, n)
	if err != nil {
		return err
	}
	actions := map[string]int{}
	for _, r := range a.Results {
		actions[r.Action]++
	}
	fmt.Fprintf(d.out, "%d alerts in one notification: answered %d in %s: %s; truncated_alerts %d\n", n, code, took.Round(time.Millisecond), counts(actions), a.TruncatedAlerts)
	want := float64(actions["started"] + actions["queued"])
	for {
		got, err := d.metric(ctx, d.urls[0], "chaingate_trigger_deliveries_total", `outcome="started"`)
		if err != nil {
			return err
		}
		if got-before >= want {
			all := time.Since(began)
			fmt.Fprintf(d.out, "all %d runs started %s after the post: %.0f runs/s\n", int(want), all.Round(time.Millisecond), want/all.Seconds())
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%.0f of %.0f runs started before giving up", got-before, want)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// duplicates posts keys notifications, copies of each at once, inFlight
// keys at a time, and checks that each started one run whose steps were
// each called once.
func (d *doorLoad) duplicates(ctx context.Context, keys, copies, steps, inFlight int) error {
	calls := func() (float64, error) {
		sum := 0.0
		for _, u := range d.urls {
			v, err := d.metric(ctx, u, "chaingate_provider_calls_total", "")
			if err != nil {
				return 0, err
			}
			sum += v
		}
		return sum, nil
	}
	before, err := calls()
	if err != nil {
		return err
	}
	type answer struct {
		code   int
		run    string
		action string
		err    error
	}
	answers := make([][]answer, keys)
	var latencies []time.Duration
	var mu sync.Mutex
	var wg sync.WaitGroup
	began := time.Now()
	slots := make(chan struct{}, inFlight)
	for k := range keys {
		answers[k] = make([]answer, copies)
		slots <- struct{}{}
		var key sync.WaitGroup
		for c := range copies {
			key.Add(1)
			wg.Go(func() {
				defer key.Done()
				code, a, took, err := d.post(ctx, d.urls[(k+c)%len(d.urls)], k, 1)
				run, action := "", ""
				if len(a.Results) == 1 {
					run, action = a.Results[0].Run, a.Results[0].Action
				}
				answers[k][c] = answer{code, run, action, err}
				mu.Lock()
				latencies = append(latencies, took)
				mu.Unlock()
			})
		}
		go func() { key.Wait(); <-slots }()
	}
	wg.Wait()
	codes := map[string]int{}
	runs := map[string]bool{}
	queued := 0
	var problems []string
	for k, as := range answers {
		named := ""
		for _, a := range as {
			codes[strconv.Itoa(a.code)]++
			switch {
			case a.err != nil:
				problems = append(problems, fmt.Sprintf("key %d: %v", k, a.err))
			case a.code != http.StatusOK && a.code != http.StatusAccepted:
				problems = append(problems, fmt.Sprintf("key %d: answered %d", k, a.code))
			case a.run == "" && a.action == "queued":
				// Kept and started after the answer, by design: the
				// calls below count it.
				queued++
			case a.run == "":
				problems = append(problems, fmt.Sprintf("key %d: an answer (%s) names no run", k, a.action))
			case named != "" && a.run != named:
				problems = append(problems, fmt.Sprintf("key %d: answers name runs %q and %q", k, named, a.run))
			default:
				named = a.run
				runs[a.run] = true
			}
		}
	}
	slices.Sort(latencies)
	fmt.Fprintf(d.out, "%d keys × %d copies at once over %d gateway(s) in %s: answers %s; %d runs named, %d answers queued; answer p50 %s, max %s\n",
		keys, copies, len(d.urls), time.Since(began).Round(time.Millisecond), counts(codes), len(runs), queued,
		latencies[len(latencies)/2].Round(time.Millisecond), latencies[len(latencies)-1].Round(time.Millisecond))
	want := float64(keys * steps)
	var got float64
	for {
		after, err := calls()
		if err != nil {
			return err
		}
		got = after - before
		if got >= want {
			break
		}
		select {
		case <-ctx.Done():
			problems = append(problems, fmt.Sprintf("%.0f of %.0f provider calls made before giving up", got, want))
			return fmt.Errorf("%d problems: %s", len(problems), strings.Join(problems[:min(len(problems), 10)], "; "))
		case <-time.After(100 * time.Millisecond):
		}
	}
	time.Sleep(time.Second) // a step called twice shows up late
	after, err := calls()
	if err != nil {
		return err
	}
	fmt.Fprintf(d.out, "provider calls: %.0f for %d runs of %d steps (want %.0f)\n", after-before, keys, steps, want)
	if after-before != want {
		problems = append(problems, fmt.Sprintf("%.0f provider calls, want %.0f", after-before, want))
	}
	if len(runs) > keys {
		problems = append(problems, fmt.Sprintf("%d runs named for %d keys", len(runs), keys))
	}
	if len(problems) > 0 {
		return fmt.Errorf("%d problems: %s", len(problems), strings.Join(problems[:min(len(problems), 10)], "; "))
	}
	return nil
}

// metric sums a metric's series on a gateway whose labels include match.
func (d *doorLoad) metric(ctx context.Context, server, name, match string) (float64, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, server+"/metrics", nil)
	if d.token != "" {
		req.Header.Set("Authorization", "Bearer "+d.token)
	}
	resp, err := d.client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("reading metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("reading metrics: %s", resp.Status)
	}
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || !strings.Contains(line, match) {
			continue
		}
		if rest := line[len(name):]; rest == "" || (rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err == nil {
			sum += v
		}
	}
	return sum, sc.Err()
}

// counts lists counts by key, most frequent first.
func counts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return m[b] - m[a] })
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d %s", m[k], k)
	}
	return strings.Join(parts, ", ")
}
