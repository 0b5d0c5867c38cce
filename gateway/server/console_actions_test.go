package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/html"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/gateway/ops"
)

// actionsConfig adds what the console's actions need besides the tour's
// chains: a chain declaring its input, a split whose items fail or are
// skipped on demand, an approval with a deadline, and a trigger.
const actionsConfig = `
[[chains]]
name = "deploy"
[chains.input]
required = ["host"]
optional = ["count", "dry_run"]
[[chains.steps]]
name = "push"
provider = "echo"
payload_template = "<<origin.payload>>"

[[chains]]
name = "patch"
[[chains.steps]]
name = "hosts"
[chains.steps.split]
items = "<<origin.payload.hosts>>"
tolerated_failures = "100%"
max_concurrency = 10
[[chains.steps.split.steps]]
name = "apply"
provider = "faulty"
when = 'item.skip != true'
payload_template = { fail = "<<item.fail ?? \"\">>", host = "<<item.host>>" }
[[chains.steps]]
name = "report"
provider = "echo"
payload_template = { succeeded = "<<steps.hosts.body.succeeded>>" }

[[chains]]
name = "change"
[[chains.steps]]
name = "approve-change"
timeout_seconds = 3600
approval = { message = "Change <<origin.payload.what>>?" }
[[chains.steps]]
name = "apply"
provider = "echo"

[[triggers]]
name = "deploys"
type = "webhook"
chain = "deploy"
payload = { host = "<<body.host>>" }
`

// patchFailing and patchFixed are the patch chain's split step before
// and after its fix: the fixed one runs every item, each for a while.
const (
	patchFailing = "when = 'item.skip != true'\npayload_template = { fail = \"<<item.fail ?? \\\"\\\">>\", host = \"<<item.host>>\" }"
	patchFixed   = "payload_template = { sleep_ms = 1500, host = \"<<item.host>>\" }"
)

// newActionsAPI is the console's test gateway with the tour's and the
// actions' chains.
func newActionsAPI(t *testing.T, extra string) *apiEnv {
	t.Helper()
	return newConsoleAPI(t, extra+tourConfig+actionsConfig)
}

// patchPayload is n hosts, the failing ones failing and the skipped ones
// skipped.
func patchPayload(n int, failing, skipped []int) string {
	hosts := make([]map[string]any, n)
	for i := range hosts {
		hosts[i] = map[string]any{"host": hostName(i)}
	}
	for _, i := range failing {
		hosts[i]["fail"] = hostName(i) + " refused the patch"
	}
	for _, i := range skipped {
		hosts[i]["skip"] = true
	}
	b, _ := json.Marshal(map[string]any{"hosts": hosts})
	return string(b)
}

func hostName(i int) string { return "host-" + string(rune('a'+i)) }

// fixPatch reloads the config with the patch chain fixed.
func fixPatch(t *testing.T, env *apiEnv) {
	t.Helper()
	cfg := mustRead(t, env.cfg)
	if !strings.Contains(cfg, patchFailing) {
		t.Fatal("the config has no patch chain to fix")
	}
	env.write(strings.Replace(cfg, patchFailing, patchFixed, 1))
	if _, err := env.srv.Reload(); err != nil {
		t.Fatal(err)
	}
}

// startLabelled starts a run through the API with labels, without waiting.
func startLabelled(t *testing.T, env *apiEnv, chainName, payload string, labels ...string) string {
	t.Helper()
	var res api.StartResponse
	q := url.Values{"label": labels}
	if code, _, body := env.call("POST", "/v1/chains/"+chainName+"/runs?"+q.Encode(), payload, nil, &res); code != http.StatusAccepted {
		t.Fatalf("starting %s: %d %s", chainName, code, body)
	}
	return res.ID
}

func byID(doc *html.Node, id string) *html.Node {
	return find(doc, func(n *html.Node) bool { return attr(n, "id") == id })
}

// idText is the text of the element with the id, or "" without one.
func idText(doc *html.Node, id string) string {
	if n := byID(doc, id); n != nil {
		return textOf(n)
	}
	return ""
}

// TestConsoleRunsByLabel filters the runs page by a label, pages through
// the result with the filter kept, and follows a run page's label to the
// runs that carry it.
func TestConsoleRunsByLabel(t *testing.T) {
	t.Parallel()
	env := newActionsAPI(t, "")
	for i := range 65 {
		at := time.Now()
		labels := map[string]string{"team": "storage", "host": hostName(i % 3)}
		if i%13 == 0 {
			labels = map[string]string{"team": "network"}
		}
		run := &store.Run{ID: store.NewID(), Chain: "deploy", ChainHash: "h", Status: store.RunSucceeded, Path: []string{"push"},
			CreatedAt: at, UpdatedAt: at, FinishedAt: at, Origin: store.Origin{ID: "o", ReceivedAt: at}, StartedBy: "api", Labels: labels}
		if err := env.gw.Store.Commit(context.Background(), &store.Batch{Run: run, Create: true}); err != nil {
			t.Fatal(err)
		}
	}
	b := newBrowser(t, env)
	filters := url.Values{"label": {"team=storage"}, "chain": {"deploy"}}
	code, doc, body := b.get("/ui/runs?" + filters.Encode() + "&label=")
	if code != http.StatusOK {
		t.Fatalf("the runs by label: %d\n%s", code, body)
	}
	var values []string
	for _, in := range findAll(doc, func(n *html.Node) bool { return n.Data == "input" && attr(n, "name") == "label" }) {
		values = append(values, attr(in, "value"))
	}
	if strings.Join(values, ",") != "team=storage," {
		t.Errorf("the filter's label fields hold %q, want team=storage and an empty one", values)
	}
	seen := 0
	for page := 1; ; page++ {
		rows := findAll(doc, func(n *html.Node) bool { return n.Data == "tr" && attr(n, "data-status") != "" })
		seen += len(rows)
		if page == 1 {
			checkKeeps(t, "the live list", attr(byID(doc, "runs"), "data-live"), filters)
		}
		next := byID(doc, "next-page")
		if next == nil {
			break
		}
		checkKeeps(t, "older runs", attr(next, "href"), filters)
		if code, doc, body = b.get(attr(next, "href")); code != http.StatusOK {
			t.Fatalf("older runs: %d\n%s", code, body)
		}
	}
	if seen != 60 {
		t.Errorf("the pages show %d runs, want the 60 of team storage", seen)
	}
	// A bare key is any value.
	_, doc, _ = b.get("/ui/runs?label=host")
	if rows := findAll(doc, func(n *html.Node) bool { return n.Data == "tr" && attr(n, "data-status") != "" }); len(rows) != 50 {
		t.Errorf("label=host shows %d runs, want a full page of 50", len(rows))
	}
	if code, _, body := b.get("/ui/runs?label=%3Dx"); code != http.StatusBadRequest || !strings.Contains(body, "a label is KEY=VALUE") {
		t.Errorf("a label without a key: %d\n%s", code, body)
	}

	// A run's page shows its labels, input and start, and a label leads
	// to the runs with it.
	id := startLabelled(t, env, "deploy", `{"host": "web-1", "count": 3}`, "ticket=INC-42", "env=prod")
	waitRunEnd(t, env, id)
	_, doc, _ = b.get("/ui/runs/" + id)
	facts := idText(doc, "run-facts")
	for _, want := range []string{"started by", "api", "env=prod", "ticket=INC-42"} {
		if !strings.Contains(facts, want) {
			t.Errorf("the run's facts do not say %q: %s", want, facts)
		}
	}
	if in := idText(doc, "run-input"); !strings.Contains(in, `"host": "web-1"`) || !strings.Contains(in, `"count": 3`) {
		t.Errorf("the run's input: %s", in)
	}
	link := find(byID(doc, "run-facts"), func(n *html.Node) bool { return n.Data == "a" && textOf(n) == "ticket=INC-42" })
	if link == nil {
		t.Fatal("the label is no link")
	}
	_, doc, _ = b.get(attr(link, "href"))
	rows := findAll(doc, func(n *html.Node) bool { return n.Data == "tr" && attr(n, "data-status") != "" })
	if len(rows) != 1 || !strings.Contains(textOf(rows[0]), id) {
		t.Errorf("the runs with ticket=INC-42, from %s: %d rows", attr(link, "href"), len(rows))
	}
}

// TestConsoleNewActionsGuarded: each action the console gained answers a
// forged token, another origin, a read session and a read-only console
// with 403, as cancel and replay do, and a read session sees none of
// their forms.
func TestConsoleNewActionsGuarded(t *testing.T) {
	t.Parallel()
	env := newActionsAPI(t, "[gateway.auth]\ntokens = [\"write-tok\"]\nread_tokens = [\"read-tok\"]\n")
	env.token = "write-tok"
	ask := startLabelled(t, env, "restart-db", `{"host": "db-1"}`, "host=db-1")
	waitAsking(t, env, ask, "ask")
	patch := startWait(t, env, "patch", patchPayload(6, []int{1}, []int{4}))

	actions := []struct {
		path string
		form url.Values
	}{
		{"/ui/runs/" + ask + "/answer/ask", url.Values{"decision": {"approve"}, "back": {"approvals"}}},
		{"/ui/runs/" + patch + "/redrive/hosts", url.Values{"items": {"failed"}}},
		{"/ui/pauses/schedule/nightly-restart", url.Values{"action": {"pause"}, "reason": {"maintenance"}}},
		{"/ui/pauses/trigger/deploys", url.Values{"action": {"unpause"}, "back": {"now"}}},
		{"/ui/chains/deploy/run", url.Values{"field.host": {"web-1"}}},
	}
	reader := newBrowser(t, env)
	reader.post("/ui/login", url.Values{"token": {"read-tok"}})
	for _, p := range []string{"/ui/approvals", "/ui/runs/" + patch, "/ui/chains", "/ui/chains/deploy", "/ui/"} {
		_, doc, _ := reader.get(p)
		if forms := writeForms(doc); len(forms) > 0 {
			t.Errorf("a read token sees write actions on %s: %v", p, forms)
		}
	}
	writer := newBrowser(t, env)
	writer.post("/ui/login", url.Values{"token": {"write-tok"}})
	writer.get("/ui/chains")
	for _, a := range actions {
		if code, _, _ := reader.post(a.path, a.form); code != http.StatusForbidden {
			t.Errorf("a read session's %s answered %d, want 403", a.path, code)
		}
		forged := url.Values{"csrf": {"forged"}}
		for k, v := range a.form {
			forged[k] = v
		}
		if code, _, _ := writer.post(a.path, forged); code != http.StatusForbidden {
			t.Errorf("%s with a forged CSRF token answered %d, want 403", a.path, code)
		}
		if code, _, _ := writer.post(a.path, a.form, "Origin", "https://evil.example"); code != http.StatusForbidden {
			t.Errorf("%s from another origin answered %d, want 403", a.path, code)
		}
		if code, _, _ := writer.post(a.path, a.form, "Sec-Fetch-Site", "cross-site"); code != http.StatusForbidden {
			t.Errorf("%s from another site answered %d, want 403", a.path, code)
		}
	}
	// Nothing happened.
	if v := waitRunEnd(t, env, patch); v.Steps["hosts"].Split.Failed != 1 {
		t.Errorf("the patch run changed: %+v", v.Steps["hosts"].Split)
	}
	var pauses struct {
		Pauses []api.Pause `json:"pauses"`
	}
	if env.call("GET", "/v1/pauses", "", nil, &pauses); len(pauses.Pauses) != 0 {
		t.Errorf("pauses: %+v", pauses.Pauses)
	}
	if page, _ := env.gw.Store.ListRuns(context.Background(), store.RunFilter{Chain: "deploy"}); len(page.Runs) != 0 {
		t.Errorf("runs of deploy were started: %d", len(page.Runs))
	}

	readOnly := newActionsAPI(t, "[gateway.ui]\nread_only = true\n")
	ro := newBrowser(t, readOnly)
	for _, p := range []string{"/ui/approvals", "/ui/chains", "/ui/chains/deploy", "/ui/"} {
		_, doc, _ := ro.get(p)
		if forms := writeForms(doc); len(forms) > 0 {
			t.Errorf("a read-only console shows write actions on %s: %v", p, forms)
		}
	}
	if code, _, body := ro.post("/ui/chains/deploy/run", url.Values{"field.host": {"web-1"}}); code != http.StatusForbidden || !strings.Contains(body, "read-only") {
		t.Errorf("a read-only console's run answered %d", code)
	}
}

// TestConsoleRunForm starts runs from a chain's page: a field each for the
// fields the chain declares, JSON or text, and labels; a start the chain's
// input refuses shows the form again, as filled in, saying why.
func TestConsoleRunForm(t *testing.T) {
	t.Parallel()
	env := newActionsAPI(t, "")
	b := newBrowser(t, env)
	_, doc, _ := b.get("/ui/chains/deploy")
	var fields []string
	for _, in := range findAll(byID(doc, "run-form"), func(n *html.Node) bool { return n.Data == "input" && attr(n, "type") == "text" }) {
		fields = append(fields, attr(in, "name"))
	}
	if strings.Join(fields, ",") != "field.host,field.count,field.dry_run" {
		t.Errorf("the run form's fields: %v", fields)
	}
	code, loc, body := b.post("/ui/chains/deploy/run", url.Values{"field.host": {"web-1"}, "field.count": {"3"}, "field.dry_run": {""}, "labels": {"ticket=INC-7\r\n\r\nenv=prod\r\n"}})
	if code != http.StatusSeeOther || !strings.HasSuffix(loc, "?done=started") {
		t.Fatalf("run: %d %q %s", code, loc, body)
	}
	id := strings.TrimSuffix(strings.TrimPrefix(loc, "/ui/runs/"), "?done=started")
	v := waitRunEnd(t, env, id)
	if v.Status != "succeeded" || string(v.Origin.Payload) != `{"count":3,"host":"web-1"}` || v.StartedBy != "api" || v.Labels["ticket"] != "INC-7" || v.Labels["env"] != "prod" || len(v.Labels) != 2 {
		t.Errorf("the run started: %s %s by %s, labels %v", v.Status, v.Origin.Payload, v.StartedBy, v.Labels)
	}
	logsSay(t, env, `"msg":"run started"`, `"run":"`+id+`","by":"a loopback client (console)"`)

	// A required field left out: the form comes back filled in.
	code, doc, body = b.postPage("/ui/chains/deploy/run", url.Values{"field.count": {"[1, 2]"}, "labels": {"team=web"}})
	if code != http.StatusBadRequest {
		t.Fatalf("a start without host: %d\n%s", code, body)
	}
	if e := idText(doc, "run-error"); !strings.Contains(e, "host: required field is missing") {
		t.Errorf("the refusal says %q", e)
	}
	count := find(byID(doc, "run-form"), func(n *html.Node) bool { return attr(n, "name") == "field.count" })
	if attr(count, "value") != "[1, 2]" || idText(doc, "run-labels") != "team=web" {
		t.Errorf("the form lost what was typed: count %q, labels %q", attr(count, "value"), idText(doc, "run-labels"))
	}
	for _, tc := range []struct {
		chain string
		form  url.Values
		says  string
	}{
		{"deploy", url.Values{"field.host": {"web-1"}, "labels": {"no-value"}}, "a label is KEY=VALUE"},
		{"hello", url.Values{"payload": {`{"who": `}}, "must be one JSON value"},
		{"hello", url.Values{"payload": {`{"who": "` + strings.Repeat("x", 3000) + `"}`}}, "2048"},
	} {
		code, doc, body := b.postPage("/ui/chains/"+tc.chain+"/run", tc.form)
		if e := idText(doc, "run-error"); code < 400 || !strings.Contains(e, tc.says) {
			t.Errorf("%s %v: %d %q\n%s", tc.chain, tc.form, code, e, body)
		}
	}
	if code, _, _ := b.post("/ui/chains/nope/run", url.Values{}); code != http.StatusNotFound {
		t.Errorf("an unknown chain's run: %d", code)
	}

	// Without declared input, the payload is one JSON value.
	_, doc, _ = b.get("/ui/chains/hello")
	if byID(doc, "run-payload") == nil {
		t.Fatal("hello's run form has no payload box")
	}
	_, loc, _ = b.post("/ui/chains/hello/run", url.Values{"payload": {`{"who": "console"}`}})
	id = strings.TrimSuffix(strings.TrimPrefix(loc, "/ui/runs/"), "?done=started")
	if v := waitRunEnd(t, env, id); v.Status != "succeeded" || !strings.Contains(string(v.Steps["greet"].Body), "hello console") {
		t.Errorf("hello from the console: %s %s", v.Status, v.Steps["greet"].Body)
	}

	// A schema's properties are the fields; a string property stays text.
	_, doc, _ = b.get("/ui/chains/typed")
	fields = nil
	for _, in := range findAll(byID(doc, "run-form"), func(n *html.Node) bool { return n.Data == "input" && attr(n, "type") == "text" }) {
		fields = append(fields, attr(in, "name"))
	}
	if strings.Join(fields, ",") != "field.alert_name,field.host,field.severity" {
		t.Errorf("the typed chain's fields: %v", fields)
	}
	_, loc, body = b.post("/ui/chains/typed/run", url.Values{"field.alert_name": {"42"}, "field.host": {"db-1"}})
	id = strings.TrimSuffix(strings.TrimPrefix(loc, "/ui/runs/"), "?done=started")
	if v := waitRunEnd(t, env, id); v.Status != "succeeded" || string(v.Origin.Payload) != `{"alert_name":"42","host":"db-1"}` {
		t.Errorf("the typed run: %s %s (%s)", v.Status, v.Origin.Payload, body)
	}
}

// TestConsoleRunFormStartsOnce sends a chain page's run form twice at
// once, as a double click or a resend does: one run starts, both answers
// lead to it, and the page drawn next carries a new form.
func TestConsoleRunFormStartsOnce(t *testing.T) {
	t.Parallel()
	env := newActionsAPI(t, "")
	b := newBrowser(t, env)
	_, doc, _ := b.get("/ui/chains/deploy")
	form := url.Values{}
	for _, in := range findAll(byID(doc, "run-form"), func(n *html.Node) bool { return n.Data == "input" }) {
		form.Set(attr(in, "name"), attr(in, "value"))
	}
	nonce := form.Get("nonce")
	if nonce == "" || form.Get("csrf") == "" {
		t.Fatalf("the run form carries no nonce or no CSRF token: %v", form)
	}
	form.Set("field.host", "web-9")
	type answer struct {
		code     int
		location string
	}
	answers := make(chan answer, 2)
	for range 2 {
		go func() {
			req, _ := http.NewRequest(http.MethodPost, env.url+"/ui/chains/deploy/run", strings.NewReader(form.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Origin", env.url)
			resp, err := b.c.Do(req)
			if err != nil {
				answers <- answer{}
				return
			}
			resp.Body.Close()
			answers <- answer{resp.StatusCode, resp.Header.Get("Location")}
		}()
	}
	first, second := <-answers, <-answers
	if first.code != http.StatusSeeOther || first != second || !strings.HasSuffix(first.location, "?done=started") {
		t.Fatalf("the form sent twice: %+v and %+v, want both to lead to one run", first, second)
	}
	id := strings.TrimSuffix(strings.TrimPrefix(first.location, "/ui/runs/"), "?done=started")
	waitRunEnd(t, env, id)
	var list struct {
		Runs []api.Run `json:"runs"`
	}
	if env.call("GET", "/v1/runs?chain=deploy", "", nil, &list); len(list.Runs) != 1 || list.Runs[0].ID != id {
		t.Errorf("deploy's runs: %+v, want %s alone", list.Runs, id)
	}
	_, doc, _ = b.get("/ui/chains/deploy")
	if again := find(byID(doc, "run-form"), func(n *html.Node) bool { return attr(n, "name") == "nonce" }); again == nil || attr(again, "value") == nonce {
		t.Error("the run form drawn again carries the nonce of the one sent")
	}
	if code, _, _ := b.post("/ui/chains/deploy/run", url.Values{"field.host": {"web-9"}, "nonce": {"not-a-nonce"}}); code != http.StatusBadRequest {
		t.Errorf("a form with a nonce the console did not give: %d", code)
	}
}

// postPage submits a form whose answer is a page, and parses it.
func (b *browser) postPage(path string, form url.Values) (int, *html.Node, string) {
	b.t.Helper()
	code, _, body := b.post(path, form)
	doc, err := html.Parse(strings.NewReader(body))
	if err != nil {
		b.t.Fatal(err)
	}
	return code, doc, body
}

// TestConsoleApprovalsPage lists every question asked now, with its run's
// labels and its deadline, and answers one in place.
func TestConsoleApprovalsPage(t *testing.T) {
	t.Parallel()
	env := newActionsAPI(t, "")
	ask := startLabelled(t, env, "restart-db", `{"host": "db-1"}`, "host=db-1", "team=dba")
	change := startRun(t, env, "change", `{"what": "the firewall"}`)
	waitAsking(t, env, ask, "ask")
	waitAsking(t, env, change, "approve-change")
	b := newBrowser(t, env)
	_, doc, _ := b.get("/ui/")
	if link := byID(doc, "waiting-link"); link == nil || attr(link, "href") != "/ui/approvals" || textOf(link) != "2 waiting on a person" {
		t.Errorf("the Now page's waiting runs do not lead to the approvals")
	}
	_, doc, body := b.get("/ui/approvals")
	rows := findAll(doc, func(n *html.Node) bool { return n.Data == "tr" && attr(n, "data-run") != "" })
	if len(rows) != 2 {
		t.Fatalf("the approvals page lists %d questions, want 2\n%s", len(rows), body)
	}
	// The one with a deadline first.
	first, second := textOf(rows[0]), textOf(rows[1])
	if attr(rows[0], "data-run") != change || !strings.Contains(first, "Change the firewall?") || !strings.Contains(first, "approve-change") || !strings.Contains(first, "change") {
		t.Errorf("the first question: %s", first)
	}
	if attr(rows[1], "data-run") != ask || !strings.Contains(second, "Restart db-1?") || !strings.Contains(second, "host=db-1") || !strings.Contains(second, "team=dba") || !strings.Contains(second, "none") {
		t.Errorf("the second question: %s", second)
	}
	code, loc, raw := b.post("/ui/runs/"+change+"/answer/approve-change", url.Values{"decision": {"reject"}, "comment": {"not today"}, "back": {"approvals"}})
	if code != http.StatusSeeOther || loc != "/ui/approvals?done=answered-reject" {
		t.Fatalf("answering from the approvals page: %d %q %s", code, loc, raw)
	}
	_, doc, _ = b.get(loc)
	rows = findAll(doc, func(n *html.Node) bool { return n.Data == "tr" && attr(n, "data-run") != "" })
	if len(rows) != 1 || attr(rows[0], "data-run") != ask || idText(doc, "flash") != "answered: reject" {
		t.Errorf("after the answer, the page lists %d questions, flash %q", len(rows), idText(doc, "flash"))
	}
	if v := waitRunEnd(t, env, change); v.Status != "failed" {
		t.Errorf("the rejected run is %s", v.Status)
	}
}

// TestStartRunOps starts a run through Ops, on the gateway's own store and
// through the API, with its labels; both refuse a payload the chain's
// input refuses, and a chain there is not; two starts at once under one
// idempotency key start one run, whichever way each goes.
func TestStartRunOps(t *testing.T) {
	t.Parallel()
	env := newActionsAPI(t, "")
	ctx := context.Background()
	for name, ops := range map[string]api.Ops{"local": &ops.Local{GW: env.gw}, "client": api.NewClient(env.url, "")} {
		run, err := ops.StartRun(ctx, "deploy", json.RawMessage(`{"host": "web-1"}`), api.StartOptions{Labels: map[string]string{"via": name}})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if v := waitRunEnd(t, env, run.ID); v.Status != "succeeded" || v.StartedBy != "api" || v.Labels["via"] != name {
			t.Errorf("%s: the run is %s, started by %s, labels %v", name, v.Status, v.StartedBy, v.Labels)
		}
		if _, err := ops.StartRun(ctx, "deploy", json.RawMessage(`{"count": 1}`), api.StartOptions{}); err == nil || !strings.Contains(err.Error(), "host: required field is missing") {
			t.Errorf("%s: a payload without host: %v", name, err)
		}
		if _, err := ops.StartRun(ctx, "deplo", nil, api.StartOptions{}); err == nil || !strings.Contains(err.Error(), `did you mean "deploy"`) {
			t.Errorf("%s: an unknown chain: %v", name, err)
		}
		if _, err := ops.StartRun(ctx, "hello", nil, api.StartOptions{Labels: map[string]string{"": "x"}}); err == nil {
			t.Errorf("%s: a label without a key was taken", name)
		}
	}
	local, client := &ops.Local{GW: env.gw}, api.NewClient(env.url, "")
	ids := make(chan string, 2)
	for _, ops := range []api.Ops{local, client} {
		go func() {
			run, err := ops.StartRun(ctx, "deploy", json.RawMessage(`{"host": "web-3"}`), api.StartOptions{IdempotencyKey: "deploy-web-3"})
			if err != nil {
				t.Errorf("a keyed start: %v", err)
				ids <- ""
				return
			}
			ids <- run.ID
		}()
	}
	if a, b := <-ids, <-ids; a == "" || a != b {
		t.Errorf("two starts under one key, through the store and the API: runs %q and %q", a, b)
	}
	page, err := local.ListRuns(ctx, store.RunFilter{Chain: "deploy"})
	if err != nil || len(page.Runs) != 3 {
		t.Errorf("deploy's runs: %d, %v; want the two started unkeyed and one keyed", len(page.Runs), err)
	}
}
