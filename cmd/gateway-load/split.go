package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/chaingate/gateway/chain"
)

const splitUsage = `Usage: gateway-load split --gateway PATH [flags]

Runs one split of --items items through the echo provider, distributed from
one "gateway serve --no-worker" to --workers "gateway worker" processes over
RabbitMQ and Redis, then the same split in local mode in the same gateway,
and prints items/s end to end (POST to the run's end), the peak RSS of each
process, and the CPU time each process and the servers used. Nothing is
timed before every worker says it is ready, and each mode first runs a
one-item split, untimed. --item-shape object makes each item a 60-byte
object instead of an integer. --repeat N then times N more splits in each
mode, taking turns, and prints the median of each: the figure to quote for a
small split, where one run is mostly noise.

`

// splitConfig is the config the gateway and its workers run; DIR is the
// load's directory.
const splitConfig = `
[gateway]
state = "bolt://DIR/gateway.db"
shutdown_grace_seconds = 5
[gateway.limits]
max_request_bytes = 268435456
max_split_items = 10000000
max_body_bytes = 268435456

[gateway.fanout]
rabbitmq_url = %q
redis_url = %q
prefix = %q
batch_size = %d
max_in_flight = %d
prefetch = %d
worker_concurrency = %d

[[providers]]
name = "echo"
type = "echo"

[[chains]]
name = "distributed"
[[chains.steps]]
name = "loop"
[chains.steps.split]
mode = "distributed"
items = "<<origin.payload.items>>"
[[chains.steps.split.steps]]
name = "echo"
provider = "echo"
payload_template = { i = "<<item>>" }

[[chains]]
name = "local"
[[chains.steps]]
name = "loop"
[chains.steps.split]
mode = "local"
max_concurrency = 256
items = "<<origin.payload.items>>"
[[chains.steps.split.steps]]
name = "echo"
provider = "echo"
payload_template = { i = "<<item>>" }
`

func runSplit(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gateway-load split", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, splitUsage)
		fs.PrintDefaults()
	}
	gatewayBin := fs.String("gateway", "", "the gateway binary (go build -o /tmp/gateway ./cmd/gateway)")
	items := fs.Int("items", 100_000, "items in the split")
	shape := fs.String("item-shape", "int", `what each item is: int (its index), or object ({"name": "host-0000001", "status": "up", "zone": "eu-west-1a"}, about 60 bytes)`)
	workers := fs.Int("workers", 2, "gateway worker processes")
	rabbit := fs.String("rabbitmq", "amqp://guest:guest@127.0.0.1:5672/", "RabbitMQ URL")
	redisURL := fs.String("redis", "redis://127.0.0.1:6379/0", "Redis URL")
	batch := fs.Int("batch-size", chain.DefaultFanoutBatchSize, "the most items per message (the [fanout] batch_size)")
	inFlight := fs.Int("max-in-flight", chain.DefaultFanoutMaxInFlight, "items out and not yet done")
	prefetch := fs.Int("prefetch", chain.DefaultFanoutPrefetch, "messages a worker holds")
	concurrency := fs.Int("worker-concurrency", chain.DefaultFanoutWorkerConcurrency, "items a worker runs at once")
	local := fs.Bool("local", true, "run the same split in local mode too, for the ratio")
	repeat := fs.Int("repeat", 0, "time this many more splits in each mode, in turns, and print the medians")
	profiles := fs.String("profile", "", "write a CPU profile of each process to this directory (the gateway's covers the local run too)")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	var problems []string
	if *gatewayBin == "" {
		problems = append(problems, "--gateway is required")
	} else if _, err := os.Stat(*gatewayBin); err != nil {
		problems = append(problems, fmt.Sprintf("--gateway: %v", err))
	}
	if *items < 1 || *workers < 1 || *batch < 1 || *inFlight < *batch || *prefetch < 1 || *concurrency < 1 {
		problems = append(problems, "--items, --workers, --batch-size, --prefetch and --worker-concurrency must be at least 1, --max-in-flight at least --batch-size")
	}
	if *repeat < 0 || (*repeat > 0 && !*local) {
		problems = append(problems, "--repeat is 0 or more, and needs --local")
	}
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintln(stderr, "gateway-load split:", p)
		}
		return exitUsage
	}
	dir, err := os.MkdirTemp("", "gateway-load-split-")
	if err != nil {
		fmt.Fprintln(stderr, "gateway-load split:", err)
		return exitFailed
	}
	defer os.RemoveAll(dir)
	var r [6]byte
	_, _ = rand.Read(r[:])
	prefix := "chaingate.load." + hex.EncodeToString(r[:]) + "."
	defer deleteQueues(*rabbit, prefix)
	cfg := filepath.Join(dir, "load.toml")
	text := strings.ReplaceAll(fmt.Sprintf(splitConfig, *rabbit, *redisURL, prefix, *batch, *inFlight, *prefetch, *concurrency), "DIR", dir)
	if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
		fmt.Fprintln(stderr, "gateway-load split:", err)
		return exitFailed
	}

	profile := func(name string) []string {
		if *profiles == "" {
			return nil
		}
		return []string{"--cpuprofile", filepath.Join(*profiles, name+".pprof")}
	}
	gw, err := startProc(ctx, *gatewayBin, dir, "gateway", append([]string{"serve", "--config", cfg, "--listen", "127.0.0.1:0", "--no-worker", "--log-level", "warn"}, profile("gateway")...)...)
	if err != nil {
		fmt.Fprintln(stderr, "gateway-load split:", err)
		return exitFailed
	}
	defer gw.stop()
	procs := []*proc{gw}
	for i := range *workers {
		name := fmt.Sprintf("worker-%d", i+1)
		w, err := startProc(ctx, *gatewayBin, dir, name, append([]string{"worker", "--config", cfg, "--log-level", "warn"}, profile(name)...)...)
		if err != nil {
			fmt.Fprintln(stderr, "gateway-load split:", err)
			return exitFailed
		}
		defer w.stop()
		procs = append(procs, w)
	}

	if *shape != "int" && *shape != "object" {
		fmt.Fprintln(stderr, "gateway-load split: --item-shape is int or object")
		return exitUsage
	}
	payload := splitPayload(*items, *shape)

	fmt.Fprintf(stdout, "split of %d %s items, echo provider; 1 gateway and %d workers; batch %d, max in flight %d, prefetch %d, worker concurrency %d\n",
		*items, *shape, *workers, *batch, *inFlight, *prefetch, *concurrency)
	for _, p := range procs {
		p.resetPeak()
	}
	servers := serverPIDs()
	// Each mode first runs a one-item split, untimed, so what is timed is
	// the split and not the first use of a connection or a plugin.
	if _, err := runOnce(ctx, gw.url, "distributed", splitPayload(1, *shape)); err != nil {
		fmt.Fprintln(stderr, "gateway-load split: warming up:", err)
		return exitFailed
	}
	cpu0 := cpuOf(procs, servers)
	stopSampling := sampleAnon(procs)
	took, err := runOnce(ctx, gw.url, "distributed", payload)
	stopSampling()
	if err != nil {
		fmt.Fprintln(stderr, "gateway-load split:", err)
		fmt.Fprintf(stderr, "gateway log:\n%s\n", gw.logs.String())
		return exitFailed
	}
	cpu1 := cpuOf(procs, servers)
	fmt.Fprintf(stdout, "distributed: %s, %.0f items/s end to end\n", took.Round(time.Millisecond), float64(*items)/took.Seconds())
	for _, p := range procs {
		fmt.Fprintf(stdout, "  %-10s peak RSS %4d MiB, of it anonymous %4d MiB (plugins %d MiB)\n", p.name, p.peak()>>20, p.anonPeak>>20, p.pluginPeak()>>20)
	}
	fmt.Fprintf(stdout, "  CPU during the split (of %s wall, 2 cores = %s):\n", took.Round(time.Millisecond), (2 * took).Round(time.Millisecond))
	for _, k := range cpuOrder(cpu1) {
		fmt.Fprintf(stdout, "    %-22s %8s\n", k, (cpu1[k] - cpu0[k]).Round(time.Millisecond))
	}
	if *local {
		if _, err := runOnce(ctx, gw.url, "local", splitPayload(1, *shape)); err != nil {
			fmt.Fprintln(stderr, "gateway-load split: warming up:", err)
			return exitFailed
		}
		gw.resetPeak()
		gw.anonPeak = 0
		stopSampling := sampleAnon([]*proc{gw})
		lt, err := runOnce(ctx, gw.url, "local", payload)
		stopSampling()
		if err != nil {
			fmt.Fprintln(stderr, "gateway-load split:", err)
			return exitFailed
		}
		fmt.Fprintf(stdout, "local:       %s, %.0f items/s end to end; gateway peak RSS %d MiB, of it anonymous %d MiB (plugins %d MiB)\n",
			lt.Round(time.Millisecond), float64(*items)/lt.Seconds(), gw.peak()>>20, gw.anonPeak>>20, gw.pluginPeak()>>20)
		fmt.Fprintf(stdout, "distributed / local: %.2f\n", lt.Seconds()/took.Seconds())
	}
	if *repeat > 0 {
		var dist, loc []time.Duration
		for range *repeat {
			for _, mode := range []string{"distributed", "local"} {
				t, err := runOnce(ctx, gw.url, mode, payload)
				if err != nil {
					fmt.Fprintln(stderr, "gateway-load split:", err)
					return exitFailed
				}
				if mode == "local" {
					loc = append(loc, t)
				} else {
					dist = append(dist, t)
				}
			}
		}
		d, l := median(dist), median(loc)
		fmt.Fprintf(stdout, "%d more of each, in turns: distributed median %s (%s to %s), local median %s (%s to %s); distributed / local: %.2f\n",
			*repeat, ms(d), ms(slices.Min(dist)), ms(slices.Max(dist)), ms(l), ms(slices.Min(loc)), ms(slices.Max(loc)), l.Seconds()/d.Seconds())
	}
	return exitOK
}

func ms(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }

// median is the middle of ds, or the mean of the two middle ones.
func median(ds []time.Duration) time.Duration {
	s := slices.Sorted(slices.Values(ds))
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// runOnce starts a run and waits for it to end; it returns how long that
// took, or why the run did not succeed.
func runOnce(ctx context.Context, server, chain string, payload []byte) (time.Duration, error) {
	start := time.Now()
	resp, err := http.Post(server+"/v1/chains/"+chain+"/runs", "application/json", bytes.NewReader(payload))
	if err != nil {
		return 0, fmt.Errorf("starting the run: %w", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var started struct {
		ID string `json:"id"`
	}
	if resp.StatusCode != http.StatusAccepted || json.Unmarshal(body, &started) != nil {
		return 0, fmt.Errorf("starting the run: %s %.300s", resp.Status, body)
	}
	// The run's event stream says when it ends, without reading the run,
	// whose record holds the large origin, again and again.
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, server+"/v1/runs/"+url.PathEscape(started.ID)+"/events", nil)
	if err != nil {
		return 0, err
	}
	ev, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("following the run: %w", err)
	}
	defer ev.Body.Close()
	sc := bufio.NewScanner(ev.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		typ, ok := strings.CutPrefix(sc.Text(), "event: ")
		if !ok {
			continue
		}
		switch typ {
		case "run_succeeded":
			return time.Since(start), nil
		case "run_failed", "run_cancelled", "run_timed_out":
			return 0, fmt.Errorf("run %s ended: %s", started.ID, typ)
		}
	}
	return 0, fmt.Errorf("the event stream of run %s ended before the run: %v", started.ID, sc.Err())
}

// proc is a gateway or worker process of the load.
type proc struct {
	name string
	cmd  *exec.Cmd
	url  string
	logs *bytes.Buffer
	// anonPeak is the most anonymous memory seen: RSS less the pages of
	// mapped files, such as the store's.
	anonPeak int64
}

// sampleAnon follows the anonymous memory of procs until the returned func
// is called.
func sampleAnon(procs []*proc) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			for _, p := range procs {
				p.anonPeak = max(p.anonPeak, statusBytes(p.cmd.Process.Pid, "RssAnon:"))
				if os.Getenv("LOAD_TRACE") != "" {
					fmt.Fprintf(os.Stderr, "%s %s anon %d file %d\n", time.Now().Format("05.000"), p.name, statusBytes(p.cmd.Process.Pid, "RssAnon:")>>20, statusBytes(p.cmd.Process.Pid, "RssFile:")>>20)
				}
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() { close(done); <-finished }
}

func startProc(ctx context.Context, bin, dir, name string, args ...string) (*proc, error) {
	p := &proc{name: name, cmd: exec.CommandContext(ctx, bin, args...), logs: &bytes.Buffer{}}
	p.cmd.Dir = dir
	p.cmd.Stderr = p.logs
	if os.Getenv("LOAD_TRACE") != "" {
		p.cmd.Stderr = io.MultiWriter(p.logs, prefixed(name))
	}
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	sc := bufio.NewScanner(out)
	if args[0] == "serve" {
		if !sc.Scan() {
			_ = p.cmd.Wait()
			return nil, fmt.Errorf("%s did not start: %s", name, p.logs)
		}
		p.url, _ = strings.CutPrefix(sc.Text(), "gateway: serving on ")
	}
	if args[0] == "worker" {
		// Nothing is timed before every worker is connected and has its
		// plugins started.
		for {
			if !sc.Scan() {
				_ = p.cmd.Wait()
				return nil, fmt.Errorf("%s did not get ready: %s", name, p.logs)
			}
			if strings.HasPrefix(sc.Text(), "gateway worker: ready") {
				break
			}
		}
	}
	go func() {
		for sc.Scan() {
		}
	}()
	return p, nil
}

func (p *proc) stop() {
	_ = p.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}

func (p *proc) pids() []int { return append([]int{p.cmd.Process.Pid}, children(p.cmd.Process.Pid)...) }

// resetPeak restarts the peak RSS of the process and its plugins.
func (p *proc) resetPeak() {
	for _, pid := range p.pids() {
		_ = os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
	}
}

func (p *proc) peak() int64 { return statusBytes(p.cmd.Process.Pid, "VmHWM:") }

func (p *proc) pluginPeak() int64 {
	var n int64
	for _, pid := range children(p.cmd.Process.Pid) {
		n += statusBytes(pid, "VmHWM:")
	}
	return n
}

func statusBytes(pid int, field string) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, field); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// children lists the processes whose parent is pid.
func children(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		c, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if stat := procStat(c); len(stat) > 1 && stat[1] == strconv.Itoa(pid) {
			out = append(out, c)
		}
	}
	return out
}

// procStat returns the fields of /proc/PID/stat after the command name.
func procStat(pid int) []string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	s := string(data)
	return strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
}

// cpuTime is the user and system time a process used so far.
func cpuTime(pid int) time.Duration {
	f := procStat(pid)
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * time.Second / 100 // clock ticks at USER_HZ = 100
}

// serverPIDs finds Redis and RabbitMQ on this machine, by command name.
func serverPIDs() map[string][]int {
	out := map[string][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		switch name := strings.TrimSpace(string(comm)); {
		case name == "redis-server":
			out["redis-server"] = append(out["redis-server"], pid)
		case name == "beam.smp":
			out["rabbitmq (beam.smp)"] = append(out["rabbitmq (beam.smp)"], pid)
		}
	}
	return out
}

func cpuOf(procs []*proc, servers map[string][]int) map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, p := range procs {
		out[p.name] += cpuTime(p.cmd.Process.Pid)
		for _, c := range children(p.cmd.Process.Pid) {
			out[p.name+" plugins"] += cpuTime(c)
		}
	}
	for name, pids := range servers {
		for _, pid := range pids {
			out[name] += cpuTime(pid)
		}
	}
	return out
}

func cpuOrder(m map[string]time.Duration) []string {
	return slices.Sorted(maps.Keys(m))
}

// deleteQueues removes the load's queues from RabbitMQ.
func deleteQueues(rabbit, prefix string) {
	conn, err := amqp.Dial(rabbit)
	if err != nil {
		return
	}
	defer conn.Close()
	for _, q := range []string{prefix + "items", prefix + "items.dead"} {
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		if _, err := ch.QueueDelete(q, false, false, false); err != nil && !errors.Is(err, amqp.ErrClosed) {
			continue
		}
		_ = ch.Close()
	}
}

func prefixed(name string) io.Writer {
	pr, pw := io.Pipe()
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			fmt.Fprintf(os.Stderr, "%s: %s\n", name, sc.Text())
		}
	}()
	return pw
}

// splitPayload is a run payload whose items array holds n items of shape
// int or object.
func splitPayload(n int, shape string) []byte {
	var b bytes.Buffer
	b.WriteString(`{"items":[`)
	zones := []string{"eu-west-1a", "eu-west-1b", "us-east-1a"}
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		if shape == "object" {
			fmt.Fprintf(&b, `{"name":"host-%07d","status":"up","zone":%q}`, i, zones[i%len(zones)])
			continue
		}
		b.WriteString(strconv.Itoa(i))
	}
	b.WriteString(`]}`)
	return b.Bytes()
}
