package fanout_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/fanout"
	"github.com/chaingate/gateway/chain/loader"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/bolt"
	"github.com/chaingate/gateway/internal/testutil"
	"github.com/chaingate/gateway/internal/testutil/brokertest"
	"github.com/chaingate/gateway/internal/testutil/redistest"
	"github.com/chaingate/gateway/plugins/host"
	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/builtin"
)

// These tests run distributed splits for real: an owning engine and worker
// engines in this process, each with its own store and plugin processes,
// over the RabbitMQ and Redis of the machine.

func TestMain(m *testing.M) {
	host.ServeBuiltinIfRequested(builtin.New)
	testutil.QuickRaceExit()
	os.Exit(m.Run())
}

// servers returns the [gateway.fanout] table of a test: its own queues and
// keys, removed when it ends.
func servers(t *testing.T, extra string) string {
	t.Helper()
	amqpURL, prefix := brokertest.Open(t)
	redisURL := redistest.OpenPrefix(t, prefix)
	redisURL, _, _ = strings.Cut(redisURL, "?")
	return fmt.Sprintf(`
[gateway.fanout]
rabbitmq_url = %q
redis_url = %q
prefix = %q
%s
`, amqpURL, redisURL, prefix, extra)
}

const providersTOML = `
[[providers]]
name = "echo"
type = "echo"
[[providers]]
name = "faulty"
type = "faulty"
`

type node struct {
	t   *testing.T
	cfg *chain.Config
	eng *engine.Engine
	st  store.Store
	pm  *host.Manager
	f   *fanout.Fanout

	mu        sync.Mutex
	events    []store.Event
	closeOnce sync.Once
}

type resolver struct{ m *host.Manager }

func (r resolver) Resolve(p *chain.Provider) (providers.Provider, error) {
	return r.m.Provider(host.Spec{Name: p.Name, Builtin: p.Type, Path: p.Plugin, SHA256: p.SHA256}), nil
}

// newNode starts an engine with its own store, and the fan-out when the
// config has one.
func newNode(t *testing.T, config string) *node {
	t.Helper()
	return newNodeAt(t, config, filepath.Join(t.TempDir(), "gw.db"), nil)
}

// newNodeAt starts an engine on the store file db, counting fan-out
// metrics in m when set.
func newNodeAt(t *testing.T, config, db string, m fanout.Metrics) *node {
	t.Helper()
	return newNodeWith(t, config, db, m, nil)
}

// newNodeWith is newNodeAt with the engine's store wrapped by wrap, when set.
func newNodeWith(t *testing.T, config, db string, m fanout.Metrics, wrap func(store.Store) store.Store) *node {
	t.Helper()
	opts := loader.Options{ProviderTypes: builtin.Types()}
	cfg, err := loader.LoadBytes("test.toml", []byte(providersTOML+config), opts)
	if err != nil {
		t.Fatalf("loading config:\n%v", err)
	}
	st, err := bolt.Open(db, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	n := &node{t: t, cfg: cfg, st: st, pm: host.NewManager(host.Options{Executable: exe})}
	eopts := engine.Options{Store: st, Config: cfg, Providers: resolver{n.pm}, LoadOptions: opts, Limits: cfg.Gateway.Limits, OnEvent: n.record}
	if wrap != nil {
		eopts.Store = wrap(st)
	}
	if cfg.Gateway.Fanout != nil {
		if n.f, err = fanout.Open(context.Background(), fanout.Options{Config: cfg.Gateway.Fanout, Metrics: m}); err != nil {
			t.Fatal(err)
		}
		eopts.Fanout = n.f
	}
	if n.eng, err = engine.New(eopts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.close)
	return n
}

// start starts a run without waiting for it.
func (n *node) start(chainName, payload string) string {
	n.t.Helper()
	run, err := n.eng.Start(context.Background(), chainName, engine.Input{Payload: json.RawMessage(payload)})
	if err != nil {
		n.t.Fatal(err)
	}
	return run.ID
}

// wait waits for a run and returns its result.
func (n *node) wait(id string) *engine.Result {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if _, err := n.eng.Wait(ctx, id); err != nil {
		n.t.Fatalf("waiting for run: %v", err)
	}
	res, err := n.eng.Result(ctx, id, false)
	if err != nil {
		n.t.Fatal(err)
	}
	return res
}

func (n *node) record(ev store.Event) {
	n.mu.Lock()
	n.events = append(n.events, ev)
	n.mu.Unlock()
}

func (n *node) close() {
	n.closeOnce.Do(n.shut)
}

func (n *node) shut() {
	n.eng.Close()
	if n.f != nil {
		_ = n.f.Close()
	}
	_ = n.pm.Close()
	_ = n.st.Close()
}

// work runs a worker on the node until the returned func is called.
func (n *node) work() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	w := n.f.Worker(n.eng)
	go func() { done <- w.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			n.t.Errorf("worker: %v", err)
		}
	}
}

// run starts a run and waits for it.
func (n *node) run(chainName, payload string) *engine.Result {
	n.t.Helper()
	return n.wait(n.start(chainName, payload))
}

func (n *node) eventTypes(runID string) map[store.EventType]int {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := map[store.EventType]int{}
	for _, ev := range n.events {
		if ev.RunID == runID {
			out[ev.Type]++
		}
	}
	return out
}

// splitChain is a split over origin.payload.items in the given mode:
// items with keep false are filtered out, items with a fail message fail,
// the others are checked and confirmed.
func splitChain(name, mode, rec, extra string) string {
	return fmt.Sprintf(`
[[chains]]
name = %[1]q
[[chains.steps]]
name = "loop"
[chains.steps.split]
mode = %[2]q
items = "<<origin.payload.items>>"
%[4]s
[[chains.steps.split.steps]]
name = "check"
provider = "faulty"
when = 'item.keep'
payload_template = { record = %[3]q, n = "<<item.n>>", fail = "<<item.fail ?? \"\">>" }
[[chains.steps.split.steps]]
name = "confirm"
provider = "echo"
payload_template = { checked = "<<steps.check.body.n>>", index = "<<item_index>>", host = "<<origin.payload.host>>" }
[[chains.steps]]
name = "after"
provider = "echo"
payload_template = { ok = "<<steps.loop.body.succeeded>>", failed = "<<steps.loop.body.failed>>" }
`, name, mode, rec, extra)
}

func itemsPayload(n int, fail func(i int) bool) string {
	var items []string
	for i := range n {
		f := ""
		if fail(i) {
			f = fmt.Sprintf(`, "fail": "item %d is broken"`, i)
		}
		items = append(items, fmt.Sprintf(`{"n": %d, "keep": %t%s}`, i, i%11 != 5, f))
	}
	return `{"host": "db-1", "items": [` + strings.Join(items, ",") + `]}`
}

func calls(t *testing.T, path string) map[string]int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if l == "" {
			continue
		}
		var r struct {
			DedupKey string `json:"dedup_key"`
		}
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("record line %q: %v", l, err)
		}
		out[r.DedupKey]++
	}
	return out
}

func TestDistributedSplitMatchesLocal(t *testing.T) {
	dir := t.TempDir()
	rec := filepath.Join(dir, "calls.jsonl")
	cfg := servers(t, "batch_size = 7\nmax_in_flight = 40") +
		splitChain("distributed", "distributed", rec, "tolerated_failures = 5") +
		splitChain("local", "local", filepath.Join(dir, "local.jsonl"), "tolerated_failures = 5")
	owner := newNode(t, cfg)
	stop1 := newNode(t, cfg).work()
	defer stop1()
	stop2 := newNode(t, cfg).work()
	defer stop2()

	const items = 300
	payload := itemsPayload(items, func(i int) bool { return i%97 == 3 })
	dist := owner.run("distributed", payload)
	local := owner.run("local", payload)
	if dist.Status != store.RunSucceeded || local.Status != store.RunSucceeded {
		t.Fatalf("distributed %s %+v; local %s %+v", dist.Status, dist.Error, local.Status, local.Error)
	}
	if d, l := string(dist.Steps["loop"].Body), string(local.Steps["loop"].Body); d != l {
		t.Errorf("split bodies differ:\ndistributed %.400s\nlocal       %.400s", d, l)
	}
	if d, l := string(dist.Steps["after"].Body), string(local.Steps["after"].Body); d != l {
		t.Errorf("the step after differs: %s vs %s", d, l)
	}
	for key, n := range calls(t, rec) {
		if n != 1 {
			t.Errorf("%s was called %d times", key, n)
		}
	}
	if n := len(calls(t, rec)); n != len(calls(t, filepath.Join(dir, "local.jsonl"))) {
		t.Errorf("%d item calls distributed, %d local", n, len(calls(t, filepath.Join(dir, "local.jsonl"))))
	}
	evs := owner.eventTypes(dist.ID)
	for _, typ := range []store.EventType{store.EventSplitFanoutStarted, store.EventSplitItemsEnqueued, store.EventStepProgress, store.EventSplitFaninCompleted} {
		if evs[typ] == 0 {
			t.Errorf("no %s event: %v", typ, evs)
		}
	}
	// A split that succeeded keeps its results in its body, and slot
	// records only for its items that did not succeed, for a redrive.
	all, err := owner.eng.Result(context.Background(), dist.ID, true)
	if err != nil {
		t.Fatal(err)
	}
	for key, r := range all.Steps {
		if !strings.HasPrefix(key, "loop[") || strings.Contains(key, "/") {
			continue
		}
		if r.Status == store.StepSucceeded {
			t.Errorf("the slot record of a succeeded item of a distributed split that succeeded: %s %+v", key, r)
		}
	}
	if r, ok := all.Steps["loop[003]"]; !ok || r.Status != store.StepFailed {
		t.Errorf("the failed item's slot: %+v", r)
	}
}

// TestJoinReadsPagesInOrder runs a split of more items than the join reads
// in one page, whose results the join reads ahead a few pages at once, and
// one small enough for its results to come with the split's last news:
// each joins its results in item order, as local mode does.
func TestJoinReadsPagesInOrder(t *testing.T) {
	chainOf := func(name, mode string) string {
		return fmt.Sprintf(`
[[chains]]
name = %q
[[chains.steps]]
name = "loop"
[chains.steps.split]
mode = %q
items = "<<origin.payload.items>>"
[[chains.steps.split.steps]]
name = "echo"
provider = "echo"
payload_template = { i = "<<item>>" }
`, name, mode)
	}
	cfg := servers(t, "batch_size = 500") + chainOf("d", "distributed") + chainOf("l", "local")
	owner := newNode(t, cfg)
	stop := newNode(t, cfg).work()
	defer stop()
	for _, n := range []int{2_345, 17} {
		items := make([]string, n)
		for i := range items {
			items[i] = fmt.Sprintf(`{"host": "h-%d"}`, i)
		}
		payload := `{"items": [` + strings.Join(items, ",") + `]}`
		dist, local := owner.run("d", payload), owner.run("l", payload)
		if dist.Status != store.RunSucceeded || local.Status != store.RunSucceeded {
			t.Fatalf("%d items: distributed %s %+v; local %s %+v", n, dist.Status, dist.Error, local.Status, local.Error)
		}
		if d, l := string(dist.Steps["loop"].Body), string(local.Steps["loop"].Body); d != l {
			t.Errorf("%d items: split bodies differ:\ndistributed %.300s\nlocal       %.300s", n, d, l)
		}
	}
}

// TestNestedSplitsMatchLocal runs 5 hosts × 3 checks, with a filtered host,
// a failing check and a failing host, distributed over two workers (the
// inner splits run on the worker that has the host) and locally.
func TestNestedSplitsMatchLocal(t *testing.T) {
	dir := t.TempDir()
	nested := func(name, mode, rec string) string {
		return fmt.Sprintf(`
[[chains]]
name = %[1]q
[[chains.steps]]
name = "hosts"
[chains.steps.split]
mode = %[2]q
items = "<<origin.payload.hosts>>"
tolerated_failures = 2
[[chains.steps.split.steps]]
name = "skip-down"
provider = "echo"
when = 'item.up'
payload_template = { host = "<<item.name>>" }
[[chains.steps.split.steps]]
name = "checks"
[chains.steps.split.steps.split]
items = "<<item.checks>>"
tolerated_failures = 1
[[chains.steps.split.steps.split.steps]]
name = "probe"
provider = "faulty"
payload_template = { record = %[3]q, host = "<<steps.skip-down.body.host>>", check = "<<item.c>>", fail = "<<item.fail ?? \"\">>" }
`, name, mode, rec)
	}
	cfg := servers(t, "batch_size = 2") + nested("d", "distributed", filepath.Join(dir, "d.jsonl")) + nested("l", "local", filepath.Join(dir, "l.jsonl"))
	owner := newNode(t, cfg)
	defer newNode(t, cfg).work()()
	defer newNode(t, cfg).work()()
	var hosts []string
	for h := range 5 {
		var checks []string
		for c := range 3 {
			fail := ""
			if (h == 1 && c == 2) || (h == 3 && c < 2) {
				fail = `, "fail": "down"`
			}
			checks = append(checks, fmt.Sprintf(`{"c": "c%d"%s}`, c, fail))
		}
		hosts = append(hosts, fmt.Sprintf(`{"name": "h%d", "up": %t, "checks": [%s]}`, h, h != 4, strings.Join(checks, ",")))
	}
	payload := `{"hosts": [` + strings.Join(hosts, ",") + `]}`
	d, l := owner.run("d", payload), owner.run("l", payload)
	if all, _ := owner.eng.Result(context.Background(), d.ID, true); d.Status != store.RunSucceeded {
		for k, v := range all.Steps {
			t.Logf("%s %s %s %+v", k, v.Status, v.Body, v.Error)
		}
	}
	same := strings.ReplaceAll(string(d.Steps["hosts"].Body), "d.jsonl", "l.jsonl") == string(l.Steps["hosts"].Body)
	if d.Status != l.Status || !same {
		t.Fatalf("distributed %s %s\nlocal       %s %s", d.Status, d.Steps["hosts"].Body, l.Status, l.Steps["hosts"].Body)
	}
	if d.Status != store.RunSucceeded {
		t.Fatalf("run %s: %+v", d.Status, d.Error)
	}
	for key, n := range calls(t, filepath.Join(dir, "d.jsonl")) {
		if n != 1 {
			t.Errorf("%s called %d times", key, n)
		}
	}
}

// TestToleranceHoldsAcrossWorkers fails the split once more items failed
// than tolerated, wherever they ran, and the items still out are dropped.
func TestToleranceHoldsAcrossWorkers(t *testing.T) {
	dir := t.TempDir()
	rec := filepath.Join(dir, "calls.jsonl")
	cfg := servers(t, "batch_size = 5\nmax_in_flight = 20") + fmt.Sprintf(`
[[chains]]
name = "c"
[[chains.steps]]
name = "loop"
[chains.steps.split]
mode = "distributed"
items = "<<origin.payload.items>>"
tolerated_failures = 3
[[chains.steps.split.steps]]
name = "check"
provider = "faulty"
payload_template = { record = %q, fail = "<<item.fail ?? \"\">>", sleep_ms = 20 }
`, rec)
	owner := newNode(t, cfg)
	defer newNode(t, cfg).work()()
	defer newNode(t, cfg).work()()
	const items = 400
	res := owner.run("c", itemsPayload(items, func(i int) bool { return i >= 30 && i%3 == 0 }))
	if res.Status != store.RunFailed || !strings.Contains(res.Error.Message, "more than the 3 tolerated") {
		t.Fatalf("run %s: %+v", res.Status, res.Error)
	}
	// The split stopped handing items out: most never ran.
	time.Sleep(500 * time.Millisecond)
	if n := len(calls(t, rec)); n > items/2 {
		t.Errorf("%d of %d items ran after the split failed", n, items)
	}
}

// TestEmptySplitCompletesAtOnce needs no worker.
func TestEmptySplitCompletesAtOnce(t *testing.T) {
	owner := newNode(t, servers(t, "")+splitChain("c", "distributed", filepath.Join(t.TempDir(), "r.jsonl"), ""))
	res := owner.run("c", `{"items": []}`)
	if res.Status != store.RunSucceeded || !strings.Contains(string(res.Steps["loop"].Body), `"total":0`) {
		t.Fatalf("run %s %+v: %s", res.Status, res.Error, res.Steps["loop"].Body)
	}
}

// TestOwnerQuietOnceOver attaches a split that is over from the start and
// leaves its handle open, as a run does while it joins: the owner tells the
// news once and reads the barrier no more.
func TestOwnerQuietOnceOver(t *testing.T) {
	n := newNode(t, servers(t, ""))
	var news atomic.Int32
	job := &engine.FanoutJob{
		Work:  &engine.WorkSplit{Run: &store.Run{ID: "quiet-" + strconv.FormatInt(time.Now().UnixNano(), 36)}, Key: "loop", Step: "loop", Total: 0},
		Items: emptyItems{},
		Gen:   1,
	}
	h := n.f.Attach(job, func(nw *engine.FanoutNews) {
		if nw.State != engine.FanoutComplete {
			t.Errorf("news of an empty split: %+v", nw)
		}
		news.Add(1)
	})
	defer h.End(store.StepSucceeded)
	deadline := time.Now().Add(30 * time.Second)
	for news.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	if got := news.Load(); got != 1 {
		t.Errorf("the owner told the news of a split that is over %d times, want once", got)
	}
}

// TestFreshHandOffQuietUntilNews hands out a split no worker takes: its
// owner tells the run nothing until something moved, here the items going
// out, so that the run's store is not written while the first message is
// on its way.
func TestFreshHandOffQuietUntilNews(t *testing.T) {
	n := newNode(t, servers(t, ""))
	var mu sync.Mutex
	var got []engine.FanoutNews
	job := &engine.FanoutJob{
		Work:  &engine.WorkSplit{Run: &store.Run{ID: "fresh-" + strconv.FormatInt(time.Now().UnixNano(), 36)}, Key: "loop", Step: "loop", Total: 3},
		Items: fanout.CountItems(3),
		Gen:   1,
	}
	h := n.f.Attach(job, func(nw *engine.FanoutNews) {
		mu.Lock()
		got = append(got, *nw)
		mu.Unlock()
	})
	defer h.End(store.StepCancelled)
	told := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(got)
	}
	deadline := time.Now().Add(30 * time.Second)
	for told() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(400 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || got[0].Published != 3 || got[0].State != engine.FanoutOpen || got[0].Succeeded+got[0].Failed+got[0].Skipped != 0 {
		t.Errorf("news of a split whose items went out and none came back: %+v, want one telling 3 published", got)
	}
}

// TestHeldHandOffWaitsForRelease: a held hand-off's items go out at once,
// and its state says held, keeping workers from them, until the release.
func TestHeldHandOffWaitsForRelease(t *testing.T) {
	m := &counter{}
	n := newNodeAt(t, servers(t, ""), filepath.Join(t.TempDir(), "gw.db"), m)
	run := "held-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	job := &engine.FanoutJob{
		Work:  &engine.WorkSplit{Run: &store.Run{ID: run}, Key: "loop", Step: "loop", Total: 3},
		Items: fanout.CountItems(3),
		Gen:   1,
		Held:  true,
		Fence: 1,
	}
	h := n.f.Attach(job, func(*engine.FanoutNews) {})
	defer h.End(store.StepCancelled)
	held := func() bool {
		keys, err := n.f.Redis().Keys(context.Background(), "*{"+run+"}*:meta").Result()
		if err != nil || len(keys) != 1 {
			return false
		}
		ok, err := n.f.Redis().HExists(context.Background(), keys[0], "held").Result()
		return err == nil && ok
	}
	waitUntil(t, "the held split's 3 items go out", func() bool { return m.get(func(c *counter) int { return c.published }) == 3 })
	if !held() {
		t.Fatal("the hand-off is not held before its release")
	}
	h.Release()
	waitUntil(t, "the hand-off is released", func() bool { return !held() })
}

// decisionHold holds the commit of a distributed split's decision until
// release is closed, telling holding once it is held.
type decisionHold struct {
	store.Store
	holding, release chan struct{}
	once             sync.Once
}

func (s *decisionHold) Commit(ctx context.Context, b *store.Batch) error {
	for _, ev := range b.Events {
		if ev.Type == store.EventSplitFanoutStarted {
			s.once.Do(func() { close(s.holding) })
			<-s.release
		}
	}
	return s.Store.Commit(ctx, b)
}

// TestItemsWaitForTheDecision: a split's items reach the workers while
// the run's decision to hand them out is not durable yet, and no worker
// runs one until it is. The release's notice starts them: with a claim
// TTL of ten minutes, a worker that waited for its timer instead would
// not finish before the wait for the run gives up.
func TestItemsWaitForTheDecision(t *testing.T) {
	dir := t.TempDir()
	rec := filepath.Join(dir, "r.jsonl")
	cfg := servers(t, "claim_ttl_seconds = 600") + splitChain("c", "distributed", rec, "")
	m := &counter{}
	hold := &decisionHold{holding: make(chan struct{}), release: make(chan struct{})}
	owner := newNodeWith(t, cfg, filepath.Join(dir, "gw.db"), m, func(st store.Store) store.Store { hold.Store = st; return hold })
	defer newNode(t, cfg).work()()
	release := sync.OnceFunc(func() { close(hold.release) })
	// A failure lets the decision through, so that the engine can stop.
	defer release()
	id := owner.start("c", itemsPayload(10, func(int) bool { return false }))
	<-hold.holding
	waitUntil(t, "the items go out", func() bool { return m.get(func(c *counter) int { return c.published }) == 10 })
	// Time for the worker to have the message and try its items.
	time.Sleep(300 * time.Millisecond)
	if got := calls(t, rec); len(got) != 0 {
		t.Fatalf("items ran before the decision was durable: %v", got)
	}
	release()
	if res := owner.wait(id); res.Status != store.RunSucceeded {
		t.Fatalf("run %s %+v", res.Status, res.Error)
	}
	for key, n := range calls(t, rec) {
		if n != 1 {
			t.Errorf("%s called %d times", key, n)
		}
	}
	if got := len(calls(t, rec)); got != 9 {
		t.Errorf("%d items called, want the 9 kept", got)
	}
}

// TestEndedHeldSplitLetsGoOfItsMessage: a worker waiting for the release
// of a held split stops waiting when the split ends instead. It holds one
// message at a time and its claims last ten minutes: a worker that waited
// for its timer would keep the ended split's message past the next run's
// wait, and that run's items would never reach it.
func TestEndedHeldSplitLetsGoOfItsMessage(t *testing.T) {
	dir := t.TempDir()
	cfg := servers(t, "claim_ttl_seconds = 600\nprefetch = 1") + splitChain("c", "distributed", filepath.Join(dir, "r.jsonl"), "")
	m := &counter{}
	n := newNodeAt(t, cfg, filepath.Join(dir, "gw.db"), m)
	worker := newNode(t, cfg)
	// The worker's claims: one as it reads the split, found held, and one
	// more, after which it waits.
	claims := &fanout.CommandCounter{Match: func(args []any) bool { return len(args) > 0 && args[0] == "evalsha" }}
	worker.f.Redis().AddHook(claims)
	defer worker.work()()
	job := &engine.FanoutJob{
		Work:  &engine.WorkSplit{Run: &store.Run{ID: "held-" + strconv.FormatInt(time.Now().UnixNano(), 36)}, Key: "loop", Step: "loop", Total: 1},
		Items: fanout.CountItems(1),
		Gen:   1,
		Held:  true,
		Fence: 1,
	}
	h := n.f.Attach(job, func(*engine.FanoutNews) {})
	waitUntil(t, "the held split's item goes out", func() bool { return m.get(func(c *counter) int { return c.published }) == 1 })
	waitUntil(t, "the worker finds the split held", func() bool { return claims.N.Load() >= 2 })
	h.End(store.StepCancelled)
	if res := n.run("c", itemsPayload(3, func(int) bool { return false })); res.Status != store.RunSucceeded {
		t.Fatalf("the next run %s %+v", res.Status, res.Error)
	}
}

type emptyItems struct{}

func (emptyItems) Len() int                          { return 0 }
func (emptyItems) At(int) any                        { return nil }
func (emptyItems) JSON(int) (json.RawMessage, error) { return nil, nil }

// TestTimeoutWithNoWorker ends a split whose items nobody takes.
func TestTimeoutWithNoWorker(t *testing.T) {
	owner := newNode(t, servers(t, "")+splitChain("c", "distributed", filepath.Join(t.TempDir(), "r.jsonl"), "timeout_seconds = 1"))
	// No worker takes the items: only the split's timeout ends the run.
	res := owner.run("c", itemsPayload(10, func(int) bool { return false }))
	if res.Status != store.RunFailed || res.Steps["loop"].Status != store.StepTimedOut {
		t.Fatalf("run %s %+v, split %+v", res.Status, res.Error, res.Steps["loop"])
	}
}

// TestAutoMode distributes only at the threshold.
func TestAutoMode(t *testing.T) {
	dir := t.TempDir()
	cfg := servers(t, "threshold = 10") + splitChain("c", "auto", filepath.Join(dir, "r.jsonl"), "")
	owner := newNode(t, cfg)
	defer newNode(t, cfg).work()()
	small := owner.run("c", itemsPayload(9, func(int) bool { return false }))
	big := owner.run("c", itemsPayload(10, func(int) bool { return false }))
	if small.Status != store.RunSucceeded || big.Status != store.RunSucceeded {
		t.Fatalf("small %s, big %s", small.Status, big.Status)
	}
	if owner.eventTypes(small.ID)[store.EventSplitFanoutStarted] != 0 || owner.eventTypes(big.ID)[store.EventSplitFanoutStarted] != 1 {
		t.Errorf("small %v, big %v", owner.eventTypes(small.ID), owner.eventTypes(big.ID))
	}
}

// counter counts fan-out metrics.
type counter struct {
	mu                                         sync.Mutex
	published, redelivered, poisoned, inFlight int
	done                                       map[string]int
}

func (c *counter) ItemsPublished(n int) { c.mu.Lock(); c.published += n; c.mu.Unlock() }
func (c *counter) ItemsDone(s string, n int) {
	c.mu.Lock()
	if c.done == nil {
		c.done = map[string]int{}
	}
	c.done[s] += n
	c.mu.Unlock()
}
func (c *counter) ItemsRedelivered(n int) { c.mu.Lock(); c.redelivered += n; c.mu.Unlock() }
func (c *counter) ItemsInFlight(d int)    { c.mu.Lock(); c.inFlight += d; c.mu.Unlock() }
func (c *counter) ItemsPoisoned(n int)    { c.mu.Lock(); c.poisoned += n; c.mu.Unlock() }

func (c *counter) get(f func(*counter) int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return f(c)
}

var waitUntil = fanout.WaitUntil

// twoSteps is a distributed split whose items make two calls, the first
// recorded before the second.
func twoSteps(rec string, sleep int) string {
	return fmt.Sprintf(`
[[chains]]
name = "c"
[[chains.steps]]
name = "loop"
[chains.steps.split]
mode = "distributed"
items = "<<origin.payload.items>>"
[[chains.steps.split.steps]]
name = "first"
provider = "faulty"
payload_template = { record = %[1]q, n = "<<item.n>>", step = "first" }
[[chains.steps.split.steps]]
name = "second"
provider = "faulty"
payload_template = { record = %[1]q, n = "<<steps.first.body.n>>", step = "second", sleep_ms = %[2]d }
`, rec, sleep)
}

// TestOwnerRestartReattaches stops the owning gateway mid-split and starts
// another on its store: it takes the hand-off up where it was, publishing
// no finished item again, and every item runs once.
func TestOwnerRestartReattaches(t *testing.T) {
	dir := t.TempDir()
	rec := filepath.Join(dir, "calls.jsonl")
	db := filepath.Join(dir, "owner.db")
	// Items take 200 ms, 30 at a time: a third are in some 600 ms before
	// the last, however quick the machine, so the owner stops mid-split.
	cfg := servers(t, "batch_size = 5\nmax_in_flight = 30") + twoSteps(rec, 200)
	defer newNode(t, cfg).work()()
	m := &counter{}
	a := newNodeAt(t, cfg, db, m)
	const items = 200
	id := a.start("c", itemsPayload(items, func(int) bool { return false }))
	waitUntil(t, "a third of the items", func() bool { return m.get(func(c *counter) int { return c.done["succeeded"] }) >= items/3 })
	a.close()
	b := newNodeAt(t, cfg, db, m)
	if ids, err := b.eng.Resume(context.Background()); err != nil || len(ids) != 1 {
		t.Fatalf("resume: %v %v", ids, err)
	}
	res := b.wait(id)
	if res.Status != store.RunSucceeded || !strings.Contains(string(res.Steps["loop"].Body), fmt.Sprintf(`"succeeded":%d`, items)) {
		t.Fatalf("run %s %+v: %.300s", res.Status, res.Error, res.Steps["loop"].Body)
	}
	for key, n := range calls(t, rec) {
		if n != 1 {
			t.Errorf("%s called %d times", key, n)
		}
	}
	// At most one publishing round may go out twice: what was confirmed
	// but not yet recorded when the owner stopped.
	if p := m.get(func(c *counter) int { return c.published }); p > items+16*5 {
		t.Errorf("%d items published for %d", p, items)
	}
	if f := m.get(func(c *counter) int { return c.inFlight }); f != 0 {
		t.Errorf("in-flight gauge at %d after the split", f)
	}
}

// TestWorkerStopsMidItem stops a worker while its items wait on their
// second call: they are delivered again to another worker, which does not
// call again what has a recorded result, and nothing counts twice.
func TestWorkerStopsMidItem(t *testing.T) {
	dir := t.TempDir()
	rec := filepath.Join(dir, "calls.jsonl")
	cfg := servers(t, "batch_size = 4\nmax_in_flight = 40") + twoSteps(rec, 400)
	owner := newNode(t, cfg)
	m := &counter{}
	first := newNodeAt(t, cfg, filepath.Join(dir, "w1.db"), m)
	stop := first.work()
	const items = 60
	id := owner.start("c", itemsPayload(items, func(int) bool { return false }))
	waitUntil(t, "second calls to be in flight", func() bool {
		for k := range calls(t, rec) {
			if strings.HasSuffix(k, "/second") {
				return true
			}
		}
		return false
	})
	stop()
	// Its plugins go too, so no call of it lands after the count.
	first.close()
	before := calls(t, rec)
	defer newNodeAt(t, cfg, filepath.Join(dir, "w2.db"), m).work()()
	res := owner.wait(id)
	if res.Status != store.RunSucceeded || !strings.Contains(string(res.Steps["loop"].Body), fmt.Sprintf(`"succeeded":%d`, items)) {
		t.Fatalf("run %s %+v: %.300s", res.Status, res.Error, res.Steps["loop"].Body)
	}
	after := calls(t, rec)
	for key, n := range after {
		// An item's second call goes out once its first one's result is
		// committed.
		if first, ok := strings.CutSuffix(key, "/first"); ok && before[first+"/second"] > 0 && n != 1 {
			t.Errorf("%s had its result recorded before the worker stopped, and was called %d times", key, n)
		}
		if n > before[key]+1 {
			t.Errorf("%s was called %d times after the stop (%d before)", key, n-before[key], before[key])
		}
	}
	if m.get(func(c *counter) int { return c.redelivered }) == 0 {
		t.Error("no item was counted as redelivered")
	}
}

// TestPoisonItemParked makes one item's message outlive max_redeliveries
// (every worker that takes it stops before it finishes): it fails with a
// dead-letter entry naming its run, split and index, and the split ends.
func TestPoisonItemParked(t *testing.T) {
	dir := t.TempDir()
	rec := filepath.Join(dir, "calls.jsonl")
	cfg := servers(t, "batch_size = 1\nmax_redeliveries = 1") + fmt.Sprintf(`
[[chains]]
name = "c"
[[chains.steps]]
name = "loop"
[chains.steps.split]
mode = "distributed"
items = "<<origin.payload.items>>"
tolerated_failures = 1
[[chains.steps.split.steps]]
name = "call"
provider = "faulty"
payload_template = { record = %q, n = "<<item.n>>", hang = "<<item.hang ?? false>>" }
`, rec)
	m := &counter{}
	owner := newNodeAt(t, cfg, filepath.Join(dir, "owner.db"), m)
	id := owner.start("c", `{"items": [{"n": 0}, {"n": 1, "hang": true}, {"n": 2}]}`)
	for round := 1; round <= 2; round++ {
		w := newNodeAt(t, cfg, filepath.Join(dir, fmt.Sprintf("w%d.db", round)), m)
		stop := w.work()
		waitUntil(t, fmt.Sprintf("delivery %d of the hanging item", round), func() bool { return calls(t, rec)[id+"/loop[1]/call"] >= round })
		if round == 1 {
			// The other two items finish here, however slow the machine,
			// so that only the hanging one is delivered again and again.
			waitUntil(t, "the other items' results", func() bool { return m.get(func(c *counter) int { return c.done["succeeded"] }) >= 2 })
		}
		stop()
		w.close()
	}
	defer newNodeAt(t, cfg, filepath.Join(dir, "w3.db"), m).work()()
	res := owner.wait(id)
	if res.Status != store.RunSucceeded {
		t.Fatalf("run %s %+v", res.Status, res.Error)
	}
	var body struct {
		Results []struct {
			Error *store.ErrorInfo `json:"error"`
		} `json:"results"`
	}
	if err := json.Unmarshal(res.Steps["loop"].Body, &body); err != nil || len(body.Results) != 3 || body.Results[1].Error == nil || body.Results[1].Error.Code != "poison" {
		t.Fatalf("the split's body: %s", res.Steps["loop"].Body)
	}
	entries, err := owner.st.ListDLQ(context.Background(), store.DLQFilter{})
	if err != nil || len(entries) != 1 {
		t.Fatalf("dead-letter entries %v: %d", err, len(entries))
	}
	if e := entries[0]; e.RunID != id || e.Step != "loop[1]" || !strings.Contains(e.Error.Message, "delivered 2 times") || string(e.Payload) != `{"n":1,"hang":true}` {
		t.Fatalf("dead-letter entry: %+v %s", e, e.Payload)
	}
	if m.get(func(c *counter) int { return c.poisoned }) != 1 {
		t.Errorf("poisoned items: %d", m.get(func(c *counter) int { return c.poisoned }))
	}
}

// TestReplayPoisonedItem replays the dead-letter entry of a poisoned item
// once its split has failed: the split is handed out again under a new
// hand-off with only that item, which now runs, and the run succeeds
// without calling the other items again.
func TestReplayPoisonedItem(t *testing.T) {
	dir := t.TempDir()
	rec := filepath.Join(dir, "calls.jsonl")
	cfg := servers(t, "batch_size = 1\nmax_redeliveries = 1") + fmt.Sprintf(`
[[chains]]
name = "c"
[[chains.steps]]
name = "loop"
[chains.steps.split]
mode = "distributed"
items = "<<origin.payload.items>>"
[[chains.steps.split.steps]]
name = "call"
provider = "faulty"
payload_template = { record = %q, n = "<<item.n>>", sleep_ms = "<<item.sleep ?? 0>>" }
`, rec)
	m := &counter{}
	owner := newNodeAt(t, cfg, filepath.Join(dir, "owner.db"), m)
	id := owner.start("c", `{"items": [{"n": 0}, {"n": 1, "sleep": 6000}, {"n": 2}]}`)
	for round := 1; round <= 2; round++ {
		w := newNodeAt(t, cfg, filepath.Join(dir, fmt.Sprintf("w%d.db", round)), nil)
		stop := w.work()
		waitUntil(t, fmt.Sprintf("delivery %d of the slow item", round), func() bool { return calls(t, rec)[id+"/loop[1]/call"] >= round })
		if round == 1 {
			// The other two items finish here, however slow the machine,
			// so that only the slow one is parked and replayed.
			waitUntil(t, "the other items' results", func() bool { return m.get(func(c *counter) int { return c.done["succeeded"] }) >= 2 })
		}
		stop()
		w.close()
	}
	defer newNodeAt(t, cfg, filepath.Join(dir, "w3.db"), nil).work()()
	if res := owner.wait(id); res.Status != store.RunFailed {
		t.Fatalf("run %s %+v", res.Status, res.Error)
	}
	entries, err := owner.st.ListDLQ(context.Background(), store.DLQFilter{})
	if err != nil || len(entries) != 1 {
		t.Fatalf("dead-letter entries %v: %d", err, len(entries))
	}
	// The stopped workers may have made an item's call again; the replay
	// must not.
	before := calls(t, rec)
	if _, err := owner.eng.Replay(context.Background(), entries[0].ID, engine.ReplayOptions{}); err != nil {
		t.Fatal(err)
	}
	res := owner.wait(id)
	if res.Status != store.RunSucceeded || !strings.Contains(string(res.Steps["loop"].Body), `"succeeded":3`) {
		t.Fatalf("after the replay: %s %+v %s", res.Status, res.Error, res.Steps["loop"].Body)
	}
	c := calls(t, rec)
	if c[id+"/loop[0]/call"] != before[id+"/loop[0]/call"] || c[id+"/loop[2]/call"] != before[id+"/loop[2]/call"] || c[id+"/loop[1]/call"] != 3 {
		t.Errorf("calls before the replay %v, after %v", before, c)
	}
	if owner.eventTypes(id)[store.EventSplitFanoutStarted] != 1 {
		t.Errorf("events: %v", owner.eventTypes(id))
	}
}

// TestSubChainInDistributedItem runs a sub-chain inside each item on the
// workers, as a local split would.
func TestSubChainInDistributedItem(t *testing.T) {
	chains := func(name, mode string) string {
		return fmt.Sprintf(`
[[chains]]
name = %[1]q
[[chains.steps]]
name = "loop"
[chains.steps.split]
mode = %[2]q
items = "<<origin.payload.items>>"
[[chains.steps.split.steps]]
name = "escalate"
sub_chain = "page-%[1]s"
input = { host = "<<item>>" }
[[chains.steps.split.steps]]
name = "confirm"
provider = "echo"
payload_template = { paged = "<<steps.escalate.body.host>>" }

[[chains]]
name = "page-%[1]s"
[[chains.steps]]
name = "page"
provider = "echo"
payload_template = { host = "<<origin.payload.host>>" }
`, name, mode)
	}
	cfg := servers(t, "batch_size = 3") + chains("d", "distributed") + chains("l", "local")
	owner := newNode(t, cfg)
	defer newNode(t, cfg).work()()
	payload := `{"items": ["db-1", "db-2", "db-3", "web-1", "web-2"]}`
	d, l := owner.run("d", payload), owner.run("l", payload)
	if d.Status != store.RunSucceeded || string(d.Steps["loop"].Body) != string(l.Steps["loop"].Body) {
		t.Fatalf("distributed %s %+v %s\nlocal %s %s", d.Status, d.Error, d.Steps["loop"].Body, l.Status, l.Steps["loop"].Body)
	}
}

// TestItemClaimedByOneWorker cuts a worker's broker connection while its
// items are mid-call: RabbitMQ hands their messages to a second worker,
// which finds them claimed by the first (which still renews its claims in
// Redis) and waits instead of running them beside it. Every call is made
// once, and the split counts every item once.
func TestItemClaimedByOneWorker(t *testing.T) {
	dir := t.TempDir()
	rec := filepath.Join(dir, "calls.jsonl")
	fan := servers(t, "batch_size = 2\nmax_in_flight = 40\nclaim_ttl_seconds = 2")
	cfg := fan + twoSteps(rec, 4000)
	owner := newNode(t, cfg)
	// The first worker reaches RabbitMQ through a proxy the test can cut.
	amqpURL := fan[strings.Index(fan, `rabbitmq_url = "`)+len(`rabbitmq_url = "`):]
	amqpURL = amqpURL[:strings.IndexByte(amqpURL, '"')]
	host := amqpURL[strings.LastIndexByte(amqpURL, '@')+1:]
	host = host[:strings.IndexByte(host, '/')]
	proxy := brokertest.Proxy(t, host)
	first := newNodeAt(t, strings.Replace(cfg, "@"+host+"/", "@"+proxy.Addr()+"/", 1), filepath.Join(dir, "w1.db"), nil)
	defer first.work()()
	const items = 6
	id := owner.start("c", itemsPayload(items, func(int) bool { return false }))
	waitUntil(t, "every item's second call to be in flight", func() bool {
		n := 0
		for k := range calls(t, rec) {
			if strings.HasSuffix(k, "/second") {
				n++
			}
		}
		return n == items
	})
	m := &counter{}
	defer newNodeAt(t, cfg, filepath.Join(dir, "w2.db"), m).work()()
	proxy.Cut()
	res := owner.wait(id)
	if res.Status != store.RunSucceeded || !strings.Contains(string(res.Steps["loop"].Body), fmt.Sprintf(`"succeeded":%d`, items)) {
		t.Fatalf("run %s %+v: %.300s", res.Status, res.Error, res.Steps["loop"].Body)
	}
	for key, n := range calls(t, rec) {
		if n != 1 {
			t.Errorf("%s was called %d times: two workers ran its item at once", key, n)
		}
	}
	if m.get(func(c *counter) int { return c.redelivered }) == 0 {
		t.Error("the second worker was handed no item: the cut did not return the messages to the queue")
	}
}

// TestWorkerReadsASplitsContextOnce hands one worker many messages of a
// split at once: the deliveries that find the split new read its context,
// which holds the run's payload, once between them.
func TestWorkerReadsASplitsContextOnce(t *testing.T) {
	dir := t.TempDir()
	cfg := servers(t, "batch_size = 5\nprefetch = 8") + splitChain("distributed", "distributed", filepath.Join(dir, "calls.jsonl"), "")
	owner := newNode(t, cfg)
	worker := newNode(t, cfg)
	// Its reads of split contexts.
	reads := &fanout.CommandCounter{Match: func(args []any) bool {
		return len(args) == 2 && args[0] == "get" && strings.HasSuffix(fmt.Sprint(args[1]), ":ctx")
	}}
	worker.f.Redis().AddHook(reads)
	stop := worker.work()
	defer stop()
	res := owner.run("distributed", itemsPayload(200, func(int) bool { return false }))
	if res.Status != store.RunSucceeded {
		t.Fatalf("run %s: %+v", res.Status, res.Error)
	}
	if n := reads.N.Load(); n != 1 {
		t.Errorf("the worker read the split's context %d times, want once", n)
	}
}

// TestRedriveDistributedSplit redrives a distributed split that ended with
// tolerated failures, after a fix to the config: only the failed items are
// handed to the workers again, the others keep their results, and the run
// carries on after the split.
func TestRedriveDistributedSplit(t *testing.T) {
	dir := t.TempDir()
	rec := filepath.Join(dir, "calls.jsonl")
	chainTOML := func(fail string) string {
		return fmt.Sprintf(`
[[chains]]
name = "c"
[[chains.steps]]
name = "loop"
[chains.steps.split]
mode = "distributed"
items = "<<origin.payload.items>>"
tolerated_failures = "50%%"
[[chains.steps.split.steps]]
name = "call"
provider = "faulty"
payload_template = { record = %q, n = "<<item.n>>", fail = %s }
[[chains.steps]]
name = "after"
provider = "faulty"
payload_template = { record = %q, ok = "<<steps.loop.body.succeeded>>" }
`, rec, fail, rec)
	}
	srv := servers(t, "batch_size = 2")
	cfg := srv + chainTOML(`"<<item.fail ?? \"\">>"`)
	owner := newNodeAt(t, cfg, filepath.Join(dir, "owner.db"), nil)
	defer newNodeAt(t, cfg, filepath.Join(dir, "w1.db"), nil).work()()
	id := owner.start("c", `{"items": [{"n": 0}, {"n": 1, "fail": "boom"}, {"n": 2}, {"n": 3}, {"n": 4, "fail": "boom"}, {"n": 5}]}`)
	res := owner.wait(id)
	if res.Status != store.RunSucceeded || !strings.Contains(string(res.Steps["loop"].Body), `"failed":2`) {
		t.Fatalf("first run: %s %+v %s", res.Status, res.Error, res.Steps["loop"].Body)
	}
	before := calls(t, rec)

	fixed, err := loader.LoadBytes("test.toml", []byte(providersTOML+srv+chainTOML(`""`)), loader.Options{ProviderTypes: builtin.Types()})
	if err != nil {
		t.Fatal(err)
	}
	owner.eng.SetConfig(fixed)
	if _, err := owner.eng.Redrive(context.Background(), id, "loop", engine.RedriveOptions{}); err != nil {
		t.Fatal(err)
	}
	res = owner.wait(id)
	if res.Status != store.RunSucceeded || !strings.Contains(string(res.Steps["loop"].Body), `"succeeded":6`) {
		t.Fatalf("after the redrive: %s %+v %s", res.Status, res.Error, res.Steps["loop"].Body)
	}
	c := calls(t, rec)
	for i := range 6 {
		key := fmt.Sprintf("%s/loop[%d]/call", id, i)
		want := before[key]
		if i == 1 || i == 4 {
			want++
		}
		if c[key] != want {
			t.Errorf("%s: %d calls, want %d (before the redrive %d)", key, c[key], want, before[key])
		}
	}
	if c[id+"/after"] != 2 {
		t.Errorf("the step after the split ran %d times, want 2", c[id+"/after"])
	}
}
