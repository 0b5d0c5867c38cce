package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/crashpoint"
	"github.com/chaingate/gateway/internal/testutil"
	"github.com/chaingate/gateway/internal/testutil/brokertest"
	"github.com/chaingate/gateway/internal/testutil/redistest"
)

// These tests run distributed splits across real processes — a gateway
// and workers — on the machine's RabbitMQ and Redis, and kill, restart or
// cut them in the middle.

const fanoutItems = 240

// fanoutEnv is one test's servers, config and processes.
type fanoutEnv struct {
	t        *testing.T
	dir      string
	config   string
	redisURL string
	prefix   string
}

func newFanoutEnv(t *testing.T, exclusive bool) *fanoutEnv {
	t.Helper()
	open := brokertest.Open
	if exclusive {
		open = brokertest.OpenExclusive
	}
	amqpURL, prefix := open(t)
	redisURL, _, _ := strings.Cut(redistest.OpenPrefix(t, prefix), "?")
	dir := t.TempDir()
	e := &fanoutEnv{t: t, dir: dir, config: filepath.Join(dir, "c.toml"), redisURL: redisURL, prefix: prefix}
	writeFile(t, e.config, fmt.Sprintf(`
[gateway]
shutdown_grace_seconds = 2
lease_ttl_seconds = 3

[gateway.fanout]
rabbitmq_url = %q
redis_url = %q
prefix = %q
batch_size = 5
max_in_flight = 60
prefetch = 4
max_redeliveries = 20
claim_ttl_seconds = 3

[[providers]]
name = "faulty"
type = "faulty"

[[chains]]
name = "fleet"
[[chains.steps]]
name = "loop"
[chains.steps.split]
mode = "distributed"
items = "<<origin.payload.items>>"
tolerated_failures = 0
[[chains.steps.split.steps]]
name = "first"
provider = "faulty"
payload_template = { record = "%[4]s/calls.jsonl", n = "<<item>>" }
[[chains.steps.split.steps]]
name = "second"
provider = "faulty"
payload_template = { record = "%[4]s/calls.jsonl", n = "<<steps.first.body.n>>", sleep_ms = 100 }

[[chains]]
name = "fleet-sub"
[[chains.steps]]
name = "loop"
[chains.steps.split]
mode = "distributed"
items = "<<origin.payload.items>>"
tolerated_failures = 0
[[chains.steps.split.steps]]
name = "check"
sub_chain = "check-host"
input = { n = "<<item>>" }

[[chains]]
name = "check-host"
[[chains.steps]]
name = "a"
provider = "faulty"
payload_template = { record = "%[4]s/calls.jsonl", n = "<<origin.payload.n>>" }
[[chains.steps]]
name = "b"
provider = "faulty"
payload_template = { record = "%[4]s/calls.jsonl", n = "<<steps.a.body.n>>", sleep_ms = 1500 }
`, amqpURL, redisURL, prefix, dir))
	return e
}

// proc is a gateway or worker process, working in a directory of its own
// that its plugin processes inherit.
type proc struct {
	cmd  *exec.Cmd
	dir  string
	logs *testutil.Buffer
	url  string
}

func (e *fanoutEnv) start(name string, args ...string) *proc {
	e.t.Helper()
	return e.startWith(name, nil, args...)
}

// startWith starts a process with env added to its environment.
func (e *fanoutEnv) startWith(name string, env []string, args ...string) *proc {
	e.t.Helper()
	exe, err := os.Executable()
	if err != nil {
		e.t.Fatal(err)
	}
	p := &proc{dir: filepath.Join(e.dir, name), logs: &testutil.Buffer{}}
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		e.t.Fatal(err)
	}
	p.cmd = exec.Command(exe, append(args, "--config", e.config)...)
	p.cmd.Dir = p.dir
	p.cmd.Env = append(append(os.Environ(), mainEnv+"=1"), env...)
	p.cmd.Stderr = p.logs
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _, _ = p.cmd.Process.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = p.cmd.Process.Kill()
		}
	})
	sc := bufio.NewScanner(out)
	if args[0] == "serve" {
		if !sc.Scan() {
			e.t.Fatalf("%s did not start:\n%s", name, p.logs)
		}
		p.url, _ = strings.CutPrefix(sc.Text(), "gateway: serving on ")
	}
	go func() {
		for sc.Scan() {
		}
	}()
	return p
}

func (e *fanoutEnv) serve(name string, extra ...string) *proc {
	return e.start(name, append([]string{"serve", "--listen", "127.0.0.1:0", "--state", filepath.Join(e.dir, "gw.db")}, extra...)...)
}

func (e *fanoutEnv) worker(name string) *proc {
	return e.start(name, "worker", "--state", filepath.Join(e.dir, name+".db"))
}

// kill ends a process with SIGKILL and waits until its plugins are gone.
func (e *fanoutEnv) kill(p *proc) {
	e.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		e.t.Fatal(err)
	}
	_, _ = p.cmd.Process.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for len(processesIn(p.dir)) > 0 {
		if time.Now().After(deadline) {
			e.t.Fatalf("plugins of %s outlived it", p.dir)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (e *fanoutEnv) post(p *proc) string {
	e.t.Helper()
	id, err := postRun(p.url, "fleet", itemsJSON(fanoutItems))
	if err != nil {
		e.t.Fatal(err)
	}
	return id
}

// itemsJSON is a run payload whose items are 0 to n-1.
func itemsJSON(n int) string {
	items := make([]string, n)
	for i := range items {
		items[i] = fmt.Sprint(i)
	}
	return `{"items": [` + strings.Join(items, ",") + `]}`
}

// calls reads faulty's record file: calls per step of each item.
func (e *fanoutEnv) calls() map[string]int {
	return callCounts(e.t, filepath.Join(e.dir, "calls.jsonl"))
}

func (e *fanoutEnv) count(suffix string) int {
	n := 0
	for k := range e.calls() {
		if strings.HasSuffix(k, suffix) {
			n++
		}
	}
	return n
}

func (e *fanoutEnv) waitCalls(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// finished waits for the run to end on gateway p and returns it.
func (e *fanoutEnv) finished(p *proc, id string) map[string]any {
	e.t.Helper()
	deadline := time.Now().Add(120 * time.Second)
	for {
		var run map[string]any
		resp, err := http.Get(p.url + "/v1/runs/" + id)
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&run)
			resp.Body.Close()
		}
		if status, _ := run["status"].(string); err == nil && store.RunStatus(status).Final() {
			return run
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("run %s did not end (%v):\n%s", id, err, p.logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkSplit checks that the run succeeded with every item counted once,
// and that no item's first call, recorded before its second went out, was
// made again after recorded (given the calls seen before the disruption).
func (e *fanoutEnv) checkSplit(run map[string]any, before map[string]int) {
	e.t.Helper()
	seconds := 0
	for k := range before {
		if strings.HasSuffix(k, "/second") {
			seconds++
		}
	}
	if seconds == fanoutItems {
		e.t.Fatal("the disruption came after every item had run")
	}
	if run["status"] != "succeeded" {
		e.t.Fatalf("run %v: %v", run["status"], run["error"])
	}
	if d, _ := run["distributed_splits"].([]any); len(d) != 1 || d[0] != "loop" {
		e.t.Errorf("distributed_splits: %v, want [loop]", run["distributed_splits"])
	}
	steps, _ := run["steps"].(map[string]any)
	loop, _ := steps["loop"].(map[string]any)
	body, _ := loop["body"].(map[string]any)
	if body["succeeded"] != float64(fanoutItems) || body["failed"] != float64(0) || body["total"] != float64(fanoutItems) {
		e.t.Errorf("split counts: succeeded %v failed %v total %v", body["succeeded"], body["failed"], body["total"])
	}
	if results, _ := body["results"].([]any); len(results) != fanoutItems {
		e.t.Errorf("%d results", len(results))
	}
	after := e.calls()
	for key, n := range after {
		if first, ok := strings.CutSuffix(key, "/first"); ok && before[first+"/second"] > 0 && n != 1 {
			e.t.Errorf("%s had its result recorded before the disruption and was called %d times", key, n)
		}
	}
	for i := range fanoutItems {
		if after[fmt.Sprintf("%s/loop[%03d]/second", run["id"], i)] == 0 {
			e.t.Errorf("item %d never ran", i)
		}
	}
}

// TestDistributedWorkerKilled kills one of two workers mid-split: its items
// are delivered to the other, none counts twice, and no step with a
// recorded result is called again.
func TestDistributedWorkerKilled(t *testing.T) {
	t.Parallel()
	e := newFanoutEnv(t, false)
	gw := e.serve("gateway", "--no-worker")
	w1 := e.worker("w1")
	e.worker("w2")
	id := e.post(gw)
	e.waitCalls("a third of the items", func() bool { return e.count("/second") >= fanoutItems/3 })
	e.kill(w1)
	before := e.calls()
	e.checkSplit(e.finished(gw, id), before)
}

// TestDistributedSubChainWorkerKilled kills the worker running items
// that are inside a sub-chain, each worker with a store file of its own:
// the next worker finds what the sub-chains recorded and calls none of
// their recorded steps again.
func TestDistributedSubChainWorkerKilled(t *testing.T) {
	t.Parallel()
	e := newFanoutEnv(t, false)
	gw := e.serve("gateway", "--no-worker")
	w1 := e.worker("w1")
	const items = 8
	id, err := postRun(gw.url, "fleet-sub", `{"items": [0, 1, 2, 3, 4, 5, 6, 7]}`)
	if err != nil {
		t.Fatal(err)
	}
	// Once a sub-chain's b is called, its a is recorded.
	e.waitCalls("a sub-chain's second step", func() bool { return e.count("/b") > 0 })
	e.kill(w1)
	before := e.calls()
	e.worker("w2")
	run := e.finished(gw, id)
	if run["status"] != "succeeded" {
		t.Fatalf("run %v: %v\n%s", run["status"], run["error"], gw.logs)
	}
	after := e.calls()
	checked := 0
	for key := range before {
		child, ok := strings.CutSuffix(key, "/b")
		if !ok {
			continue
		}
		checked++
		if n := after[child+"/a"]; n != 1 {
			t.Errorf("%s/a was recorded before the worker died and was called %d times", child, n)
		}
	}
	if checked == 0 {
		t.Fatal("no sub-chain had recorded a step when the worker died")
	}
	bs := 0
	for key := range after {
		if strings.HasSuffix(key, "/b") {
			bs++
		}
	}
	if bs != items {
		t.Errorf("%d sub-chains reached b, want %d", bs, items)
	}
}

// TestDistributedOwnerKilled kills the gateway that owns the run mid-split
// while a worker goes on; a new gateway on the same store takes the split
// up again without handing finished items out a second time.
func TestDistributedOwnerKilled(t *testing.T) {
	t.Parallel()
	e := newFanoutEnv(t, false)
	gw := e.serve("gateway", "--no-worker")
	e.worker("w1")
	id := e.post(gw)
	e.waitCalls("a third of the items", func() bool { return e.count("/second") >= fanoutItems/3 })
	e.kill(gw)
	before := e.calls()
	gw2 := e.serve("gateway2", "--no-worker")
	run := e.finished(gw2, id)
	e.checkSplit(run, before)
	// The worker never stopped, so every call was made once.
	for key, n := range e.calls() {
		if n != 1 {
			t.Errorf("%s was called %d times", key, n)
		}
	}
	done := 0
	for k := range before {
		if strings.HasSuffix(k, "/second") {
			done++
		}
	}
	// What was out before the kill stays out; at most one round of
	// publishing, confirmed but not yet recorded, goes out again.
	if published := metric(t, gw2.url, "chaingate_fanout_items_published_total"); published > float64(fanoutItems-done+5*16) {
		t.Errorf("the new gateway published %v items; %d had run before it started", published, done)
	}
}

// TestDistributedOwnerKilledBeforeItsDecision kills the gateway in place of
// the commit that records its split as handed out, while it makes the
// split's state in Redis beside it: the gateway that takes the run up
// decides again, over what the first left, and every item runs once.
func TestDistributedOwnerKilledBeforeItsDecision(t *testing.T) {
	t.Parallel()
	e := newFanoutEnv(t, false)
	gw := e.startWith("gateway", []string{crashpoint.Env + "=before loop running"},
		"serve", "--listen", "127.0.0.1:0", "--state", filepath.Join(e.dir, "gw.db"), "--no-worker")
	e.worker("w1")
	// The gateway may die before it answers.
	go func() { _, _ = postRun(gw.url, "fleet", itemsJSON(fanoutItems)) }()
	if err := gw.cmd.Wait(); err == nil {
		t.Fatalf("the gateway did not crash:\n%s", gw.logs)
	}
	gw2 := e.serve("gateway2", "--no-worker")
	var id string
	e.waitCalls("the run to be taken up", func() bool {
		var list struct {
			Runs []struct {
				ID string `json:"id"`
			} `json:"runs"`
		}
		resp, err := http.Get(gw2.url + "/v1/runs")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		if json.NewDecoder(resp.Body).Decode(&list) != nil || len(list.Runs) != 1 {
			return false
		}
		id = list.Runs[0].ID
		return true
	})
	e.checkSplit(e.finished(gw2, id), nil)
	for key, n := range e.calls() {
		if n != 1 {
			t.Errorf("%s was called %d times", key, n)
		}
	}
}

// TestDistributedBrokerRestart restarts RabbitMQ mid-split: publishing and
// consuming carry on once it is back, and the counts are exact.
func TestDistributedBrokerRestart(t *testing.T) {
	t.Parallel()
	e := newFanoutEnv(t, true)
	gw := e.serve("gateway")
	e.worker("w1")
	id := e.post(gw)
	e.waitCalls("a third of the items", func() bool { return e.count("/second") >= fanoutItems/3 })
	before := e.calls()
	brokertest.RestartBroker(t)
	e.checkSplit(e.finished(gw, id), before)
}

// TestDistributedRedisDrop drops every Redis connection of the gateway and
// the worker mid-split: they reconnect, and the counts are exact.
func TestDistributedRedisDrop(t *testing.T) {
	t.Parallel()
	e := newFanoutEnv(t, false)
	gw := e.serve("gateway")
	e.worker("w1")
	id := e.post(gw)
	e.waitCalls("a third of the items", func() bool { return e.count("/second") >= fanoutItems/3 })
	before := e.calls()
	opts, err := goredis.ParseURL(e.redisURL)
	if err != nil {
		t.Fatal(err)
	}
	c := goredis.NewClient(opts)
	defer c.Close()
	ctx := context.Background()
	list, err := c.ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	name := strings.TrimRight(e.prefix, ".:") + "-fanout"
	killed := 0
	for _, line := range strings.Split(list, "\n") {
		var cid string
		mine := false
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "id="); ok {
				cid = v
			}
			if f == "name="+name {
				mine = true
			}
		}
		if mine && cid != "" {
			if err := c.Do(ctx, "CLIENT", "KILL", "ID", cid).Err(); err == nil {
				killed++
			}
		}
	}
	if killed < 2 {
		t.Fatalf("killed %d Redis connections named %s", killed, name)
	}
	e.checkSplit(e.finished(gw, id), before)
}

// metric reads one unlabelled metric from a gateway.
func metric(t *testing.T, url, name string) float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			var f float64
			fmt.Sscan(v, &f)
			return f
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// TestWorkerStartsItsPluginsWhenItStarts checks that a worker starts the
// plugins its split items call before it takes any item, so its first
// batch costs what later ones do.
func TestWorkerStartsItsPluginsWhenItStarts(t *testing.T) {
	t.Parallel()
	e := newFanoutEnv(t, false)
	w := e.worker("w1")
	deadline := time.Now().Add(time.Minute)
	// The worker runs in its directory too: a plugin is a second process.
	for len(processesIn(w.dir)) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the worker started no plugin before its first item:\n%s", w.logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
