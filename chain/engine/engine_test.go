package engine_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/loader"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/bolt"
	"github.com/chaingate/gateway/internal/testutil"
	"github.com/chaingate/gateway/plugins/host"
	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/builtin"
)

// TestMain lets this test binary serve the built-in providers, so every
// engine test calls real plugin subprocesses.
func TestMain(m *testing.M) {
	host.ServeBuiltinIfRequested(builtin.New)
	testutil.QuickRaceExit()
	os.Exit(m.Run())
}

const testProviders = `
[[providers]]
name = "echo"
type = "echo"

[[providers]]
name = "faulty"
type = "faulty"
`

type harness struct {
	t     testing.TB
	eng   *engine.Engine
	store store.Store
	pm    *host.Manager
	// ownsStore is false for an engine standing for another gateway on
	// the same store.
	ownsStore bool

	mu     sync.Mutex
	events []store.Event
}

type resolver struct{ m *host.Manager }

// panicsOnResolve names a provider whose resolution panics, standing in
// for a bug met while a run is advanced.
const panicsOnResolve = "panics-on-resolve"

func (r resolver) Resolve(p *chain.Provider) (providers.Provider, error) {
	if p.Name == panicsOnResolve {
		panic("resolver bug")
	}
	return r.m.Provider(host.Spec{Name: p.Name, Builtin: p.Type, Path: p.Plugin, SHA256: p.SHA256}), nil
}

// harnessOption adjusts a harness's engine and store.
type harnessOption func(*harnessOpts)

type harnessOpts struct {
	db      string            // the store file; default a fresh one
	shared  store.Store       // a store another harness owns
	onEvent func(store.Event) // replaces the harness's own recording
	wrap    func(store.Store) store.Store
	lease   time.Duration
	linger  time.Duration
	logger  *slog.Logger
	obs     engine.Observer
}

// atStore opens the store file db, so that a second harness on it stands
// for the gateway restarted.
func atStore(db string) harnessOption { return func(o *harnessOpts) { o.db = db } }

// sharing runs over st, which another harness owns: the engine stands for
// another gateway on the same store.
func sharing(st store.Store) harnessOption { return func(o *harnessOpts) { o.shared = st } }

// onEvents replaces the harness's own event recording with fn.
func onEvents(fn func(store.Event)) harnessOption { return func(o *harnessOpts) { o.onEvent = fn } }

// wrapStore wraps the engine's store, to watch or hold its calls.
func wrapStore(fn func(store.Store) store.Store) harnessOption {
	return func(o *harnessOpts) { o.wrap = fn }
}

func withLeaseTTL(d time.Duration) harnessOption { return func(o *harnessOpts) { o.lease = d } }

// withLinger sets how long a run's results may wait to be committed together.
func withLinger(d time.Duration) harnessOption { return func(o *harnessOpts) { o.linger = d } }

// withObserver has the engine tell obs about every provider call.
func withObserver(obs engine.Observer) harnessOption { return func(o *harnessOpts) { o.obs = obs } }

// withLogger gets the engine's logs, outcomes included.
func withLogger(l *slog.Logger) harnessOption { return func(o *harnessOpts) { o.logger = l } }

// newHarness builds an engine over a bbolt store, on a fresh file unless
// an option says otherwise, with the test's built-in providers.
func newHarness(t testing.TB, config string, options ...harnessOption) *harness {
	t.Helper()
	var o harnessOpts
	for _, opt := range options {
		opt(&o)
	}
	st, owns := o.shared, false
	if st == nil {
		db := o.db
		if db == "" {
			db = filepath.Join(t.TempDir(), "gateway.db")
		}
		var err error
		if st, err = bolt.Open(db, bolt.Options{}); err != nil {
			t.Fatal(err)
		}
		owns = true
	}
	opts := loader.Options{ProviderTypes: builtin.Types()}
	cfg, err := loader.LoadBytes("test.toml", []byte(testProviders+config), opts)
	if err != nil {
		t.Fatalf("loading config:\n%v", err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	pm := host.NewManager(host.Options{Executable: exe})
	h := &harness{t: t, store: st, pm: pm, ownsStore: owns}
	onEvent := o.onEvent
	if onEvent == nil {
		onEvent = h.record
	}
	var engStore = st
	if o.wrap != nil {
		engStore = o.wrap(st)
	}
	h.eng, err = engine.New(engine.Options{Store: engStore, Config: cfg, Providers: resolver{pm}, LoadOptions: opts, Limits: cfg.Gateway.Limits, OnEvent: onEvent, LeaseTTL: o.lease,
		Linger: o.linger, Observer: o.obs, Logger: o.logger, LogOutcomes: o.logger != nil})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.close)
	return h
}

// close stops the engine as a gateway shutting down would: runs stay as
// persisted.
func (h *harness) close() {
	h.eng.Close()
	_ = h.pm.Close()
	if h.ownsStore {
		_ = h.store.Close()
	}
}

func (h *harness) record(ev store.Event) {
	h.mu.Lock()
	h.events = append(h.events, ev)
	h.mu.Unlock()
}

// run starts a run and waits for it to finish.
func (h *harness) run(chainName, payload string) *engine.Result {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	run, err := h.eng.Start(ctx, chainName, engine.Input{Payload: json.RawMessage(payload)})
	if err != nil {
		h.t.Fatalf("starting run: %v", err)
	}
	if _, err := h.eng.Wait(ctx, run.ID); err != nil {
		h.t.Fatalf("waiting for run: %v", err)
	}
	res, err := h.eng.Result(ctx, run.ID, true)
	if err != nil {
		h.t.Fatal(err)
	}
	return res
}

// eventTypes lists a run's persisted events as "type step" strings.
func (h *harness) eventTypes(runID string) []string {
	h.t.Helper()
	evs, err := h.store.Events(context.Background(), runID, 0, 0)
	if err != nil {
		h.t.Fatal(err)
	}
	var out []string
	for _, ev := range evs {
		out = append(out, strings.TrimSpace(string(ev.Type)+" "+ev.Step))
	}
	return out
}

func body(t *testing.T, res *engine.Result, step string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(res.Steps[step].Body, &m); err != nil {
		t.Fatalf("step %s body %s: %v", step, res.Steps[step].Body, err)
	}
	return m
}

func TestSequentialTemplates(t *testing.T) {
	h := newHarness(t, `
[[chains]]
name = "seq"
[[chains.steps]]
name = "check-severity"
provider = "echo"
payload_template = { severity = "<<origin.payload.severity>>", hosts = ["a", "b"], n = 3 }
[[chains.steps]]
name = "notify"
provider = "echo"
payload_template = { text = "sev=<<steps.check-severity.body.severity>> first=<<prev.body.hosts[0]>>", hosts = "<<steps.check-severity.body.hosts>>", n = "<<prev.body.n>>", owner = "<<steps.check-severity.body.owner ?? \"ops\">>", run = "<<run.id>>", chain = "<<chain.name>>" }
[[chains.steps]]
name = "last"
provider = "echo"
payload_template = { status = "<<prev.status>>", attempts = "<<steps.notify.attempts>>", literal = "<<\"<<steps.x>>\">>" }
`)
	res := h.run("seq", `{"severity":"critical"}`)
	if res.Status != store.RunSucceeded {
		t.Fatalf("run %s: %+v", res.Status, res.Error)
	}
	if want := []string{"check-severity", "notify", "last"}; !slices.Equal(res.Path, want) {
		t.Errorf("path %v, want %v", res.Path, want)
	}
	n := body(t, res, "notify")
	if n["text"] != "sev=critical first=a" || n["n"] != float64(3) || n["owner"] != "ops" || n["run"] != res.ID || n["chain"] != "seq" {
		t.Errorf("notify body: %v", n)
	}
	if hosts, ok := n["hosts"].([]any); !ok || len(hosts) != 2 {
		t.Errorf("lone placeholder lost its array type: %v", n["hosts"])
	}
	l := body(t, res, "last")
	if l["status"] != "succeeded" || l["attempts"] != float64(1) || l["literal"] != "<<steps.x>>" {
		t.Errorf("last body: %v", l)
	}
	want := []string{
		"run_started", "step_started check-severity", "step_succeeded check-severity",
		"step_started notify", "step_succeeded notify", "step_started last", "step_succeeded last", "run_succeeded",
	}
	if got := h.eventTypes(res.ID); !slices.Equal(got, want) {
		t.Errorf("events:\n got %v\nwant %v", got, want)
	}
}

const branchChain = `
[[chains]]
name = "triage"
[[chains.steps]]
name = "rate"
provider = "echo"
payload_template = "<<origin.payload>>"
default_next = "low"
[[chains.steps.branches]]
field = "body.severity"
operator = "eq"
value = "critical"
target = "page"
[[chains.steps.branches]]
when = 'result.body.score > 80 && origin.payload.env == "prod"'
target = "page"
[[chains.steps.branches]]
field = "body.tags"
operator = "contains"
value = "mail"
target = "mail"
[[chains.steps]]
name = "low"
provider = "echo"
default_next = "done"
[[chains.steps]]
name = "page"
provider = "echo"
[[chains.steps]]
name = "mail"
provider = "echo"
[[chains.steps]]
name = "done"
provider = "echo"
`

func TestBranches(t *testing.T) {
	h := newHarness(t, branchChain)
	tests := []struct {
		payload string
		path    []string
	}{
		{`{"severity":"critical"}`, []string{"rate", "page", "mail", "done"}},
		{`{"severity":"low","score":90,"env":"prod"}`, []string{"rate", "page", "mail", "done"}},
		{`{"severity":"low","score":90,"env":"dev","tags":["mail"]}`, []string{"rate", "mail", "done"}},
		{`{"severity":"low","score":10,"env":"prod"}`, []string{"rate", "low", "done"}},
	}
	for _, tc := range tests {
		res := h.run("triage", tc.payload)
		if res.Status != store.RunSucceeded || !slices.Equal(res.Path, tc.path) {
			t.Errorf("payload %s: status %s path %v, want %v (error %+v)", tc.payload, res.Status, res.Path, tc.path, res.Error)
		}
	}
}

func TestBranchConditionErrorFailsRun(t *testing.T) {
	h := newHarness(t, branchChain)
	// score is missing, so `result.body.score > 80` cannot be evaluated.
	res := h.run("triage", `{"severity":"low"}`)
	if res.Status != store.RunFailed || res.Error == nil || !strings.Contains(res.Error.Message, `branch 2 of step "rate"`) {
		t.Fatalf("got %s %+v, want failure naming the branch", res.Status, res.Error)
	}
}

func TestWhenSkipsStep(t *testing.T) {
	h := newHarness(t, `
[[chains]]
name = "c"
[[chains.steps]]
name = "maybe"
provider = "echo"
when = 'origin.payload.env != "test"'
[[chains.steps]]
name = "after"
provider = "echo"
payload_template = { prev = "<<prev.status>>" }
`)
	res := h.run("c", `{"env":"test"}`)
	if res.Status != store.RunSucceeded || res.Steps["maybe"].Status != store.StepSkipped || res.Steps["maybe"].Attempts != 0 {
		t.Fatalf("got %s, maybe=%+v", res.Status, res.Steps["maybe"])
	}
	if b := body(t, res, "after"); b["prev"] != "skipped" {
		t.Errorf("after: %v", b)
	}
	res = h.run("c", `{"env":"prod"}`)
	if res.Steps["maybe"].Status != store.StepSucceeded {
		t.Errorf("maybe with env=prod: %+v", res.Steps["maybe"])
	}
}

func TestOnFailure(t *testing.T) {
	h := newHarness(t, `
[[chains]]
name = "abort"
[[chains.steps]]
name = "boom"
provider = "faulty"
payload_template = { fail = "disk on fire" }
[[chains.steps]]
name = "never"
provider = "echo"

[[chains]]
name = "skip"
[[chains.steps]]
name = "boom"
provider = "faulty"
payload_template = { fail = "disk on fire" }
on_failure = "skip"
[[chains.steps]]
name = "after"
provider = "echo"
payload_template = { err = "<<prev.error.message>>" }

[[chains]]
name = "dlq"
[[chains.steps]]
name = "boom"
provider = "faulty"
payload_template = { fail = "pager down", who = "<<origin.payload.who>>" }
on_failure = "dlq"
[[chains.steps]]
name = "never"
provider = "echo"
`)
	res := h.run("abort", `{}`)
	if res.Status != store.RunFailed || res.Steps["boom"].Status != store.StepFailed || !strings.Contains(res.Error.Message, "disk on fire") {
		t.Errorf("abort: %s %+v %+v", res.Status, res.Error, res.Steps["boom"])
	}
	if _, ran := res.Steps["never"]; ran || !slices.Equal(res.Path, []string{"boom"}) {
		t.Errorf("abort: later step ran; path %v", res.Path)
	}
	if run, err := h.store.Run(context.Background(), res.ID); err != nil || run.Cursor != "" {
		t.Errorf("abort: a failed run has no step to go on from, got cursor %q (%v)", run.Cursor, err)
	}

	res = h.run("skip", `{}`)
	if res.Status != store.RunSucceeded || res.Steps["boom"].Status != store.StepSkipped || res.Steps["boom"].Error == nil {
		t.Errorf("skip: %s %+v", res.Status, res.Steps["boom"])
	}
	if b := body(t, res, "after"); b["err"] != "faulty: disk on fire" {
		t.Errorf("skip: after saw %v", b)
	}

	res = h.run("dlq", `{"who":"ops"}`)
	if res.Status != store.RunFailed || !strings.Contains(res.Error.Message, "dead-letter entry") {
		t.Fatalf("dlq: %s %+v", res.Status, res.Error)
	}
	entries, err := h.store.ListDLQ(context.Background(), store.DLQFilter{Chain: "dlq"})
	if err != nil || len(entries) != 1 {
		t.Fatalf("dlq entries: %v %v", entries, err)
	}
	e := entries[0]
	if e.RunID != res.ID || e.Step != "boom" || e.Attempts != 1 || !strings.Contains(e.Error.Message, "pager down") || !strings.Contains(string(e.Payload), `"who":"ops"`) {
		t.Errorf("dlq entry: %+v payload %s", e, e.Payload)
	}
	if !slices.Contains(h.eventTypes(res.ID), "dead_lettered boom") {
		t.Errorf("no dead_lettered event: %v", h.eventTypes(res.ID))
	}
}

func TestRenderErrorNamesPathAndStep(t *testing.T) {
	h := newHarness(t, `
[[chains]]
name = "c"
[[chains.steps]]
name = "first"
provider = "echo"
[[chains.steps]]
name = "second"
provider = "echo"
payload_template = { owner = "<<steps.first.body.owner>>" }
`)
	res := h.run("c", `{}`)
	st := res.Steps["second"]
	if res.Status != store.RunFailed || st.Status != store.StepFailed || st.Attempts != 0 ||
		!strings.Contains(st.Error.Message, `"second"`) || !strings.Contains(st.Error.Message, "steps.first.body.owner") {
		t.Fatalf("got %s, second=%+v", res.Status, st)
	}
}

func TestStepTimeout(t *testing.T) {
	h := newHarness(t, `
[[chains]]
name = "c"
[[chains.steps]]
name = "slow"
provider = "faulty"
timeout_seconds = 1
payload_template = { hang = true }
`)
	// The call hangs: only the step's timeout ends it, well within the
	// harness's 30 s wait.
	res := h.run("c", `{}`)
	if res.Status != store.RunFailed || res.Steps["slow"].Status != store.StepTimedOut {
		t.Fatalf("got %s, slow=%+v", res.Status, res.Steps["slow"])
	}
}

func TestChainTimeout(t *testing.T) {
	h := newHarness(t, `
[[chains]]
name = "c"
timeout_seconds = 1
[[chains.steps]]
name = "slow"
provider = "faulty"
payload_template = { sleep_ms = 60000 }
[[chains.steps]]
name = "never"
provider = "echo"
`)
	res := h.run("c", `{}`)
	if res.Status != store.RunTimedOut || res.Steps["slow"].Status != store.StepTimedOut {
		t.Fatalf("got %s, slow=%+v", res.Status, res.Steps["slow"])
	}
	if _, ran := res.Steps["never"]; ran {
		t.Error("a step ran after the chain timed out")
	}
	types := h.eventTypes(res.ID)
	if types[len(types)-1] != "run_timed_out" {
		t.Errorf("events: %v", types)
	}
}

// TestIntentBeforeCall checks that the step record, with its dedup key, is
// durable before the provider sees the call, and that the provider gets the
// dedup key and attempt.
func TestIntentBeforeCall(t *testing.T) {
	rec := filepath.Join(t.TempDir(), "record.jsonl")
	h := newHarness(t, fmt.Sprintf(`
[[chains]]
name = "c"
[[chains.steps]]
name = "page"
provider = "faulty"
action_type = "create_incident"
payload_template = { record = %q, hang = true }
`, rec))
	ctx := context.Background()
	run, err := h.eng.Start(ctx, "c", engine.Input{})
	if err != nil {
		t.Fatal(err)
	}
	line := waitForLine(t, rec)
	var got struct {
		DedupKey   string `json:"dedup_key"`
		Attempt    int    `json:"attempt"`
		ActionType string `json:"action_type"`
	}
	if err := json.Unmarshal([]byte(line), &got); err != nil {
		t.Fatal(err)
	}
	if got.DedupKey != run.ID+"/page" || got.Attempt != 1 || got.ActionType != "create_incident" {
		t.Errorf("provider saw %+v", got)
	}
	steps, err := h.store.Steps(ctx, run.ID, "page")
	if err != nil || len(steps) != 1 {
		t.Fatalf("steps: %v %v", steps, err)
	}
	if s := steps[0]; s.Status != store.StepRunning || s.DedupKey != got.DedupKey || s.Attempts != 1 {
		t.Errorf("persisted intent: %+v", s)
	}
	if err := h.eng.Cancel(ctx, run.ID); err != nil {
		t.Fatal(err)
	}
	final, err := h.eng.Wait(ctx, run.ID)
	if err != nil || final.Status != store.RunCancelled {
		t.Fatalf("after cancel: %+v %v", final, err)
	}
	// The path names the step the run was cancelled at.
	if !slices.Equal(final.Path, []string{"page"}) {
		t.Errorf("path of the cancelled run = %q, want [page]", final.Path)
	}
}

func waitForLine(t *testing.T, path string) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if f, err := os.Open(path); err == nil {
			sc := bufio.NewScanner(f)
			ok := sc.Scan()
			_ = f.Close()
			if ok {
				return sc.Text()
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no line in %s", path)
	return ""
}

func TestPluginCrashFailsStepClearly(t *testing.T) {
	h := newHarness(t, `
[[chains]]
name = "c"
[[chains.steps]]
name = "crash"
provider = "faulty"
payload_template = { crash = true }
[[chains]]
name = "ok"
[[chains.steps]]
name = "fine"
provider = "faulty"
payload_template = { x = 1 }
`)
	res := h.run("c", `{}`)
	st := res.Steps["crash"]
	if res.Status != store.RunFailed || st.Error == nil || st.Error.Code != "plugin_crashed" {
		t.Fatalf("got %s, crash=%+v", res.Status, st)
	}
	// The provider's process is relaunched for the next call.
	if res := h.run("ok", `{}`); res.Status != store.RunSucceeded {
		t.Fatalf("after a crash: %s %+v", res.Status, res.Error)
	}
}

func TestRetryKeepsDedupKey(t *testing.T) {
	rec := filepath.Join(t.TempDir(), "record.jsonl")
	h := newHarness(t, fmt.Sprintf(`
[[chains]]
name = "c"
[[chains.steps]]
name = "flaky"
provider = "faulty"
payload_template = { record = %q, fail_times = 2 }
retry = { max_retries = 3, backoff_ms = 10, strategy = "fixed" }
`, rec))
	res := h.run("c", `{}`)
	if res.Status != store.RunSucceeded || res.Steps["flaky"].Attempts != 3 {
		t.Fatalf("got %s, flaky=%+v", res.Status, res.Steps["flaky"])
	}
	data, err := os.ReadFile(rec)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) != 3 {
		t.Fatalf("provider was called %d times, want 3", len(lines))
	}
	for i, l := range lines {
		var got struct {
			DedupKey string `json:"dedup_key"`
			Attempt  int    `json:"attempt"`
		}
		_ = json.Unmarshal([]byte(l), &got)
		if got.DedupKey != res.ID+"/flaky" || got.Attempt != i+1 {
			t.Errorf("call %d: %+v", i+1, got)
		}
	}
	if n := strings.Count(strings.Join(h.eventTypes(res.ID), ","), "step_retrying"); n != 2 {
		t.Errorf("%d retrying events, want 2", n)
	}
}

// TestRetryAfterOverridesBackoff checks that a retry waits as long as the
// provider's RetryAfter (a 429's Retry-After) asks when that is longer than
// the step's backoff, and keeps the backoff when it is shorter.
func TestRetryAfterOverridesBackoff(t *testing.T) {
	for _, tc := range []struct {
		name         string
		retryAfterMS int
		want         string
	}{
		{"longer than the backoff", 300, "retrying in 300ms"},
		{"shorter than the backoff", 5, "retrying in 50ms"},
		{"none", 0, "retrying in 50ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, fmt.Sprintf(`
[[chains]]
name = "c"
[[chains.steps]]
name = "limited"
provider = "faulty"
payload_template = { fail_times = 1, retry_after_ms = %d }
retry = { max_retries = 1, backoff_ms = 50, strategy = "fixed" }
`, tc.retryAfterMS))
			res := h.run("c", `{}`)
			if res.Status != store.RunSucceeded || res.Steps["limited"].Attempts != 2 {
				t.Fatalf("got %s, limited=%+v", res.Status, res.Steps["limited"])
			}
			evs, err := h.store.Events(context.Background(), res.ID, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			var msgs []string
			for _, ev := range evs {
				if ev.Type == store.EventStepRetrying {
					msgs = append(msgs, ev.Message)
				}
			}
			if len(msgs) != 1 || !strings.HasSuffix(msgs[0], tc.want) {
				t.Errorf("retrying events %q, want one ending %q", msgs, tc.want)
			}
		})
	}
}

func TestUnknownChain(t *testing.T) {
	h := newHarness(t, `
[[chains]]
name = "c"
[[chains.steps]]
name = "a"
provider = "echo"
`)
	if _, err := h.eng.Start(context.Background(), "nope", engine.Input{}); err == nil {
		t.Fatal("started a run of an unknown chain")
	}
	if _, err := h.eng.Start(context.Background(), "c", engine.Input{Payload: json.RawMessage(`{bad`)}); err == nil {
		t.Fatal("started a run with invalid JSON")
	}
}

// TestBadProviderBody checks that a body that is not one JSON value fails
// the step with a reason, rather than be stored or read as something else.
func TestBadProviderBody(t *testing.T) {
	h := newHarness(t, `
[[chains]]
name = "c"
[[chains.steps]]
name = "call"
provider = "faulty"
payload_template = { raw = "<<origin.payload.raw>>" }
`)
	for _, raw := range []string{`{"a":1} {"b":2}`, `{"a":`, `not json`} {
		res := h.run("c", fmt.Sprintf(`{"raw":%q}`, raw))
		st := res.Steps["call"]
		if res.Status != store.RunFailed || st.Error == nil || st.Error.Code != "bad_response" {
			t.Errorf("body %s: run %s, step %+v", raw, res.Status, st)
		}
	}
	if res := h.run("c", `{"raw":"[1, 2]"}`); res.Status != store.RunSucceeded || strings.ReplaceAll(string(res.Steps["call"].Body), " ", "") != "[1,2]" {
		t.Errorf("a JSON body: %s %s", res.Status, res.Steps["call"].Body)
	}
}

// TestDeepBodyFailsStep: a provider answer nested deeper than a run may
// keep fails its step, permanently, rather than making the run unreadable.
func TestDeepBodyFailsStep(t *testing.T) {
	deep := strings.Repeat("[", store.MaxNesting+1) + strings.Repeat("]", store.MaxNesting+1)
	h := newHarness(t, `
[[chains]]
name = "c"
[[chains.steps]]
name = "deep"
provider = "faulty"
payload_template = { raw = '`+deep+`' }
retry = { max_retries = 2, backoff_ms = 1 }
`)
	res := h.run("c", `{}`)
	st := res.Steps["deep"]
	if res.Status != store.RunFailed || st.Error == nil || st.Error.Code != "body_too_deep" || st.Attempts != 1 {
		t.Fatalf("run %s, step %+v", res.Status, st)
	}
}

// TestConditionsReadBodies checks that conditions see inside the bodies
// steps returned, which the engine keeps undecoded until something reads
// them: a step's, the previous one's, a group sub-step's through the
// group's body, and a split item's fields.
func TestConditionsReadBodies(t *testing.T) {
	h := newHarness(t, `
[[chains]]
name = "c"
[[chains.steps]]
name = "first"
provider = "echo"
payload_template = { level = "<<origin.payload.level>>" }
[[chains.steps]]
name = "by-steps"
provider = "echo"
when = 'steps.first.body.level == "high"'
[[chains.steps]]
name = "by-prev"
provider = "echo"
payload_template = { level = "<<steps.first.body.level>>" }
[[chains.steps]]
name = "after-prev"
provider = "echo"
when = 'prev.body.level == "high"'
[[chains.steps]]
name = "group"
[chains.steps.parallel]
[[chains.steps.parallel.steps]]
name = "a"
provider = "echo"
payload_template = { n = "<<origin.payload.n>>" }
[[chains.steps]]
name = "by-group"
provider = "echo"
when = 'steps.group.body.a.n > 2'
[[chains.steps]]
name = "loop"
[chains.steps.split]
items = "<<origin.payload.hosts>>"
[[chains.steps.split.steps]]
name = "check"
provider = "echo"
when = 'item.up && item.zone == "a"'
payload_template = { name = "<<item.name>>" }
`)
	tests := []struct {
		payload string
		ran     []string
		checked int
	}{
		{`{"level":"high","n":3,"hosts":[{"name":"h1","up":true,"zone":"a"},{"name":"h2","up":false,"zone":"a"},{"name":"h3","up":true,"zone":"b"}]}`,
			[]string{"by-steps", "after-prev", "by-group"}, 1},
		{`{"level":"low","n":1,"hosts":[{"name":"h1","up":true,"zone":"a"},{"name":"h2","up":true,"zone":"a"}]}`,
			nil, 2},
	}
	for _, tc := range tests {
		res := h.run("c", tc.payload)
		if res.Status != store.RunSucceeded {
			t.Fatalf("payload %s: %s %+v", tc.payload, res.Status, res.Error)
		}
		for _, name := range []string{"by-steps", "after-prev", "by-group"} {
			want := slices.Contains(tc.ran, name)
			if got := res.Steps[name].Status == store.StepSucceeded; got != want {
				t.Errorf("payload %s: step %s ran %v, want %v (%s)", tc.payload, name, got, want, res.Steps[name].Status)
			}
		}
		var loop struct {
			Results []*struct{ Name string } `json:"results"`
		}
		if err := json.Unmarshal(res.Steps["loop"].Body, &loop); err != nil {
			t.Fatalf("loop body %s: %v", res.Steps["loop"].Body, err)
		}
		checked := 0
		for i, r := range loop.Results {
			if r != nil {
				checked++
				if want := fmt.Sprintf("h%d", i+1); r.Name != want {
					t.Errorf("payload %s: item %d checked %q, want %q", tc.payload, i, r.Name, want)
				}
			}
		}
		if checked != tc.checked {
			t.Errorf("payload %s: %d items checked, want %d: %s", tc.payload, checked, tc.checked, res.Steps["loop"].Body)
		}
	}
}

// TestExternalURLInTemplates checks run.url: the run's console page at
// [gateway] external_url under the console's base path, in a step's
// payload, in a condition and in a split's items.
func TestExternalURLInTemplates(t *testing.T) {
	h := newHarness(t, `
[gateway]
external_url = "https://gw.example.com/ops/"
[gateway.ui]
base_path = "/console"

[[chains]]
name = "links"
[[chains.steps]]
name = "post"
provider = "echo"
when = 'run.url startsWith "https://gw.example.com/ops/console/runs/"'
payload_template = { text = "Approve: <<run.url>>/steps/ask", hosts = ["a"] }
[[chains.steps]]
name = "each"
[chains.steps.split]
items = "<<steps.post.body.hosts>>"
[[chains.steps.split.steps]]
name = "link"
provider = "echo"
payload_template = { url = "<<run.url>>" }
`)
	res := h.run("links", `{}`)
	if res.Status != store.RunSucceeded {
		t.Fatalf("run %s: %+v", res.Status, res.Error)
	}
	want := "https://gw.example.com/ops/console/runs/" + res.ID
	if got := body(t, res, "post")["text"]; got != "Approve: "+want+"/steps/ask" {
		t.Errorf("post's text: %q, want %q", got, "Approve: "+want+"/steps/ask")
	}
	if got := body(t, res, "each"); !strings.Contains(fmt.Sprint(got["results"]), want) {
		t.Errorf("the split's item did not read run.url: %v", got)
	}
}
