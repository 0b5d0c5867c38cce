package server_test

import (
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/gateway/api"
	"github.com/chromedp/chromedp"
)

// failureRunbook is issue 40's runbook: verify fails, its catch routes
// the failure to page, on_failure tells, finally unlocks.
const failureRunbook = `
[[chains]]
name = "failing-runbook"
[[chains.steps]]
name = "verify"
provider = "faulty"
payload_template = { fail = "disk still full" }
catch = [{ errors = ["permanent"], target = "page" }]
[[chains.steps]]
name = "post"
provider = "echo"
default_next = "end"
[[chains.steps]]
name = "page"
provider = "echo"
payload_template = { summary = "<<failure.step>>: <<failure.message>>" }
[[chains.on_failure]]
name = "tell"
provider = "echo"
payload_template = { text = "<<failure.class>>" }
[[chains.finally]]
name = "unlock"
provider = "echo"

[[chains]]
name = "failing-handler"
[[chains.steps]]
name = "work"
provider = "faulty"
payload_template = { fail = "broken" }
[[chains.on_failure]]
name = "notify"
provider = "faulty"
payload_template = { fail = "slack is down" }
`

// TestBrowserFailureRoutes runs a runbook whose verify step fails and is
// routed to page: the run ends failed, counted so in the metrics and
// listed among the Now page's failures, and its page says what failed and
// what handled it, with the catch route drawn dashed and the handler lists
// drawn under the chain's steps.
func TestBrowserFailureRoutes(t *testing.T) {
	t.Parallel()
	env := newConsoleAPI(t, "")
	env.write(strings.Replace(mustRead(t, env.cfg), apiConfig, apiConfig+failureRunbook, 1))
	if _, err := env.srv.Reload(); err != nil {
		t.Fatal(err)
	}
	id := startRun(t, env, "failing-runbook", `{}`)
	waitRun(t, env, id)
	wants := []string{
		`chaingate_runs_finished_total{chain="failing-runbook",status="failed"} 1`,
		`chaingate_failure_routes_total{chain="failing-runbook",class="permanent",step="verify",target="page"} 1`,
		`chaingate_failure_handlers_total{chain="failing-runbook",ending="failed",phase="on_failure"} 1`,
		`chaingate_failure_handlers_total{chain="failing-runbook",ending="failed",phase="finally"} 1`,
	}
	// The metrics hear of the run's end from its events, which are handed
	// on once the end is durable: the API may show the end a moment first.
	var missing []string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		_, _, metrics := env.call("GET", "/metrics", "", nil, nil)
		missing = missing[:0]
		for _, want := range wants {
			if !strings.Contains(metrics, want) {
				missing = append(missing, want)
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, m := range missing {
		t.Errorf("the metrics lack %s", m)
	}
	ctx := chrome(t)
	do(t, ctx, "opening the run", chromedp.Navigate(env.url+"/ui/runs/"+id), chromedp.WaitVisible(chromedp.CSS("svg.graph")))
	if got := eval[string](t, ctx, `document.querySelector('.run-meta').dataset.status`); got != "failed" {
		t.Errorf("run page status %q, want failed", got)
	}
	info := eval[string](t, ctx, `(document.querySelector('.failure-info') || {}).textContent || ''`)
	for _, want := range []string{"failed at verify", "permanent", "routed to page", "on_failure:tell", "finally:unlock"} {
		if !strings.Contains(info, want) {
			t.Errorf("the run page's failure line %q does not say %q", info, want)
		}
	}
	if n := eval[int](t, ctx, `document.querySelectorAll('svg.graph path.edge.failure').length`); n != 1 {
		t.Errorf("%d failure edges drawn, want 1", n)
	}
	if dash := eval[string](t, ctx, `getComputedStyle(document.querySelector('svg.graph path.edge.failure')).strokeDasharray`); dash == "" || dash == "none" {
		t.Errorf("the failure edge is drawn solid (stroke-dasharray %q)", dash)
	}
	titles := eval[[]string](t, ctx, `Array.from(document.querySelectorAll('.handler-title')).map(p => p.dataset.phase)`)
	if strings.Join(titles, ",") != "on_failure,finally" {
		t.Errorf("handler lists drawn: %v", titles)
	}
	do(t, ctx, "opening the Now page", chromedp.Navigate(env.url+"/ui/"), chromedp.WaitVisible(chromedp.CSS("body")))
	if !eval[bool](t, ctx, `Array.from(document.querySelectorAll('#failures tr')).some(r => r.textContent.includes('failing-runbook') && r.textContent.includes('verify'))`) {
		t.Errorf("the Now page's failures do not list the run's failure")
	}

	// A handler's failure is parked, and its entry says it came from one.
	id = startRun(t, env, "failing-handler", `{}`)
	waitRun(t, env, id)
	var dlq struct {
		Entries []*api.DLQEntry `json:"entries"`
	}
	env.call("GET", "/v1/dlq?chain=failing-handler", "", nil, &dlq)
	if len(dlq.Entries) != 1 || dlq.Entries[0].Step != "notify" || dlq.Entries[0].Handler != "on_failure" {
		t.Fatalf("dead-letter entries %+v", dlq.Entries)
	}
	do(t, ctx, "opening the entry", chromedp.Navigate(env.url+"/ui/dlq/"+dlq.Entries[0].ID), chromedp.WaitVisible(chromedp.CSS("h1")))
	if text := eval[string](t, ctx, `document.body.textContent`); !strings.Contains(text, "a step of the chain's on_failure handlers") {
		t.Errorf("the entry's page does not say it came from a handler")
	}
}
