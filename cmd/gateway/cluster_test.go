package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/store"
	redisstore "github.com/chaingate/gateway/chain/store/redis"
	"github.com/chaingate/gateway/internal/testutil"
	"github.com/chaingate/gateway/internal/testutil/redistest"
)

// These tests run several gateway processes on one Redis, as a team would
// when one machine is not enough.

// clusterLeaseTTL is short, for quick takeovers, and long enough that a
// start's lease outlives the moment to its first commit on a loaded
// machine (race detector, CPU hogs beside the suite).
const clusterLeaseTTL = 4

// clusterConfig is a chain of one parallel group of subs staggered
// sub-steps; lastSleep, when set, is the last one's sleep in ms.
func clusterConfig(dir string, subs, lastSleep int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `
[gateway]
lease_ttl_seconds = %d
shutdown_grace_seconds = 2

[[providers]]
name = "faulty"
type = "faulty"

[[chains]]
name = "fanout"
[[chains.steps]]
name = "notify"
[chains.steps.parallel]
`, clusterLeaseTTL)
	for i := range subs {
		sleep := 50 + i*600
		if i == subs-1 && lastSleep > 0 {
			sleep = lastSleep
		}
		fmt.Fprintf(&b, "[[chains.steps.parallel.steps]]\nname = \"s%d\"\nprovider = \"faulty\"\npayload_template = { record = %q, sleep_ms = %d }\n",
			i, filepath.Join(dir, "calls.jsonl"), sleep)
	}
	b.WriteString(`
[[chains.steps]]
name = "after"
provider = "faulty"
payload_template = { total = "<<steps.notify.body>>" }
`)
	return b.String()
}

// gatewayProc is one `gateway serve` process.
type gatewayProc struct {
	cmd  *exec.Cmd
	url  string
	logs *testutil.Buffer
	out  *bufio.Scanner
}

// startServe starts a gateway and returns once it serves.
func startServe(t testing.TB, cfg, state string) *gatewayProc {
	t.Helper()
	p := launchServe(t, cfg, state)
	p.waitServing(t)
	return p
}

// launchServe starts a gateway process without waiting for it.
func launchServe(t testing.TB, cfg, state string) *gatewayProc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "serve", "--config", cfg, "--state", state, "--listen", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), mainEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &gatewayProc{cmd: cmd, logs: &testutil.Buffer{}, out: bufio.NewScanner(out)}
	cmd.Stderr = p.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _, _ = cmd.Process.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
		}
	})
	return p
}

// waitServing reads the line that says where the gateway serves.
func (p *gatewayProc) waitServing(t testing.TB) {
	t.Helper()
	if !p.out.Scan() {
		t.Fatalf("gateway serve did not start:\n%s", p.logs)
	}
	addr, ok := strings.CutPrefix(p.out.Text(), "gateway: serving on ")
	if !ok {
		t.Fatalf("gateway serve said %q", p.out.Text())
	}
	// Nothing else comes on stdout; keep the pipe drained all the same.
	go func() {
		for p.out.Scan() {
		}
	}()
	p.url = addr
}

// waitLog waits for the gateway to log text.
func (p *gatewayProc) waitLog(t testing.TB, text string) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); !strings.Contains(p.logs.String(), text); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the gateway never logged %q:\n%s", text, p.logs)
		}
	}
}

func postRun(url, chain, body string) (string, error) {
	resp, err := http.Post(url+"/v1/chains/"+chain+"/runs", "application/json", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		b, _ := io.ReadAll(resp.Body)
		return "", fmt.Errorf("POST: %d %s", resp.StatusCode, b)
	}
	var out struct {
		ID string `json:"id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return "", fmt.Errorf("reading the answer: %w", err)
	}
	return out.ID, nil
}

// callCounts reads the record file: calls per dedup key.
func callCounts(t testing.TB, path string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for key, calls := range readRecords(t, path) {
		out[key] = len(calls)
	}
	return out
}

// TestThreeGatewaysShareRedis starts three gateways on one Redis, posts 300
// runs with parallel groups across them, kills one with SIGKILL mid-way,
// and checks that every run completes on the others and that no sub-step
// whose result was recorded before the kill was called again.
func TestThreeGatewaysShareRedis(t *testing.T) {
	t.Parallel()
	const runs, subs = 300, 4
	url := redistest.Open(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gateway.toml")
	// The last sub-step is still in flight at the kill, however loaded the
	// machine is.
	writeFile(t, cfg, clusterConfig(dir, subs, 8000))
	gws := []*gatewayProc{startServe(t, cfg, url), startServe(t, cfg, url), startServe(t, cfg, url)}

	owner := map[string]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, runs)
	for i := range runs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			gw := i % 3
			id, err := postRun(gws[gw].url, "fanout", `{}`)
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			owner[id] = gw
			mu.Unlock()
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// Kill gateway 0 once every sub-step has been called and the quicker
	// half of them have answered.
	calls := filepath.Join(dir, "calls.jsonl")
	deadline := time.Now().Add(60 * time.Second)
	for n := 0; n < runs*subs; n = len(callCounts(t, calls)) {
		if time.Now().After(deadline) {
			t.Fatalf("only %d calls made", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(900 * time.Millisecond)
	if err := gws[0].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, _ = gws[0].cmd.Process.Wait()
	killed := time.Now()

	// What had a recorded result at the moment of the kill.
	st, err := redisstore.OpenURL(context.Background(), url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	recorded := map[string]bool{}
	for id, gw := range owner {
		if gw != 0 {
			continue
		}
		steps, err := st.Steps(ctx, id, "notify/")
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range steps {
			if s.Status.Final() {
				recorded[id+"/"+s.Key] = true
			}
		}
	}
	// Read after what was recorded: a recorded step has no call after this.
	atKill := callCounts(t, calls)

	// Every run finishes, the killed gateway's on the other two.
	deadline = time.Now().Add(90 * time.Second)
	for {
		ids, err := st.UnfinishedRuns(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d runs never finished\ngateway 1:\n%s\ngateway 2:\n%s", len(ids), gws[1].logs, gws[2].logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	counts := callCounts(t, calls)
	taken := 0
	for id, gw := range owner {
		run, err := st.Run(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if run.Status != store.RunSucceeded {
			t.Errorf("run %s (gateway %d): %s %+v", id, gw, run.Status, run.Error)
		}
		// A machine loaded past the lease's TTL lets leases lapse, the
		// killed gateway's before the kill too, and each takeover sends the
		// call in flight at it again, as promised.
		evs, _ := st.Events(ctx, id, 0, 0)
		takeovers, beforeKill := 0, 0
		for _, ev := range evs {
			if ev.Type == store.EventRunResumed {
				takeovers++
				if ev.Time.Before(killed) {
					beforeKill++
				}
			}
		}
		if gw == 0 && takeovers > beforeKill {
			taken++
		}
		for i := range subs {
			key := fmt.Sprintf("%s/notify/s%d", id, i)
			switch n := counts[key]; {
			case n == 0:
				t.Errorf("%s was never called", key)
			case recorded[key] && n != atKill[key]:
				t.Errorf("%s had a recorded result before the kill but was called again after it: %d calls, %d at the kill", key, n, atKill[key])
			case recorded[key] && n > 1+beforeKill && !lostLease(gws, id):
				t.Errorf("%s had a recorded result before the kill but was called %d times, its run taken over %d times before the kill and its lease never lost", key, n, beforeKill)
			case gw != 0 && n > 1+takeovers:
				t.Errorf("%s, on a gateway that kept running, was called %d times, its run taken over %d times", key, n, takeovers)
			case n > 1 && (gw != 0 || beforeKill > 0):
				t.Logf("%s was called %d times, its run taken over %d times (%d before the kill) as leases lapsed under load", key, n, takeovers, beforeKill)
			}
		}
	}
	if taken == 0 {
		t.Error("no run was taken over from the killed gateway")
	}
	t.Logf("%d runs of the killed gateway were taken over; %d sub-steps had recorded results at the kill", taken, len(recorded))
}

// lostLease reports whether a gateway logged losing its lease on the run: a
// gateway that took the run over and lost it in turn before its first
// commit leaves no run_resumed event, only its call and this line.
func lostLease(gws []*gatewayProc, id string) bool {
	for _, gw := range gws {
		for _, l := range strings.Split(gw.logs.String(), "\n") {
			if strings.Contains(l, "lost the lease on the run") && strings.Contains(l, "run="+id) {
				return true
			}
		}
	}
	return false
}

// TestWaitFollowsRunOnAnotherGateway retries a POST with the same
// Idempotency-Key and ?wait= on a second gateway while the first runs it:
// the answer waits for the run to end there.
func TestWaitFollowsRunOnAnotherGateway(t *testing.T) {
	t.Parallel()
	url := redistest.Open(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gateway.toml")
	writeFile(t, cfg, clusterConfig(dir, 2, 0))
	a, b := startServe(t, cfg, url), startServe(t, cfg, url)
	post := func(gw *gatewayProc, query string) (int, map[string]any) {
		req, _ := http.NewRequest("POST", gw.url+"/v1/chains/fanout/runs"+query, strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "incident-7")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, out
	}
	code, first := post(a, "")
	if code != http.StatusAccepted {
		t.Fatalf("first POST: %d %v", code, first)
	}
	// The run's slower sub-step sleeps 650 ms on gateway a.
	code, again := post(b, "?wait=20s")
	run, _ := again["run"].(map[string]any)
	if code != http.StatusOK || again["id"] != first["id"] || again["replayed"] != true || again["status"] != "succeeded" || run == nil {
		t.Errorf("retry with wait on the other gateway: %d %v", code, again)
	}
}

// BenchmarkTakeover measures how long the runs of a gateway killed with
// SIGKILL wait before another gateway sharing the Redis store resumes them:
// from the kill to the first call the survivors dispatch again, against the
// lease TTL.
func BenchmarkTakeover(b *testing.B) {
	const runs, leaseTTL = 30, 2
	url := redistest.Open(b)
	for range b.N {
		b.StopTimer()
		dir := b.TempDir()
		cfg := filepath.Join(dir, "gateway.toml")
		calls := filepath.Join(dir, "calls.jsonl")
		writeFileTB(b, cfg, fmt.Sprintf(`
[gateway]
lease_ttl_seconds = %d
shutdown_grace_seconds = 1
[[providers]]
name = "faulty"
type = "faulty"
[[chains]]
name = "slow"
[[chains.steps]]
name = "wait"
provider = "faulty"
payload_template = { record = %q, sleep_ms = 60000 }
`, leaseTTL, calls))
		victim, a, c := startServe(b, cfg, url), startServe(b, cfg, url), startServe(b, cfg, url)
		_, _ = a, c
		for range runs {
			if _, err := postRun(victim.url, "slow", `{}`); err != nil {
				b.Fatal(err)
			}
		}
		for deadline := time.Now().Add(60 * time.Second); len(callCounts(b, calls)) < runs; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				b.Fatalf("only %d of %d runs called the provider", len(callCounts(b, calls)), runs)
			}
		}
		b.StartTimer()
		killed := time.Now()
		_ = victim.cmd.Process.Signal(syscall.SIGKILL)
		// Every run was called once; the first second call is a takeover.
		for deadline := killed.Add(10 * leaseTTL * time.Second); total(callCounts(b, calls)) == runs; time.Sleep(2 * time.Millisecond) {
			if time.Now().After(deadline) {
				b.Fatalf("no run was taken over within %s of the kill", time.Since(killed).Round(time.Millisecond))
			}
		}
		took := time.Since(killed)
		b.StopTimer()
		b.ReportMetric(float64(took.Milliseconds()), "ms-to-takeover")
		b.ReportMetric(float64(leaseTTL*1000), "lease-ttl-ms")
		_, _ = victim.cmd.Process.Wait()
		b.StartTimer()
	}
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func writeFileTB(tb testing.TB, path, content string) {
	tb.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		tb.Fatal(err)
	}
}

// TestScheduleTicksOnceWithAGatewayKilled runs a schedule that ticks every
// second on two gateways sharing Redis and kills one of them with SIGKILL
// at a tick: every tick that started a run started exactly one, and the
// survivor goes on ticking.
func TestScheduleTicksOnceWithAGatewayKilled(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gateway.toml")
	writeFileTB(t, cfg, fmt.Sprintf(`
[gateway]
lease_ttl_seconds = %d
shutdown_grace_seconds = 2

[[providers]]
name = "faulty"
type = "faulty"

[[schedules]]
name = "heartbeat"
chain = "beat"
every = "1s"

[[chains]]
name = "beat"
[[chains.steps]]
name = "call"
provider = "faulty"
payload_template = { record = %q, tick = "<<origin.payload.tick>>", sleep_ms = 300 }
`, clusterLeaseTTL, filepath.Join(dir, "calls.jsonl")))
	state := redistest.Open(t)
	victim, survivor := startServe(t, cfg, state), startServe(t, cfg, state)
	ticks := func() map[string]map[string]bool {
		runs := map[string]map[string]bool{}
		data, _ := os.ReadFile(filepath.Join(dir, "calls.jsonl"))
		for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			var c struct {
				DedupKey string `json:"dedup_key"`
				Payload  struct {
					Tick string `json:"tick"`
				} `json:"payload"`
			}
			if json.Unmarshal([]byte(line), &c) != nil {
				continue
			}
			run, _, _ := strings.Cut(c.DedupKey, "/")
			if runs[c.Payload.Tick] == nil {
				runs[c.Payload.Tick] = map[string]bool{}
			}
			runs[c.Payload.Tick][run] = true
		}
		return runs
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("waiting for %s", what)
			}
		}
	}
	waitFor("three ticks", func() bool { return len(ticks()) >= 3 })
	// At the next whole second, a tick.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
	_ = victim.cmd.Process.Signal(syscall.SIGKILL)
	killedAt := time.Now()
	waitFor("ticks after the kill", func() bool {
		n := 0
		for tick := range ticks() {
			if at, err := time.Parse(time.RFC3339, tick); err == nil && at.After(killedAt.Add(time.Second)) {
				n++
			}
		}
		return n >= 3
	})
	_ = survivor.cmd.Process.Signal(syscall.SIGTERM)
	_, _ = survivor.cmd.Process.Wait()
	for tick, runs := range ticks() {
		if len(runs) != 1 {
			t.Errorf("tick %s started %d runs: %v", tick, len(runs), runs)
		}
	}
}
