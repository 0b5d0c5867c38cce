package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/gateway/console"
	"github.com/chaingate/gateway/gateway/events"
	"github.com/chaingate/gateway/gateway/metrics"
	"github.com/chaingate/gateway/gateway/server"
	"github.com/chaingate/gateway/internal/testutil"
	"github.com/chaingate/gateway/plugins/host"
)

func TestMain(m *testing.M) {
	host.ServeBuiltinIfRequested(lookupProvider)
	testutil.QuickRaceExit()
	flag.Parse()
	// Its tests mostly wait on the gateways, plugins and browser they
	// start: one test per CPU would leave the CPUs idle.
	if !flagGiven("test.parallel") && runtime.GOMAXPROCS(0) < 8 {
		_ = flag.Set("test.parallel", "8")
	}
	code := m.Run()
	closeBrowser()
	os.Exit(code)
}

func flagGiven(name string) bool {
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

const apiConfig = `
[gateway.limits]
max_request_bytes = 2048

[[providers]]
name = "echo"
type = "echo"
[[providers]]
name = "faulty"
type = "faulty"

[[chains]]
name = "hello"
[[chains.steps]]
name = "greet"
provider = "echo"
payload_template = { text = "hello <<origin.payload.who ?? \"world\">>", token = "<<secrets.API_TOKEN ?? \"none\">>" }
[[chains.steps]]
name = "notify"
[chains.steps.parallel]
[[chains.steps.parallel.steps]]
name = "a"
provider = "echo"
[[chains.steps.parallel.steps]]
name = "b"
provider = "faulty"
payload_template = { sleep_ms = "<<origin.payload.sleep_ms ?? 0>>", record = "<<origin.payload.record ?? \"\">>" }

[[chains]]
name = "breaks"
[[chains.steps]]
name = "call"
provider = "faulty"
payload_template = { fail = "remote said no to <<secrets.API_TOKEN ?? \"x\">>" }
on_failure = "dlq"

[[chains]]
name = "flaky"
[[chains.steps]]
name = "call"
provider = "faulty"
payload_template = { fail = "still down", sleep_ms = 300 }
on_failure = "dlq"

[[chains]]
name = "many"
[[chains.steps]]
name = "check"
[chains.steps.split]
items = "<<origin.payload.hosts>>"
[[chains.steps.split.steps]]
name = "ping"
provider = "echo"
payload_template = { host = "<<item.host>>" }

[[chains]]
name = "typed"
[chains.input.schema]
type = "object"
required = ["alert_name", "host"]
properties = { alert_name = { type = "string" }, host = { type = "string" }, severity = { enum = ["critical", "warning"] } }
[[chains.steps]]
name = "page"
provider = "echo"
payload_template = { alert = "<<origin.payload.alert_name>>", severity = "<<origin.payload.severity ?? \"critical\">>" }
`

type apiEnv struct {
	t      testing.TB
	dir    string
	cfg    string
	url    string
	srv    *server.Server
	gw     *gateway.Gateway
	hub    *events.Hub
	logs   *testutil.Buffer
	client *http.Client
	token  string
}

const testSecret = "tok-9f8e7d6c5b4a"

func newAPI(t *testing.T, extra string) *apiEnv {
	t.Helper()
	return newAPIOn(t, extra, "")
}

// newAPIOn serves the API over the store at state: a redis:// URL, or a
// fresh bbolt file when empty; with changes the gateway's options.
func newAPIOn(t testing.TB, extra, state string, with ...func(*gateway.Options)) *apiEnv {
	t.Helper()
	dir := t.TempDir()
	if state == "" {
		state = filepath.Join(dir, "gw.db")
	}
	env := &apiEnv{t: t, dir: dir, cfg: filepath.Join(dir, "gateway.toml"), logs: &testutil.Buffer{}, client: &http.Client{}}
	if err := os.WriteFile(filepath.Join(dir, "secrets.env"), []byte("API_TOKEN="+testSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env.write(`[gateway]
secrets_file = "secrets.env"
` + extra + apiConfig)
	cfg, err := gateway.LoadConfig([]string{env.cfg})
	if err != nil {
		t.Fatal(err)
	}
	exe, _ := os.Executable()
	hub, metrics := events.NewHub(), metrics.NewMetrics()
	logger := slog.New(slog.NewJSONHandler(env.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	opts := gateway.Options{
		Config: cfg, State: state, Logger: logger, Executable: exe, Observer: metrics,
		OnEvent: func(ev store.Event) { hub.Publish(ev); metrics.Event(ev) },
	}
	for _, change := range with {
		change(&opts)
	}
	gw, err := gateway.Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	env.gw, env.hub = gw, hub
	env.srv = server.NewServer(gw, hub, metrics, []string{env.cfg})
	env.srv.MountConsole(func(base string) http.Handler { return console.New(env.srv, base, logger.With("component", "console")) })
	ts := httptest.NewServer(env.srv.Handler())
	env.url = ts.URL
	t.Cleanup(func() {
		ts.Close()
		_ = gw.Close()
		if t.Failed() {
			t.Logf("gateway log:\n%s", env.logs)
		}
	})
	return env
}

func (env *apiEnv) write(content string) {
	env.t.Helper()
	if err := os.WriteFile(env.cfg, []byte(content), 0o644); err != nil {
		env.t.Fatal(err)
	}
}

// call makes a request and decodes a JSON answer into out (if not nil).
func (env *apiEnv) call(method, path, body string, headers map[string]string, out any) (int, http.Header, string) {
	env.t.Helper()
	req, _ := http.NewRequest(method, env.url+path, strings.NewReader(body))
	if env.token != "" {
		req.Header.Set("Authorization", "Bearer "+env.token)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := env.client.Do(req)
	if err != nil {
		env.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if out != nil && len(data) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			env.t.Fatalf("%s %s: answer is not JSON: %v\n%s", method, path, err, data)
		}
	}
	return resp.StatusCode, resp.Header, string(data)
}

type apiErr struct {
	Error struct {
		Code    string   `json:"code"`
		Message string   `json:"message"`
		Details []string `json:"details"`
	} `json:"error"`
}

func TestStartAndReadRun(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	var started api.StartResponse
	code, _, body := env.call("POST", "/v1/chains/hello/runs", `{"who":"ops"}`, nil, &started)
	if code != http.StatusAccepted || started.ID == "" || started.Links["events"] == "" {
		t.Fatalf("POST: %d %s", code, body)
	}
	var done api.StartResponse
	code, _, body = env.call("POST", "/v1/chains/hello/runs?wait=20s", `{"who":"sre"}`, nil, &done)
	if code != http.StatusOK || done.Run == nil || done.Run.Status != string(store.RunSucceeded) {
		t.Fatalf("POST with wait: %d %s", code, body)
	}
	if g := done.Run.Steps["greet"]; g == nil || !strings.Contains(string(g.Body), "hello sre") {
		t.Errorf("greet: %+v", done.Run.Steps)
	}
	var view api.RunView
	waitRun(t, env, started.ID)
	code, _, body = env.call("GET", "/v1/runs/"+started.ID, "", nil, &view)
	if code != http.StatusOK || view.Status != string(store.RunSucceeded) || view.Steps["notify/a"] == nil {
		t.Fatalf("GET run: %d %s", code, body)
	}
	var meta map[string]string
	_ = json.Unmarshal(view.Origin.Metadata, &meta)
	if meta["remote_addr"] == "" {
		t.Errorf("origin metadata: %s", view.Origin.Metadata)
	}
	var list struct {
		Runs []store.Run `json:"runs"`
		Next string      `json:"next_cursor"`
	}
	code, _, body = env.call("GET", "/v1/runs?chain=hello&status=succeeded&limit=1", "", nil, &list)
	if code != http.StatusOK || len(list.Runs) != 1 || list.Next == "" {
		t.Fatalf("list: %d %s", code, body)
	}
	code, _, _ = env.call("GET", "/v1/runs?chain=hello&limit=1&cursor="+list.Next, "", nil, &list)
	if code != http.StatusOK || len(list.Runs) != 1 {
		t.Errorf("second page: %d %+v", code, list)
	}
	var dag api.DAG
	code, _, body = env.call("GET", "/v1/runs/"+started.ID+"/dag", "", nil, &dag)
	if code != http.StatusOK || len(dag.Nodes) != 2 || dag.Nodes[1].Kind != "parallel" || len(dag.Nodes[1].Children) != 2 || dag.Nodes[1].Children[0].Status != "succeeded" {
		t.Errorf("dag: %d %s", code, body)
	}
}

func waitRun(t *testing.T, env *apiEnv, id string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		var v api.RunView
		env.call("GET", "/v1/runs/"+id, "", nil, &v)
		if v.Run != nil && v.Final() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("run %s did not finish", id)
}

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	h := map[string]string{"Idempotency-Key": "alert-42"}
	var first, second, other api.StartResponse
	c1, _, _ := env.call("POST", "/v1/chains/hello/runs", `{}`, h, &first)
	c2, _, _ := env.call("POST", "/v1/chains/hello/runs", `{}`, h, &second)
	c3, _, _ := env.call("POST", "/v1/chains/breaks/runs", `{}`, h, &other)
	if c1 != 202 || c2 != 200 || first.ID != second.ID || !second.Replayed {
		t.Errorf("retried POST: %d %+v then %d %+v", c1, first, c2, second)
	}
	if c3 != 202 || other.ID == first.ID {
		t.Errorf("the same key on another chain: %d %+v", c3, other)
	}
	var list struct {
		Runs []store.Run `json:"runs"`
	}
	env.call("GET", "/v1/runs?chain=hello", "", nil, &list)
	if len(list.Runs) != 1 {
		t.Errorf("%d runs of hello, want 1", len(list.Runs))
	}

	// A key whose first request claimed it but failed to start the run:
	// the retry starts it, and says so.
	orphan := store.NewID()
	if _, err := env.gw.Store.ClaimKey(context.Background(), "run/hello/alert-43", orphan, time.Hour); err != nil {
		t.Fatal(err)
	}
	var retried api.StartResponse
	code, _, body := env.call("POST", "/v1/chains/hello/runs", `{}`, map[string]string{"Idempotency-Key": "alert-43"}, &retried)
	if code != 202 || retried.ID != orphan || retried.Replayed {
		t.Errorf("retry after a failed start: %d %s", code, body)
	}

	// A key longer than a store keeps is refused, and nothing is started.
	code, _, body = env.call("POST", "/v1/chains/hello/runs", `{}`, map[string]string{"Idempotency-Key": strings.Repeat("k", store.MaxKeyBytes)}, nil)
	if code != 400 || !strings.Contains(string(body), "more than the 16384 a key may have") {
		t.Errorf("a %d-byte key: %d %s", store.MaxKeyBytes, code, body)
	}
	env.call("GET", "/v1/runs?chain=hello", "", nil, &list)
	if len(list.Runs) != 2 {
		t.Errorf("%d runs of hello after a refused key, want 2", len(list.Runs))
	}
}

func TestErrors(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	tests := []struct {
		method, path, body string
		status             int
		code               string
	}{
		{"POST", "/v1/chains/nope/runs", `{}`, 404, "unknown_chain"},
		{"POST", "/v1/chains/typed/runs", `{"alert_name":"disk-full"}`, 400, "invalid_payload"},
		{"POST", "/v1/chains/typed/runs", `["disk-full"]`, 400, "invalid_payload"},
		{"POST", "/v1/chains/hello/runs", `{"a":`, 400, "invalid_json"},
		{"POST", "/v1/chains/hello/runs", `{"a":1} {"b":2}`, 400, "invalid_json"},
		{"POST", "/v1/chains/hello/runs", `{"pad":"` + strings.Repeat("x", 3000) + `"}`, 413, "payload_too_large"},
		{"POST", "/v1/chains/hello/runs?wait=forever", `{}`, 400, "invalid_parameter"},
		{"GET", "/v1/runs/01nonexistent", "", 404, "not_found"},
		{"GET", "/v1/runs?status=sleeping", "", 400, "invalid_parameter"},
		{"GET", "/v1/runs?limit=0", "", 400, "invalid_parameter"},
		{"GET", "/v1/runs?since=yesterday", "", 400, "invalid_parameter"},
		{"GET", "/v1/nothing", "", 404, "not_found"},
		{"DELETE", "/v1/runs", "", 405, "method_not_allowed"},
		{"GET", "/v1/dlq/nope", "", 404, "not_found"},
		{"POST", "/v1/dlq/purge", `{}`, 400, "filter_required"},
		{"POST", "/v1/dlq/purge", `{"chian":"x"}`, 400, "invalid_json"},
		{"POST", "/v1/dlq/x/replay", `{"mode":"sideways"}`, 400, "invalid_parameter"},
		{"POST", "/v1/dlq/x/replay", `{"definition":"latest"}`, 400, "invalid_parameter"},
		{"POST", "/v1/dlq/x/replay", `{"mode":"restart","definition":"pinned"}`, 400, "invalid_parameter"},
		{"POST", "/v1/dlq/x/replay?definition=pinned", `{"mode":"restart"}`, 400, "invalid_parameter"},
		{"POST", "/v1/dlq/replay", `{"all":true,"definition":"old"}`, 400, "invalid_parameter"},
		{"GET", "/v1/chains/nope", "", 404, "unknown_chain"},
		{"GET", "/v1/runs?cursor=not-a-cursor!", "", 400, "invalid_parameter"},
		{"GET", "/v1/runs?cursor=zzzz", "", 400, "invalid_parameter"},
		{"POST", "/v1/dlq/replay", ``, 400, "filter_required"},
		{"POST", "/v1/dlq/replay", `{"mode":"restart"}`, 400, "filter_required"},
		{"POST", "/v1/dlq/purge", `{"chain":"nope"} {"all":true}`, 400, "invalid_json"},
		{"POST", "/v1/dlq/purge", `{"all":true,"mode":"restart"}`, 400, "invalid_json"},
		{"POST", "/v1/dlq/purge", `{"all":true,"limit":-3}`, 400, "invalid_parameter"},
		{"POST", "/v1/dlq/replay", `{"all":true,"concurrency":65}`, 400, "invalid_parameter"},
		{"POST", "/v1/dlq/x/replay", `{"chain":"breaks"}`, 400, "invalid_json"},
		{"POST", "/v1/dlq/x/replay", `{"mode":"resume","all":true,"concurrency":2,"limit":1}`, 400, "invalid_json"},
		{"POST", "/v1/dlq/x/replay", `{"mode":"resume"} {}`, 400, "invalid_json"},
		{"GET", "/v1/nope/../x", "", 404, "not_found"},
		{"GET", "//v1/chains", "", 404, "not_found"},
		{"GET", "/v1/./runs", "", 404, "not_found"},
		{"GET", "/v1/runs/", "", 404, "not_found"},
		{"POST", "/v1/runs", "", 405, "method_not_allowed"},
	}
	for _, tc := range tests {
		var e apiErr
		code, hdr, body := env.call(tc.method, tc.path, tc.body, nil, &e)
		if code != tc.status || e.Error.Code != tc.code || e.Error.Message == "" || hdr.Get("Content-Type") != "application/json" || hdr.Get("Location") != "" {
			t.Errorf("%s %s: %d %s, want %d %s", tc.method, tc.path, code, body, tc.status, tc.code)
		}
		if code == 405 && hdr.Get("Allow") != "GET, HEAD" {
			t.Errorf("%s %s: Allow %q", tc.method, tc.path, hdr.Get("Allow"))
		}
	}
}

func TestAuth(t *testing.T) {
	t.Parallel()
	env := newAPI(t, `[gateway.auth]
tokens = ["writer"]
read_tokens = ["reader"]
`)
	tests := []struct {
		token, method, path string
		status              int
	}{
		{"", "GET", "/healthz", 200},
		{"", "GET", "/readyz", 200},
		{"", "GET", "/v1/runs", 401},
		{"wrong", "GET", "/v1/runs", 401},
		{"reader", "GET", "/v1/runs", 200},
		{"reader", "GET", "/metrics", 200},
		{"reader", "POST", "/v1/chains/hello/runs", 403},
		{"writer", "POST", "/v1/chains/hello/runs", 202},
		{"writer", "GET", "/v1/chains", 200},
		{"", "GET", "/metrics", 401},
	}
	for _, tc := range tests {
		env.token = tc.token
		code, hdr, body := env.call(tc.method, tc.path, "{}", nil, nil)
		if code != tc.status {
			t.Errorf("%q %s %s: %d %s, want %d", tc.token, tc.method, tc.path, code, body, tc.status)
		}
		if code == 401 && !strings.HasPrefix(hdr.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("401 without WWW-Authenticate")
		}
	}
}

// TestReloadKeepsAuth checks that a reload cannot drop every API token:
// one slip in an edit would open the API to anyone.
func TestReloadKeepsAuth(t *testing.T) {
	t.Parallel()
	env := newAPI(t, `[gateway.auth]
tokens = ["writer"]
`)
	env.token = "writer"
	env.write("[gateway]\nsecrets_file = \"secrets.env\"\n" + apiConfig)
	var e apiErr
	code, _, _ := env.call("POST", "/v1/admin/reload", "", nil, &e)
	if code != 400 || e.Error.Code != "invalid_config" || !strings.Contains(strings.Join(e.Error.Details, "\n"), "gateway.auth") {
		t.Errorf("reload without tokens: %d %+v", code, e)
	}
	env.token = ""
	if code, _, _ := env.call("GET", "/v1/runs", "", nil, nil); code != 401 {
		t.Errorf("after the refused reload, a request without a token: %d", code)
	}
}

// readSSE reads events from a stream until the run ends or n events came.
// waitRunEnd waits, up to 30 s, for a run to end and returns its view.
func waitRunEnd(t *testing.T, env *apiEnv, id string) *api.RunView {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var v api.RunView
		if code, _, _ := env.call("GET", "/v1/runs/"+id, "", nil, &v); code == http.StatusOK && v.Final() {
			return &v
		}
	}
	t.Fatalf("run %s did not end within 30 s", id)
	return nil
}

func readSSE(t *testing.T, env *apiEnv, id string, lastID string) []store.Event {
	t.Helper()
	req, _ := http.NewRequest("GET", env.url+"/v1/runs/"+id+"/events", nil)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	if env.token != "" {
		req.Header.Set("Authorization", "Bearer "+env.token)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := env.client.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	var evs []store.Event
	sc := bufio.NewScanner(resp.Body)
	var id64 string
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "id: "); ok {
			id64 = v
		}
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			var ev store.Event
			if err := json.Unmarshal([]byte(data), &ev); err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(ev.Seq) != id64 {
				t.Errorf("SSE id %s for event seq %d", id64, ev.Seq)
			}
			evs = append(evs, ev)
		}
	}
	return evs
}

func TestEventStream(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	var started api.StartResponse
	env.call("POST", "/v1/chains/hello/runs", `{"sleep_ms":400}`, nil, &started)
	// Connect while the run is still going: the log is replayed, then the
	// stream follows live until the run ends.
	evs := readSSE(t, env, started.ID, "")
	if len(evs) < 8 || evs[0].Type != store.EventRunStarted || evs[len(evs)-1].Type != store.EventRunSucceeded {
		t.Fatalf("events: %+v", evs)
	}
	for i, ev := range evs {
		if ev.Seq != uint64(i+1) {
			t.Fatalf("event %d has seq %d", i, ev.Seq)
		}
	}
	rest := readSSE(t, env, started.ID, "5")
	if len(rest) != len(evs)-5 || rest[0].Seq != 6 {
		t.Errorf("after Last-Event-ID 5: %d events starting at %d", len(rest), rest[0].Seq)
	}
	var e apiErr
	if code, _, _ := env.call("GET", "/v1/runs/"+started.ID+"/events?after=five", "", nil, &e); code != 400 || !strings.Contains(e.Error.Message, `after "five"`) {
		t.Errorf("bad after: %d %+v", code, e)
	}
}

// TestEventStreamFollowsReplayedRun checks that a stream of a run resumed
// from the dead-letter queue follows it live past the end event of its
// first attempt.
func TestEventStreamFollowsReplayedRun(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	var failed api.StartResponse
	env.call("POST", "/v1/chains/flaky/runs?wait=20s", `{}`, nil, &failed)
	if failed.Status != string(store.RunFailed) {
		t.Fatalf("first attempt: %+v", failed)
	}
	var list struct {
		Entries []store.DLQEntry `json:"entries"`
	}
	env.call("GET", "/v1/dlq?chain=flaky", "", nil, &list)
	if len(list.Entries) != 1 {
		t.Fatalf("entries: %+v", list)
	}
	if code, _, body := env.call("POST", "/v1/dlq/"+list.Entries[0].ID+"/replay", `{}`, nil, nil); code != 202 {
		t.Fatalf("replay: %d %s", code, body)
	}
	// The resumed call sleeps 300 ms and fails again: the stream connects while it runs and follows it to
	// its second end.
	evs := readSSE(t, env, failed.ID, "")
	ends := 0
	for _, ev := range evs {
		if ev.Type == store.EventRunFailed {
			ends++
		}
	}
	if ends != 2 || evs[len(evs)-1].Type != store.EventRunFailed {
		t.Errorf("events: %+v", evs)
	}
}

// TestShutdownEndsStreams runs the server as `gateway serve` does and stops
// it with a call in flight: open event streams end at once, so clients
// reconnect elsewhere; the API answers while the engine drains, refusing
// new runs and reporting not ready; the call finishes within the grace.
func TestShutdownEndsStreams(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	env.url = "http://" + l.Addr().String()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	served := make(chan error, 1)
	go func() { served <- env.srv.Run(ctx, l, 30*time.Second) }()

	var slow api.StartResponse
	called := filepath.Join(env.dir, "called.jsonl")
	if code, _, body := env.call("POST", "/v1/chains/hello/runs", fmt.Sprintf(`{"sleep_ms":2500,"record":%q}`, called), nil, &slow); code != 202 {
		t.Fatalf("POST: %d %s", code, body)
	}
	req, _ := http.NewRequest("GET", env.url+"/v1/runs/"+slow.ID+"/events", nil)
	resp, err := env.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	streamDone := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, resp.Body)
		close(streamDone)
	}()
	// Shut down once the slow sub-step's call has reached the plugin: a
	// call whose intent is written but that has not gone out waits for the
	// next start.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if data, _ := os.ReadFile(called); bytes.Contains(data, []byte("\n")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the slow call never reached the plugin")
		}
	}
	stop()
	select {
	case <-streamDone:
	case err := <-served:
		t.Fatalf("the server stopped (%v) before it ended the event stream", err)
	}
	select {
	case err := <-served:
		t.Fatalf("the server stopped (%v) before the call in flight finished", err)
	default:
	}
	var e apiErr
	if code, _, _ := env.call("GET", "/readyz", "", nil, &e); code != 503 || e.Error.Code != "shutting_down" {
		t.Errorf("readyz while draining: %d %+v", code, e)
	}
	// Probes during a drain are expected: no error in the log for them.
	for _, line := range strings.Split(env.logs.String(), "\n") {
		if strings.Contains(line, `"level":"ERROR"`) && strings.Contains(line, "/readyz") {
			t.Errorf("a probe while draining logged an error: %s", line)
		}
	}
	if code, _, _ := env.call("POST", "/v1/chains/hello/runs", `{}`, nil, &e); code != 503 {
		t.Errorf("POST while draining: %d %+v", code, e)
	}
	if code, _, _ := env.call("GET", "/v1/runs/"+slow.ID, "", nil, nil); code != 200 {
		t.Errorf("reads while draining: %d", code)
	}
	if err := <-served; err != nil {
		t.Errorf("Run: %v", err)
	}
	steps, err := env.gw.Store.Steps(context.Background(), slow.ID, "notify/b")
	if err != nil || len(steps) != 1 || steps[0].Status != store.StepSucceeded {
		t.Errorf("the call in flight did not finish within the grace: %+v %v", steps, err)
	}
}

func TestChainsEndpoints(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	var list struct {
		Chains []map[string]any `json:"chains"`
	}
	env.call("GET", "/v1/chains", "", nil, &list)
	if len(list.Chains) != 5 || list.Chains[0]["name"] != "hello" {
		t.Errorf("chains: %+v", list)
	}
	var c struct {
		Name       string `json:"name"`
		Definition string `json:"definition"`
		Mermaid    string `json:"mermaid"`
		Graph      struct {
			Nodes []map[string]any `json:"nodes"`
		} `json:"graph"`
	}
	env.call("GET", "/v1/chains/hello", "", nil, &c)
	if !strings.Contains(c.Definition, `name = "greet"`) || !strings.HasPrefix(c.Mermaid, "flowchart TD") || len(c.Graph.Nodes) != 2 {
		t.Errorf("chain: %+v", c)
	}
}

func TestDLQOperations(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	var runs []string
	for range 3 {
		var done api.StartResponse
		env.call("POST", "/v1/chains/breaks/runs?wait=20s", `{}`, nil, &done)
		if done.Status != string(store.RunFailed) {
			t.Fatalf("run: %+v", done)
		}
		runs = append(runs, done.ID)
	}
	var list struct {
		Entries []store.DLQEntry `json:"entries"`
	}
	env.call("GET", "/v1/dlq?chain=breaks&step=call", "", nil, &list)
	if len(list.Entries) != 3 {
		t.Fatalf("entries: %+v", list)
	}
	var entry store.DLQEntry
	code, _, _ := env.call("GET", "/v1/dlq/"+list.Entries[0].ID, "", nil, &entry)
	if code != 200 || entry.RunID != runs[0] || entry.Attempts != 1 {
		t.Errorf("entry: %d %+v", code, entry)
	}
	var replayed struct {
		Run string `json:"run"`
	}
	code, _, body := env.call("POST", "/v1/dlq/"+entry.ID+"/replay", `{"mode":"restart"}`, nil, &replayed)
	if code != 202 || replayed.Run == "" || replayed.Run == entry.RunID {
		t.Fatalf("replay: %d %s", code, body)
	}
	waitRun(t, env, replayed.Run)
	var bulk api.BulkReplay
	code, _, body = env.call("POST", "/v1/dlq/replay", `{"chain":"breaks","mode":"resume","concurrency":2}`, nil, &bulk)
	// The restarted run failed again and parked a new entry: three to resume.
	if code != 200 || len(bulk.Replayed) != 3 || len(bulk.Failed) != 0 {
		t.Fatalf("bulk replay: %d %s", code, body)
	}
	for _, r := range bulk.Replayed {
		waitRun(t, env, r.Run)
	}
	env.call("GET", "/v1/dlq", "", nil, &list)
	if len(list.Entries) != 3 {
		t.Fatalf("after the resumes (which failed again): %d entries", len(list.Entries))
	}
	if code, _, _ := env.call("DELETE", "/v1/dlq/"+list.Entries[0].ID, "", nil, nil); code != 204 {
		t.Errorf("delete: %d", code)
	}
	if code, _, _ := env.call("DELETE", "/v1/dlq/"+list.Entries[0].ID, "", nil, nil); code != 404 {
		t.Errorf("delete twice: %d", code)
	}
	var purged struct {
		Purged int `json:"purged"`
	}
	env.call("POST", "/v1/dlq/purge", `{"chain":"breaks"}`, nil, &purged)
	if purged.Purged != 2 {
		t.Errorf("purged %d, want 2", purged.Purged)
	}
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	env.call("POST", "/v1/chains/hello/runs?wait=20s", `{}`, nil, nil)
	env.call("POST", "/v1/chains/breaks/runs?wait=20s", `{}`, nil, nil)
	_, hdr, body := env.call("GET", "/metrics", "", nil, nil)
	for _, want := range []string{
		`chaingate_runs_started_total{chain="hello"} 1`,
		`chaingate_runs_finished_total{chain="breaks",status="failed"} 1`,
		`chaingate_runs_finished_total{chain="hello",status="succeeded"} 1`,
		`chaingate_run_duration_seconds_count{chain="hello",status="succeeded"} 1`,
		`chaingate_run_duration_seconds_bucket{chain="breaks",status="failed",le="+Inf"} 1`,
		`# TYPE chaingate_run_duration_seconds histogram`,
		`chaingate_step_duration_seconds_count{provider="echo"} 2`,
		`chaingate_step_duration_seconds_bucket{provider="faulty",le="+Inf"} 2`,
		`chaingate_provider_calls_total{provider="faulty",result="error"} 1`,
		`chaingate_steps_in_flight{provider="echo"} 0`,
		`chaingate_dlq_depth 1`,
		`chaingate_plugin_restarts_total{provider="echo"} 0`,
		`# TYPE chaingate_step_duration_seconds histogram`,
		`# TYPE go_goroutines gauge`,
		`# TYPE process_resident_memory_bytes gauge`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if !strings.HasPrefix(hdr.Get("Content-Type"), "text/plain") {
		t.Errorf("content type %q", hdr.Get("Content-Type"))
	}
	if t.Failed() {
		t.Log(body)
	}
}

// TestSecretsStayOut runs chains that send a secret to providers which echo
// it and fail with it, and checks that no API answer and no log line holds
// it.
func TestSecretsStayOut(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	var ok, bad api.StartResponse
	env.call("POST", "/v1/chains/hello/runs?wait=20s", `{}`, nil, &ok)
	env.call("POST", "/v1/chains/breaks/runs?wait=20s", `{}`, nil, &bad)
	var all strings.Builder
	for _, path := range []string{
		"/v1/runs/" + ok.ID + "?items=true", "/v1/runs/" + bad.ID, "/v1/runs", "/v1/dlq", "/v1/runs/" + bad.ID + "/dag", "/v1/chains/hello", "/metrics",
	} {
		_, _, body := env.call("GET", path, "", nil, nil)
		all.WriteString(body)
	}
	for _, id := range []string{ok.ID, bad.ID} {
		_, _, body := env.call("GET", "/v1/runs/"+id+"/events?follow=false", "", nil, nil)
		all.WriteString(body)
	}
	all.WriteString(env.logs.String())
	if strings.Contains(all.String(), testSecret) {
		t.Fatalf("the secret leaked:\n%s", all.String())
	}
	if !strings.Contains(all.String(), "[REDACTED]") {
		t.Error("nothing was redacted: the test did not exercise the secret")
	}
	// The provider did get it: echo's body held it before redaction.
	var v api.RunView
	env.call("GET", "/v1/runs/"+ok.ID, "", nil, &v)
	if !strings.Contains(string(v.Steps["greet"].Body), `"token":"[REDACTED]"`) {
		t.Errorf("greet body: %s", v.Steps["greet"].Body)
	}
}

func TestReload(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	// A slow run keeps the definition it started with across the reload.
	var slow api.StartResponse
	env.call("POST", "/v1/chains/hello/runs", `{"sleep_ms":800}`, nil, &slow)

	env.write("[[chains]]\nname = \"broken\"\nsteps = 3\n")
	var e apiErr
	code, _, _ := env.call("POST", "/v1/admin/reload", "", nil, &e)
	if code != 400 || e.Error.Code != "invalid_config" || len(e.Error.Details) == 0 || !strings.Contains(strings.Join(e.Error.Details, "\n"), "gateway.toml:3:1: chains[broken].steps") {
		t.Fatalf("broken reload: %d %+v", code, e)
	}
	if code, _, _ := env.call("POST", "/v1/chains/hello/runs", `{}`, nil, nil); code != 202 {
		t.Errorf("after a refused reload, the old config serves: %d", code)
	}
	env.write(`[gateway]
secrets_file = "secrets.env"
[[providers]]
name = "echo"
type = "echo"
[[chains]]
name = "hello"
[[chains.steps]]
name = "only"
provider = "echo"
[[chains]]
name = "new"
[[chains.steps]]
name = "x"
provider = "echo"
`)
	var ok map[string]int
	if code, _, body := env.call("POST", "/v1/admin/reload", "", nil, &ok); code != 200 || ok["chains"] != 2 {
		t.Fatalf("reload: %d %s", code, body)
	}
	var done api.StartResponse
	env.call("POST", "/v1/chains/new/runs?wait=20s", `{}`, nil, &done)
	if done.Status != string(store.RunSucceeded) {
		t.Errorf("new chain: %+v", done)
	}
	waitRun(t, env, slow.ID)
	var v api.RunView
	env.call("GET", "/v1/runs/"+slow.ID, "", nil, &v)
	if v.Status != string(store.RunSucceeded) || v.Steps["notify"] == nil || v.Steps["only"] != nil {
		t.Errorf("the running run changed definition: %s %v", v.Status, v.Path)
	}
}

// TestClientBulkLimits drives bulk purge and replay through the API client,
// as `gateway dlq … --server` does: the limit must reach the server.
func TestClientBulkLimits(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	for range 4 {
		var done api.StartResponse
		env.call("POST", "/v1/chains/breaks/runs?wait=20s", `{}`, nil, &done)
		if done.Status != string(store.RunFailed) {
			t.Fatalf("run: %+v", done)
		}
	}
	client := api.NewClient(env.url, "")
	ctx := context.Background()
	n, err := client.PurgeDLQ(ctx, store.DLQFilter{Chain: "breaks", Limit: 1})
	if err != nil || n != 1 {
		t.Fatalf("purge with limit 1: %d %v", n, err)
	}
	res, err := client.ReplayMany(ctx, store.DLQFilter{Chain: "breaks", Limit: 2}, engine.ReplayOptions{Mode: engine.ReplayRestart}, 1)
	if err != nil || len(res.Replayed) != 2 {
		t.Fatalf("replay with limit 2: %+v %v", res, err)
	}
	for _, r := range res.Replayed {
		waitRun(t, env, r.Run)
	}
	// One left untouched, two parked again by the restarted runs.
	if n, err := client.PurgeDLQ(ctx, store.DLQFilter{}); err != nil || n != 3 {
		t.Errorf("purge of the rest: %d %v", n, err)
	}
}

// TestOriginMetadata checks what X-Chaingate-Meta-* headers can put in
// origin.metadata: anything but the keys the gateway sets itself.
func TestOriginMetadata(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	tests := []struct {
		name    string
		headers map[string]string
		want    map[string]string // "" means absent
	}{
		{"a header", map[string]string{"X-Chaingate-Meta-Source": "alertmanager"}, map[string]string{"source": "alertmanager"}},
		{"built-ins cannot be forged", map[string]string{
			"X-Chaingate-Meta-Remote_addr": "6.6.6.6:1", "X-Chaingate-Meta-User_agent": "forged", "User-Agent": "probe/1",
		}, map[string]string{"remote_addr": "127.0.0.1:", "user_agent": "probe/1"}},
		{"no key, no idempotency_key", map[string]string{"X-Chaingate-Meta-Idempotency_key": "forged"}, map[string]string{"idempotency_key": ""}},
		{"the real key wins", map[string]string{"X-Chaingate-Meta-Idempotency_key": "forged", "Idempotency-Key": "meta-1"}, map[string]string{"idempotency_key": "meta-1"}},
		{"replay keys are the gateway's", map[string]string{"X-Chaingate-Meta-Replay_of": "01x", "X-Chaingate-Meta-Dead_letter_entry": "01y"}, map[string]string{"replay_of": "", "dead_letter_entry": ""}},
		{"an empty name is dropped", map[string]string{"X-Chaingate-Meta-": "nameless"}, map[string]string{"": ""}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var done api.StartResponse
			code, _, body := env.call("POST", "/v1/chains/hello/runs?wait=20s", `{}`, tc.headers, &done)
			if code != http.StatusOK || done.Run == nil {
				t.Fatalf("POST: %d %s", code, body)
			}
			var meta map[string]string
			if err := json.Unmarshal(done.Run.Origin.Metadata, &meta); err != nil {
				t.Fatal(err)
			}
			for k, want := range tc.want {
				got, ok := meta[k]
				switch {
				case want == "" && ok:
					t.Errorf("metadata has %q = %q: %s", k, got, done.Run.Origin.Metadata)
				case want != "" && !strings.HasPrefix(got, want):
					t.Errorf("metadata %q = %q, want %q: %s", k, got, want, done.Run.Origin.Metadata)
				}
			}
		})
	}
}

func TestParseJSON(t *testing.T) {
	type body struct {
		Mode string `json:"mode"`
	}
	tests := []struct {
		in         string
		value, obj bool // valid as a payload; valid as a body
	}{
		{`{}`, true, true},
		{` {"mode":"resume"} `, true, true},
		{`[1, 2]`, true, false},
		{`"text"`, true, false},
		{`{"mode":`, false, false},
		{`{} {}`, false, false},
		{`{"mode":"x"} trailing`, false, false},
		{`{"chain":"x"}`, true, false},
		{``, false, false},
	}
	for _, tc := range tests {
		if err := api.ParseJSON([]byte(tc.in), nil); (err == nil) != tc.value {
			t.Errorf("api.ParseJSON(%q, nil) = %v", tc.in, err)
		}
		if err := api.ParseJSON([]byte(tc.in), &body{}); (err == nil) != tc.obj {
			t.Errorf("api.ParseJSON(%q, &body) = %v", tc.in, err)
		}
	}
	// A payload is checked, not built: its size must not cost allocations.
	payload := []byte(`{"hosts":[` + strings.Repeat(`{"name":"db","tags":["a","b"],"n":1},`, 500) + `{}]}`)
	if n := testing.AllocsPerRun(20, func() { _ = api.ParseJSON(payload, nil) }); n > 2 {
		t.Errorf("checking a payload took %.0f allocations", n)
	}
}

// countingStore counts run reads.
type countingStore struct {
	store.Store
	runs atomic.Int64
}

func (c *countingStore) Run(ctx context.Context, id string) (*store.Run, error) {
	c.runs.Add(1)
	return c.Store.Run(ctx, id)
}

func (c *countingStore) RunHeader(ctx context.Context, id string) (*store.Run, error) {
	c.runs.Add(1)
	return c.Store.RunHeader(ctx, id)
}

// TestStartReadsOnlyWhatItNeeds checks that starting a run reads no run
// from the store unless an Idempotency-Key was seen before.
func TestStartReadsOnlyWhatItNeeds(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	cs := &countingStore{Store: env.gw.Store}
	env.gw.Store = cs
	tests := []struct {
		key   string
		reads int64
	}{
		{"", 0},
		{"first-use", 0},
		{"first-use", 1},
	}
	for _, tc := range tests {
		before := cs.runs.Load()
		var h map[string]string
		if tc.key != "" {
			h = map[string]string{"Idempotency-Key": tc.key}
		}
		if code, _, body := env.call("POST", "/v1/chains/hello/runs", `{}`, h, nil); code != 202 && code != 200 {
			t.Fatalf("POST: %d %s", code, body)
		}
		if n := cs.runs.Load() - before; n != tc.reads {
			t.Errorf("key %q: %d run reads, want %d", tc.key, n, tc.reads)
		}
	}
}

// TestReloadSecrets checks that a reload reads the secrets again and
// refuses a config whose secrets the gateway cannot give its runs, naming
// where they are read; the running config goes on serving.
func TestReloadSecrets(t *testing.T) {
	t.Parallel()
	const rotated = "rotated-7c1e2a9b"
	base := "[gateway]\nsecrets_file = \"secrets.env\"\n" + apiConfig
	tests := []struct {
		name, config, secrets string
		status                int
		want                  []string // in the details
	}{
		{"a missing secret in a payload", base + `
[[chains]]
name = "uses-new"
[[chains.steps]]
name = "call"
provider = "echo"
payload_template = { key = "<<secrets.NEW_TOKEN>>" }
`, "API_TOKEN=" + testSecret + "\n", 400, []string{"gateway.toml:", "chains[uses-new].steps[call].payload_template.key: <<secrets.NEW_TOKEN>>: no secret NEW_TOKEN"}},
		{"a missing secret in a provider's config", base + `
[[providers]]
name = "hooks"
type = "http"
[providers.config]
base_url = "https://hooks.example.com"
headers = { Authorization = "Bearer <<secrets.HOOK_TOKEN>>" }
`, "API_TOKEN=" + testSecret + "\n", 400, []string{"gateway.toml:", "providers[hooks].config.headers.Authorization: <<secrets.HOOK_TOKEN>>"}},
		{"a rotated value", base, "API_TOKEN=" + rotated + "\n", 400, []string{"new or changed secret values (API_TOKEN)", "restart"}},
		{"a secret added to the file", base, "API_TOKEN=" + testSecret + "\nNEW_TOKEN=" + rotated + "\n", 400, []string{"new or changed secret values (NEW_TOKEN)"}},
		{"a secrets file that is gone", strings.Replace(base, "secrets.env", "gone.env", 1), "API_TOKEN=" + testSecret + "\n", 400, []string{"gateway.secrets_file: reading secrets file"}},
		{"the same secrets, read by a new chain", base + `
[[chains]]
name = "uses-token"
[[chains.steps]]
name = "call"
provider = "echo"
payload_template = { key = "<<secrets.API_TOKEN>>" }
`, "API_TOKEN=" + testSecret + "\n", 200, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := newAPI(t, "")
			env.write(tc.config)
			if err := os.WriteFile(filepath.Join(env.dir, "secrets.env"), []byte(tc.secrets), 0o600); err != nil {
				t.Fatal(err)
			}
			var e apiErr
			code, _, body := env.call("POST", "/v1/admin/reload", "", nil, &e)
			if code != tc.status {
				t.Errorf("reload: %d %s", code, body)
			}
			for _, want := range tc.want {
				if !strings.Contains(strings.Join(e.Error.Details, "\n"), want) {
					t.Errorf("reload details lack %q: %s", want, body)
				}
			}
			if strings.Contains(body, testSecret) || strings.Contains(body, rotated) {
				t.Errorf("the answer holds a secret value: %s", body)
			}
			if code, _, body := env.call("POST", "/v1/chains/hello/runs", `{}`, nil, nil); code != 202 {
				t.Errorf("after the reload: %d %s", code, body)
			}
		})
	}
}

// TestOpenRefusesMissingSecret checks that a gateway does not start on a
// config whose templates read a secret it does not have.
func TestOpenRefusesMissingSecret(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "gateway.toml")
	if err := os.WriteFile(path, []byte(`
[[providers]]
name = "echo"
type = "echo"
[[chains]]
name = "c"
[[chains.steps]]
name = "call"
provider = "echo"
payload_template = { key = "<<secrets.NOT_SET_ANYWHERE>>", other = "<<secrets.ALSO_NOT ?? \"fine\">>" }
`), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := gateway.LoadConfig([]string{path})
	if err != nil {
		t.Fatal(err)
	}
	_, err = gateway.Open(context.Background(), gateway.Options{Config: cfg, State: filepath.Join(dir, "gw.db")})
	var ce *chain.ConfigError
	if !errors.As(err, &ce) || len(ce.Diagnostics) != 1 || !strings.Contains(ce.Error(), path+":10:22: chains[c].steps[call].payload_template.key: <<secrets.NOT_SET_ANYWHERE>>") {
		t.Fatalf("Open: %v", err)
	}
}

// TestStartChecksDeclaredInput starts runs of a chain that declares its
// input: a payload that does not match is refused with 400 naming each
// field, no run is created, and a matching one starts.
func TestStartChecksDeclaredInput(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	var out struct {
		Error struct {
			Code    string   `json:"code"`
			Message string   `json:"message"`
			Details []string `json:"details"`
		} `json:"error"`
	}
	code, _, body := env.call("POST", "/v1/chains/typed/runs", `{"alert_name":"disk-full","severity":"low"}`, nil, &out)
	if code != 400 || out.Error.Code != "invalid_payload" {
		t.Fatalf("start: %d %s", code, body)
	}
	details := strings.Join(out.Error.Details, "\n")
	if len(out.Error.Details) != 2 || !strings.Contains(details, "missing property 'host'") || !strings.Contains(details, "severity: value must be one of") {
		t.Errorf("details name the fields: %q", out.Error.Details)
	}
	if !strings.Contains(out.Error.Message, `chain "typed"`) {
		t.Errorf("message: %s", out.Error.Message)
	}
	if page, err := env.gw.Store.ListRuns(context.Background(), store.RunFilter{Chain: "typed"}); err != nil || len(page.Runs) != 0 {
		t.Errorf("a refused start left runs: %v %v", page.Runs, err)
	}
	code, _, body = env.call("POST", "/v1/chains/typed/runs?wait=20s", `{"alert_name":"disk-full","host":"db-1"}`, nil, nil)
	if code != 200 || !strings.Contains(body, `"status":"succeeded"`) {
		t.Errorf("a matching payload: %d %s", code, body)
	}
	code, _, body = env.call("POST", "/v1/chains/typd/runs", `{}`, nil, &out)
	if code != 404 || !strings.Contains(out.Error.Message, `(did you mean "typed"?)`) {
		t.Errorf("unknown chain: %d %s", code, body)
	}
}

// TestDeepPayloadsRefused: a payload nested deeper than a run may keep is
// refused at the door with 400, one at the limit is taken, and listing
// runs keeps working either way.
func TestDeepPayloadsRefused(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "") // max_request_bytes = 2048 takes a payload nested 1,000 deep
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	var out struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	code, _, body := env.call("POST", "/v1/chains/hello/runs", deep(store.MaxNesting+1), nil, &out)
	if code != 400 || out.Error.Code != "payload_too_deep" || !strings.Contains(out.Error.Message, fmt.Sprintf("nests %d levels deep; at most %d", store.MaxNesting+1, store.MaxNesting)) {
		t.Errorf("nesting %d: %d %s", store.MaxNesting+1, code, body)
	}
	if code, _, body := env.call("POST", "/v1/chains/hello/runs?wait=20s", deep(store.MaxNesting), nil, nil); code != 200 || !strings.Contains(body, `"status":"succeeded"`) {
		t.Errorf("nesting %d: %d %s", store.MaxNesting, code, body)
	}
	if code, _, body := env.call("GET", "/v1/runs", "", nil, nil); code != 200 || strings.Count(body, `"chain":"hello"`) != 1 || !strings.Contains(body, `"damaged":[]`) {
		t.Errorf("listing runs: %d %s", code, body)
	}
}
