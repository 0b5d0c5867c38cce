package fanout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/fanout/broker"
	"github.com/chaingate/gateway/chain/store"
)

// importChunk bounds the results taken in at once, so a split of a million
// items is read back without holding it.
const importChunk = 2000

// lookAgain is how long an owner waits for a notice before it reads the
// barrier anyway: notices are the way news travels; this only covers one
// lost while Redis was out of reach.
const lookAgain = 15 * time.Second

// Threshold implements engine.Fanout.
func (f *Fanout) Threshold() int { return f.cfg.Threshold }

// Attach implements engine.Fanout.
func (f *Fanout) Attach(job *engine.FanoutJob, news func(*engine.FanoutNews)) engine.FanoutHandle {
	r := ref{Run: job.Work.Run.ID, Split: job.Work.Key, Gen: job.Gen}
	ctx, cancel := context.WithCancel(context.Background())
	o := &owned{
		f: f, b: newBarrier(f.rdb, f.cfg.Prefix, r), job: job, news: news,
		log:  f.log.With("run", r.Run, "split", r.Split, "gen", r.Gen),
		wake: make(chan struct{}, 1), room: make(chan struct{}, 1), acked: make(chan struct{}, 1),
		ctx: ctx, cancel: cancel,
	}
	o.imported.Store(int64(job.Imported))
	o.unsub = f.notices.subscribe(r.String(), func(string) { o.poke() })
	o.wg.Add(1)
	go o.run()
	return o
}

// owned is one hand-off followed by the gateway that owns its run.
type owned struct {
	f    *Fanout
	b    *barrier
	job  *engine.FanoutJob
	news func(*engine.FanoutNews)
	log  *slog.Logger

	wake  chan struct{} // a notice came
	room  chan struct{} // results came, so more may go out
	acked chan struct{} // the run made news durable
	// imported is how far the run holds the log durably.
	imported atomic.Int64
	// cursor is the publish cursor: every item below it is out or done.
	cursor atomic.Int64
	done   atomic.Int64
	// inFlight is what this owner added to the in-flight gauge.
	inFlight int

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	unsub  func()
	once   sync.Once
}

var _ engine.FanoutHandle = (*owned)(nil)

func (o *owned) poke() {
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// Imported implements engine.FanoutHandle.
func (o *owned) Imported(n int) {
	o.imported.Store(int64(n))
	select {
	case o.acked <- struct{}{}:
	default:
	}
}

// Detach implements engine.FanoutHandle.
func (o *owned) Detach() {
	o.stop()
	go o.wait()
}

// stop ends the owner's goroutines without waiting for them: the run calls
// it from its own goroutine, to which they may be reporting.
func (o *owned) stop() {
	o.once.Do(func() {
		o.unsub()
		o.cancel()
	})
}

func (o *owned) wait() {
	o.wg.Wait()
	o.f.metrics.ItemsInFlight(-o.inFlight)
}

// End implements engine.FanoutHandle: workers are told to drop what is
// left, then the hand-off's keys go. Messages still queued find it gone.
func (o *owned) End(status store.StepStatus) {
	o.stop()
	go func() {
		o.wait()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if status != store.StepSucceeded {
			state := stateCancelled
			switch status {
			case store.StepTimedOut:
				state = stateTimedOut
			case store.StepFailed:
				state = string(engine.FanoutFailed)
			}
			if err := o.b.end(ctx, state); err != nil {
				o.log.Warn("telling workers a split is over; they find out when its keys are gone", "err", err)
			}
		}
		if err := o.b.remove(ctx); err != nil {
			o.log.Warn("removing a finished split from Redis; its keys expire on their own", "err", err)
		}
	}()
}

// ttl is how long a hand-off's keys outlive its deadline, so that nothing
// is left behind by a run nobody resumes.
func (o *owned) ttl() time.Duration {
	deadline := o.job.Work.Deadline
	if d := o.job.Work.Run.Deadline; !d.IsZero() && (deadline.IsZero() || d.Before(deadline)) {
		deadline = d
	}
	if deadline.IsZero() {
		return 7 * 24 * time.Hour
	}
	return max(time.Until(deadline), 0) + 24*time.Hour
}

// retry runs fn until it succeeds or the owner stops, logging an outage
// once.
func (o *owned) retry(what string, fn func() error) bool {
	delay, warned := 100*time.Millisecond, false
	for {
		err := fn()
		if err == nil {
			if warned {
				o.log.Info(what + ": working again")
			}
			return true
		}
		if o.ctx.Err() != nil {
			return false
		}
		if !warned {
			o.log.Warn(what+"; retrying", "err", err)
			warned = true
		}
		select {
		case <-time.After(delay):
		case <-o.ctx.Done():
			return false
		}
		delay = min(delay*2, 5*time.Second)
	}
}

func (o *owned) run() {
	defer o.wg.Done()
	var state string
	var published int
	ok := o.retry("creating a distributed split in Redis", func() error {
		var done []byte
		count := 0
		if o.job.Done != nil {
			done = make([]byte, (o.job.Work.Total+7)/8)
			for i := range o.job.Work.Total {
				if o.job.Done(i) {
					setBit(done, i)
					count++
				}
			}
		}
		var err error
		state, published, err = o.b.init(o.ctx, o.job.Work, o.job.Tolerated, done, count, o.ttl())
		return err
	})
	if !ok {
		return
	}
	o.cursor.Store(int64(published))
	if state == string(engine.FanoutOpen) {
		o.wg.Add(1)
		go o.publish(published)
	}
	o.follow()
}

// follow takes the barrier's news to the run, a chunk at a time, each once
// the run has made the one before durable.
func (o *owned) follow() {
	pos := int(o.imported.Load())
	lastState, lastPublished := "", -1
	var lastSent time.Time
	for {
		var n *newsBatch
		if !o.retry("reading a distributed split's results from Redis", func() (err error) {
			n, err = o.b.news(o.ctx, pos, importChunk)
			return err
		}) {
			return
		}
		if n.gone {
			o.send(&engine.FanoutNews{Imported: pos, State: engine.FanoutGone,
				Message: fmt.Sprintf("split %s's results are gone from Redis (flushed, or expired); the items still out cannot come back", o.b.ref)})
			<-o.ctx.Done()
			return
		}
		o.done.Store(int64(n.done))
		select {
		case o.room <- struct{}{}:
		default:
		}
		o.gauge()
		published := max(n.published, int(o.cursor.Load()))
		now := time.Now()
		throttled := published != lastPublished && now.Sub(lastSent) < 500*time.Millisecond && published < o.job.Work.Total
		if len(n.entries) == 0 && n.state == lastState && (published == lastPublished || throttled) {
			wait := lookAgain
			if throttled {
				wait = 500*time.Millisecond - now.Sub(lastSent)
			}
			select {
			case <-o.wake:
			case <-time.After(wait):
			case <-o.ctx.Done():
				return
			}
			continue
		}
		news := o.decode(n, pos, published)
		if !o.send(news) {
			return
		}
		lastState, lastPublished, lastSent = n.state, published, now
		if len(n.entries) == 0 {
			continue
		}
		// The log is trimmed once the run holds what it read.
		for int(o.imported.Load()) < news.Imported {
			select {
			case <-o.acked:
			case <-o.ctx.Done():
				return
			}
		}
		pos = news.Imported
		if err := o.b.trim(o.ctx, pos); err != nil && o.ctx.Err() == nil {
			o.log.Debug("trimming a distributed split's results; later", "err", err)
		}
	}
}

func (o *owned) send(n *engine.FanoutNews) bool {
	select {
	case <-o.ctx.Done():
		return false
	default:
	}
	o.news(n)
	return true
}

// decode turns log entries into news for the run.
func (o *owned) decode(n *newsBatch, pos, published int) *engine.FanoutNews {
	news := &engine.FanoutNews{Imported: pos + len(n.entries), Published: published, State: engine.FanoutState(n.state), Message: n.message}
	switch n.state {
	case stateCancelled, stateTimedOut:
		// The run ended the split itself; only it sets these.
		news.State = engine.FanoutOpen
	}
	counts := map[string]int{}
	for _, e := range n.entries {
		switch {
		case e.Result != nil:
			news.Records = append(news.Records, e.Result)
			counts[statusField(e.Result.Status)]++
		case e.DLQ != nil:
			news.DLQ = append(news.DLQ, e.DLQ)
		case e.Event != nil:
			news.Events = append(news.Events, *e.Event)
		}
	}
	for status, c := range counts {
		o.f.metrics.ItemsDone(status, c)
	}
	return news
}

// gauge keeps the in-flight gauge at what this hand-off has out.
func (o *owned) gauge() {
	now := max(int(o.cursor.Load()-o.done.Load()), 0)
	o.f.metrics.ItemsInFlight(now - o.inFlight)
	o.inFlight = now
}

// publishCall is how many messages go to the broker in one confirmed call.
const publishCall = 16

// publish hands the items out from cursor on, skipping those done, never
// more than the in-flight bound ahead of the results. The cursor is
// recorded after the broker confirmed what is below it: after a restart
// publishing starts there again, so an item may be published twice, but
// never not at all.
func (o *owned) publish(cursor int) {
	defer o.wg.Done()
	total := o.job.Work.Total
	limit := o.f.cfg.MaxInFlight
	if n := o.job.MaxInFlight; n > 0 && n < limit {
		limit = n
	}
	size := min(o.f.cfg.BatchSize, limit)
	var done []byte
	if !o.retry("reading a distributed split's finished items from Redis", func() (err error) {
		done, err = o.b.doneBits(o.ctx)
		return err
	}) {
		return
	}
	for cursor < total {
		for cursor-int(o.done.Load()) >= limit {
			select {
			case <-o.room:
			case <-o.ctx.Done():
				return
			}
		}
		room := limit - (cursor - int(o.done.Load()))
		var msgs []broker.Message
		count := 0
		next := cursor
		for len(msgs) < publishCall && next < total && room > 0 {
			var indexes []int
			var body message
			for next < total && len(indexes) < min(size, room) {
				if !bitSet(done, next) {
					v, err := json.Marshal(o.job.Items[next])
					if err != nil {
						v, _ = json.Marshal(fmt.Sprint(o.job.Items[next]))
					}
					indexes = append(indexes, next)
					body.Items = append(body.Items, messageItem{Index: next, Value: v})
				}
				next++
			}
			if len(indexes) == 0 {
				continue
			}
			room -= len(indexes)
			count += len(indexes)
			data, _ := json.Marshal(body)
			msgs = append(msgs, broker.Message{Headers: headers(o.b.ref, indexes), Body: data})
		}
		if len(msgs) > 0 {
			if err := o.f.broker.Publish(o.ctx, msgs); err != nil {
				if o.ctx.Err() == nil && !errors.Is(err, broker.ErrClosed) {
					o.log.Warn("publishing a distributed split's items stopped", "err", err)
				}
				return
			}
			o.f.metrics.ItemsPublished(count)
		}
		cursor = next
		o.cursor.Store(int64(cursor))
		if !o.retry("recording a distributed split's published items in Redis", func() error { return o.b.setPublished(o.ctx, cursor) }) {
			return
		}
		o.poke()
	}
}
