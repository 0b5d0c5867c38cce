package server_test

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/internal/testutil/brokertest"
	"github.com/chaingate/gateway/internal/testutil/redistest"
)

var screenshots = flag.Bool("screenshots", false, "write the console's screenshots in docs/img")

// recoversConfig is a chain that fails until its config is fixed, so a
// replay of its dead letters after the fix succeeds.
const recoversConfig = `
[[chains]]
name = "recovers"
[[chains.steps]]
name = "call"
provider = "faulty"
payload_template = { fail = "the service is down" }
on_failure = "dlq"

[[chains]]
name = "fleet-later"
[[chains.steps]]
name = "first"
provider = "faulty"
payload_template = { sleep_ms = "<<origin.payload.first_ms>>" }
[[chains.steps]]
name = "check"
[chains.steps.split]
items = "<<origin.payload.hosts>>"
tolerated_failures = "100%"
max_concurrency = 5
[[chains.steps.split.steps]]
name = "ping"
provider = "faulty"
payload_template = { fail = "<<item.fail ?? \"\">>", sleep_ms = "<<origin.payload.sleep_ms>>", host = "<<item.host>>" }
`

// newConsoleAPI is the API's test gateway with the console's chains too.
func newConsoleAPI(t *testing.T, extra string) *apiEnv {
	t.Helper()
	env := newAPI(t, extra)
	env.write(strings.Replace(mustRead(t, env.cfg), apiConfig, apiConfig+consoleConfig+recoversConfig, 1))
	if _, err := env.srv.Reload(); err != nil {
		t.Fatal(err)
	}
	return env
}

// chromiumPath finds Debian's headless Chromium: the tests skip without
// one, except under CI=true, where .ci/run has installed it.
func chromiumPath(t *testing.T) string {
	for _, name := range []string{os.Getenv("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"} {
		if name == "" {
			continue
		}
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("CI=true and no Chromium found (chromium, chromium-browser, google-chrome or $CHROMIUM); .ci/run installs it with apt-get install -y chromium")
	}
	t.Skip("SKIP: no Chromium found; apt-get install -y chromium (or set $CHROMIUM) to run the console's browser tests")
	return ""
}

// browsers is the one headless Chromium the package's tests share: each
// test gets a tab in a browser context of its own (cookies and storage
// apart), and starting one browser rather than one per test keeps the
// package well inside go test's timeout on a loaded machine.
var browsers struct {
	once   sync.Once
	ctx    context.Context
	cancel func()
	err    error
}

// closeBrowser ends the shared Chromium, from TestMain.
func closeBrowser() {
	if browsers.cancel != nil {
		browsers.cancel()
	}
}

// chrome is one headless browser tab for a test; a failing test leaves a
// screenshot of where the page was.
func chrome(t *testing.T) context.Context {
	t.Helper()
	path := chromiumPath(t)
	browsers.once.Do(func() {
		// Chromium leaves its singleton socket in $TMPDIR when it is
		// killed: this one goes with the browser. Short, since a socket's
		// path must fit in 108 bytes.
		tmp, err := os.MkdirTemp("", "cgc")
		if err != nil {
			browsers.err = err
			return
		}
		opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.WindowSize(1300, 1000), chromedp.Env("TMPDIR="+tmp))
		actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
		bctx, cancelBrowser := chromedp.NewContext(actx)
		browsers.ctx = bctx
		browsers.cancel = func() {
			cancelBrowser()
			cancelAlloc()
			_ = os.RemoveAll(tmp)
		}
		browsers.err = chromedp.Do(bctx)
	})
	if browsers.err != nil {
		t.Fatalf("starting Chromium: %v", browsers.err)
	}
	ctx, cancel := chromedp.NewContext(browsers.ctx, chromedp.WithNewBrowserContext())
	if err := chromedp.Do(ctx); err != nil {
		cancel()
		t.Fatalf("opening a tab in Chromium: %v", err)
	}
	return withScreenshot(t, ctx, cancel)
}

// chromeAlone is chrome in a Chromium of the test's own: keyboard focus
// follows the one window's tab, which tabs of a shared browser, at once in
// other tests, would take from it.
func chromeAlone(t *testing.T) context.Context {
	t.Helper()
	tmp, err := os.MkdirTemp("", "cgc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(tmp) })
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromiumPath(t)), chromedp.NoSandbox, chromedp.WindowSize(1300, 1000), chromedp.Env("TMPDIR="+tmp))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	if err := chromedp.Do(ctx); err != nil {
		cancel()
		cancelAlloc()
		t.Fatalf("starting Chromium: %v", err)
	}
	return withScreenshot(t, ctx, func() { cancel(); cancelAlloc() })
}

// withScreenshot leaves a screenshot of where the page was when the test
// fails, then ends the tab with cancel.
func withScreenshot(t *testing.T, ctx context.Context, cancel func()) context.Context {
	t.Cleanup(func() {
		if t.Failed() {
			sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
			if png, err := chromedp.Run(sctx, chromedp.FullScreenshot(100)); err == nil {
				dir := filepath.Join(os.TempDir(), "chaingate-console-failures")
				_ = os.MkdirAll(dir, 0o755)
				file := filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+".png")
				if os.WriteFile(file, png, 0o644) == nil {
					t.Logf("screenshot of the page at the failure: %s", file)
				}
			}
			scancel()
		}
		cancel()
	})
	return ctx
}

// do runs browser steps, each bounded so a page that never gets there
// fails the test instead of hanging it.
func do(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(sctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(sctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("evaluating %s: %v", expr, err)
	}
	return v
}

// poll waits for a JavaScript condition, up to a minute.
func poll(t *testing.T, ctx context.Context, what, expr string) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if _, err := chromedp.Run(sctx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(60*time.Second))); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// startRun starts a run through the API without waiting for it.
func startRun(t *testing.T, env *apiEnv, chainName, payload string) string {
	t.Helper()
	var res api.StartResponse
	if code, _, body := env.call("POST", "/v1/chains/"+chainName+"/runs", payload, nil, &res); code != http.StatusAccepted {
		t.Fatalf("starting %s: %d %s", chainName, code, body)
	}
	return res.ID
}

const barLabel = `(document.querySelector('.bar-label') || {}).textContent || ''`

// TestBrowserSplitFollowedLive opens a run before its 50-item split
// starts: the split's bar appears and moves without a reload, ends at 47
// succeeded and 3 failed, and the items page's failed filter shows exactly
// those three.
func TestBrowserSplitFollowedLive(t *testing.T) {
	t.Parallel()
	env := newConsoleAPI(t, "")
	ctx := chrome(t)
	id := startRun(t, env, "fleet-later", strings.Replace(fleetPayload(50, 3, 17, 42), `{"hosts"`, `{"first_ms": 1500, "sleep_ms": 300, "hosts"`, 1))
	do(t, ctx, "opening the run", chromedp.Navigate(env.url+"/ui/runs/"+id), chromedp.WaitVisible(chromedp.CSS("svg.graph")))
	eval[bool](t, ctx, `window.__sameDocument = true`)
	if eval[string](t, ctx, `document.querySelector('.run-meta').dataset.final`) == "true" {
		t.Fatal("the run ended before its page opened; nothing was left to follow")
	}
	if eval[bool](t, ctx, `document.querySelector('.split-bar') !== null`) {
		t.Log("the split had started before its page opened; only the bar's moves are tested")
	}
	poll(t, ctx, "the live badge", `document.getElementById('badge').dataset.state === 'live' || document.getElementById('badge').dataset.state === 'ended'`)
	poll(t, ctx, "the split's items counted as they finish", `/^([1-9]|[1-4][0-9])\/50 items/.test(`+barLabel+`)`)
	poll(t, ctx, "the split's end", barLabel+`.startsWith('50/50 items: 47 succeeded, 3 failed')`)
	poll(t, ctx, "the run's end", `document.querySelector('.run-meta').dataset.final === 'true'`)
	if !eval[bool](t, ctx, `window.__sameDocument === true`) {
		t.Fatal("the page was reloaded")
	}
	do(t, ctx, "opening the failed items", chromedp.Click(chromedp.CSS("a.split-bar")), chromedp.WaitVisible(chromedp.CSS("#filter-failed")),
		chromedp.Click(chromedp.CSS("#filter-failed")), chromedp.WaitVisible(chromedp.CSS("table.items")))
	got := eval[[]string](t, ctx, `Array.from(document.querySelectorAll('table.items tr[data-status]')).map(r => r.dataset.status + ' ' + r.cells[0].textContent)`)
	if strings.Join(got, ",") != "failed 3,failed 17,failed 42" {
		t.Errorf("the failed filter shows %v, want items 3, 17 and 42", got)
	}
}

// TestBrowserDistributedSplitMoves follows a split handed to workers over
// RabbitMQ and Redis: its counts move on the page while the workers run it.
func TestBrowserDistributedSplitMoves(t *testing.T) {
	t.Parallel()
	amqpURL, prefix := brokertest.Open(t)
	redisURL, _, _ := strings.Cut(redistest.OpenPrefix(t, prefix), "?")
	env := newConsoleAPI(t, fmt.Sprintf("[gateway.fanout]\nrabbitmq_url = %q\nredis_url = %q\nprefix = %q\nthreshold = 10\nbatch_size = 5\n", amqpURL, redisURL, prefix))
	wctx, stop := context.WithCancel(context.Background())
	worked := make(chan error, 1)
	go func() { worked <- env.gw.WorkItems(wctx) }()
	t.Cleanup(func() {
		stop()
		<-worked
	})
	ctx := chrome(t)
	id := startRun(t, env, "fleet", strings.Replace(fleetPayload(60, 5, 6, 50), `{"hosts"`, `{"sleep_ms": 300, "hosts"`, 1))
	do(t, ctx, "opening the run", chromedp.Navigate(env.url+"/ui/runs/"+id), chromedp.WaitVisible(chromedp.CSS("svg.graph")))
	poll(t, ctx, "counts moving while the workers run the items", `/^([1-9]|[1-5][0-9])\/60 items.*on workers/.test(`+barLabel+`)`)
	poll(t, ctx, "the split's end", barLabel+`.startsWith('60/60 items: 57 succeeded, 3 failed')`)
}

// TestBrowserRunsListLive keeps the runs list open while a run starts and
// ends: its row appears, then shows the run's end, with no reload.
func TestBrowserRunsListLive(t *testing.T) {
	t.Parallel()
	env := newConsoleAPI(t, "")
	ctx := chrome(t)
	do(t, ctx, "opening the runs", chromedp.Navigate(env.url+"/ui/runs?chain=fleet"), chromedp.WaitVisible(chromedp.CSS("#runs")))
	eval[bool](t, ctx, `window.__sameDocument = true`)
	id := startRun(t, env, "fleet", strings.Replace(fleetPayload(10), `{"hosts"`, `{"sleep_ms": 400, "hosts"`, 1))
	row := fmt.Sprintf(`document.querySelector('#runs a[href$="/runs/%s"]')`, id)
	poll(t, ctx, "the new run's row", row+` !== null`)
	poll(t, ctx, "the run's end in its row", row+` && `+row+`.closest('tr').dataset.status === 'succeeded'`)
	if !eval[bool](t, ctx, `window.__sameDocument === true`) {
		t.Fatal("the page was reloaded")
	}
}

// TestBrowserStepPanel opens a step's panel beside the graph.
func TestBrowserStepPanel(t *testing.T) {
	t.Parallel()
	env := newConsoleAPI(t, "")
	ctx := chrome(t)
	id := startWait(t, env, "hello", `{"who": "ops"}`)
	do(t, ctx, "opening the step's panel", chromedp.Navigate(env.url+"/ui/runs/"+id), chromedp.WaitVisible(chromedp.CSS("svg.graph")),
		chromedp.Click(chromedp.CSS(`a.node[data-key="greet"]`)), chromedp.WaitVisible(chromedp.CSS("#panel .step-panel")))
	text := eval[string](t, ctx, `document.getElementById('panel').textContent`)
	for _, want := range []string{"dedup key", id + "/greet", "hello ops"} {
		if !strings.Contains(text, want) {
			t.Errorf("the panel does not show %q:\n%s", want, text)
		}
	}
	if loc := eval[string](t, ctx, `location.pathname`); loc != "/ui/runs/"+id {
		t.Errorf("the page went to %s; the panel opens in place", loc)
	}
}

// TestBrowserCancelStopsRun cancels a running run from its page.
func TestBrowserCancelStopsRun(t *testing.T) {
	t.Parallel()
	env := newConsoleAPI(t, "")
	ctx := chrome(t)
	id := startRun(t, env, "fleet", strings.Replace(fleetPayload(20), `{"hosts"`, `{"sleep_ms": 3000, "hosts"`, 1))
	do(t, ctx, "cancelling the run", chromedp.Navigate(env.url+"/ui/runs/"+id), chromedp.WaitVisible(chromedp.CSS("#cancel")), chromedp.Click(chromedp.CSS("#cancel")),
		chromedp.WaitVisible(chromedp.CSS("#flash")))
	poll(t, ctx, "the run cancelled", `(document.querySelector('.run-meta') || {dataset: {}}).dataset.status === 'cancelled'`)
	var v api.RunView
	env.call("GET", "/v1/runs/"+id, "", nil, &v)
	if v.Status != "cancelled" {
		t.Errorf("the run is %s, want cancelled", v.Status)
	}
}

// TestBrowserBulkReplay replays the dead letters one filter selects: they
// are gone, the others stay.
func TestBrowserBulkReplay(t *testing.T) {
	t.Parallel()
	env := newConsoleAPI(t, "")
	ctx := chrome(t)
	var runs []string
	for range 3 {
		runs = append(runs, startWait(t, env, "recovers", `{}`))
	}
	startWait(t, env, "breaks", `{}`)
	env.write(strings.Replace(mustRead(t, env.cfg), `fail = "the service is down"`, `fail = ""`, 1))
	if _, err := env.srv.Reload(); err != nil {
		t.Fatal(err)
	}
	do(t, ctx, "previewing", chromedp.Navigate(env.url+"/ui/dlq?chain=recovers"), chromedp.WaitVisible(chromedp.CSS("#confirm")))
	if m := eval[string](t, ctx, `document.getElementById('matched').textContent`); !strings.HasPrefix(m, "3 entries match") {
		t.Fatalf("preview: %q", m)
	}
	do(t, ctx, "replaying", chromedp.SendKeys(chromedp.CSS("#confirm"), "3"), chromedp.Click(chromedp.CSS("#bulk-replay")),
		chromedp.WaitVisible(chromedp.CSS("#progress[data-finished=true]")))
	if f := eval[string](t, ctx, `document.getElementById('progress').textContent`); !strings.HasPrefix(f, "replay: 3 of 3 entries") {
		t.Errorf("the progress page says %q", f)
	}
	if f := eval[string](t, ctx, `document.getElementById('outcome').textContent`); f != "The replayed runs: 3 succeeded, 0 failed again, 0 still running." {
		t.Errorf("the progress page says %q of the replayed runs", f)
	}
	for _, id := range runs {
		if v := waitRunEnd(t, env, id); v.Status != "succeeded" {
			t.Errorf("replayed run %s is %s", id, v.Status)
		}
	}
	var list struct {
		Entries []api.DLQEntry `json:"entries"`
	}
	env.call("GET", "/v1/dlq", "", nil, &list)
	if len(list.Entries) != 1 || list.Entries[0].Chain != "breaks" {
		t.Errorf("the queue holds %+v, want the breaks entry alone", list.Entries)
	}
}

// TestBrowserReadTokenAndSecrets signs in with a read token: no write
// action shows, a forged POST from the page is refused, and the secret a
// run's payload read appears on no page.
func TestBrowserReadTokenAndSecrets(t *testing.T) {
	t.Parallel()
	env := newConsoleAPI(t, "[gateway.auth]\ntokens = [\"write-tok\"]\nread_tokens = [\"read-tok\"]\n")
	env.token = "write-tok"
	hello := startWait(t, env, "hello", `{"who": "ops"}`)
	failed := startWait(t, env, "breaks", `{}`)
	ctx := chrome(t)
	do(t, ctx, "signing in", chromedp.Navigate(env.url+"/ui/runs/"+failed), chromedp.WaitVisible(chromedp.CSS("input[name=token]")),
		chromedp.SendKeys(chromedp.CSS("input[name=token]"), "read-tok"), chromedp.Submit(chromedp.CSS("input[name=token]")),
		chromedp.WaitVisible(chromedp.CSS("svg.graph")))
	if n := eval[int](t, ctx, `document.querySelectorAll('form[method=post]:not([action$="/logout"])').length`); n != 0 {
		t.Errorf("a read token sees %d write forms", n)
	}
	status := eval[int](t, ctx, `fetch(location.pathname + '/cancel', {method: 'POST', body: new URLSearchParams({csrf: 'forged'})}).then(r => r.status)`)
	if status != http.StatusForbidden {
		t.Errorf("a forged POST answered %d, want 403", status)
	}
	for _, p := range []string{"/ui/runs/" + hello, "/ui/runs/" + hello + "/steps/greet", "/ui/runs/" + failed, "/ui/dlq", "/ui/"} {
		do(t, ctx, "opening "+p, chromedp.Navigate(env.url+p), chromedp.WaitVisible(chromedp.CSS("main")))
		if html := eval[string](t, ctx, `document.documentElement.outerHTML`); strings.Contains(html, testSecret) {
			t.Errorf("%s shows the secret's value", p)
		}
	}
}

// cuttingProxy stands between the browser and the gateway, and can cut
// the run's event stream while letting every other request through, as a
// proxy that buffers or times out streams does.
type cuttingProxy struct {
	srv *httptest.Server
	cut atomic.Bool
}

func newCuttingProxy(t *testing.T, target string) *cuttingProxy {
	u, _ := url.Parse(target)
	p := &cuttingProxy{}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.FlushInterval = -1
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p.cut.Load() && strings.HasSuffix(r.URL.Path, "/stream") {
			http.Error(w, "stream cut", http.StatusBadGateway)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

// TestBrowserStreamCutFallsBackToPolling cuts the run's event stream: the
// badge says so, and the page goes on updating by polling.
func TestBrowserStreamCutFallsBackToPolling(t *testing.T) {
	t.Parallel()
	env := newConsoleAPI(t, "")
	proxy := newCuttingProxy(t, env.url)
	ctx := chrome(t)
	id := startRun(t, env, "fleet", strings.Replace(fleetPayload(40), `{"hosts"`, `{"sleep_ms": 250, "hosts"`, 1))
	// The proxy's address is another origin than the gateway's, but it is
	// a loopback name, which is all a gateway without tokens asks.
	do(t, ctx, "opening the run", chromedp.Navigate(proxy.srv.URL+"/ui/runs/"+id), chromedp.WaitVisible(chromedp.CSS("svg.graph")))
	poll(t, ctx, "the live badge", `document.getElementById('badge').dataset.state === 'live'`)
	proxy.cut.Store(true)
	proxy.srv.CloseClientConnections()
	poll(t, ctx, "the polling badge", `document.getElementById('badge').dataset.state === 'polling'`)
	before := eval[string](t, ctx, barLabel)
	poll(t, ctx, "the page updating by polling", fmt.Sprintf(`%s !== %q`, barLabel, before))
	poll(t, ctx, "the run's end, by polling", `document.querySelector('.run-meta').dataset.final === 'true'`)
}

// TestBrowserScreenshots writes docs/img/console-*.png, one per page (the
// approvals waiting and a chain's run form among them), the runs on a phone
// and a run in dark mode, when asked with -screenshots; docs/console.md
// shows them.
func TestBrowserScreenshots(t *testing.T) {
	t.Parallel()
	if !*screenshots {
		t.Skip("writes docs/img only with -screenshots")
	}
	env := newActionsAPI(t, "")
	ctx := chrome(t)
	startWait(t, env, "hello", `{"who": "ops"}`)
	fleet := startLabelled(t, env, "fleet", fleetPayload(50, 3, 17, 42), "change=CHG-1042", "team=infra")
	waitRunEnd(t, env, fleet)
	for range 2 {
		startWait(t, env, "breaks", `{}`)
	}
	ask := startLabelled(t, env, "restart-db", `{"host": "db-1"}`, "alertname=PrimaryDown", "instance=db-1:9100")
	change := startRun(t, env, "change", `{"what": "the firewall"}`)
	waitAsking(t, env, ask, "ask")
	waitAsking(t, env, change, "approve-change")
	pages := map[string]string{
		"now": "/ui/", "runs": "/ui/runs", "run": "/ui/runs/" + fleet, "items": "/ui/runs/" + fleet + "/items/check?status=failed",
		"dlq": "/ui/dlq?chain=breaks", "chain": "/ui/chains/hello", "approvals": "/ui/approvals", "chain-run": "/ui/chains/deploy",
	}
	shot := func(name, p string) {
		do(t, ctx, "opening "+p, chromedp.Navigate(env.url+p), chromedp.WaitVisible(chromedp.CSS("main")))
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join("..", "..", "docs", "img", "console-"+name+".png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for name, p := range pages {
		shot(name, p)
	}
	do(t, ctx, "a phone's viewport", phone)
	shot("runs-phone", "/ui/runs")
	do(t, ctx, "dark mode", chromedp.EmulateViewport(1300, 1000), darkMode(true))
	shot("run-dark", "/ui/runs/"+fleet)
}

// TestBrowserNowFollowsLive keeps the Now page open while a run fails into
// the dead-letter queue: the failure, the queue's depth and the time the
// page is as of change without a reload, and how long a run waiting for
// an answer has run moves, there and on its own page.
func TestBrowserNowFollowsLive(t *testing.T) {
	t.Parallel()
	env := newConsoleAPI(t, tourConfig)
	ask := startRun(t, env, "restart-db", `{"host": "db-1"}`)
	waitAsking(t, env, ask, "ask")
	ctx := chrome(t)
	do(t, ctx, "opening Now", chromedp.Navigate(env.url+"/ui/"), chromedp.WaitVisible(chromedp.CSS("#now")))
	eval[bool](t, ctx, `window.__sameDocument = true`)
	if depth := eval[string](t, ctx, `document.getElementById('dlq-depth').textContent`); depth != "0" {
		t.Fatalf("the queue's depth is %s before any failure", depth)
	}
	asOf := eval[string](t, ctx, `document.querySelector('#as-of time').getAttribute('datetime')`)
	running := `(document.querySelector('#in-flight .took') || {}).textContent`
	before := eval[string](t, ctx, running)
	poll(t, ctx, "the waiting run's time moving", running+fmt.Sprintf(` !== %q`, before))

	startWait(t, env, "breaks", `{}`)
	poll(t, ctx, "the failure on the page", `document.getElementById('dlq-depth').textContent === '1' && /breaks/.test((document.getElementById('failures') || {}).textContent)`)
	if now := eval[string](t, ctx, `document.querySelector('#as-of time').getAttribute('datetime')`); now == asOf {
		t.Errorf("the page still says it is as of %s", asOf)
	}
	if !eval[bool](t, ctx, `window.__sameDocument === true`) {
		t.Fatal("the page was reloaded")
	}

	do(t, ctx, "opening the waiting run", chromedp.Navigate(env.url+"/ui/runs/"+ask), chromedp.WaitVisible(chromedp.CSS(".run-meta .took")))
	took := `document.querySelector('.run-meta .took').textContent`
	before = eval[string](t, ctx, took)
	poll(t, ctx, "the run's time moving", took+fmt.Sprintf(` !== %q`, before))
}
