// Package fanout hands the items of large split loops to worker processes
// over RabbitMQ and brings their results back through a barrier in Redis.
//
// The owning gateway (Owner, an engine.Fanout) records in its store that a
// split is distributed, then publishes its items in batches, as persistent
// messages on a quorum queue, with publisher confirms, never more than
// max_in_flight ahead of the results. Workers (Worker) run each item with
// the engine's own runner, commit its steps and its result to the barrier,
// and acknowledge a message only once every item in it is committed. The
// barrier counts each item once however often it is delivered, opens
// exactly once, and tells the owner through a Redis channel, which reads
// the results in the order they came, writes them to its store as the
// same records a local split writes, and joins.
//
// It is the gateway's own package, with no compatibility promise.
package fanout

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/fanout/internal/broker"
	"github.com/chaingate/gateway/internal/jsonx"
)

// Metrics is told what distributed splits do. Its methods must not block.
type Metrics interface {
	// ItemsPublished counts items handed to the broker by this gateway.
	ItemsPublished(n int)
	// ItemsDone counts results taken in by this gateway, by status.
	ItemsDone(status string, n int)
	// ItemsRedelivered counts items a worker here was handed again.
	ItemsRedelivered(n int)
	// ItemsInFlight moves the count of items out and not yet done.
	ItemsInFlight(delta int)
	// ItemsPoisoned counts items parked because their message kept failing.
	ItemsPoisoned(n int)
}

type noMetrics struct{}

func (noMetrics) ItemsPublished(int)    {}
func (noMetrics) ItemsDone(string, int) {}
func (noMetrics) ItemsRedelivered(int)  {}
func (noMetrics) ItemsInFlight(int)     {}
func (noMetrics) ItemsPoisoned(int)     {}

// Options configure a Fanout.
type Options struct {
	Config  *chain.Fanout
	Logger  *slog.Logger
	Metrics Metrics
}

// Fanout holds the connections a gateway or a worker shares between the
// splits it owns and the items it works.
type Fanout struct {
	cfg     *chain.Fanout
	rdb     goredis.UniversalClient
	broker  *broker.Broker
	log     *slog.Logger
	metrics Metrics
	channel string

	notices *noticeHub
	// pushed passes on the news sent on hand-offs' own channels, by ref.
	pushed *noticeHub
	ps     *goredis.PubSub
	cancel context.CancelFunc
	done   chan struct{}
}

// Open connects to Redis and RabbitMQ; a server that does not answer is an
// error naming it.
func Open(ctx context.Context, opts Options) (*Fanout, error) {
	cfg := opts.Config
	if cfg == nil {
		return nil, fmt.Errorf("opening fan-out: no [gateway.fanout]")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Metrics == nil {
		opts.Metrics = noMetrics{}
	}
	ropts, err := goredis.ParseURL(cfg.RedisURL)
	if err != nil {
		return nil, fmt.Errorf("opening fan-out: parsing redis_url: %w", err)
	}
	ropts.ClientName = strings.TrimRight(cfg.Prefix, ".:") + "-fanout"
	rdb := goredis.NewClient(ropts)
	pctx, cancelPing := context.WithTimeout(ctx, 5*time.Second)
	defer cancelPing()
	if err := rdb.Ping(pctx).Err(); err != nil {
		_ = rdb.Close()
		return nil, fmt.Errorf("opening fan-out: connecting to Redis at %s: %w", ropts.Addr, err)
	}
	b, err := broker.Open(ctx, broker.Options{URL: cfg.RabbitMQURL, Prefix: cfg.Prefix, MaxRedeliveries: cfg.MaxRedeliveries, Logger: opts.Logger.With("component", "broker")})
	if err != nil {
		_ = rdb.Close()
		return nil, fmt.Errorf("opening fan-out: %w", err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	f := &Fanout{
		cfg: cfg, rdb: rdb, broker: b, log: opts.Logger, metrics: opts.Metrics, channel: cfg.Prefix + "fanout",
		notices: newNoticeHub(), pushed: newNoticeHub(), cancel: cancel, done: make(chan struct{}),
	}
	f.ps = rdb.Subscribe(runCtx, f.channel)
	go f.listen(runCtx)
	return f, nil
}

// Redis is the client of the Redis where items' results meet. It is closed
// with the Fanout.
func (f *Fanout) Redis() goredis.UniversalClient { return f.rdb }

// RunsPrefix is where, in that Redis, the runs that distributed items start
// (their sub-chains) are kept, so that whichever worker runs an item next
// finds them.
func (f *Fanout) RunsPrefix() string { return f.cfg.Prefix + "runs:" }

// Close stops listening and closes the connections. Owners and workers
// using it must be stopped first.
func (f *Fanout) Close() error {
	f.cancel()
	// A blocked read of the channel ends only with its connection.
	_ = f.ps.Close()
	<-f.done
	return joinErr(f.broker.Close(), f.rdb.Close())
}

func joinErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// listen follows the channel on which barriers announce news and state
// changes. After a reconnection everything following it looks again, since
// a notice may have been missed meanwhile.
func (f *Fanout) listen(ctx context.Context) {
	defer close(f.done)
	for {
		msg, err := f.ps.Receive(ctx)
		if ctx.Err() != nil {
			return
		}
		switch m := msg.(type) {
		case *goredis.Subscription:
			// Hand-offs' own channels come and go; only the shared one
			// being taken up again may follow a missed notice.
			if m.Channel == f.channel && m.Kind == "subscribe" {
				f.notices.all()
			}
		case *goredis.Message:
			if ref, ok := strings.CutPrefix(m.Channel, f.channel+":news:"); ok {
				f.pushed.send(ref, m.Payload)
				continue
			}
			ref, state := parseNotice(m.Payload)
			f.notices.send(ref, state)
		default:
			if err != nil {
				f.log.Warn("following fan-out notices in Redis; retrying", "err", err)
				select {
				case <-time.After(500 * time.Millisecond):
				case <-ctx.Done():
					return
				}
			}
		}
	}
}

// message is the body of one published message: a batch of items of one
// hand-off. Its headers carry the hand-off and the indexes too, so that a
// body that cannot be decoded can still be placed.
type message struct {
	Items []messageItem `json:"items"`
}

type messageItem struct {
	Index int             `json:"i"`
	Value json.RawMessage `json:"v"`
}

// Message headers. The split's key already holds its lineage, as
// SPLIT[INDEX]/ levels; lineage and definition say the same for people
// reading a queue.
const (
	headerRun        = "run"
	headerSplit      = "split"
	headerGen        = "gen"
	headerIndexes    = "indexes"
	headerLineage    = "lineage"
	headerDefinition = "definition"
)

func headers(r ref, ws *engine.WorkSplit, indexes []int) map[string]any {
	lineage := []byte("[]")
	if len(ws.Lineage) > 0 {
		lineage, _ = jsonx.Marshal(ws.Lineage)
	}
	return map[string]any{
		headerRun: r.Run, headerSplit: r.Split, headerGen: int64(r.Gen), headerIndexes: formatIndexes(indexes),
		headerLineage: string(lineage), headerDefinition: ws.Run.ChainHash,
	}
}

// refOf reads a message's hand-off and indexes from its headers.
func refOf(h map[string]any) (ref, []int, error) {
	run, _ := h[headerRun].(string)
	split, _ := h[headerSplit].(string)
	var gen int
	switch g := h[headerGen].(type) {
	case int64:
		gen = int(g)
	case int32:
		gen = int(g)
	case int:
		gen = g
	}
	idx, _ := h[headerIndexes].(string)
	if run == "" || split == "" || gen < 1 {
		return ref{}, nil, fmt.Errorf("message headers name no split (run %q, split %q, gen %d)", run, split, gen)
	}
	indexes, err := parseIndexes(idx)
	if err != nil {
		return ref{}, nil, err
	}
	return ref{Run: run, Split: split, Gen: gen}, indexes, nil
}

// formatIndexes writes ascending indexes as ranges: "0-99,102,105-110".
func formatIndexes(indexes []int) string {
	var sb strings.Builder
	for i := 0; i < len(indexes); {
		j := i
		for j+1 < len(indexes) && indexes[j+1] == indexes[j]+1 {
			j++
		}
		if sb.Len() > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(strconv.Itoa(indexes[i]))
		if j > i {
			sb.WriteByte('-')
			sb.WriteString(strconv.Itoa(indexes[j]))
		}
		i = j + 1
	}
	return sb.String()
}

func parseIndexes(s string) ([]int, error) {
	if s == "" {
		return nil, fmt.Errorf("message headers list no items")
	}
	var out []int
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, fmt.Errorf("bad item index %q in message headers", part)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a || b-a > 1_000_000 {
				return nil, fmt.Errorf("bad item range %q in message headers", part)
			}
		}
		for i := a; i <= b; i++ {
			out = append(out, i)
		}
	}
	return out, nil
}

// noticeHub passes the notices heard on the channel to whatever here
// follows the hand-off they name. An empty state asks to look again.
type noticeHub struct {
	mu   sync.Mutex
	next int
	subs map[string]map[int]func(state string)
}

func newNoticeHub() *noticeHub { return &noticeHub{subs: map[string]map[int]func(string){}} }

// subscribe calls fn, which must not block, with each notice for ref.
func (h *noticeHub) subscribe(ref string, fn func(state string)) (unsubscribe func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.next++
	id := h.next
	if h.subs[ref] == nil {
		h.subs[ref] = map[int]func(string){}
	}
	h.subs[ref][id] = fn
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(h.subs[ref], id)
		if len(h.subs[ref]) == 0 {
			delete(h.subs, ref)
		}
	}
}

func (h *noticeHub) send(ref, state string) {
	h.mu.Lock()
	fns := make([]func(string), 0, len(h.subs[ref]))
	for _, fn := range h.subs[ref] {
		fns = append(fns, fn)
	}
	h.mu.Unlock()
	for _, fn := range fns {
		fn(state)
	}
}

func (h *noticeHub) all() {
	h.mu.Lock()
	var fns []func(string)
	for _, m := range h.subs {
		for _, fn := range m {
			fns = append(fns, fn)
		}
	}
	h.mu.Unlock()
	for _, fn := range fns {
		fn("")
	}
}
