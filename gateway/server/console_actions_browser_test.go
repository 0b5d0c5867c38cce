package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/gateway/api"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
)

// TestBrowserRunLabels opens a run started with labels: its page shows
// them, its input and how it started; a click on a label lists the runs
// with it, and the runs filter takes another label.
func TestBrowserRunLabels(t *testing.T) {
	t.Parallel()
	env := newActionsAPI(t, "")
	labelled := startLabelled(t, env, "deploy", `{"host": "web-1", "count": 3}`, "ticket=INC-42", "env=prod")
	other := startLabelled(t, env, "deploy", `{"host": "web-2"}`, "env=staging")
	waitRunEnd(t, env, labelled)
	waitRunEnd(t, env, other)
	ctx := chrome(t)
	do(t, ctx, "opening the run", chromedp.Navigate(env.url+"/ui/runs/"+labelled), chromedp.WaitVisible(chromedp.CSS("#run-facts")))
	facts := eval[string](t, ctx, `document.getElementById('run-facts').innerText`)
	for _, want := range []string{"started by\tapi", "env=prod", "ticket=INC-42"} {
		if !strings.Contains(facts, want) {
			t.Errorf("the run's facts do not say %q:\n%s", want, facts)
		}
	}
	if in := eval[string](t, ctx, `document.querySelector('#run-input pre').innerText`); !strings.Contains(in, `"host": "web-1"`) {
		t.Errorf("the run's input: %s", in)
	}
	if !eval[bool](t, ctx, `document.querySelector('#run-input pre').getBoundingClientRect().height > 0`) {
		t.Error("a small input is not shown open")
	}
	do(t, ctx, "clicking a label", chromedp.Click(chromedp.CSS(`#run-facts a.label[href*="ticket"]`)), chromedp.WaitVisible(chromedp.CSS("#runs")))
	rows := `Array.from(document.querySelectorAll('#runs tr[data-status] td.wide a')).map(a => a.textContent)`
	if got := eval[[]string](t, ctx, rows); len(got) != 1 || got[0] != labelled {
		t.Errorf("the runs with ticket=INC-42: %v, want %s", got, labelled)
	}
	if v := eval[[]string](t, ctx, `Array.from(document.querySelectorAll('input[name=label]')).map(i => i.value)`); strings.Join(v, ",") != "ticket=INC-42," {
		t.Errorf("the filter's label fields hold %v", v)
	}
	do(t, ctx, "filtering by another label", chromedp.Navigate(env.url+"/ui/runs"), chromedp.WaitVisible(chromedp.CSS("#label-filter")),
		chromedp.SendKeys(chromedp.CSS("#label-filter"), "env=staging"), chromedp.Submit(chromedp.CSS("#label-filter")),
		chromedp.WaitVisible(chromedp.CSS(`input[name=label][value="env=staging"]`)))
	if got := eval[[]string](t, ctx, rows); len(got) != 1 || got[0] != other {
		t.Errorf("the runs with env=staging: %v, want %s", got, other)
	}
}

// TestBrowserApprovals follows the Now page's waiting runs to the
// approvals page, and answers both questions there: one approved with a
// comment, the other rejected.
func TestBrowserApprovals(t *testing.T) {
	t.Parallel()
	env := newActionsAPI(t, "")
	ask := startLabelled(t, env, "restart-db", `{"host": "db-1"}`, "host=db-1")
	change := startRun(t, env, "change", `{"what": "the firewall"}`)
	waitAsking(t, env, ask, "ask")
	waitAsking(t, env, change, "approve-change")
	ctx := chrome(t)
	do(t, ctx, "following the waiting runs", chromedp.Navigate(env.url+"/ui/"), chromedp.WaitVisible(chromedp.CSS("#waiting-link")),
		chromedp.Click(chromedp.CSS("#waiting-link")), chromedp.WaitVisible(chromedp.CSS("#approvals")))
	if on := eval[string](t, ctx, `document.querySelector('header nav a.on').textContent`); on != "Approvals" {
		t.Errorf("the nav marks %q", on)
	}
	row := func(id string) string { return fmt.Sprintf(`#approvals tr[data-run="%s"]`, id) }
	text := eval[string](t, ctx, `document.querySelector('`+row(ask)+`').innerText`)
	for _, want := range []string{"Restart db-1?", "restart-db", "ask", "host=db-1", "ago"} {
		if !strings.Contains(text, want) {
			t.Errorf("the question of %s does not say %q:\n%s", ask, want, text)
		}
	}
	if d := eval[string](t, ctx, `document.querySelector('`+row(change)+` td[data-label=deadline]').innerText`); !strings.Contains(d, "Z") {
		t.Errorf("the change's deadline: %q", d)
	}
	do(t, ctx, "approving with a comment", chromedp.SendKeys(chromedp.CSS(row(ask)+` input[name=comment]`), "window open"),
		chromedp.Click(chromedp.CSS(row(ask)+` button.approve`)), chromedp.WaitVisible(chromedp.CSS("#flash")))
	if f := eval[string](t, ctx, `document.getElementById('flash').textContent`); f != "answered: approve" {
		t.Errorf("the banner says %q", f)
	}
	if eval[bool](t, ctx, `document.querySelector('`+row(ask)+`') !== null`) {
		t.Error("the answered question is still listed")
	}
	do(t, ctx, "rejecting", chromedp.Click(chromedp.CSS(row(change)+` button.reject`)), chromedp.WaitVisible(chromedp.CSS("#no-approvals")))
	if v := waitRunEnd(t, env, ask); v.Status != "succeeded" || !strings.Contains(string(v.Steps["ask"].Body), `"comment":"window open"`) {
		t.Errorf("the approved run: %s %s", v.Status, v.Steps["ask"].Body)
	}
	if v := waitRunEnd(t, env, change); v.Status != "failed" {
		t.Errorf("the rejected run is %s", v.Status)
	}
}

// TestBrowserRedrive runs again the failed and skipped items of a split
// once its chain is fixed: the run page shows the run going on, then its
// end with every item succeeded.
func TestBrowserRedrive(t *testing.T) {
	t.Parallel()
	env := newActionsAPI(t, "")
	id := startWait(t, env, "patch", patchPayload(8, []int{1, 5}, []int{3}))
	fixPatch(t, env)
	ctx := chrome(t)
	do(t, ctx, "opening the run", chromedp.Navigate(env.url+"/ui/runs/"+id), chromedp.WaitVisible(chromedp.CSS("#redrive-failed-hosts")))
	labels := eval[[]string](t, ctx, `Array.from(document.querySelectorAll('form.redrive button')).map(b => b.textContent)`)
	if strings.Join(labels, ",") != "Redrive failed items (2),Redrive failed and skipped items (3)" {
		t.Errorf("the redrive buttons: %q", labels)
	}
	// The page after the redrive is read as the gateway served it, before
	// its script follows the run: on a slow machine the redriven items may
	// be done before the test looks.
	do(t, ctx, "noting how each page is served", func(ctx context.Context, target *chromedp.Target) (chromedp.Void, error) {
		_, err := cdp.Call(ctx, target, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: `
			document.addEventListener('readystatechange', () => {
				const m = document.querySelector('.run-meta');
				if (document.readyState === 'interactive' && m) { window.servedFinal = m.dataset.final; }
			});`})
		return chromedp.Void{}, err
	})
	do(t, ctx, "redriving", chromedp.Click(chromedp.CSS("#redrive-skipped-hosts")), chromedp.WaitVisible(chromedp.CSS("#flash")))
	if f := eval[string](t, ctx, `document.getElementById('flash').textContent`); !strings.HasPrefix(f, "redriven") {
		t.Errorf("the banner says %q", f)
	}
	if served := eval[string](t, ctx, `String(window.servedFinal)`); served != "false" {
		t.Errorf("the run page after the redrive was served with final=%s, not showing the run going on", served)
	}
	if eval[bool](t, ctx, `document.querySelector('form.redrive') !== null`) {
		t.Error("the run going on offers a redrive")
	}
	poll(t, ctx, "the redriven items' end", barLabel+`.startsWith('8/8 items: 8 succeeded, 0 failed')`)
	poll(t, ctx, "the run's end", `document.querySelector('.run-meta').dataset.final === 'true' && document.querySelector('.run-meta').dataset.status === 'succeeded'`)
	if eval[bool](t, ctx, `document.querySelector('form.redrive') !== null`) {
		t.Error("a split with nothing failed or skipped offers a redrive")
	}
	var v api.RunView
	env.call("GET", "/v1/runs/"+id, "", nil, &v)
	if s := v.Steps["hosts"].Split; v.Status != "succeeded" || s.Succeeded != 8 {
		t.Errorf("the redriven run: %s %+v", v.Status, s)
	}
}

// TestBrowserPause pauses a schedule from the chains page with a reason,
// sees it paused there and on the Now page, and unpauses it from the Now
// page; a trigger the same way from the chains page.
func TestBrowserPause(t *testing.T) {
	t.Parallel()
	env := newActionsAPI(t, "")
	ctx := chrome(t)
	do(t, ctx, "pausing the schedule", chromedp.Navigate(env.url+"/ui/chains"), chromedp.WaitVisible(chromedp.CSS("#pause-schedule-nightly-restart")),
		chromedp.SendKeys(chromedp.CSS("#reason-schedule-nightly-restart"), "database maintenance"),
		chromedp.Click(chromedp.CSS("#pause-schedule-nightly-restart")), chromedp.WaitVisible(chromedp.CSS("#unpause-schedule-nightly-restart")))
	if f := eval[string](t, ctx, `document.getElementById('flash').textContent`); f != "paused" {
		t.Errorf("the banner says %q", f)
	}
	state := eval[string](t, ctx, `document.querySelector('tr[data-name="nightly-restart"] td[data-label=state]').innerText`)
	if !strings.Contains(state, "paused by a loopback client (console)") || !strings.Contains(state, "database maintenance") {
		t.Errorf("the schedule's state: %q", state)
	}
	var pauses struct {
		Pauses []api.Pause `json:"pauses"`
	}
	if env.call("GET", "/v1/pauses", "", nil, &pauses); len(pauses.Pauses) != 1 || pauses.Pauses[0].Reason != "database maintenance" {
		t.Fatalf("the pauses: %+v", pauses.Pauses)
	}
	do(t, ctx, "the chain's page", chromedp.Navigate(env.url+"/ui/chains/restart-db"), chromedp.WaitVisible(chromedp.CSS("ul.started-by")))
	if s := eval[string](t, ctx, `document.querySelector('ul.started-by').innerText`); !strings.Contains(s, "paused by a loopback client (console): database maintenance") {
		t.Errorf("the chain's page says %q", s)
	}
	do(t, ctx, "unpausing from Now", chromedp.Navigate(env.url+"/ui/"), chromedp.WaitVisible(chromedp.CSS("#unpause-schedule-nightly-restart")),
		chromedp.Click(chromedp.CSS("#unpause-schedule-nightly-restart")), chromedp.WaitVisible(chromedp.CSS("#flash")))
	if f := eval[string](t, ctx, `document.getElementById('flash').textContent`); f != "unpaused" {
		t.Errorf("the banner says %q", f)
	}
	if eval[bool](t, ctx, `document.getElementById('paused') !== null`) {
		t.Error("the Now page still shows something paused")
	}
	do(t, ctx, "pausing the trigger", chromedp.Navigate(env.url+"/ui/chains"), chromedp.WaitVisible(chromedp.CSS("#pause-trigger-deploys")),
		chromedp.Click(chromedp.CSS("#pause-trigger-deploys")), chromedp.WaitVisible(chromedp.CSS("#unpause-trigger-deploys")))
	if env.call("GET", "/v1/pauses", "", nil, &pauses); len(pauses.Pauses) != 1 || pauses.Pauses[0].Kind != "trigger" || pauses.Pauses[0].Name != "deploys" {
		t.Fatalf("the pauses: %+v", pauses.Pauses)
	}
	do(t, ctx, "unpausing it", chromedp.Click(chromedp.CSS("#unpause-trigger-deploys")), chromedp.WaitVisible(chromedp.CSS("#pause-trigger-deploys")))
	if env.call("GET", "/v1/pauses", "", nil, &pauses); len(pauses.Pauses) != 0 {
		t.Errorf("the pauses: %+v", pauses.Pauses)
	}
}

// TestBrowserRunButton starts runs from a chain's page: a refused one
// shows why with what was typed kept, a good one leads to the new run's
// page; a chain without declared input takes its payload as JSON.
func TestBrowserRunButton(t *testing.T) {
	t.Parallel()
	env := newActionsAPI(t, "")
	ctx := chrome(t)
	do(t, ctx, "running without the required field", chromedp.Navigate(env.url+"/ui/chains/deploy"), chromedp.WaitVisible(chromedp.CSS("#run-form")),
		chromedp.SendKeys(chromedp.CSS(`input[name="field.count"]`), "3"), chromedp.SendKeys(chromedp.CSS("#run-labels"), "ticket=INC-7\nenv=prod"),
		chromedp.Click(chromedp.CSS("#run-start")), chromedp.WaitVisible(chromedp.CSS("#run-error")))
	if e := eval[string](t, ctx, `document.getElementById('run-error').innerText`); !strings.Contains(e, "host: required field is missing") {
		t.Errorf("the refusal says %q", e)
	}
	do(t, ctx, "filling it in", chromedp.SendKeys(chromedp.CSS(`input[name="field.host"]`), "web-1"), chromedp.Click(chromedp.CSS("#run-start")),
		chromedp.WaitVisible(chromedp.CSS("#run-facts")))
	if f := eval[string](t, ctx, `document.getElementById('flash').textContent`); f != "run started" {
		t.Errorf("the banner says %q", f)
	}
	id := eval[string](t, ctx, `document.getElementById('live').dataset.run`)
	v := waitRunEnd(t, env, id)
	if v.Status != "succeeded" || string(v.Origin.Payload) != `{"count":3,"host":"web-1"}` || v.Labels["ticket"] != "INC-7" || v.Labels["env"] != "prod" {
		t.Errorf("the run started: %s %s %v", v.Status, v.Origin.Payload, v.Labels)
	}
	if facts := eval[string](t, ctx, `document.getElementById('run-facts').innerText`); !strings.Contains(facts, "ticket=INC-7") {
		t.Errorf("the new run's page: %s", facts)
	}

	do(t, ctx, "running hello with a JSON payload", chromedp.Navigate(env.url+"/ui/chains/hello"), chromedp.WaitVisible(chromedp.CSS("#run-payload")),
		chromedp.SetValue(chromedp.CSS("#run-payload"), `{"who": "the console"}`), chromedp.Click(chromedp.CSS("#run-start")),
		chromedp.WaitVisible(chromedp.CSS("#run-facts")))
	id = eval[string](t, ctx, `document.getElementById('live').dataset.run`)
	if v := waitRunEnd(t, env, id); v.Status != "succeeded" || !strings.Contains(string(v.Steps["greet"].Body), "hello the console") {
		t.Errorf("hello from the console: %s %s", v.Status, v.Steps["greet"].Body)
	}
	poll(t, ctx, "the run's end on its page", `document.querySelector('.run-meta').dataset.final === 'true'`)
	if code, _, _ := env.call("GET", "/v1/runs/"+id, "", nil, nil); code != http.StatusOK {
		t.Errorf("the run: %d", code)
	}
}

// TestBrowserApprovalsFollowLive keeps the approvals page open while runs
// come to ask: each new question appears, and the time the page is as of
// moves, without a reload; a comment being typed stays as it was.
func TestBrowserApprovalsFollowLive(t *testing.T) {
	t.Parallel()
	env := newActionsAPI(t, "")
	ctx := chrome(t)
	do(t, ctx, "opening the approvals", chromedp.Navigate(env.url+"/ui/approvals"), chromedp.WaitVisible(chromedp.CSS("#no-approvals")))
	eval[bool](t, ctx, `window.__sameDocument = true`)
	asOf := eval[string](t, ctx, `document.querySelector('#as-of time').getAttribute('datetime')`)
	row := func(id string) string {
		return fmt.Sprintf(`document.querySelector('#approvals tr[data-run="%s"]')`, id)
	}

	first := startRun(t, env, "restart-db", `{"host": "db-1"}`)
	poll(t, ctx, "the first question", row(first)+` !== null`)
	if now := eval[string](t, ctx, `document.querySelector('#as-of time').getAttribute('datetime')`); now == asOf {
		t.Errorf("the page still says it is as of %s", asOf)
	}
	comment := fmt.Sprintf(`#approvals tr[data-run="%s"] input[name=comment]`, first)
	do(t, ctx, "typing a comment", chromedp.SendKeys(chromedp.CSS(comment), "after the backup"))

	second := startRun(t, env, "change", `{"what": "the firewall"}`)
	poll(t, ctx, "the second question", row(second)+` !== null`)
	if q := eval[string](t, ctx, row(second)+`.querySelector('td.question').textContent`); q != "Change the firewall?" {
		t.Errorf("the second question reads %q", q)
	}
	if got := eval[[]string](t, ctx, `[document.querySelector('`+comment+`').value, (document.activeElement || {}).name || '']`); got[0] != "after the backup" || got[1] != "comment" {
		t.Errorf("the comment being typed, once the page was drawn again: %q, the focus on %q", got[0], got[1])
	}
	if !eval[bool](t, ctx, `window.__sameDocument === true`) {
		t.Fatal("the page was reloaded")
	}
}

// TestBrowserRunsListLabels lists runs with their labels on a phone: a
// label's value that holds markup is shown as the text it is, a long one
// wraps, and the page scrolls no wider than the screen.
func TestBrowserRunsListLabels(t *testing.T) {
	t.Parallel()
	env := newActionsAPI(t, "")
	hostile := `<img src=x onerror="window.__pwned=1"><script>window.__pwned=1</script>`
	long := "db-1.prod.eu-west-1.example.com:9100/" + strings.Repeat("a-very-long-path-segment/", 6)
	id := startLabelled(t, env, "deploy", `{"host": "web-1"}`, "summary="+hostile, "instance="+long, "team=dba")
	plain := startLabelled(t, env, "deploy", `{"host": "web-2"}`)
	waitRunEnd(t, env, id)
	waitRunEnd(t, env, plain)
	ctx := chrome(t)
	do(t, ctx, "a phone's viewport", phone)
	fits(t, ctx, "the runs with labels", env.url+"/ui/runs")
	labels := eval[[]string](t, ctx, fmt.Sprintf(`Array.from(document.querySelectorAll('#runs a[href$="/runs/%s"]')).flatMap(a => Array.from(a.closest('tr').querySelectorAll('a.label'))).map(a => a.textContent)`, id))
	if want := []string{"instance=" + long, "summary=" + hostile, "team=dba"}; strings.Join(labels, "\n") != strings.Join(want, "\n") {
		t.Errorf("the run's labels read %q, want %q", labels, want)
	}
	if eval[bool](t, ctx, `document.querySelector('#runs img, #runs script') !== null || window.__pwned === 1`) {
		t.Error("a label's markup became part of the page")
	}
	if n := eval[int](t, ctx, fmt.Sprintf(`document.querySelector('#runs a[href$="/runs/%s"]').closest('tr').querySelectorAll('a.label').length`, plain)); n != 0 {
		t.Errorf("a run without labels shows %d", n)
	}
	do(t, ctx, "following a label", chromedp.Click(chromedp.CSS(`#runs a.label[href*="team"]`)), chromedp.WaitVisible(chromedp.CSS(`input[name=label][value="team=dba"]`)))
	if got := eval[[]string](t, ctx, `Array.from(document.querySelectorAll('#runs tr[data-status] td.wide a')).map(a => a.textContent)`); len(got) != 1 || got[0] != id {
		t.Errorf("the runs with team=dba: %v, want %s", got, id)
	}
}

// TestSlackAndConsoleAnswerOnPhone answers two runs' approvals, one from
// a Slack message's button, signed as Slack signs it, the other from the
// console's approvals page on a phone-sized Chromium: both runs succeed,
// and each run's page says who answered it.
func TestSlackAndConsoleAnswerOnPhone(t *testing.T) {
	t.Setenv("CHAINGATE_SECRET_SLACK_SIGNING_SECRET", slackSigningSecret)
	env := newActionsAPI(t, `
[gateway.auth]
tokens = [{ name = "carol", token = "carol-tok" }]

[gateway.slack]
signing_secret = "<<secrets.SLACK_SIGNING_SECRET>>"
users = { U0ALICE1 = "alice" }
`)
	env.token = "carol-tok"
	slack := newFakeSlack(t, env)
	bySlack := startRun(t, env, "restart-db", `{"host": "db-1"}`)
	byConsole := startRun(t, env, "restart-db", `{"host": "db-2"}`)
	waitAsking(t, env, bySlack, "ask")
	waitAsking(t, env, byConsole, "ask")

	message := json.RawMessage(`{"text": "Restart db-1?", "blocks": [{"type": "actions", "elements": [{"type": "button", "action_id": "chaingate:approve", "value": "` + bySlack + `/ask"}]}]}`)
	click := slackClick(t, slack.srv.URL+"/actions/T0TEAM/1/abc", "U0ALICE1", "chaingate:approve", bySlack+"/ask", message)
	ts, sig := slackSign(slackSigningSecret, time.Now(), click)
	if code, body := postSlack(t, env, click, ts, sig); code != http.StatusOK {
		t.Fatalf("the Slack click: %d %s", code, body)
	}
	if reply := slack.reply(t); !strings.Contains(fmt.Sprint(reply["blocks"]), "Approved by alice (Slack)") {
		t.Errorf("the reply to Slack: %v", reply)
	}
	if v := waitRunEnd(t, env, bySlack); v.Status != "succeeded" {
		t.Errorf("the run answered from Slack is %s", v.Status)
	}

	ctx := chrome(t)
	do(t, ctx, "a phone's viewport", chromedp.EmulateViewport(390, 844, chromedp.EmulatePortrait, chromedp.EmulateMobile))
	do(t, ctx, "signing in", chromedp.Navigate(env.url+"/ui/approvals"), chromedp.WaitVisible(chromedp.CSS("input[name=token]")),
		chromedp.SendKeys(chromedp.CSS("input[name=token]"), "carol-tok"), chromedp.Submit(chromedp.CSS("input[name=token]")),
		chromedp.WaitVisible(chromedp.CSS("#approvals")))
	fits(t, ctx, "the approvals", env.url+"/ui/approvals")
	if n := eval[int](t, ctx, `document.querySelectorAll('#approvals tr[data-run]').length`); n != 1 {
		t.Errorf("the approvals page asks %d questions, want the one not answered from Slack", n)
	}
	approve := fmt.Sprintf(`#approvals tr[data-run="%s"] button.approve`, byConsole)
	do(t, ctx, "approving", chromedp.ScrollIntoView(chromedp.CSS(approve)), chromedp.Click(chromedp.CSS(approve)), chromedp.WaitVisible(chromedp.CSS("#flash")))
	if f := eval[string](t, ctx, `document.getElementById('flash').textContent`); f != "answered: approve" {
		t.Errorf("the banner says %q", f)
	}
	if v := waitRunEnd(t, env, byConsole); v.Status != "succeeded" {
		t.Errorf("the run answered from the console is %s", v.Status)
	}

	for id, who := range map[string]string{bySlack: "approved by alice (Slack)", byConsole: "approved by carol (console)"} {
		do(t, ctx, "opening run "+id, chromedp.Navigate(env.url+"/ui/runs/"+id), chromedp.WaitVisible(chromedp.CSS("ol.timeline")))
		if events := eval[string](t, ctx, `document.querySelector('ol.timeline').innerText`); !strings.Contains(events, who) {
			t.Errorf("run %s's events do not say %q:\n%s", id, who, events)
		}
	}
}
