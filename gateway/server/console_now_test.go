package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/html"

	"github.com/chaingate/gateway/chain/store"
)

// TestNowGroupsParkedDeliveries: deliveries a trigger parked for the same
// reason are one kind of failure on the Now page however their messages'
// times and counts differ, and a delivery parked for another reason is a
// kind of its own.
func TestNowGroupsParkedDeliveries(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	messages := []string{
		// The trigger paused, unpaused and paused again.
		`trigger "am" is paused (by alice at 2026-11-28T07:27:47Z: maintenance): the delivery is kept here; resume the trigger and replay it`,
		`trigger "am" is paused (by alice at 2026-11-28T07:31:05Z: maintenance): the delivery is kept here; resume the trigger and replay it`,
		`trigger "am" is paused (by alice at 2026-11-28T07:31:05Z: maintenance): the delivery is kept here; resume the trigger and replay it`,
		`the delivery holds 12 alerts, and trigger "am" turns at most max_alerts = 10 of one delivery into runs`,
	}
	for _, msg := range messages {
		err := env.gw.Store.AddDLQ(context.Background(), &store.DLQEntry{
			ID: store.NewID(), Kind: store.DLQDelivery, Chain: "hello", Trigger: "am",
			Error: store.ErrorInfo{Message: msg, Code: "trigger_paused"}, Payload: []byte(`{}`), CreatedAt: time.Now().UTC(),
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	code, doc, page := newBrowser(t, env).get("/ui/")
	if code != http.StatusOK {
		t.Fatalf("the Now page: %d", code)
	}
	table := find(doc, func(n *html.Node) bool { return attr(n, "id") == "failures" })
	if table == nil {
		t.Fatalf("the Now page shows no failures:\n%s", page)
	}
	var counts []string
	for _, row := range findAll(table, func(n *html.Node) bool { return n.Data == "tr" }) {
		cells := findAll(row, func(n *html.Node) bool { return n.Data == "td" })
		if len(cells) == 4 {
			counts = append(counts, strings.TrimSpace(textOf(cells[3])))
		}
	}
	if strings.Join(counts, ",") != "3,1" {
		t.Errorf("kinds of failure counted %v, want 3 paused and 1 over max_alerts", counts)
	}
}
