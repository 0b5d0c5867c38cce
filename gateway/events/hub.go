// Package events wakes the streams that follow runs when their events are
// durable: a run's own events, and every run's status changes.
//
// It is the gateway's own package, with no compatibility promise.
package events

import (
	"context"
	"sync"
	"time"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/internal/jsonx"
)

// Hub wakes whoever watches a run when one of its events is durable: the
// API's and the console's event streams. It keeps a watched run's latest
// events, so that streams following a run this gateway advances take them
// from memory instead of each reading the store; a stream that finds a gap
// reads the store. The engine never waits on a slow client.
type Hub struct {
	mu       sync.Mutex
	watchers map[string]map[*Watch]struct{}
	recent   map[string][]keptEvent
	// runWatchers follow every run's status changes.
	runWatchers map[*RunWatch]struct{}
	// fed is set once the store's feed carries every gateway's status
	// changes to the run watchers, this one's included.
	fed bool
}

// RunWatch follows the status changes of every run: a run starting,
// resuming, being replayed, or ending. C drops what a slow reader has not
// taken, and Lost says so, so that the reader reads again; a zero event
// only wakes the reader to ask.
type RunWatch struct {
	C    <-chan store.Event
	c    chan store.Event
	lost bool
	hub  *Hub
}

// runWatchBuffer is how many status changes a run watch holds unread.
const runWatchBuffer = 256

// keptEvent is an event the hub keeps, with its JSON once a stream has
// encoded it: every stream following the run sends the same bytes.
type keptEvent struct {
	ev   store.Event
	data []byte
}

// recentMax is how many of a watched run's latest events the hub keeps.
const recentMax = 256

// Watch is one subscription to a run's events. C holds at most one
// wake-up, standing for every event published since it was last read.
type Watch struct {
	C     <-chan struct{}
	c     chan struct{}
	hub   *Hub
	runID string
}

// NewHub returns an empty hub.
func NewHub() *Hub {
	return &Hub{watchers: map[string]map[*Watch]struct{}{}, recent: map[string][]keptEvent{}, runWatchers: map[*RunWatch]struct{}{}}
}

// Publish wakes the run's watchers without blocking.
func (h *Hub) Publish(ev store.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ws := h.watchers[ev.RunID]
	if len(ws) > 0 {
		r := h.recent[ev.RunID]
		if n := len(r); n > 0 && r[n-1].ev.Seq+1 != ev.Seq {
			r = r[:0] // a gap: what is kept must run without one
		}
		if len(r) == recentMax {
			r = append(r[:0], r[1:]...)
		}
		h.recent[ev.RunID] = append(r, keptEvent{ev: ev})
	}
	if store.IsRunChange(ev.Type) && !h.fed {
		h.toRunWatchers(ev)
	}
	for w := range ws {
		select {
		case w.c <- struct{}{}:
		default: // already woken
		}
	}
}

// toRunWatchers hands a status change to every run watcher; the caller
// holds mu.
func (h *Hub) toRunWatchers(ev store.Event) {
	for w := range h.runWatchers {
		select {
		case w.c <- ev:
		default:
			w.lost = true
		}
	}
}

// Follow feeds the run watchers from the store's RunFeed, when it has one,
// so that they hear the runs every gateway sharing the store advances, not
// only this one's. It returns once following has begun, or after a few
// seconds if the store is slow to answer, and follows until ctx ends or the
// store closes.
func (h *Hub) Follow(ctx context.Context, st store.Store) {
	feed, ok := st.(store.RunFeed)
	if !ok {
		return
	}
	begun := make(chan struct{})
	go feed.FollowRuns(ctx, func(ev store.Event, lost bool) {
		h.mu.Lock()
		defer h.mu.Unlock()
		if !lost {
			h.toRunWatchers(ev)
			return
		}
		if !h.fed {
			// Until now this gateway's own changes went straight to the
			// watchers, and the feed missed nothing they did not have.
			h.fed = true
			close(begun)
			return
		}
		for w := range h.runWatchers {
			w.lost = true
			select {
			case w.c <- store.Event{}:
			default:
			}
		}
	})
	t := time.NewTimer(followWait)
	defer t.Stop()
	select {
	case <-begun:
	case <-t.C:
	case <-ctx.Done():
	}
}

// followWait is how long Follow waits for the feed to begin.
const followWait = 5 * time.Second

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
		delete(h.recent, w.runID)
	}
}

// WatchRuns follows every run's status changes; Close ends it.
func (h *Hub) WatchRuns() *RunWatch {
	c := make(chan store.Event, runWatchBuffer)
	w := &RunWatch{C: c, c: c, hub: h}
	h.mu.Lock()
	h.runWatchers[w] = struct{}{}
	h.mu.Unlock()
	return w
}

// Lost reports, once, that changes were dropped since it was last asked.
func (w *RunWatch) Lost() bool {
	w.hub.mu.Lock()
	defer w.hub.mu.Unlock()
	lost := w.lost
	w.lost = false
	return lost
}

// Close ends the watch.
func (w *RunWatch) Close() {
	w.hub.mu.Lock()
	delete(w.hub.runWatchers, w)
	w.hub.mu.Unlock()
}

// Since returns the run's events after seq from memory, and whether memory
// has them all: false when the events kept do not reach back to seq+1.
func (h *Hub) Since(runID string, seq uint64) ([]store.Event, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.recent[runID]
	if len(r) == 0 || r[0].ev.Seq > seq+1 {
		return nil, false
	}
	var out []store.Event
	for _, k := range r {
		if k.ev.Seq > seq {
			out = append(out, k.ev)
		}
	}
	return out, true
}

// EventJSON is ev as a stream sends it, encoded once for every stream
// while the hub keeps the event.
func (h *Hub) EventJSON(ev store.Event) []byte {
	h.mu.Lock()
	k := h.kept(ev)
	if k != nil && k.data != nil {
		data := k.data
		h.mu.Unlock()
		return data
	}
	h.mu.Unlock()
	data, _ := jsonx.Marshal(api.EventOf(ev))
	h.mu.Lock()
	if k := h.kept(ev); k != nil {
		k.data = data
	}
	h.mu.Unlock()
	return data
}

// kept finds ev among the events kept; the caller holds mu.
func (h *Hub) kept(ev store.Event) *keptEvent {
	r := h.recent[ev.RunID]
	if len(r) == 0 || ev.Seq < r[0].ev.Seq {
		return nil
	}
	if i := int(ev.Seq - r[0].ev.Seq); i < len(r) && r[i].ev.Seq == ev.Seq {
		return &r[i]
	}
	return nil
}
