package redis

import (
	"context"
	"encoding/json"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/chaingate/gateway/chain/store"
)

var _ store.RunFeed = (*Store)(nil)

func (s *Store) feedChannel() string { return s.p + "runs:changes" }

// announce publishes the run status changes of a batch just committed.
// Pub/Sub holds nothing for a gateway not listening: a follower that
// reconnects is told it may have missed some (store.RunFeed), so a lost
// announcement costs a reread, never a wrong answer.
func (s *Store) announce(ctx context.Context, b *store.Batch) {
	var p goredis.Pipeliner
	for _, ev := range b.Events {
		if !store.IsRunChange(ev.Type) {
			continue
		}
		ev.RunID = b.Run.ID
		v, err := store.MarshalEvent(&ev)
		if err != nil {
			continue // it was encoded for the commit a moment ago
		}
		if p == nil {
			p = s.client.Pipeline()
		}
		p.Publish(ctx, s.feedChannel(), v)
	}
	if p == nil {
		return
	}
	if _, err := p.Exec(ctx); err != nil {
		s.log.Warn("announcing run status changes to other gateways", "run", b.Run.ID, "err", err)
	}
}

// FollowRuns implements store.RunFeed.
func (s *Store) FollowRuns(ctx context.Context, fn func(ev store.Event, lost bool)) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.follows.Add(1)
	s.mu.Unlock()
	defer s.follows.Done()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ps := s.client.Subscribe(ctx, s.feedChannel())
	// A blocked read ends only with its connection.
	stop := context.AfterFunc(ctx, func() { _ = ps.Close() })
	defer stop()
	go func() {
		select {
		case <-s.stopping:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		msg, err := ps.Receive(ctx)
		if ctx.Err() != nil {
			_ = ps.Close()
			return
		}
		switch m := msg.(type) {
		case *goredis.Subscription:
			fn(store.Event{}, true)
		case *goredis.Message:
			var ev store.Event
			if err := json.Unmarshal([]byte(m.Payload), &ev); err != nil || ev.RunID == "" {
				s.log.Warn("an announced run change cannot be read; ignoring it", "err", err)
				continue
			}
			fn(ev, false)
		default:
			if err != nil {
				s.log.Warn("following other gateways' run changes in Redis; retrying", "err", err)
				select {
				case <-time.After(500 * time.Millisecond):
				case <-ctx.Done():
				}
			}
		}
	}
}
