package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/html"

	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/internal/testutil/redistest"
)

// consoleConfig adds a split whose items fail on demand to the API's test
// config.
const consoleConfig = `
[[chains]]
name = "fleet"
[[chains.steps]]
name = "check"
[chains.steps.split]
items = "<<origin.payload.hosts>>"
tolerated_failures = "100%"
max_concurrency = 5
[[chains.steps.split.steps]]
name = "ping"
provider = "faulty"
payload_template = { fail = "<<item.fail ?? \"\">>", sleep_ms = "<<origin.payload.sleep_ms ?? 0>>", host = "<<item.host>>" }
`

// browser is a console user: a cookie jar and the last page's CSRF token.
type browser struct {
	t    *testing.T
	env  *apiEnv
	c    *http.Client
	csrf string
}

func newBrowser(t *testing.T, env *apiEnv) *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: t, env: env, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// get fetches a console page and parses it.
func (b *browser) get(path string) (int, *html.Node, string) {
	b.t.Helper()
	resp, err := b.c.Get(b.env.url + path)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	doc, err := html.Parse(strings.NewReader(string(body)))
	if err != nil {
		b.t.Fatalf("%s: %v", path, err)
	}
	if m := find(doc, func(n *html.Node) bool { return n.Data == "meta" && attr(n, "name") == "csrf" }); m != nil {
		b.csrf = attr(m, "content")
	}
	return resp.StatusCode, doc, string(body)
}

// post submits a form; the CSRF token of the last page goes with it unless
// form sets one.
func (b *browser) post(path string, form url.Values, header ...string) (int, string, string) {
	b.t.Helper()
	if _, ok := form["csrf"]; !ok {
		form.Set("csrf", b.csrf)
	}
	req, _ := http.NewRequest(http.MethodPost, b.env.url+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := b.c.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Location"), string(body)
}

func find(n *html.Node, match func(*html.Node) bool) *html.Node {
	if n.Type == html.ElementNode && match(n) {
		return n
	}
	for c := n.FirstChild; c != nil; c = c.NextSibling {
		if f := find(c, match); f != nil {
			return f
		}
	}
	return nil
}

func findAll(n *html.Node, match func(*html.Node) bool) []*html.Node {
	var out []*html.Node
	if n.Type == html.ElementNode && match(n) {
		out = append(out, n)
	}
	for c := n.FirstChild; c != nil; c = c.NextSibling {
		out = append(out, findAll(c, match)...)
	}
	return out
}

func attr(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

// writeForms are the forms that change something.
func writeForms(doc *html.Node) []string {
	var out []string
	for _, f := range findAll(doc, func(n *html.Node) bool { return n.Data == "form" && attr(n, "method") == "post" }) {
		if a := attr(f, "action"); !strings.HasSuffix(a, "/logout") && !strings.HasSuffix(a, "/login") {
			out = append(out, a)
		}
	}
	return out
}

// startWait starts a run through the API and waits for it to end.
func startWait(t *testing.T, env *apiEnv, chainName, payload string) string {
	t.Helper()
	var res api.StartResponse
	code, _, body := env.call("POST", "/v1/chains/"+chainName+"/runs?wait=30s", payload, nil, &res)
	if code != http.StatusOK || res.Run == nil {
		t.Fatalf("run of %s: %d %s", chainName, code, body)
	}
	return res.ID
}

func fleetPayload(n int, failing ...int) string {
	hosts := make([]map[string]string, n)
	for i := range hosts {
		hosts[i] = map[string]string{"host": fmt.Sprintf("host-%02d", i)}
	}
	for _, i := range failing {
		hosts[i]["fail"] = fmt.Sprintf("host-%02d unreachable", i)
	}
	b, _ := json.Marshal(map[string]any{"hosts": hosts})
	return string(b)
}

func TestConsolePagesRender(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	env.write(strings.Replace(mustRead(t, env.cfg), apiConfig, apiConfig+consoleConfig, 1))
	if _, err := env.srv.Reload(); err != nil {
		t.Fatal(err)
	}
	// The console was mounted with the first config; its routes do not
	// depend on the chains, so the reloaded config's chain is served.
	hello := startWait(t, env, "hello", `{"who": "ops"}`)
	fleet := startWait(t, env, "fleet", fleetPayload(12, 2, 7, 9))
	b := newBrowser(t, env)
	for _, path := range []string{"/ui/", "/ui/runs", "/ui/runs/" + hello, "/ui/runs/" + fleet, "/ui/dlq", "/ui/chains", "/ui/chains/hello",
		"/ui/runs/" + hello + "/steps/notify", "/ui/runs/" + hello + "/steps/notify/a", "/ui/runs/" + fleet + "/items/check"} {
		code, doc, body := b.get(path)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d\n%s", path, code, body)
		}
		if find(doc, func(n *html.Node) bool { return n.Data == "h1" }) == nil {
			t.Errorf("GET %s: no heading", path)
		}
		// The secret the hello chain's payload reads is never shown.
		if strings.Contains(body, testSecret) {
			t.Errorf("GET %s shows the secret's value", path)
		}
	}

	_, doc, _ := b.get("/ui/runs/" + hello)
	svg := find(doc, func(n *html.Node) bool { return n.Data == "svg" })
	if svg == nil {
		t.Fatal("the run page has no graph")
	}
	for _, step := range []string{"greet", "notify"} {
		node := find(svg, func(n *html.Node) bool { return n.Data == "a" && strings.HasSuffix(attr(n, "href"), "/steps/"+step) })
		if node == nil || !strings.Contains(attr(node, "class"), "st-succeeded") {
			t.Errorf("step %s is not drawn as succeeded", step)
		}
	}
	for _, sub := range []string{"notify/a", "notify/b"} {
		if find(svg, func(n *html.Node) bool { return strings.HasSuffix(attr(n, "href"), "/steps/"+sub) }) == nil {
			t.Errorf("sub-step %s is not drawn", sub)
		}
	}

	// A split is one node with a bar, whatever its item count; its items
	// page filters by status.
	_, doc, _ = b.get("/ui/runs/" + fleet)
	bars := findAll(doc, func(n *html.Node) bool { return n.Data == "rect" && strings.HasPrefix(attr(n, "class"), "bar ") })
	if len(bars) == 0 || len(bars) > 5 {
		t.Errorf("the split is drawn with %d bar segments, want 1 to 5", len(bars))
	}
	_, doc, _ = b.get("/ui/runs/" + fleet + "/items/check?status=failed")
	rows := findAll(doc, func(n *html.Node) bool { return n.Data == "tr" && attr(n, "data-status") != "" })
	if len(rows) != 3 {
		t.Fatalf("the failed filter shows %d items, want 3", len(rows))
	}
	for _, r := range rows {
		if attr(r, "data-status") != "failed" {
			t.Errorf("the failed filter shows a %s item", attr(r, "data-status"))
		}
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestConsoleSignInAndAccess(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "[gateway.auth]\ntokens = [\"write-tok\"]\nread_tokens = [\"read-tok\"]\n")
	env.token = "write-tok"
	id := startWait(t, env, "breaks", `{}`)

	anon := newBrowser(t, env)
	code, _, _ := anon.get("/ui/runs")
	if code != http.StatusSeeOther {
		t.Fatalf("a page without a session answered %d, want a redirect to sign in", code)
	}
	if code, _, _ := anon.post("/ui/login", url.Values{"token": {"nope"}}); code != http.StatusUnauthorized {
		t.Errorf("a wrong token signed in: %d", code)
	}

	reader := newBrowser(t, env)
	if code, loc, _ := reader.post("/ui/login", url.Values{"token": {"read-tok"}, "next": {"/ui/runs/" + id}}); code != http.StatusSeeOther || loc != "/ui/runs/"+id {
		t.Fatalf("sign-in: %d to %q", code, loc)
	}
	for _, p := range []string{"/ui/runs/" + id, "/ui/dlq?chain=breaks"} {
		_, doc, _ := reader.get(p)
		if forms := writeForms(doc); len(forms) > 0 {
			t.Errorf("a read token sees write actions on %s: %v", p, forms)
		}
	}
	entries := dlqIDs(t, env, "breaks")
	if code, _, _ := reader.post("/ui/dlq/"+entries[0]+"/replay", url.Values{"mode": {"resume"}}); code != http.StatusForbidden {
		t.Errorf("a read session's replay answered %d, want 403", code)
	}

	writer := newBrowser(t, env)
	writer.post("/ui/login", url.Values{"token": {"write-tok"}})
	_, doc, _ := writer.get("/ui/dlq/" + entries[0])
	if len(writeForms(doc)) == 0 {
		t.Fatal("a write token sees no actions on a dead letter")
	}
	// A forged request: the session cookie alone is not enough.
	if code, _, _ := writer.post("/ui/dlq/"+entries[0]+"/replay", url.Values{"mode": {"resume"}, "csrf": {"forged"}}); code != http.StatusForbidden {
		t.Errorf("a POST with a forged CSRF token answered %d, want 403", code)
	}
	if code, _, _ := writer.post("/ui/dlq/"+entries[0]+"/replay", url.Values{"mode": {"resume"}}, "Origin", "https://evil.example"); code != http.StatusForbidden {
		t.Errorf("a POST from another origin answered %d, want 403", code)
	}
	if code, loc, body := writer.post("/ui/dlq/"+entries[0]+"/replay", url.Values{"mode": {"resume"}}); code != http.StatusSeeOther || !strings.Contains(loc, "/ui/runs/"+id) {
		t.Fatalf("replay: %d %q %s", code, loc, body)
	}
}

func dlqIDs(t *testing.T, env *apiEnv, chainName string) []string {
	t.Helper()
	var list struct {
		Entries []api.DLQEntry `json:"entries"`
	}
	env.call("GET", "/v1/dlq?chain="+chainName, "", nil, &list)
	var out []string
	for _, e := range list.Entries {
		out = append(out, e.ID)
	}
	if len(out) == 0 {
		t.Fatalf("no dead letters of %s", chainName)
	}
	return out
}

func TestConsoleReadOnly(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "[gateway.ui]\nread_only = true\n")
	id := startWait(t, env, "breaks", `{}`)
	b := newBrowser(t, env)
	_, doc, _ := b.get("/ui/runs/" + id)
	if forms := writeForms(doc); len(forms) > 0 {
		t.Errorf("a read-only console shows write actions: %v", forms)
	}
	entry := dlqIDs(t, env, "breaks")[0]
	if code, _, body := b.post("/ui/dlq/"+entry+"/replay", url.Values{"mode": {"resume"}}); code != http.StatusForbidden || !strings.Contains(body, "read-only") {
		t.Errorf("a read-only console's replay answered %d", code)
	}
}

func TestConsoleBulkReplayNeedsFilterAndCount(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	for range 3 {
		startWait(t, env, "breaks", `{}`)
	}
	startWait(t, env, "flaky", `{}`)
	b := newBrowser(t, env)
	_, doc, _ := b.get("/ui/dlq?chain=breaks")
	if m := find(doc, func(n *html.Node) bool { return attr(n, "id") == "matched" }); m == nil || !strings.HasPrefix(textOf(m), "3 entries match") {
		t.Fatalf("the preview does not say 3 entries match")
	}
	if code, _, _ := b.post("/ui/dlq-bulk", url.Values{"action": {"replay"}, "confirm": {"4"}}); code != http.StatusBadRequest {
		t.Errorf("an empty filter answered %d, want 400", code)
	}
	if code, _, body := b.post("/ui/dlq-bulk", url.Values{"action": {"replay"}, "chain": {"breaks"}, "confirm": {"4"}}); code != http.StatusConflict || !strings.Contains(body, "selects 3 entries") {
		t.Errorf("a wrong count answered %d", code)
	}
	code, loc, body := b.post("/ui/dlq-bulk", url.Values{"action": {"purge"}, "chain": {"breaks"}, "confirm": {"3"}})
	if code != http.StatusSeeOther || !strings.Contains(loc, "/ui/dlq-jobs/") {
		t.Fatalf("purge: %d %q %s", code, loc, body)
	}
	// The progress page follows the action to its end.
	progress := textOf(find(waitJob(t, b, loc), func(n *html.Node) bool { return attr(n, "id") == "progress" }))
	if !strings.HasPrefix(progress, "purge: 3 of 3 entries") || !strings.Contains(progress, "done") {
		t.Fatalf("the bulk action ended with %q", progress)
	}
	var list struct {
		Entries []api.DLQEntry `json:"entries"`
	}
	env.call("GET", "/v1/dlq", "", nil, &list)
	if len(list.Entries) != 1 || list.Entries[0].Chain != "flaky" {
		t.Errorf("after purging breaks, the queue holds %+v, want flaky's entry alone", list.Entries)
	}
}

func textOf(n *html.Node) string {
	var b strings.Builder
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.TextNode {
			b.WriteString(n.Data)
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(n)
	return strings.TrimSpace(b.String())
}

func TestSplitItemsAPI(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	env.write(strings.Replace(mustRead(t, env.cfg), apiConfig, apiConfig+consoleConfig, 1))
	if _, err := env.srv.Reload(); err != nil {
		t.Fatal(err)
	}
	id := startWait(t, env, "fleet", fleetPayload(30, 4, 20))
	var page api.ItemPage
	code, _, body := env.call("GET", "/v1/runs/"+id+"/items?split=check&status=failed&limit=1", "", nil, &page)
	if code != http.StatusOK || page.Matched != 2 || len(page.Items) != 1 || page.Items[0].Index != 4 || page.Counts["succeeded"] != 28 {
		t.Fatalf("failed items: %d %s", code, body)
	}
	env.call("GET", "/v1/runs/"+id+"/items?split=check&status=failed&offset=1", "", nil, &page)
	if len(page.Items) != 1 || page.Items[0].Index != 20 || page.Items[0].Error == nil {
		t.Fatalf("second page: %+v", page.Items)
	}
	var input map[string]string
	if err := json.Unmarshal(page.Items[0].Input, &input); err != nil || input["host"] != "host-20" || input["fail"] != "host-20 unreachable" || page.Items[0].Attempts != 1 {
		t.Errorf("item 20's input %s (%v), attempts %d", page.Items[0].Input, err, page.Items[0].Attempts)
	}
	for _, q := range []string{"", "?split=check&status=running", "?split=check&limit=0", "?split=nope"} {
		code, _, _ := env.call("GET", "/v1/runs/"+id+"/items"+q, "", nil, nil)
		if code != http.StatusBadRequest && code != http.StatusNotFound {
			t.Errorf("items%s answered %d", q, code)
		}
	}
}

// sweepConfig is a split whose items park their failures in the
// dead-letter queue, one item at a time, so the split fails at the first
// failing item with the items before it done and those after it not begun.
const sweepConfig = `
[[chains]]
name = "sweep"
[[chains.steps]]
name = "check"
[chains.steps.split]
items = "<<origin.payload.hosts>>"
max_concurrency = 1
[[chains.steps.split.steps]]
name = "ping"
provider = "faulty"
payload_template = { fail = "<<item.fail ?? \"\">>", record = "<<origin.payload.record>>", host = "<<item.host>>" }
on_failure = "dlq"
`

// TestConsoleReplaysOnlyFailedItems fixes the config of a split whose items
// failed and replays from the dead-letter page: the failed items run
// again, and the ones that succeeded are not called again.
func TestConsoleReplaysOnlyFailedItems(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	env.write(strings.Replace(mustRead(t, env.cfg), apiConfig, apiConfig+sweepConfig, 1))
	if _, err := env.srv.Reload(); err != nil {
		t.Fatal(err)
	}
	rec := env.dir + "/calls.jsonl"
	payload := strings.Replace(fleetPayload(10, 2, 6), `{"hosts"`, fmt.Sprintf(`{"record": %q, "hosts"`, rec), 1)
	var res api.StartResponse
	env.call("POST", "/v1/chains/sweep/runs?wait=30s", payload, nil, &res)
	if res.Run == nil || res.Run.Status != "failed" {
		t.Fatalf("the sweep did not fail: %+v", res)
	}
	entries := dlqIDs(t, env, "sweep")

	env.write(strings.Replace(mustRead(t, env.cfg), `fail = "<<item.fail ?? \"\">>"`, `fail = ""`, 1))
	if _, err := env.srv.Reload(); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, env)
	b.get("/ui/dlq/" + entries[0])
	if code, loc, body := b.post("/ui/dlq/"+entries[0]+"/replay", url.Values{"mode": {"resume"}}); code != http.StatusSeeOther || !strings.Contains(loc, res.ID) {
		t.Fatalf("replay: %d %q %s", code, loc, body)
	}
	if v := waitRunEnd(t, env, res.ID); v.Status != "succeeded" {
		t.Fatalf("the replayed run is %s", v.Status)
	}
	data, _ := os.ReadFile(rec)
	calls := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var c struct {
			Payload struct {
				Host string `json:"host"`
			} `json:"payload"`
		}
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatal(err)
		}
		calls[c.Payload.Host]++
	}
	// Items 0 and 1 succeeded before item 2 failed the split; item 2 runs
	// again, and the rest run for the first time.
	for i := range 10 {
		want := 1
		if i == 2 {
			want = 2
		}
		if host := fmt.Sprintf("host-%02d", i); calls[host] != want {
			t.Errorf("%s was called %d times, want %d", host, calls[host], want)
		}
	}
}

// TestActionsNamedInEvents checks that a cancel or a replay, from the
// console or the API, is recorded in the run's events with the name the
// config gives the token.
func TestActionsNamedInEvents(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "[gateway.auth]\ntokens = [{ name = \"alice\", token = \"write-tok\" }, \"bare-tok\"]\n")
	env.write(strings.Replace(mustRead(t, env.cfg), apiConfig, apiConfig+consoleConfig, 1))
	if _, err := env.srv.Reload(); err != nil {
		t.Fatal(err)
	}
	env.token = "write-tok"
	slow := strings.Replace(fleetPayload(10), `{"hosts"`, `{"sleep_ms": 5000, "hosts"`, 1)
	// The last event of a type in a run's log, once the run has ended.
	lastEvent := func(id string, typ string) string {
		t.Helper()
		evs := readSSE(t, env, id, "")
		for i := len(evs) - 1; i >= 0; i-- {
			if string(evs[i].Type) == typ {
				return evs[i].Message
			}
		}
		t.Fatalf("run %s has no %s event", id, typ)
		return ""
	}

	b := newBrowser(t, env)
	b.post("/ui/login", url.Values{"token": {"write-tok"}})
	viaConsole := startRun(t, env, "fleet", slow)
	b.get("/ui/runs/" + viaConsole)
	if code, _, body := b.post("/ui/runs/"+viaConsole+"/cancel", url.Values{}); code != http.StatusSeeOther {
		t.Fatalf("console cancel: %d %s", code, body)
	}
	if msg := lastEvent(viaConsole, "run_cancelled"); msg != "run cancelled by alice (console)" {
		t.Errorf("the console's cancel is recorded as %q", msg)
	}

	viaAPI := startRun(t, env, "fleet", slow)
	env.token = "bare-tok"
	if code, _, body := env.call("POST", "/v1/runs/"+viaAPI+"/cancel", "", nil, nil); code != http.StatusAccepted {
		t.Fatalf("API cancel: %d %s", code, body)
	}
	if msg := lastEvent(viaAPI, "run_cancelled"); !strings.HasPrefix(msg, "run cancelled by token sha256:") || !strings.HasSuffix(msg, " (API)") || strings.Contains(msg, "bare-tok") {
		t.Errorf("the API's cancel with an unnamed token is recorded as %q", msg)
	}

	env.token = "write-tok"
	failed := startWait(t, env, "breaks", `{}`)
	entry := dlqIDs(t, env, "breaks")[0]
	b.get("/ui/dlq/" + entry)
	if code, _, body := b.post("/ui/dlq/"+entry+"/replay", url.Values{"mode": {"resume"}}); code != http.StatusSeeOther {
		t.Fatalf("console replay: %d %s", code, body)
	}
	if msg := lastEvent(failed, "run_replayed"); !strings.HasSuffix(msg, "by alice (console)") {
		t.Errorf("the console's replay is recorded as %q", msg)
	}
}

// TestRunChangesStream follows GET /v1/events while a run starts and ends.
func TestRunChangesStream(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	followRunChanges(t, env, env)
}

// TestRunChangesAcrossGateways follows GET /v1/events on one gateway while
// another sharing its Redis starts and ends a run.
func TestRunChangesAcrossGateways(t *testing.T) {
	t.Parallel()
	state := redistest.Open(t)
	followRunChanges(t, newAPIOn(t, "", state), newAPIOn(t, "", state))
}

// followRunChanges follows GET /v1/events on env while a run starts and
// ends on starter.
func followRunChanges(t *testing.T, env, starter *apiEnv) {
	t.Helper()
	sc := openRunChanges(t, env)
	id := startWait(t, starter, "hello", `{}`)
	var seen []string
	for sc.Scan() && len(seen) < 2 {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			var ev api.Event
			if err := json.Unmarshal([]byte(data), &ev); err != nil {
				t.Fatal(err)
			}
			if ev.RunID != id {
				t.Errorf("an event of run %s, want %s", ev.RunID, id)
			}
			seen = append(seen, ev.Type)
		}
	}
	if strings.Join(seen, ",") != "run_started,run_succeeded" {
		t.Errorf("the stream carried %v, want the run's start and end and no step's", seen)
	}
}

// openRunChanges follows GET /v1/events on env for up to 30 s, past the
// stream's opening comment.
func openRunChanges(t *testing.T, env *apiEnv) *bufio.Scanner {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, env.url+"/v1/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = resp.Body.Close() })
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("GET /v1/events: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Scan() // the opening comment: the stream is following
	return sc
}

// TestEventsAfterNow follows a finished run's events from now: nothing
// of its history comes.
func TestEventsAfterNow(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	id := startWait(t, env, "hello", `{}`)
	code, _, body := env.call("GET", "/v1/runs/"+id+"/events?after=now&follow=false", "", nil, nil)
	if code != http.StatusOK || strings.Contains(body, "data:") {
		t.Errorf("after=now: %d %q", code, body)
	}
	if code, _, _ := env.call("GET", "/v1/runs/"+id+"/events?after=later", "", nil, nil); code != http.StatusBadRequest {
		t.Errorf("after=later answered %d, want 400", code)
	}
}

// TestRunReplay replays runs by their id, from the run page and the API:
// a failed run whose entry is gone resumes at the step it stopped at, a
// restart is a new run, and a succeeded run can only be restarted.
func TestRunReplay(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	env.write(strings.Replace(mustRead(t, env.cfg), apiConfig, apiConfig+consoleConfig, 1))
	if _, err := env.srv.Reload(); err != nil {
		t.Fatal(err)
	}
	failed := startWait(t, env, "breaks", `{}`)
	if code, _, body := env.call("POST", "/v1/dlq/purge", `{"chain": "breaks"}`, nil, nil); code != http.StatusOK {
		t.Fatalf("purging: %d %s", code, body)
	}
	b := newBrowser(t, env)
	_, doc, _ := b.get("/ui/runs/" + failed)
	for _, id := range []string{"run-replay-resume", "run-replay-restart"} {
		if find(doc, func(n *html.Node) bool { return attr(n, "id") == id }) == nil {
			t.Errorf("the failed run's page has no %s button", id)
		}
	}
	if code, loc, body := b.post("/ui/runs/"+failed+"/replay", url.Values{"mode": {"resume"}}); code != http.StatusSeeOther || !strings.HasSuffix(strings.Split(loc, "?")[0], "/ui/runs/"+failed) {
		t.Fatalf("console replay: %d %q %s", code, loc, body)
	}
	if v := waitRunEnd(t, env, failed); v.Status != "failed" {
		t.Fatalf("the replayed run is %s", v.Status)
	}
	var replayed []string
	for _, ev := range readSSE(t, env, failed, "") {
		if ev.Type == "run_replayed" {
			replayed = append(replayed, ev.Message)
		}
	}
	if len(replayed) != 1 || !strings.HasPrefix(replayed[0], `replaying from step "call" by `) || !strings.HasSuffix(replayed[0], "(console)") {
		t.Errorf("the run's replay events: %q", replayed)
	}

	var out struct {
		ReplayOf string `json:"replay_of"`
		Run      string `json:"run"`
		Mode     string `json:"mode"`
	}
	if code, _, body := env.call("POST", "/v1/runs/"+failed+"/replay", `{"mode": "restart"}`, nil, &out); code != http.StatusAccepted || out.ReplayOf != failed || out.Run == "" || out.Run == failed || out.Mode != "restart" {
		t.Fatalf("API restart: %d %+v %s", code, out, body)
	}
	waitRunEnd(t, env, out.Run)

	succeeded := startWait(t, env, "hello", `{"who": "ops"}`)
	_, doc, _ = b.get("/ui/runs/" + succeeded)
	if find(doc, func(n *html.Node) bool { return attr(n, "id") == "run-replay-resume" }) != nil {
		t.Error("a succeeded run's page offers to resume it")
	}
	for _, tc := range []struct {
		id, body string
		code     int
		says     string
	}{
		{succeeded, `{}`, http.StatusConflict, "it succeeded; replay it with mode restart"},
		{succeeded, `{"mode": "again"}`, http.StatusBadRequest, "is not resume or restart"},
		{"01nosuchrun", `{}`, http.StatusNotFound, "not found"},
	} {
		if code, _, body := env.call("POST", "/v1/runs/"+tc.id+"/replay", tc.body, nil, nil); code != tc.code || !strings.Contains(body, tc.says) {
			t.Errorf("replaying %s with %s: %d %s, want %d saying %q", tc.id, tc.body, code, body, tc.code, tc.says)
		}
	}
}

// TestRunPageTimeline shows a long run's latest events, and all of them on
// request.
func TestRunPageTimeline(t *testing.T) {
	t.Parallel()
	var cfg strings.Builder
	cfg.WriteString("\n[[chains]]\nname = \"long\"\n")
	for i := range 40 {
		fmt.Fprintf(&cfg, "[[chains.steps]]\nname = \"s%02d\"\nprovider = \"echo\"\n", i)
	}
	env := newAPI(t, cfg.String())
	id := startWait(t, env, "long", `{}`)
	b := newBrowser(t, env)
	count := func(path string) (int, bool) {
		_, doc, _ := b.get(path)
		events := findAll(doc, func(n *html.Node) bool { return n.Data == "li" && strings.HasPrefix(attr(n, "class"), "ev ") })
		link := find(doc, func(n *html.Node) bool { return attr(n, "id") == "all-events" }) != nil
		return len(events), link
	}
	if n, link := count("/ui/runs/" + id); n != 50 || !link {
		t.Errorf("the run page shows %d events (link to all: %t), want the latest 50 and a link", n, link)
	}
	if n, link := count("/ui/runs/" + id + "?events=all"); n != 82 || link {
		t.Errorf("?events=all shows %d events (link: %t), want all 82", n, link)
	}
}

// TestConsoleBannerSaysOnlyItsOwn shows the banner an action's redirect
// asks for, and nothing for words a link brings in ?done=.
func TestConsoleBannerSaysOnlyItsOwn(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	env.write(strings.Replace(mustRead(t, env.cfg), apiConfig, apiConfig+consoleConfig, 1))
	if _, err := env.srv.Reload(); err != nil {
		t.Fatal(err)
	}
	id := startRun(t, env, "fleet", strings.Replace(fleetPayload(10), `{"hosts"`, `{"sleep_ms": 3000, "hosts"`, 1))
	b := newBrowser(t, env)
	b.get("/ui/runs/" + id)
	code, loc, body := b.post("/ui/runs/"+id+"/cancel", url.Values{})
	if code != http.StatusSeeOther {
		t.Fatalf("cancel: %d %s", code, body)
	}
	flash := func(path string) string {
		t.Helper()
		_, doc, _ := b.get(path)
		if f := find(doc, func(n *html.Node) bool { return attr(n, "id") == "flash" }); f != nil {
			return textOf(f)
		}
		return ""
	}
	if got := flash(loc); got != "cancel requested" {
		t.Errorf("after the cancel (%s) the banner says %q", loc, got)
	}
	for _, done := range []string{"Your session expired: sign in again at https://evil.example", "cancel requested", "<b>hi</b>", "flashes"} {
		if got := flash("/ui/runs?done=" + url.QueryEscape(done)); got != "" {
			t.Errorf("?done=%s puts %q in the banner", done, got)
		}
	}
}

// waitJob follows a bulk action's page until it is done, and returns it.
func waitJob(t *testing.T, b *browser, loc string) *html.Node {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		_, doc, _ := b.get(loc)
		p := find(doc, func(n *html.Node) bool { return attr(n, "id") == "progress" })
		if p == nil {
			t.Fatal("the bulk action's page shows no progress")
		}
		if attr(p, "data-finished") == "true" {
			return doc
		}
	}
	t.Fatalf("the bulk action at %s did not end within 30 s", loc)
	return nil
}

// TestConsoleBulkReplayFailingAgain replays two entries whose cause is
// still there: the page says both runs failed again rather than that the
// replay is a success, and its link to what the filter selects now shows
// the filter's two entries, not every entry.
func TestConsoleBulkReplayFailingAgain(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	for range 2 {
		startWait(t, env, "breaks", `{}`)
	}
	startWait(t, env, "flaky", `{}`)
	b := newBrowser(t, env)
	b.get("/ui/dlq?chain=breaks")
	code, loc, body := b.post("/ui/dlq-bulk", url.Values{"action": {"replay"}, "mode": {"resume"}, "chain": {"breaks"}, "confirm": {"2"}})
	if code != http.StatusSeeOther {
		t.Fatalf("bulk replay: %d %s", code, body)
	}
	doc := waitJob(t, b, loc)
	byID := func(doc *html.Node, id string) string {
		if n := find(doc, func(n *html.Node) bool { return attr(n, "id") == id }); n != nil {
			return textOf(n)
		}
		return ""
	}
	if got := byID(doc, "outcome"); got != "The replayed runs: 0 succeeded, 2 failed again, 0 still running." {
		t.Errorf("the outcome: %q", got)
	}
	if !strings.HasPrefix(byID(doc, "all-failed"), "Every replayed run failed again") {
		t.Error("the page does not say that every replayed run failed again")
	}
	link := find(doc, func(n *html.Node) bool { return attr(n, "id") == "selects-now" })
	checkKeeps(t, "the entries this filter selects now", attr(link, "href"), url.Values{"chain": {"breaks"}})
	if _, doc, _ := b.get(attr(link, "href")); !strings.HasPrefix(byID(doc, "matched"), "2 entries match") {
		t.Errorf("the entries the filter selects now: %q, want breaks' 2", byID(doc, "matched"))
	}
}

// TestRunChangesStreamWaiting follows GET /v1/events while a run comes to
// wait on a person and is answered: run_waiting, naming the approval step,
// comes between its start and its end.
func TestRunChangesStreamWaiting(t *testing.T) {
	t.Parallel()
	env := newAPI(t, `
[[chains]]
name = "asks"
[[chains.steps]]
name = "first"
provider = "faulty"
payload_template = { sleep_ms = 100 }
[[chains.steps]]
name = "ask"
approval = { message = "go on?" }
`)
	sc := openRunChanges(t, env)
	var run api.StartResponse
	if code, _, body := env.call("POST", "/v1/chains/asks/runs", `{}`, nil, &run); code != http.StatusAccepted && code != http.StatusOK {
		t.Fatalf("start: %d %s", code, body)
	}
	var seen []string
	for sc.Scan() && len(seen) < 3 {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev api.Event
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatal(err)
		}
		seen = append(seen, ev.Type+" "+ev.Step)
		if ev.Type == "run_waiting" {
			if code, _, body := env.call("POST", "/v1/runs/"+run.ID+"/signals/ask", `{"decision": "approve"}`, nil, nil); code != http.StatusAccepted {
				t.Fatalf("approve: %d %s", code, body)
			}
		}
	}
	if got := strings.Join(seen, ","); got != "run_started ,run_waiting ask,run_succeeded " {
		t.Errorf("the stream carried %q", got)
	}
}
