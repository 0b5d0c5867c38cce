package fanout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/fanout/internal/broker"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/internal/jsonx"
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
		wake: make(chan struct{}, 1), room: make(chan struct{}, 1), acked: make(chan struct{}, 1), salvageReq: make(chan struct{}, 1),
		released: make(chan struct{}), ctx: ctx, cancel: cancel,
	}
	o.imported.Store(int64(job.Imported))
	if !job.Held {
		o.Release()
	}
	o.unsub = f.notices.subscribe(r.String(), func(string) { o.poke() })
	o.unsubPushed = func() {}
	if o.small() {
		// Its last commit sends the news here, so that it need not be read;
		// a push lost, or not subscribed to in time, leaves the notice that
		// follows it to have the news read.
		o.unsubPushed = f.pushed.subscribe(r.String(), func(payload string) {
			if n, err := o.b.pushedNews(payload); err == nil {
				o.pushed.Store(n)
			} else {
				o.log.Warn("taking in a split's news as sent; reading it instead", "err", err)
			}
			o.poke()
		})
	}
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

	wake chan struct{} // a notice came
	// salvageReq asks for the results that are in, for a split that will
	// not succeed.
	salvageReq chan struct{}
	room       chan struct{} // results came, so more may go out
	acked      chan struct{} // the run made news durable
	released   chan struct{} // closed once the run's decision is durable
	release    sync.Once
	// imported is how far the run holds the log durably.
	imported atomic.Int64
	// cursor is the publish cursor: every item below it is out or done.
	cursor atomic.Int64
	done   atomic.Int64
	// inFlight is what this owner added to the in-flight gauge.
	inFlight int
	// inline are the results the news brought, for a small split.
	inline atomic.Pointer[[]*result]

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	unsub  func()
	once   sync.Once
	// unsubPushed and pushed are for the news sent on the hand-off's own
	// channel, the latest not yet taken.
	unsubPushed func()
	pushed      atomic.Pointer[newsBatch]
}

var _ engine.FanoutHandle = (*owned)(nil)

func (o *owned) poke() {
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// small reports whether the split is small enough for its last commit to
// send its news, results included, on the hand-off's own channel.
func (o *owned) small() bool { return o.job.Work.Total <= resultsPage }

// Release implements engine.FanoutHandle.
func (o *owned) Release() { o.release.Do(func() { close(o.released) }) }

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
		o.unsubPushed()
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
	var created bool
	if !o.retry("creating a distributed split in Redis", func() (err error) {
		state, published, created, err = o.b.init(o.ctx, o.job.Work, o.job.Tolerated, o.job.Seed != nil, o.ttl(), o.job.Fence, o.job.Held, o.job.Held)
		return err
	}) {
		return
	}
	if state == stateSuperseded {
		o.log.Warn("not handing a split out: a gateway that took its run over since has")
		return
	}
	// A hand-off this owner just created, with no seed, has no item done.
	fresh := created && state == string(engine.FanoutOpen)
	if state == stateSeeding {
		if !o.retry("taking a replayed split's earlier results into Redis", func() error { return o.b.seed(o.ctx, o.job.Seed) }) {
			return
		}
		state = string(engine.FanoutOpen)
	}
	o.cursor.Store(int64(published))
	if state == string(engine.FanoutOpen) {
		o.wg.Add(1)
		go o.publish(published, fresh)
	}
	if o.job.Held {
		o.wg.Add(1)
		go o.releaseOnceDurable()
	}
	if o.small() {
		// Once the items are on their way: the news comes after they are
		// run, and news pushed before this is read instead. The channel is
		// followed again after a reconnection, even when this subscription
		// did not reach Redis, so it is always let go of.
		_ = o.f.ps.Subscribe(o.ctx, o.b.newsChannel())
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = o.f.ps.Unsubscribe(ctx, o.b.newsChannel())
		}()
	}
	o.follow(fresh)
}

// releaseOnceDurable lets workers claim the hand-off's items once the run's
// decision is durable. Its items went out as soon as it was created.
func (o *owned) releaseOnceDurable() {
	defer o.wg.Done()
	select {
	case <-o.released:
	case <-o.ctx.Done():
		return
	}
	o.retry("releasing a distributed split's items to workers in Redis", func() error { return o.b.release(o.ctx) })
}

// countsEvery bounds how often news that only moves the counts goes to
// the run, each report being a write of the split's record.
const countsEvery = 250 * time.Millisecond

// follow takes the barrier's news to the run, a chunk of the log at a
// time, each once the run has made the one before durable. A fresh
// hand-off has nothing to tell at first, and the run's store nothing to
// write: its first news is the first that moves.
func (o *owned) follow(fresh bool) {
	pos := int(o.imported.Load())
	var last engine.FanoutNews
	var lastSent time.Time
	first := !fresh
	if fresh {
		last.State, lastSent = engine.FanoutOpen, time.Now()
		if !o.idle(lookAgain, last) {
			return
		}
	}
	for {
		select {
		case <-o.salvageReq:
			if !o.salvage(last) {
				return
			}
		default:
		}
		n := o.pushed.Swap(nil)
		if n == nil && !o.retry("reading a distributed split's news from Redis", func() (err error) {
			n, err = o.b.news(o.ctx, pos, importChunk, resultsPage)
			return err
		}) {
			return
		}
		if n.gone {
			o.send(&engine.FanoutNews{Imported: pos, State: engine.FanoutGone,
				Message: fmt.Sprintf("split %s's state is gone from Redis (flushed, or expired); the items still out cannot come back", o.b.ref)})
			<-o.ctx.Done()
			return
		}
		if len(n.results) == o.job.Work.Total {
			o.inline.Store(&n.results)
		}
		o.done.Store(int64(n.done))
		select {
		case o.room <- struct{}{}:
		default:
		}
		o.gauge()
		news := o.decode(n, pos)
		now := time.Now()
		moved := news.Succeeded != last.Succeeded || news.Failed != last.Failed || news.Skipped != last.Skipped || news.Published != last.Published
		urgent := first || len(n.entries) > 0 || news.State != last.State || n.done == o.job.Work.Total
		if !urgent && (!moved || now.Sub(lastSent) < countsEvery) {
			wait := lookAgain
			if moved {
				wait = countsEvery - now.Sub(lastSent)
			}
			if !o.idle(wait, last) {
				return
			}
			continue
		}
		o.counted(&last, news)
		if !o.send(news) {
			return
		}
		first, last, lastSent = false, *news, now
		if len(n.entries) == 0 {
			if news.State == engine.FanoutComplete || news.State == engine.FanoutFailed {
				// A split that is over takes no more commits: all its news
				// is told. Reading on would only keep Redis and this
				// gateway busy while the run joins.
				select {
				case <-o.salvageReq:
					if !o.salvage(last) {
						return
					}
				case <-o.ctx.Done():
					return
				}
			}
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
			o.log.Debug("trimming a distributed split's log; later", "err", err)
		}
	}
}

// idle waits for a notice, or for wait, serving a salvage asked for
// meanwhile; it reports false once the owner stops.
func (o *owned) idle(wait time.Duration, last engine.FanoutNews) bool {
	select {
	case <-o.wake:
	case <-o.salvageReq:
		return o.salvage(last)
	case <-time.After(wait):
	case <-o.ctx.Done():
		return false
	}
	return true
}

// counted tells the metrics what results came in since the last news.
func (o *owned) counted(last, now *engine.FanoutNews) {
	for _, c := range []struct {
		result   string
		was, now int
	}{{"succeeded", last.Succeeded, now.Succeeded}, {"failed", last.Failed, now.Failed}, {"skipped", last.Skipped, now.Skipped}} {
		if c.now > c.was {
			o.f.metrics.ItemsDone(c.result, c.now-c.was)
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

// decode turns what the barrier holds into news for the run.
func (o *owned) decode(n *newsBatch, pos int) *engine.FanoutNews {
	news := &engine.FanoutNews{
		Imported: pos + len(n.entries), Published: max(n.published, int(o.cursor.Load())),
		Succeeded: n.succeeded, Failed: n.failed, Skipped: n.skipped,
		State: engine.FanoutState(n.state), Message: n.message,
	}
	switch n.state {
	case stateCancelled, stateTimedOut, stateSeeding:
		// The run ended the split itself; only it sets these. Or the seed
		// is still going in.
		news.State = engine.FanoutOpen
	}
	for _, e := range n.entries {
		switch {
		case e.DLQ != nil:
			news.DLQ = append(news.DLQ, e.DLQ)
		case e.Event != nil:
			news.Events = append(news.Events, *e.Event)
		}
	}
	return news
}

// Salvage implements engine.FanoutHandle.
func (o *owned) Salvage() {
	select {
	case o.salvageReq <- struct{}{}:
	default:
	}
}

// salvage sends the run the slot record of every item with a result, a
// chunk at a time, the last marked.
func (o *owned) salvage(counts engine.FanoutNews) bool {
	var recs []*store.StepRecord
	flush := func(last bool) bool {
		n := counts
		n.DLQ, n.Events, n.Records, n.Salvaged = nil, nil, recs, last
		ok := o.send(&n)
		recs = nil
		return ok
	}
	if !o.retry("reading a distributed split's results from Redis", func() error {
		recs = nil
		return o.b.scanResults(o.ctx, func(i int, r *result) error {
			recs = append(recs, r.record(o.job.Work, i))
			if len(recs) == importChunk && !flush(false) {
				return o.ctx.Err()
			}
			return nil
		})
	}) {
		return false
	}
	return flush(true)
}

// Results implements engine.FanoutHandle. It is called from the run's own
// goroutine once every item has a result; a Redis that does not answer is
// waited for a while.
func (o *owned) Results(ctx context.Context, fn func(*store.StepRecord) error) error {
	total := o.job.Work.Total
	if rs := o.inline.Load(); rs != nil && len(*rs) == total {
		return o.emit(0, *rs, fn)
	}
	// The join waits on these reads alone, so a few pages are read ahead,
	// at once, and handed on in order: a bounded memory, and the reading
	// and decoding spread over the gateway's cores.
	type page struct {
		rs  []*result
		err error
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pages := make(chan chan page, 3)
	go func() {
		defer close(pages)
		for from := 0; from < total; from += resultsPage {
			c := make(chan page, 1)
			select {
			case pages <- c:
			case <-ctx.Done():
				return
			}
			go func() {
				rs, err := o.readResults(ctx, from, min(from+resultsPage, total))
				c <- page{rs, err}
			}()
		}
	}()
	from := 0
	for c := range pages {
		p := <-c
		if p.err != nil {
			return p.err
		}
		if err := o.emit(from, p.rs, fn); err != nil {
			return err
		}
		from += len(p.rs)
	}
	return ctx.Err()
}

// resultsPage is how many results the join reads at once.
const resultsPage = 1000

// emit hands the results of items from on to the join.
func (o *owned) emit(from int, rs []*result, fn func(*store.StepRecord) error) error {
	// One record serves every item: a million would be a million
	// allocations.
	var rec store.StepRecord
	total := o.job.Work.Total
	for j, r := range rs {
		if r == nil {
			return fmt.Errorf("split %s has no result for item %d in Redis", o.b.ref, from+j)
		}
		rec = store.StepRecord{Key: engine.ItemKey(o.job.Work.Key, from+j, total), Name: o.job.Work.Step, Status: r.Status, Body: r.Body, Error: r.Error}
		if err := fn(&rec); err != nil {
			return err
		}
	}
	return nil
}

// readResults reads the results of items from to to-1, waiting a while
// for a Redis that does not answer.
func (o *owned) readResults(ctx context.Context, from, to int) ([]*result, error) {
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		rs, err := o.b.results(ctx, from, to)
		if err == nil || wait >= 5*time.Second || ctx.Err() != nil {
			return rs, err
		}
		o.log.Warn("reading a distributed split's results; retrying", "err", err)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// gauge keeps the in-flight gauge at what this hand-off has out.
func (o *owned) gauge() {
	now := max(int(o.cursor.Load()-o.done.Load()), 0)
	o.f.metrics.ItemsInFlight(now - o.inFlight)
	o.inFlight = now
}

// publishCall is how many messages go to the broker in one confirmed call.
const publishCall = 16

// A split is cut into at least shareMessages messages, so that that many
// workers can share it, unless that makes them smaller than minBatch items:
// each message costs a claim and a commit in Redis and a delivery, whatever
// it carries.
const (
	shareMessages = 32
	minBatch      = 100
)

// batchSize is how many items each message of a split of total carries:
// batch_size at most, less for a split too small to fill shareMessages.
func batchSize(total, batch, limit int) int {
	return max(1, min(batch, limit, max(minBatch, (total+shareMessages-1)/shareMessages)))
}

// publish hands the items out from cursor on, skipping those done, never
// more than the in-flight bound ahead of the results. The cursor is
// recorded after the broker confirmed what is below it: after a restart
// publishing starts there again, so an item may be published twice, but
// never not at all. fresh says no item can be done yet.
func (o *owned) publish(cursor int, fresh bool) {
	defer o.wg.Done()
	total := o.job.Work.Total
	limit := o.f.cfg.MaxInFlight
	if n := o.job.MaxInFlight; n > 0 && n < limit {
		limit = n
	}
	size := batchSize(total, o.f.cfg.BatchSize, limit)
	var done []byte
	if !fresh && !o.retry("reading a distributed split's finished items from Redis", func() (err error) {
		done, err = o.b.doneBits(o.ctx)
		return err
	}) {
		return
	}
	// Once every item is out, the items are no longer this owner's to keep.
	defer func() {
		if cursor >= total {
			o.job.Items = nil
		}
	}()
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
					v, err := o.job.Items.JSON(next)
					if err != nil {
						v, _ = jsonx.Marshal(fmt.Sprint(o.job.Items.At(next)))
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
			data, _ := jsonx.Marshal(body)
			msgs = append(msgs, broker.Message{Headers: headers(o.b.ref, o.job.Work, indexes), Body: data})
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
