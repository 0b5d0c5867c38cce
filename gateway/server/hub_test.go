package server_test

import (
	"testing"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway/events"
)

// TestHubWakes checks that a watcher is woken once however many events it
// misses (it reads them from the store), and only for its own run.
func TestHubWakes(t *testing.T) {
	t.Parallel()
	h := events.NewHub()
	w, other := h.Watch("r1"), h.Watch("r2")
	defer other.Close()
	for i := range 1000 {
		h.Publish(store.Event{RunID: "r1", Seq: uint64(i + 1)})
	}
	if len(w.C) != 1 || len(other.C) != 0 {
		t.Fatalf("after 1000 events of r1: %d wake-ups for r1, %d for r2", len(w.C), len(other.C))
	}
	<-w.C
	w.Close()
	h.Publish(store.Event{RunID: "r1", Seq: 1001})
	if len(w.C) != 0 {
		t.Error("a closed watch was woken")
	}
}
