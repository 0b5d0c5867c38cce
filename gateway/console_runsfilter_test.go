package gateway_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/html"

	"github.com/chaingate/gateway/chain/store"
)

// TestConsoleRunsByHowStarted filters the runs page by how runs started
// and without a chain, pages through the result with the filters kept, and
// follows a run's page back to the runs of its trigger.
func TestConsoleRunsByHowStarted(t *testing.T) {
	env := newTriggerAPI(t)
	code, res, raw := fire(t, env, "alertmanager", triggerFixture(t, "alertmanager-firing.json"), map[string]string{"Authorization": "Bearer am-secret-token"})
	if code != http.StatusAccepted || res.Results[0].Run == "" {
		t.Fatalf("firing: %d %s", code, raw)
	}
	byTrigger := res.Results[0].Run
	waitRunEnd(t, env, byTrigger)
	// A schedule since removed from the config started 60 runs of page and
	// 5 of resolved: more than a page of the runs list.
	for i := range 65 {
		chainName := "page"
		if i%13 == 0 {
			chainName = "resolved"
		}
		at := time.Now()
		run := &store.Run{ID: store.NewID(), Chain: chainName, ChainHash: "h", Status: store.RunSucceeded, Path: []string{"call"},
			CreatedAt: at, UpdatedAt: at, FinishedAt: at, Origin: store.Origin{ID: "o", ReceivedAt: at}, StartedBy: "schedule:nightly"}
		if err := env.gw.Store.Commit(context.Background(), &store.Batch{Run: run, Create: true}); err != nil {
			t.Fatal(err)
		}
	}
	b := newBrowser(t, env)
	if code, _, body := b.post("/ui/login", url.Values{"token": {"full-tok"}}); code != http.StatusSeeOther {
		t.Fatalf("sign-in: %d %s", code, body)
	}

	// The ids' common start is a filter too: each page keeps it.
	filters := url.Values{"started_by": {"schedule:nightly"}, "hide_chain": {"resolved"}, "id": {byTrigger[:1]}}
	code, doc, body := b.get("/ui/runs?" + filters.Encode())
	if code != http.StatusOK {
		t.Fatalf("the filtered runs: %d\n%s", code, body)
	}
	form := find(doc, func(n *html.Node) bool { return n.Data == "form" && attr(n, "class") == "filters" })
	selected := find(form, func(n *html.Node) bool {
		return n.Data == "option" && hasAttr(n, "selected") && textOf(n) == "schedule:nightly"
	})
	if selected == nil {
		t.Error("the started-by choice does not show the schedule no longer configured as chosen")
	}
	for _, name := range []string{"trigger", "api", "sub_chain", "trigger:alertmanager", "trigger:grafana"} {
		if find(form, func(n *html.Node) bool { return n.Data == "option" && textOf(n) == name }) == nil {
			t.Errorf("started by offers no %s", name)
		}
	}
	boxes := findAll(form, func(n *html.Node) bool { return n.Data == "input" && attr(n, "name") == "hide_chain" })
	var checked []string
	for _, box := range boxes {
		if hasAttr(box, "checked") {
			checked = append(checked, attr(box, "value"))
		}
	}
	if len(boxes) != len(env.gw.Config.ChainNames) || strings.Join(checked, ",") != "resolved" {
		t.Errorf("hide chains: %d choices, %v checked; want every chain, resolved checked", len(boxes), checked)
	}

	var seen int
	for page := 1; ; page++ {
		rows := findAll(doc, func(n *html.Node) bool { return n.Data == "tr" && attr(n, "data-status") != "" })
		for _, row := range rows {
			cells := findAll(row, func(n *html.Node) bool { return n.Data == "td" })
			if chainName, by := textOf(cells[1]), textOf(cells[4]); chainName != "page" || by != "schedule:nightly" {
				t.Errorf("page %d shows a run of %s started by %s", page, chainName, by)
			}
		}
		seen += len(rows)
		live := find(doc, func(n *html.Node) bool { return attr(n, "id") == "runs" })
		if page == 1 {
			checkKeeps(t, "the live list", attr(live, "data-live"), filters)
		}
		next := find(doc, func(n *html.Node) bool { return attr(n, "id") == "next-page" })
		if next == nil {
			break
		}
		href := attr(next, "href")
		checkKeeps(t, "older runs", href, filters)
		if code, doc, body = b.get(href); code != http.StatusOK {
			t.Fatalf("older runs: %d\n%s", code, body)
		}
	}
	if seen != 60 {
		t.Errorf("the pages show %d runs, want the schedule's 60 runs of page", seen)
	}

	// The run page names the trigger, linked to its runs.
	_, doc, _ = b.get("/ui/runs/" + byTrigger)
	link := find(doc, func(n *html.Node) bool { return attr(n, "id") == "started-by" })
	if link == nil || textOf(link) != "alertmanager" {
		t.Fatal("the run page does not name the trigger the run started by")
	}
	_, doc, _ = b.get(attr(link, "href"))
	rows := findAll(doc, func(n *html.Node) bool { return n.Data == "tr" && attr(n, "data-status") != "" })
	if len(rows) != 1 || !strings.Contains(textOf(rows[0]), byTrigger) {
		t.Errorf("the trigger's runs, from %s: %d rows", attr(link, "href"), len(rows))
	}

	if code, _, body := b.get("/ui/runs?started_by=door"); code != http.StatusBadRequest || !strings.Contains(body, "is not one of trigger, schedule") {
		t.Errorf("an unknown started-by: %d\n%s", code, body)
	}
}

// checkKeeps fails unless the link's query holds every filter.
func checkKeeps(t *testing.T, what, link string, filters url.Values) {
	t.Helper()
	u, err := url.Parse(link)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	got := u.Query()
	for k, want := range filters {
		if strings.Join(got[k], ",") != strings.Join(want, ",") {
			t.Errorf("%s (%s) has %s=%v, want %v", what, link, k, got[k], want)
		}
	}
}

func hasAttr(n *html.Node, key string) bool {
	for _, a := range n.Attr {
		if a.Key == key {
			return true
		}
	}
	return false
}
