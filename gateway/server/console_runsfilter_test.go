package server_test

import (
	"context"
	"fmt"
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

// TestConsoleRunSearchFindsOldRuns searches runs by the start of their id
// when every run that matches is older than the newest thousand: the
// search finds them all, 50 a page, and "older runs" keeps the search and
// the other filters.
func TestConsoleRunSearchFindsOldRuns(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	commit := func(id, chainName string, at time.Time) {
		run := &store.Run{ID: id, Chain: chainName, ChainHash: "h", Status: store.RunSucceeded, Path: []string{"call"},
			CreatedAt: at, UpdatedAt: at, FinishedAt: at, Origin: store.Origin{ID: "o", ReceivedAt: at}, StartedBy: "api"}
		if err := env.gw.Store.Commit(context.Background(), &store.Batch{Run: run, Create: true}); err != nil {
			t.Fatal(err)
		}
	}
	// 65 old runs of hello whose ids start "old", 10 of breaks, then 1,200
	// newer runs.
	start := time.Now().Add(-time.Hour)
	for i := range 75 {
		chainName := "hello"
		if i%7 == 3 && i < 70 {
			chainName = "breaks"
		}
		commit(fmt.Sprintf("old%03d", i), chainName, start.Add(time.Duration(i)*time.Millisecond))
	}
	for i := range 1200 {
		commit(fmt.Sprintf("new%04d", i), "hello", start.Add(time.Minute+time.Duration(i)*time.Millisecond))
	}
	b := newBrowser(t, env)
	filters := url.Values{"id": {"old"}, "chain": {"hello"}}
	path := "/ui/runs?" + filters.Encode()
	var seen []string
	for page := 1; path != ""; page++ {
		code, doc, body := b.get(path)
		if code != http.StatusOK {
			t.Fatalf("page %d: %d\n%s", page, code, body)
		}
		for _, row := range findAll(doc, func(n *html.Node) bool { return n.Data == "tr" && attr(n, "data-status") != "" }) {
			cells := findAll(row, func(n *html.Node) bool { return n.Data == "td" })
			if id, chainName := textOf(cells[0]), textOf(cells[1]); !strings.HasPrefix(id, "old") || chainName != "hello" {
				t.Errorf("page %d shows run %s of %s", page, id, chainName)
			} else {
				seen = append(seen, id)
			}
		}
		if page == 1 && len(seen) != 50 {
			t.Errorf("the first page shows %d runs, want 50", len(seen))
		}
		path = ""
		if next := find(doc, func(n *html.Node) bool { return attr(n, "id") == "next-page" }); next != nil {
			path = attr(next, "href")
			checkKeeps(t, "older runs", path, filters)
		}
	}
	want := 75 - 10
	if len(seen) != want || seen[0] != "old074" || seen[len(seen)-1] != "old000" {
		t.Errorf("the pages show %d runs (%v), want the %d old runs of hello, newest first", len(seen), seen, want)
	}
	if _, _, body := b.get("/ui/runs?id=nomatch"); !strings.Contains(body, "No run matches") {
		t.Error("a search that matches no run does not say so")
	}
}
