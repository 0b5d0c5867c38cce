package server_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/gateway/api"
	"golang.org/x/net/html"
)

const queueConfig = `
[[chains]]
name = "fix-host"
concurrency = { key = "<<origin.payload.host>>" }
[[chains.steps]]
name = "ask"
approval = {}
`

// TestQueuedRunShown starts two runs of one host: the second waits, and
// the API, the console's run page and the metrics say where and for what.
func TestQueuedRunShown(t *testing.T) {
	t.Parallel()
	env := newAPI(t, queueConfig)
	start := func() api.StartResponse {
		var res api.StartResponse
		code, _, body := env.call("POST", "/v1/chains/fix-host/runs", `{"host": "db-1"}`, nil, &res)
		if code != http.StatusAccepted {
			t.Fatalf("starting a run: %d %s", code, body)
		}
		return res
	}
	holder, queued := start(), start()
	if holder.Status != "running" || queued.Status != "queued" {
		t.Fatalf("the answers say %q and %q, want running and queued", holder.Status, queued.Status)
	}
	var run api.RunView
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		env.call("GET", "/v1/runs/"+queued.ID, "", nil, &run)
		if run.Queue != nil && run.Queue.Position == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the queued run's record never said its place: %+v", run.Queue)
		}
	}
	if run.Status != "queued" || run.Queue.Key != "db-1" || !slices.Equal(run.Queue.WaitingFor, []string{holder.ID}) {
		t.Errorf("the queued run: %s %+v", run.Status, run.Queue)
	}

	b := newBrowser(t, env)
	_, doc, _ := b.get("/ui/runs/" + queued.ID)
	place := find(doc, func(n *html.Node) bool { return attr(n, "id") == "run-queue" })
	if place == nil {
		t.Fatal("the run page does not say where the run waits")
	}
	if text := textOf(place); !strings.Contains(text, "db-1") || !strings.Contains(text, holder.ID) {
		t.Errorf("the run page says %q", text)
	}
	if find(place, func(n *html.Node) bool {
		return n.Data == "a" && strings.HasSuffix(attr(n, "href"), "/runs/"+holder.ID)
	}) == nil {
		t.Error("the run page does not link to the run holding the key")
	}

	_, _, metrics := env.call("GET", "/metrics", "", nil, nil)
	if !strings.Contains(metrics, `chaingate_runs_queued{key="db-1"} 1`) {
		t.Errorf("the metrics do not count the queued run:\n%s", grepLines(metrics, "chaingate_runs_queued"))
	}
	var page api.RunPage
	env.call("GET", "/v1/runs?status=queued", "", nil, &page)
	if len(page.Runs) != 1 || page.Runs[0].ID != queued.ID {
		t.Errorf("listing queued runs: %+v", page.Runs)
	}
}
