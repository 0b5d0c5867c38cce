package events

import (
	"context"
	"fmt"
	"net/http"
	"time"
)

// SSE is a response of Server-Sent Events. hold, called before each write,
// keeps the connection open past the server's write timeout.
type SSE struct {
	w     http.ResponseWriter
	flush func()
	hold  func()
}

// OpenSSE answers 200 with the headers of an event stream, sent at once.
func OpenSSE(w http.ResponseWriter, hold func()) *SSE {
	s := &SSE{w: w, flush: func() {}, hold: hold}
	if f, ok := w.(http.Flusher); ok {
		s.flush = f.Flush
	}
	hold()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	s.flush()
	return s
}

// Write writes without sending: what is written together goes out at the
// next Flush, under one hold.
func (s *SSE) Write(format string, args ...any) error {
	_, err := fmt.Fprintf(s.w, format, args...)
	return err
}

// Hold keeps the connection open for the writes that follow.
func (s *SSE) Hold() { s.hold() }

// Flush sends what was written.
func (s *SSE) Flush() { s.flush() }

// Send writes and sends at once; false when the client is gone.
func (s *SSE) Send(format string, args ...any) bool {
	s.hold()
	if s.Write(format, args...) != nil {
		return false
	}
	s.flush()
	return true
}

// StreamRunChanges sends every run's status changes until ctx ends or the
// client goes: runs starting, resuming, replayed, ending, on this gateway
// and, through the store's feed, on the others sharing its store. A client
// that falls behind gets a "resync" event and reads the runs again; a
// comment every heartbeat keeps proxies from closing a quiet stream.
func (h *Hub) StreamRunChanges(ctx context.Context, s *SSE, heartbeat time.Duration) {
	watch := h.WatchRuns()
	defer watch.Close()
	beat := time.NewTicker(heartbeat)
	defer beat.Stop()
	if !s.Send(": following every run's status\n\n") {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-beat.C:
			if !s.Send(": heartbeat\n\n") {
				return
			}
		case ev := <-watch.C:
			if watch.Lost() && !s.Send("event: resync\ndata: {}\n\n") {
				return
			}
			if ev.RunID == "" {
				continue
			}
			if !s.Send("event: %s\ndata: %s\n\n", ev.Type, h.EventJSON(ev)) {
				return
			}
		}
	}
}
