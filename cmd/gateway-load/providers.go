package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/plugins/host"
	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/builtin"
	"github.com/chaingate/gateway/providers/opsgenie/opsgenietest"
	"github.com/chaingate/gateway/providers/pagerduty/pagerdutytest"
	"github.com/chaingate/gateway/providers/slack/slacktest"
	"github.com/chaingate/gateway/providers/webhook/webhooktest"
)

// loadServer is a provider's local test server as the load needs it.
type loadServer interface {
	Record(on bool)
	Count() int
	Close()
}

// providerCase is one HTTP-based provider driven against its test server.
type providerCase struct {
	typ, action, payload string
	// start starts the test server and returns it with the provider config
	// pointing at it; secret is the config with its credential read from
	// the LOAD_CREDENTIAL secret, for the run mode.
	start func() (srv loadServer, config, secret string)
}

var providerCases = []providerCase{
	{typ: "slack", action: "post_message", payload: `{"channel":"C0123456789","text":"disk-full on db-1"}`,
		start: func() (loadServer, string, string) {
			s := slacktest.NewServer()
			return s, fmt.Sprintf(`{"token":%q,"base_url":%q}`, slacktest.Token, s.BaseURL()),
				fmt.Sprintf(`token = "<<secrets.LOAD_CREDENTIAL>>"`+"\n"+`base_url = %q`, s.BaseURL())
		}},
	{typ: "pagerduty", action: "trigger", payload: `{"summary":"disk-full on db-1","source":"db-1","severity":"critical"}`,
		start: func() (loadServer, string, string) {
			s := pagerdutytest.NewServer()
			return s, fmt.Sprintf(`{"routing_key":%q,"base_url":%q}`, pagerdutytest.RoutingKey, s.URL),
				fmt.Sprintf(`routing_key = "<<secrets.LOAD_CREDENTIAL>>"`+"\n"+`base_url = %q`, s.URL)
		}},
	{typ: "opsgenie", action: "create_alert", payload: `{"message":"disk-full on db-1"}`,
		start: func() (loadServer, string, string) {
			s := opsgenietest.NewServer()
			return s, fmt.Sprintf(`{"api_key":%q,"base_url":%q}`, opsgenietest.APIKey, s.URL),
				fmt.Sprintf(`api_key = "<<secrets.LOAD_CREDENTIAL>>"`+"\n"+`base_url = %q`, s.URL)
		}},
	{typ: "webhook", action: "post", payload: `{"alert":"disk-full","host":"db-1"}`,
		start: func() (loadServer, string, string) {
			s := webhooktest.NewServer()
			return s, fmt.Sprintf(`{"url":%q,"secret":%q}`, s.URL+"/hooks/alerts", webhooktest.Secret),
				fmt.Sprintf(`url = %q`+"\n"+`secret = "<<secrets.LOAD_CREDENTIAL>>"`, s.URL+"/hooks/alerts")
		}},
}

func credential(typ string) string {
	switch typ {
	case "slack":
		return slacktest.Token
	case "pagerduty":
		return pagerdutytest.RoutingKey
	case "opsgenie":
		return opsgenietest.APIKey
	default:
		return webhooktest.Secret
	}
}

// measurement is what one mode of one provider achieved.
type measurement struct {
	calls     int
	elapsed   time.Duration
	latencies []time.Duration
	failures  int
	firstErr  error
}

func (m measurement) rate() float64 { return float64(m.calls) / m.elapsed.Seconds() }

func (m measurement) pct(p float64) time.Duration {
	if len(m.latencies) == 0 {
		return 0
	}
	return m.latencies[int(float64(len(m.latencies)-1)*p)]
}

// runProviders measures each HTTP-based provider against its local test
// server three ways, each with the same number of callers: Execute called
// in this process (no plugin hop), Execute through the plugin subprocess,
// and whole one-step runs through a gateway with its embedded store.
func runProviders(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gateway-load providers", flag.ContinueOnError)
	fs.SetOutput(stderr)
	bin := fs.String("gateway", "", "gateway binary, re-executed to serve the built-in providers (required)")
	concurrency := fs.Int("concurrency", 100, "callers, and concurrent runs in the run mode")
	duration := fs.Duration("duration", 5*time.Second, "how long to measure each mode")
	warmup := fs.Duration("warmup", time.Second, "load driven before measuring each mode")
	only := fs.String("providers", "", "comma-separated providers to measure (default: all)")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if *bin == "" || *concurrency < 1 || *duration <= 0 || *warmup < 0 {
		fmt.Fprintln(stderr, "gateway-load providers: --gateway is required; --concurrency and --duration must be positive")
		return exitUsage
	}
	exe, err := filepath.Abs(*bin)
	if err != nil {
		fmt.Fprintln(stderr, "gateway-load providers:", err)
		return exitUsage
	}
	cases := providerCases
	if *only != "" {
		want := strings.Split(*only, ",")
		cases = slices.DeleteFunc(slices.Clone(cases), func(c providerCase) bool { return !slices.Contains(want, c.typ) })
	}
	fmt.Fprintf(stdout, "%d callers, %s per mode after %s of warm-up\n", *concurrency, *duration, *warmup)
	fmt.Fprintf(stdout, "%-10s %-7s %10s %9s %9s %9s\n", "provider", "mode", "calls/s", "p50", "p99", "failed")
	code := exitOK
	for _, c := range cases {
		res, err := measureProvider(ctx, c, exe, *concurrency, *warmup, *duration)
		if err != nil {
			fmt.Fprintf(stderr, "gateway-load providers: %s: %v\n", c.typ, err)
			code = exitFailed
			continue
		}
		for _, mode := range []string{"direct", "plugin", "run"} {
			m := res[mode]
			fmt.Fprintf(stdout, "%-10s %-7s %10.0f %9s %9s %9d\n", c.typ, mode, m.rate(),
				m.pct(0.5).Round(10*time.Microsecond), m.pct(0.99).Round(10*time.Microsecond), m.failures)
			if m.firstErr != nil {
				fmt.Fprintf(stderr, "gateway-load providers: %s %s: first error: %v\n", c.typ, mode, m.firstErr)
				code = exitFailed
			}
		}
		d, p := res["direct"], res["plugin"]
		fmt.Fprintf(stdout, "%-10s plugin hop: %.2f× the direct calls/s, p50 %.2f× the direct p50\n", c.typ, p.rate()/d.rate(),
			float64(p.pct(0.5))/float64(d.pct(0.5)))
	}
	return code
}

func measureProvider(ctx context.Context, c providerCase, exe string, concurrency int, warmup, duration time.Duration) (map[string]measurement, error) {
	srv, config, secretConfig := c.start()
	defer srv.Close()
	srv.Record(false)
	res := map[string]measurement{}

	direct, _ := builtin.New(c.typ)
	res["direct"] = drive(ctx, concurrency, warmup, duration, callWith(direct, c, config))

	m := host.NewManager(host.Options{Executable: exe})
	defer m.Close()
	res["plugin"] = drive(ctx, concurrency, warmup, duration, callWith(m.Provider(host.Spec{Name: c.typ, Builtin: c.typ}), c, config))

	runs, err := runMode(ctx, c, exe, secretConfig, concurrency, warmup, duration)
	if err != nil {
		return nil, err
	}
	res["run"] = runs
	if srv.Count() == 0 {
		return nil, errors.New("the test server saw no request")
	}
	return res, nil
}

// callWith returns a call of p with a dedup key of its own each time, as
// each step of each run has.
func callWith(p providers.Provider, c providerCase, config string) func(context.Context, int64) error {
	return func(ctx context.Context, n int64) error {
		_, err := p.Execute(ctx, providers.Request{
			ActionType: c.action, Payload: json.RawMessage(c.payload), Config: json.RawMessage(config),
			DedupKey: fmt.Sprintf("load-%d/notify", n), Attempt: 1, RunID: fmt.Sprintf("load-%d", n), Step: "notify",
		})
		return err
	}
}

// runMode drives whole runs of a one-step chain calling the provider,
// through a gateway on its own embedded store.
func runMode(ctx context.Context, c providerCase, exe, secretConfig string, concurrency int, warmup, duration time.Duration) (measurement, error) {
	dir, err := os.MkdirTemp("", "gateway-load-providers-")
	if err != nil {
		return measurement{}, err
	}
	defer os.RemoveAll(dir)
	cfgPath := filepath.Join(dir, "load.toml")
	toml := fmt.Sprintf(`
[[providers]]
name = %[1]q
type = %[1]q
[providers.config]
%[2]s

[[chains]]
name = "notify"
[[chains.steps]]
name = "notify"
provider = %[1]q
action_type = %[3]q
payload_template = %[4]s
`, c.typ, secretConfig, c.action, tomlInline(c.payload))
	if err := os.WriteFile(cfgPath, []byte(toml), 0o644); err != nil {
		return measurement{}, err
	}
	if err := os.Setenv("CHAINGATE_SECRET_LOAD_CREDENTIAL", credential(c.typ)); err != nil {
		return measurement{}, err
	}
	cfg, err := gateway.LoadConfig([]string{cfgPath})
	if err != nil {
		return measurement{}, err
	}
	gw, err := gateway.Open(ctx, gateway.Options{Config: cfg, State: filepath.Join(dir, "gw.db"), Executable: exe,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return measurement{}, err
	}
	defer gw.Close()
	return drive(ctx, concurrency, warmup, duration, func(ctx context.Context, _ int64) error {
		run, err := gw.Engine.Start(ctx, "notify", engine.Input{})
		if err != nil {
			return err
		}
		end, err := gw.Engine.Wait(ctx, run.ID)
		if err != nil {
			return err
		}
		if end.Status != store.RunSucceeded {
			return fmt.Errorf("run %s %s", end.ID, end.Status)
		}
		return nil
	}), nil
}

// tomlInline writes a flat JSON object of strings as a TOML inline table.
func tomlInline(obj string) string {
	var m map[string]string
	_ = json.Unmarshal([]byte(obj), &m)
	parts := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s = %q", k, m[k]))
	}
	return "{ " + strings.Join(parts, ", ") + " }"
}

// drive keeps concurrency callers busy for warmup+duration and measures
// what finished during duration.
func drive(ctx context.Context, concurrency int, warmup, duration time.Duration, call func(context.Context, int64) error) measurement {
	var (
		mu        sync.Mutex
		m         measurement
		measuring atomic.Bool
		seq       atomic.Int64
	)
	end := time.Now().Add(warmup + duration)
	var wg sync.WaitGroup
	for range concurrency {
		wg.Go(func() {
			for ctx.Err() == nil && time.Now().Before(end) {
				t0 := time.Now()
				err := call(ctx, seq.Add(1))
				took := time.Since(t0)
				if !measuring.Load() || time.Now().After(end) {
					continue
				}
				mu.Lock()
				if err != nil {
					m.failures++
					if m.firstErr == nil {
						m.firstErr = err
					}
				} else {
					m.calls++
					m.latencies = append(m.latencies, took)
				}
				mu.Unlock()
			}
		})
	}
	sleep(ctx, warmup)
	measuring.Store(true)
	start := time.Now()
	wg.Wait()
	m.elapsed = min(time.Since(start), duration)
	slices.Sort(m.latencies)
	return m
}
