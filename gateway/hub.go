package gateway

import (
	"sync"

	"github.com/chaingate/gateway/chain/store"
)

// Hub hands every durable run event to whoever watches the run: the API's
// event streams. A watcher that falls behind is told so and catches up from
// the store, so the engine never waits on a slow client.
type Hub struct {
	mu       sync.Mutex
	watchers map[string]map[*Watch]struct{}
}

// Watch is one subscription to a run's events.
type Watch struct {
	C <-chan store.Event
	c chan store.Event
	// Lagged is closed when an event could not be delivered; the watcher
	// must read what it missed from the store.
	Lagged chan struct{}
	once   sync.Once
	hub    *Hub
	runID  string
}

// NewHub returns an empty hub.
func NewHub() *Hub { return &Hub{watchers: map[string]map[*Watch]struct{}{}} }

// Publish delivers ev to the run's watchers without blocking.
func (h *Hub) Publish(ev store.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.watchers[ev.RunID] {
		select {
		case w.c <- ev:
		default:
			w.once.Do(func() { close(w.Lagged) })
		}
	}
}

// Watch subscribes to a run's events; Close ends the subscription.
func (h *Hub) Watch(runID string) *Watch {
	c := make(chan store.Event, 256)
	w := &Watch{C: c, c: c, Lagged: make(chan struct{}), hub: h, runID: runID}
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
