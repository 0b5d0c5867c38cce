package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/internal/jsonx"
	"github.com/chaingate/gateway/templates"
)

// A chain's concurrency key: a run renders it when it starts, and takes a
// slot of it in the store (store.Slots) before its first step. The slot
// is the run's, not this gateway's: a gateway taking the run over holds it
// on, and it is given back when the run ends, here in launch, or found
// free by the next acquire once the run is no longer unfinished (a crash
// between the run's end and the release). A run that finds every slot
// held waits, with status queued, in the key's FIFO queue in the store;
// it asks again every QueuePoll, and at once when a run of this gateway
// gives a slot of its key back.

// QueuePoll is how often a queued run asks for its slot again, so that a
// slot another gateway gave back is seen.
const QueuePoll = time.Second

// queuePollKey is the timer of a queued run's next ask; no step has it.
const queuePollKey = "\x00queue"

// ErrConcurrencyKey marks a run refused because its concurrency key could
// not be rendered, or its store keeps no slots.
var ErrConcurrencyKey = errors.New("concurrency key unusable")

// runSlot is a run's chain-level concurrency key.
type runSlot struct {
	conc *chain.Concurrency
	key  string
	// nextAsk is when a queued run asks for its slot again; zero: now.
	nextAsk time.Time
	// cancelled says the holders were asked to end (on_busy = "cancel").
	cancelled bool
}

// RenderConcurrencyKey renders a concurrency key to the string it is: a
// string, or a number or boolean written out; anything else, or an empty
// string, is an error.
func RenderConcurrencyKey(tpl *templates.Template, sc templates.Scope) (string, error) {
	v, err := tpl.Render(sc)
	if err != nil {
		return "", fmt.Errorf("rendering the concurrency key: %w", err)
	}
	var key string
	switch x := v.(type) {
	case string:
		key = x
	case int64:
		key = strconv.FormatInt(x, 10)
	case float64:
		key = strconv.FormatFloat(x, 'g', -1, 64)
	case bool:
		key = strconv.FormatBool(x)
	case nil:
		return "", errors.New("the concurrency key rendered to null: the value it reads is missing")
	default:
		return "", fmt.Errorf("the concurrency key rendered to %T, not a string", v)
	}
	if strings.TrimSpace(key) == "" {
		return "", errors.New("the concurrency key rendered to an empty string")
	}
	return key, nil
}

// chainSlot renders the run's chain-level key; nil when its chain has none.
func (r *runner) chainSlot() (*runSlot, error) {
	c := r.def.Concurrency
	if c == nil || c.Key == nil {
		return nil, nil
	}
	if r.e.slots == nil {
		return nil, fmt.Errorf("%w: chain %q has a concurrency key, and this store keeps no slots", ErrConcurrencyKey, r.def.Name)
	}
	key, err := RenderConcurrencyKey(c.Key, r.scopeOf(r.top))
	if err != nil {
		return nil, fmt.Errorf("%w: chain %q: %w", ErrConcurrencyKey, r.def.Name, err)
	}
	return &runSlot{conc: c, key: key}, nil
}

// enterQueue readies a new run of a chain with a concurrency key: it is
// created queued, without a step to go on from, until its slot is taken.
func (r *runner) enterQueue() error {
	s, err := r.chainSlot()
	if err != nil || s == nil {
		return err
	}
	r.slot = s
	r.run.Status = store.RunQueued
	r.run.Cursor, r.top.cursor = "", ""
	r.run.Queue = &store.QueuePlace{Key: s.key, Since: r.run.CreatedAt, WaitingFor: []string{}}
	return nil
}

// resumeSlot finds the key again of a run taken up from the store: a
// queued one asks for its slot again at once, keeping its place; one
// that holds its slot holds it on (asking again keeps it), and gives it
// back when it ends. A running run that does not hold it — a replay of a
// run that had ended, or a store restored without its slots — waits for
// it as a new run would, from the step it is at.
func (r *runner) resumeSlot(ctx context.Context) {
	s, err := r.chainSlot()
	if err != nil {
		r.log.Error("the run's concurrency key cannot be rendered again; it goes on without one", "err", err)
		return
	}
	r.slot = s
	if s == nil || r.run.Status != store.RunRunning {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	g, err := r.e.slots.AcquireSlot(ctx, store.SlotRequest{Key: s.key, Holder: r.run.ID, Limit: s.conc.Limit, Queue: true, QueueLimit: s.conc.QueueLimit})
	if err != nil {
		r.log.Warn("asking again for the concurrency slot of a run taken up; it goes on as holding it", "key", s.key, "err", err)
		return
	}
	if !g.Granted {
		r.run.Status = store.RunQueued
		r.run.Queue = &store.QueuePlace{Key: s.key, Since: r.e.clock.Now().UTC(), WaitingFor: []string{}}
		r.queueDirty = true
	}
}

// askSlot asks the store for the run's slot and applies the answer; it
// reports whether the run holds its slot. A store that does not answer
// leaves the run queued, to ask again.
func (r *runner) askSlot(ctx context.Context, now time.Time) bool {
	s := r.slot
	c := s.conc
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	g, err := r.e.slots.AcquireSlot(ctx, store.SlotRequest{
		Key: s.key, Holder: r.run.ID, Limit: c.Limit, Queue: c.OnBusy != chain.OnBusySkip, QueueLimit: c.QueueLimit,
	})
	if err != nil {
		r.log.Warn("asking for the run's concurrency slot; asking again", "key", s.key, "err", err, "in", QueuePoll)
		return false
	}
	holders := strings.Join(g.Holders, ", ")
	switch {
	case g.Granted:
		wasQueued := r.run.Queue != nil && r.run.Queue.Position > 0
		since := r.run.CreatedAt
		if r.run.Queue != nil {
			since = r.run.Queue.Since
		}
		r.run.Status = store.RunRunning
		r.run.Queue = nil
		if r.run.Cursor == "" {
			// A new run; a replayed one goes on from the step it is at.
			r.run.Cursor = r.def.Steps[0].Name
			r.top.cursor = r.run.Cursor
		}
		r.queueDirty = true
		if wasQueued {
			r.event(store.EventRunDequeued, "", 0, fmt.Sprintf("took its slot of concurrency key %q after %s in its queue", s.key, now.Sub(since).Round(time.Millisecond)))
		}
		return true
	case g.Full:
		r.finishSkipped(fmt.Sprintf("skipped: concurrency key %q is held by run %s and %d runs wait for it already (queue_limit)", s.key, holders, c.QueueLimit), "queue_full")
	case c.OnBusy == chain.OnBusySkip:
		r.finishSkipped(fmt.Sprintf("skipped: concurrency key %q is held by run %s (on_busy = \"skip\")", s.key, holders), "concurrency_busy")
	default:
		if r.run.Queue == nil {
			r.run.Queue = &store.QueuePlace{Key: s.key, Since: now.UTC()}
		}
		q := r.run.Queue
		first := q.Position == 0
		if q.Position != g.Position || !slices.Equal(q.WaitingFor, g.Holders) {
			q.Position, q.WaitingFor = g.Position, slices.Clone(g.Holders)
			r.queueDirty = true
		}
		if first {
			r.queuedEvent(fmt.Sprintf("queued for concurrency key %q, place %d, behind run %s", s.key, g.Position, holders))
		}
		if c.OnBusy == chain.OnBusyCancel && !s.cancelled {
			s.cancelled = true
			r.cancelHolders(g.Holders)
		}
	}
	return false
}

// queuedEvent records the run entering its queue, its place as data.
func (r *runner) queuedEvent(msg string) {
	r.event(store.EventRunQueued, "", 0, msg)
	if data, err := jsonx.Marshal(r.run.Queue); err == nil {
		r.events[len(r.events)-1].Data = json.RawMessage(data)
	}
}

// finishSkipped ends a run that did not take its slot.
func (r *runner) finishSkipped(msg, code string) {
	r.finishRun(store.RunSkipped, &store.ErrorInfo{Message: msg, Code: code})
}

// cancelHolders asks the runs holding the key to end, wherever they run
// (Cancel records the request for the gateway advancing one); the slot
// comes to this run when they have.
func (r *runner) cancelHolders(holders []string) {
	for _, h := range holders {
		id := store.SlotRun(h)
		if id == r.run.ID {
			continue
		}
		r.e.act.Begin()
		go func() {
			defer r.e.act.End()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			ctx = WithActor(ctx, fmt.Sprintf("run %s, which wants concurrency key %q (on_busy = \"cancel\")", r.run.ID, r.slot.key))
			if err := r.e.Cancel(ctx, id); err != nil && !errors.Is(err, ErrFinished) {
				r.log.Warn("cancelling a run that holds the run's concurrency key", "holder", id, "key", r.slot.key, "err", err)
			}
		}()
	}
}

// advanceQueued moves a queued run along: it asks for its slot when it is
// time to, ends the run when its queue_timeout_seconds or its chain's
// timeout has passed, and reports whether the run holds its slot now and
// goes on to its steps.
func (r *runner) advanceQueued(now time.Time) bool {
	if r.run.Status.Final() {
		return false
	}
	s := r.slot
	if !r.run.Deadline.IsZero() && !now.Before(r.run.Deadline) {
		r.finishRun(store.RunTimedOut, &store.ErrorInfo{
			Message: fmt.Sprintf("chain %q timed out after %ds waiting for concurrency key %q", r.def.Name, r.def.TimeoutSeconds, s.key), Code: "timeout",
		})
		return false
	}
	if q := r.run.Queue; q != nil && s.conc.QueueTimeoutSeconds > 0 {
		if limit := time.Duration(s.conc.QueueTimeoutSeconds) * time.Second; now.Sub(q.Since) >= limit {
			r.finishQueueTimeout(limit, q)
			return false
		}
	}
	if now.Before(s.nextAsk) {
		return false
	}
	if r.askSlot(context.Background(), now) {
		return true
	}
	if !r.run.Status.Final() {
		s.nextAsk = now.Add(QueuePoll)
		r.addTimer(s.nextAsk, queuePollKey)
		if q := r.run.Queue; q != nil && s.conc.QueueTimeoutSeconds > 0 {
			r.addTimer(q.Since.Add(time.Duration(s.conc.QueueTimeoutSeconds)*time.Second), queuePollKey)
		}
	}
	return false
}

// finishQueueTimeout ends a run that waited its queue_timeout_seconds:
// failed, code "queue_timeout", naming the key and what held it.
func (r *runner) finishQueueTimeout(limit time.Duration, q *store.QueuePlace) {
	held := "runs that held it"
	if len(q.WaitingFor) > 0 {
		held = "run " + strings.Join(q.WaitingFor, ", ")
	}
	msg := fmt.Sprintf("waited %s (queue_timeout_seconds) for concurrency key %q, held by %s, at place %d of its queue", limit, q.Key, held, q.Position)
	r.finishRun(store.RunFailed, &store.ErrorInfo{Message: msg, Code: "queue_timeout"})
}

// releaseRunSlot gives back the slot, or the place in the queue, of a run
// that has ended, and wakes this gateway's runs queued for its key.
func (e *Engine) releaseRunSlot(r *runner) {
	if !r.run.Status.Final() {
		return
	}
	r.releaseStepSlots()
	s := r.slot
	if s == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.slots.ReleaseSlot(ctx, s.key, r.run.ID); err != nil {
		// The next acquire of the key finds the run ended and frees it.
		r.log.Warn("giving back the run's concurrency slot; the next run to ask for it frees it", "key", s.key, "err", err)
	}
	e.wakeQueued(s.key, r)
}

// wakeQueued has this gateway's runs queued for key ask for it at once.
func (e *Engine) wakeQueued(key string, except *runner) {
	e.mu.Lock()
	var rs []*runner
	for _, q := range e.runners {
		if q != except && q.slot != nil && q.slot.key == key {
			rs = append(rs, q)
		}
	}
	e.mu.Unlock()
	for _, q := range rs {
		q.e.act.Begin()
		go func() {
			if !q.tryGive(outcome{do: func(r *runner) { r.slot.nextAsk = time.Time{} }}) {
				q.e.act.End()
			}
		}()
	}
}

// Slots lists the concurrency keys held or queued for, when the store
// keeps them (nil otherwise).
func (e *Engine) Slots(ctx context.Context) ([]store.SlotState, error) {
	if e.slots == nil {
		return nil, nil
	}
	return e.slots.ListSlots(ctx)
}
