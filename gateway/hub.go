package gateway

import (
	"sync"

	"github.com/chaingate/gateway/chain/store"
)

// Hub wakes whoever watches a run when one of its events is durable: the
// API's event streams, which then read the events from the store. Only
// the wake-up matters, so the engine never waits on a slow client.
type Hub struct {
	mu       sync.Mutex
	watchers map[string]map[*Watch]struct{}
}

// Watch is one subscription to a run's events. C holds at most one
// wake-up, standing for every event published since it was last read.
type Watch struct {
	C     <-chan struct{}
	c     chan struct{}
	hub   *Hub
	runID string
}

// NewHub returns an empty hub.
func NewHub() *Hub { return &Hub{watchers: map[string]map[*Watch]struct{}{}} }

// Publish wakes the run's watchers without blocking.
func (h *Hub) Publish(ev store.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.watchers[ev.RunID] {
		select {
		case w.c <- struct{}{}:
		default: // already woken
		}
	}
}

// Watch subscribes to a run's events; Close ends the subscription.
func (h *Hub) Watch(runID string) *Watch {
	c := make(chan struct{}, 1)
	w := &Watch{C: c, c: c, hub: h, runID: runID}
	h.mu.Lock()
	if h.watchers[runID] == nil {
		h.watchers[runID] = map[*Watch]struct{}{}
	}
	h.watchers[runID][w] = struct{}{}
	h.mu.Unlock()
	return w
}

// Close ends the subscription.
func (w *Watch) Close() {
	h := w.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.watchers[w.runID], w)
	if len(h.watchers[w.runID]) == 0 {
		delete(h.watchers, w.runID)
	}
}
