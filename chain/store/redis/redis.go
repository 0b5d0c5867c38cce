// Package redis is the shared store: several gateways keep their runs in
// one Redis and take each other's runs over when a lease expires. Every
// commit is one Lua script, so it is atomic, and fenced by the run's lease.
//
// Keys, all under the prefix P:
//
//	P run:ID        hash: h the run without its origin, o the origin
//	P stepkeys:ID   sorted set of step keys, score 0, for key order and prefix scans
//	P steps:ID      hash: step key → step record
//	P events:ID     list of events; event seq n is at index n-1
//	P lease:ID      "owner|fence", with the lease's TTL
//	P fence:ID      counter of the run's last fence, without TTL
//	P runs          sorted set, score 0, of hex(created-at ns)+ID, for listing
//	P unfinished    sorted set, score 0, of unfinished run ids
//	P dlq           hash: entry id → DLQ entry
//	P dlqids        sorted set, score 0, of DLQ entry ids, for ordering
//	P finished:S    sorted set, score 0, of hex(ended-at ns)+ID of the runs
//	                that ended with status S, for retention; a run's hash
//	                keeps its member as field f
//	P meta:finished "done" once the finished indexes hold the runs that ended
//	                before they existed
//	P inbox         hash: delivery id → a kept trigger delivery
//	P inboxids      sorted set, score 0, of kept delivery ids, for ordering
//	P audit         hash: audit entry id → entry (audit.go)
//	P auditids      sorted set, score 0, of audit entry ids, which sort by time
//	P def:HASH      chain definition source
//	P idem:KEY      run id an idempotency key is bound to, with its TTL
//	P backup:T:...  a backup's copy of a large run's keys, for an hour at most (backup.go)
//
// The first part after the prefix never contains an id, so ids cannot make
// two keys collide.
//
// A commit's durability is that of the Redis deployment (AOF, replicas).
//
// It is the gateway's own package, with no compatibility promise.
package redis

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/internal/jsonx"
)

const (
	// DefaultPrefix namespaces keys when Options.Prefix is empty.
	DefaultPrefix = "chaingate:"
	defaultAddr   = "127.0.0.1:6379"

	defaultListLimit = 50
	maxListLimit     = 1000
	// pageSize bounds how many records one read fetches, so a split of a
	// million items never sits in memory or blocks Redis at once.
	pageSize = 1000
)

// Options configures the store.
type Options struct {
	// Client, if set, is used as is (and not closed by Close); else Addr,
	// DB and Password are used.
	Client   goredis.UniversalClient
	Addr     string // default 127.0.0.1:6379
	DB       int
	Password string
	// Prefix namespaces every key; default DefaultPrefix. On Redis Cluster
	// it needs a hash tag, such as "{chaingate}:", because a commit touches
	// the run's keys and the shared indexes in one script.
	Prefix string
	Logger *slog.Logger
	// Durability is checked at open and asked of every commit.
	Durability Durability
}

// Store is a store.Store on Redis.
type Store struct {
	client goredis.UniversalClient
	owned  bool
	p      string
	log    *slog.Logger
	dur    Durability

	mu     sync.Mutex // guards closed and adding to ops and follows
	closed bool
	ops    sync.WaitGroup // calls under way, for Close to wait on
	// stopping ends FollowRuns, which Close waits for apart from calls.
	stopping chan struct{}
	follows  sync.WaitGroup
}

var _ store.Store = (*Store)(nil)

// Open connects to Redis and checks that it answers.
func Open(ctx context.Context, opts Options) (*Store, error) {
	if opts.Client != nil {
		return open(ctx, opts.Client, false, clientAddr(opts.Client), opts.Prefix, opts.Durability, opts.Logger)
	}
	if opts.Addr == "" {
		opts.Addr = defaultAddr
	}
	client := goredis.NewClient(&goredis.Options{Addr: opts.Addr, DB: opts.DB, Password: opts.Password})
	return open(ctx, client, true, opts.Addr, opts.Prefix, opts.Durability, opts.Logger)
}

// OpenURL opens the store at a URL of the form
// redis://[[user]:password@]host:port/db?prefix=chaingate: (rediss:// for
// TLS); other query parameters are go-redis's client options.
func OpenURL(ctx context.Context, rawURL string, logger *slog.Logger) (*Store, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Error quotes the URL, password and all.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("parsing Redis URL: %w", err)
	}
	q := u.Query()
	prefix := q.Get("prefix")
	q.Del("prefix")
	dur, err := parseDurability(q)
	if err != nil {
		return nil, fmt.Errorf("parsing Redis URL: %w", err)
	}
	u.RawQuery = q.Encode()
	opts, err := goredis.ParseURL(u.String())
	if err != nil {
		return nil, fmt.Errorf("parsing Redis URL: %w", err)
	}
	return open(ctx, goredis.NewClient(opts), true, opts.Addr, prefix, dur, logger)
}

func open(ctx context.Context, client goredis.UniversalClient, owned bool, addr, prefix string, dur Durability, logger *slog.Logger) (*Store, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	fail := func(err error) (*Store, error) {
		if owned {
			_ = client.Close()
		}
		return nil, err
	}
	if _, single := client.(*goredis.Client); !single && !hasHashTag(prefix) {
		return fail(fmt.Errorf("opening Redis store: prefix %q has no hash tag such as {chaingate}:, which a sharded client needs so that one commit's keys share a slot", prefix))
	}
	if err := client.Ping(ctx).Err(); err != nil {
		return fail(fmt.Errorf("connecting to Redis at %s: %w", addr, err))
	}
	st := &Store{client: client, owned: owned, p: prefix, log: logger, dur: dur, stopping: make(chan struct{})}
	if err := st.checkDurability(ctx, addr, dur); err != nil {
		return fail(err)
	}
	if err := st.buildFinishedIndex(ctx); err != nil {
		return fail(fmt.Errorf("opening Redis store: %w", err))
	}
	logger.Debug("opened Redis store", "addr", addr, "prefix", prefix, "wait_replicas", dur.WaitReplicas)
	return st, nil
}

func clientAddr(c goredis.UniversalClient) string {
	switch c := c.(type) {
	case *goredis.Client:
		return c.Options().Addr
	case *goredis.ClusterClient:
		return strings.Join(c.Options().Addrs, ",")
	}
	return "the given client's address"
}

// hasHashTag reports whether s has a non-empty {tag}, which Redis Cluster
// hashes instead of the whole key.
func hasHashTag(s string) bool {
	i := strings.IndexByte(s, '{')
	return i >= 0 && strings.IndexByte(s[i+1:], '}') > 0
}

// Close waits for calls under way, then closes the client if Open made it.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	close(s.stopping)
	s.follows.Wait()
	s.ops.Wait()
	if !s.owned {
		return nil
	}
	if err := s.client.Close(); err != nil {
		return fmt.Errorf("closing Redis client: %w", err)
	}
	return nil
}

// begin registers a call, unless the store is closed; end must follow.
func (s *Store) begin() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return store.ErrClosed
	}
	s.ops.Add(1)
	return nil
}

func (s *Store) end() { s.ops.Done() }

func (s *Store) runKey(id string) string               { return s.p + "run:" + id }
func (s *Store) stepKeysKey(id string) string          { return s.p + "stepkeys:" + id }
func (s *Store) stepsKey(id string) string             { return s.p + "steps:" + id }
func (s *Store) eventsKey(id string) string            { return s.p + "events:" + id }
func (s *Store) leaseKey(id string) string             { return s.p + "lease:" + id }
func (s *Store) fenceKey(id string) string             { return s.p + "fence:" + id }
func (s *Store) runsKey() string                       { return s.p + "runs" }
func (s *Store) unfinishedKey() string                 { return s.p + "unfinished" }
func (s *Store) dlqKey() string                        { return s.p + "dlq" }
func (s *Store) dlqIDsKey() string                     { return s.p + "dlqids" }
func (s *Store) inboxKey() string                      { return s.p + "inbox" }
func (s *Store) inboxIDsKey() string                   { return s.p + "inboxids" }
func (s *Store) finishedKey(st store.RunStatus) string { return s.p + "finished:" + string(st) }
func (s *Store) defKey(hash string) string             { return s.p + "def:" + hash }
func (s *Store) idemKey(key string) string             { return s.p + "idem:" + key }

// indexMember sorts runs by creation time, then id, as bolt's index does.
func indexMember(created time.Time, id string) string {
	return hex.EncodeToString(binary.BigEndian.AppendUint64(nil, uint64(created.UnixNano()))) + id
}

func leaseToken(l *store.Lease) string {
	return l.Owner + "|" + strconv.FormatUint(l.Fence, 10)
}

// Commit implements store.Store. If ctx ends or the connection fails while
// the script is under way, the batch may have been applied; committing the
// same batch again is then safe, as the script recognises a replay.
func (s *Store) Commit(ctx context.Context, b *store.Batch) error {
	if b == nil || b.Run == nil || b.Run.ID == "" {
		return errors.New("committing batch: batch has no run")
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	run := b.Run
	if err := store.CheckClaim(b); err != nil {
		return fmt.Errorf("committing run %s: %w", run.ID, err)
	}
	if l := b.Lease; l != nil && l.RunID != run.ID {
		return fmt.Errorf("committing run %s under a lease on run %q: %w", run.ID, l.RunID, store.ErrLeaseLost)
	}
	keys, args, err := s.commitArgs(b)
	if err != nil {
		return fmt.Errorf("committing run %s: %w", run.ID, err)
	}
	if err := s.begin(); err != nil {
		return err
	}
	defer s.end()
	res, err := s.runCommit(ctx, keys, args)
	if err != nil {
		return fmt.Errorf("committing run %s: %w", run.ID, err)
	}
	switch {
	case len(res) == 0:
		return fmt.Errorf("committing run %s: empty reply from the commit script", run.ID)
	case res[0] == 0:
		s.announce(ctx, b)
		return nil
	case res[0] == 6:
		s.log.Info("commit was already applied; a retried commit whose reply was lost", "run", run.ID, "seq", run.Seq)
		s.announce(ctx, b)
		return nil
	case res[0] == 1:
		return fmt.Errorf("committing run %s: %w", run.ID, store.ErrLeaseLost)
	case res[0] == 2:
		return fmt.Errorf("creating run %s: %w", run.ID, store.ErrExists)
	case res[0] == 3:
		return fmt.Errorf("committing run %s: %w", run.ID, store.ErrNotFound)
	case res[0] == 4 && len(res) == 3:
		return fmt.Errorf("committing run %s: event seq %d does not follow %d: %w", run.ID, res[1], res[2], store.ErrConflict)
	case res[0] == 5 && len(res) == 3:
		return fmt.Errorf("committing run %s: run seq %d, last event %d: %w", run.ID, res[1], res[2], store.ErrConflict)
	case res[0] == 7 && b.Claim != nil:
		// The script answers with numbers only; the holder is read after.
		bound, err := s.client.Get(ctx, s.idemKey(b.Claim.Key)).Result()
		if err != nil && !errors.Is(err, goredis.Nil) {
			return fmt.Errorf("creating run %s: reading who holds idempotency key %q: %w", run.ID, b.Claim.Key, err)
		}
		return fmt.Errorf("creating run %s: %w", run.ID, &store.KeyBoundError{Key: b.Claim.Key, Run: bound})
	}
	return fmt.Errorf("committing run %s: unexpected reply %v from the commit script", run.ID, res)
}

// runCommit runs the commit script; with WaitReplicas, on one connection
// with a WAIT after it, and a commit too few replicas hold is an error. It
// was applied on the primary all the same: the engine stops the run there,
// and whoever resumes it reads it back, so no call is made on a change a
// failover could lose.
func (s *Store) runCommit(ctx context.Context, keys []string, args []any) ([]int64, error) {
	if s.dur.WaitReplicas == 0 {
		return commitScript.Run(ctx, s.client, keys, args...).Int64Slice()
	}
	for loaded := false; ; loaded = true {
		p := s.client.Pipeline()
		res := commitScript.EvalSha(ctx, p, keys, args...)
		acked := s.dur.wait(ctx, p)
		_, _ = p.Exec(ctx)
		if err := res.Err(); err != nil {
			if !loaded && goredis.HasErrorPrefix(err, "NOSCRIPT") {
				if err := commitScript.Load(ctx, s.client).Err(); err != nil {
					return nil, fmt.Errorf("loading the commit script: %w", err)
				}
				continue
			}
			return nil, err
		}
		n, err := acked.Int64()
		if err != nil {
			return nil, fmt.Errorf("waiting for replicas: %w", err)
		}
		if n < int64(s.dur.WaitReplicas) {
			return nil, fmt.Errorf("%w: applied on the primary, but %d of the %d replicas asked for (wait_replicas) acknowledged it within %s", ErrNotReplicated, n, s.dur.WaitReplicas, s.dur.waitTimeout())
		}
		return res.Int64Slice()
	}
}

// commitArgs encodes a batch as commitScript's KEYS and ARGV. JSON
// encoding happens here, in the caller's goroutine, not inside Redis.
func (s *Store) commitArgs(b *store.Batch) ([]string, []any, error) {
	run := b.Run
	// The origin never changes, so it is written once, apart from the
	// header that every commit rewrites.
	h, err := store.MarshalHeader(run)
	if err != nil {
		return nil, nil, fmt.Errorf("encoding run: %w", err)
	}
	var origin []byte
	if b.Create {
		if origin, err = store.MarshalOrigin(&run.Origin); err != nil {
			return nil, nil, fmt.Errorf("encoding origin: %w", err)
		}
	}
	var lease string
	if b.Lease != nil {
		lease = leaseToken(b.Lease)
	}
	fin, finMember := 0, ""
	if run.Status.Final() {
		fin, finMember = finishedIndex(run.Status)+1, finishedMember(run)
	}
	claimTTL := ""
	if c := b.Claim; c != nil {
		ms, err := ttlMillis(c.TTL)
		if err != nil {
			return nil, nil, fmt.Errorf("claiming idempotency key: %w", err)
		}
		claimTTL = strconv.FormatInt(ms, 10)
	}
	args := make([]any, 0, 15+len(b.DeleteSteps)+2*(len(b.Steps)+len(b.Events)+len(b.DLQ))+1)
	args = append(args, flag(b.Create), flag(run.Status.Final()), lease, strconv.FormatUint(run.Seq, 10),
		h, origin, indexMember(run.CreatedAt, run.ID), run.ID,
		len(b.DeleteSteps), len(b.Steps), len(b.Events), len(b.DLQ), fin, finMember, claimTTL)
	for _, k := range b.DeleteSteps {
		args = append(args, k)
	}
	for _, st := range b.Steps {
		v, err := store.MarshalStep(st)
		if err != nil {
			return nil, nil, fmt.Errorf("encoding step %s: %w", st.Key, err)
		}
		args = append(args, st.Key, v)
	}
	for _, ev := range b.Events {
		ev.RunID = run.ID
		v, err := store.MarshalEvent(&ev)
		if err != nil {
			return nil, nil, fmt.Errorf("encoding event %d: %w", ev.Seq, err)
		}
		args = append(args, strconv.FormatUint(ev.Seq, 10), v)
	}
	for _, d := range b.DLQ {
		v, err := jsonx.Marshal(d)
		if err != nil {
			return nil, nil, fmt.Errorf("encoding dead-letter entry %s: %w", d.ID, err)
		}
		args = append(args, d.ID, v)
	}
	keys := []string{
		s.runKey(run.ID), s.stepKeysKey(run.ID), s.stepsKey(run.ID), s.eventsKey(run.ID), s.leaseKey(run.ID),
		s.runsKey(), s.unfinishedKey(), s.dlqKey(), s.dlqIDsKey(),
	}
	for _, st := range finalStatuses {
		keys = append(keys, s.finishedKey(st))
	}
	if c := b.Claim; c != nil {
		keys = append(keys, s.idemKey(c.Key))
	}
	if d := b.Definition; d != nil {
		keys = append(keys, s.defKey(d.Hash))
		args = append(args, d.Source)
	}
	return keys, args, nil
}

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// Run implements store.Store.
func (s *Store) Run(ctx context.Context, id string) (*store.Run, error) {
	if err := s.begin(); err != nil {
		return nil, err
	}
	defer s.end()
	vals, err := s.client.HMGet(ctx, s.runKey(id), "h", "o").Result()
	if err != nil {
		return nil, fmt.Errorf("reading run %s: %w", id, err)
	}
	return s.decodeRun(id, vals)
}

// RunHeader implements store.Store.
func (s *Store) RunHeader(ctx context.Context, id string) (*store.Run, error) {
	if err := s.begin(); err != nil {
		return nil, err
	}
	defer s.end()
	vals, err := s.client.HMGet(ctx, s.runKey(id), "h").Result()
	if err != nil {
		return nil, fmt.Errorf("reading run %s: %w", id, err)
	}
	return s.decodeRun(id, vals)
}

// decodeRun decodes a run hash's header and origin, as HMGET returns them.
func (s *Store) decodeRun(id string, vals []any) (*store.Run, error) {
	h, ok := vals[0].(string)
	if !ok {
		return nil, fmt.Errorf("run %s: %w", id, store.ErrNotFound)
	}
	var run store.Run
	if err := jsonx.Unmarshal([]byte(h), &run); err != nil {
		return nil, fmt.Errorf("decoding run %s (key %s): %w: %w", id, s.runKey(id), store.ErrDamaged, err)
	}
	if len(vals) < 2 {
		return &run, nil
	}
	if o, ok := vals[1].(string); ok {
		if err := jsonx.Unmarshal([]byte(o), &run.Origin); err != nil {
			return nil, fmt.Errorf("decoding origin of run %s (key %s): %w: %w", id, s.runKey(id), store.ErrDamaged, err)
		}
	}
	return &run, nil
}

// Steps implements store.Store.
func (s *Store) Steps(ctx context.Context, runID, prefix string) ([]*store.StepRecord, error) {
	var out []*store.StepRecord
	err := s.ForEachStep(ctx, runID, store.StepScan{Prefix: prefix}, func(st *store.StepRecord) error {
		out = append(out, st)
		return nil
	})
	return out, err
}

// ForEachStep implements store.Store. It reads pageSize records at a time;
// each page is consistent, the walk as a whole is not a snapshot.
func (s *Store) ForEachStep(ctx context.Context, runID string, scan store.StepScan, fn func(*store.StepRecord) error) error {
	if err := s.begin(); err != nil {
		return err
	}
	defer s.end()
	keys := []string{s.stepKeysKey(runID), s.stepsKey(runID)}
	lo, hi := "-", "+"
	switch end, ok := prefixEnd(scan.Prefix); {
	case scan.Exact && scan.Prefix == "":
		return nil // no step has an empty key
	case scan.Exact:
		lo = "[" + scan.Prefix
		hi = lo
	case scan.Prefix != "":
		lo = "[" + scan.Prefix
		if ok {
			hi = "(" + end
		}
	}
	skip := "0"
	if scan.SkipItems {
		skip = "1"
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		res, err := stepPageScript.Run(ctx, s.client, keys, lo, hi, pageSize, skip).Slice()
		if err != nil {
			return fmt.Errorf("reading steps of run %s: %w", runID, err)
		}
		if len(res) < 2 {
			return fmt.Errorf("reading steps of run %s: a page of %d values", runID, len(res))
		}
		// The page starts with how many keys it went through and the last
		// of them, which the next page starts after, skipped or not.
		scanned, _ := res[0].(int64)
		if last, _ := res[1].(string); last != "" {
			lo = "(" + last
		}
		page := res[2:]
		for i := 0; i+1 < len(page); i += 2 {
			if err := ctx.Err(); err != nil {
				return err
			}
			k, _ := page[i].(string)
			v, ok := page[i+1].(string)
			if !ok {
				return fmt.Errorf("decoding step %q of run %s (key %s): no record for an indexed key", k, runID, keys[1])
			}
			var st store.StepRecord
			if err := jsonx.Unmarshal([]byte(v), &st); err != nil {
				err = fmt.Errorf("%w: %w", store.ErrDamaged, err)
				return fmt.Errorf("decoding step %q of run %s (key %s): %w", k, runID, keys[1], err)
			}
			if err := fn(&st); err != nil {
				return err
			}
		}
		if scanned < pageSize {
			return nil
		}
	}
}

// prefixEnd returns the least string greater than every string starting
// with prefix, or false if there is none.
func prefixEnd(prefix string) (string, bool) {
	b := []byte(prefix)
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] < 0xff {
			b[i]++
			return string(b[:i+1]), true
		}
	}
	return "", false
}

// Events implements store.Store.
func (s *Store) Events(ctx context.Context, runID string, after uint64, limit int) ([]store.Event, error) {
	if err := s.begin(); err != nil {
		return nil, err
	}
	defer s.end()
	// Event seq n is at index n-1, so the events after seq `after` start
	// at index `after`.
	if after >= math.MaxInt64 {
		return nil, nil
	}
	start, stop := int64(after), int64(-1)
	if limit > 0 && int64(limit) <= math.MaxInt64-start {
		stop = start + int64(limit) - 1
	}
	vals, err := s.client.LRange(ctx, s.eventsKey(runID), start, stop).Result()
	if err != nil {
		return nil, fmt.Errorf("reading events of run %s: %w", runID, err)
	}
	var out []store.Event
	if len(vals) > 0 {
		out = make([]store.Event, len(vals))
	}
	for i, v := range vals {
		if err := jsonx.Unmarshal([]byte(v), &out[i]); err != nil {
			return nil, fmt.Errorf("decoding event %d of run %s (key %s): %w: %w", start+int64(i)+1, runID, s.eventsKey(runID), store.ErrDamaged, err)
		}
	}
	return out, nil
}

// ListRuns implements store.Store. The cursor is the index entry of the
// last run returned, as in the bolt store.
func (s *Store) ListRuns(ctx context.Context, f store.RunFilter) (store.RunPage, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = defaultListLimit
	}
	limit = min(limit, maxListLimit)
	if err := s.begin(); err != nil {
		return store.RunPage{}, err
	}
	defer s.end()
	hi, lo := "+", "-"
	if f.Cursor != "" {
		badCursor := fmt.Errorf("listing runs: cursor %q was not returned by this store: %w", f.Cursor, store.ErrInvalid)
		c, err := base64.RawURLEncoding.DecodeString(f.Cursor)
		if err != nil {
			return store.RunPage{}, badCursor
		}
		// A cursor is the index entry of a run listed before.
		switch err := s.client.ZScore(ctx, s.runsKey(), string(c)).Err(); {
		case errors.Is(err, goredis.Nil):
			return store.RunPage{}, badCursor
		case err != nil:
			return store.RunPage{}, fmt.Errorf("listing runs: %w", err)
		}
		hi = "(" + string(c)
	}
	if !f.Since.IsZero() {
		lo = "[" + indexMember(f.Since, "")
	}
	// Without filters, limit+1 entries tell whether there is a next page.
	chunk := limit + 1
	if f.Filtered() {
		chunk = pageSize
	}
	page, err := s.listRuns(ctx, f, lo, hi, chunk, limit)
	if err == nil && !f.NoOrigins {
		err = s.readOrigins(ctx, &page)
	}
	if err != nil {
		return store.RunPage{}, fmt.Errorf("listing runs: %w", err)
	}
	return page, nil
}

// listRuns pages through the index, reading runs without their origins,
// which only the runs that pass the filter need.
func (s *Store) listRuns(ctx context.Context, f store.RunFilter, lo, hi string, chunk, limit int) (store.RunPage, error) {
	var page store.RunPage
	var last string // index entry of the last run in page
	needles := labelNeedles(f.Labels)
	for {
		members, err := s.client.ZRevRangeByLex(ctx, s.runsKey(), &goredis.ZRangeBy{Min: lo, Max: hi, Count: int64(chunk)}).Result()
		if err != nil {
			return page, err
		}
		runs, err := s.readHeaders(ctx, members, needles)
		if err != nil {
			return page, err
		}
		for i, run := range runs {
			if run.Run == nil && run.err == nil {
				continue // it does not carry the labels
			}
			if run.err != nil {
				page.Damaged = append(page.Damaged, store.DamagedRun{ID: run.id, Error: run.err.Error()})
				continue
			}
			if !f.Keeps(run.Run) {
				continue
			}
			if len(page.Runs) == limit {
				page.Next = base64.RawURLEncoding.EncodeToString([]byte(last))
				return page, nil
			}
			page.Runs = append(page.Runs, run.Run)
			last = members[i]
		}
		if len(members) < chunk {
			return page, nil
		}
		hi = "(" + members[len(members)-1]
	}
}

// readOrigins fills in the page's origins in one round trip; a run whose
// origin cannot be read moves to the page's damaged runs.
func (s *Store) readOrigins(ctx context.Context, page *store.RunPage) error {
	runs := page.Runs
	cmds := make([]*goredis.StringCmd, len(runs))
	_, err := s.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for i, run := range runs {
			cmds[i] = p.HGet(ctx, s.runKey(run.ID), "o")
		}
		return nil
	})
	if err != nil && !errors.Is(err, goredis.Nil) {
		return err
	}
	page.Runs = runs[:0]
	for i, c := range cmds {
		o, err := c.Result()
		if err == nil {
			if err := jsonx.Unmarshal([]byte(o), &runs[i].Origin); err != nil {
				err = fmt.Errorf("decoding origin of run %s (key %s): %w: %w", runs[i].ID, s.runKey(runs[i].ID), store.ErrDamaged, err)
				page.Damaged = append(page.Damaged, store.DamagedRun{ID: runs[i].ID, Error: err.Error()})
				continue
			}
		}
		page.Runs = append(page.Runs, runs[i])
	}
	return nil
}

// listedRun is a run an index entry names, or why it cannot be read.
// labelNeedles are the texts a run's header must hold to carry labels, as
// its JSON writes them: a search by label decodes only the headers that
// hold them.
func labelNeedles(labels map[string]string) []string {
	var out []string
	for k, v := range labels {
		if v == "" {
			continue
		}
		kb, _ := jsonx.Marshal(k)
		vb, _ := jsonx.Marshal(v)
		out = append(out, string(kb)+":"+string(vb))
	}
	return out
}

func holdsAll(header string, needles []string) bool {
	for _, n := range needles {
		if !strings.Contains(header, n) {
			return false
		}
	}
	return true
}

type listedRun struct {
	*store.Run
	id  string
	err error
}

// readHeaders reads the runs of index entries, without their origins, in
// one round trip. A run that cannot be read back is returned with why.
func (s *Store) readHeaders(ctx context.Context, members []string, needles []string) ([]listedRun, error) {
	ids := make([]string, len(members))
	for i, m := range members {
		if len(m) < 16 {
			return nil, fmt.Errorf("decoding run index entry %q (key %s): too short", m, s.runsKey())
		}
		ids[i] = m[16:]
	}
	cmds := make([]*goredis.SliceCmd, len(ids))
	_, err := s.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for i, id := range ids {
			cmds[i] = p.HMGet(ctx, s.runKey(id), "h")
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	runs := make([]listedRun, len(ids))
	for i, c := range cmds {
		runs[i].id = ids[i]
		if h, ok := c.Val()[0].(string); ok && !holdsAll(h, needles) {
			continue
		}
		runs[i].Run, runs[i].err = s.decodeRun(ids[i], c.Val())
		if runs[i].err != nil && !errors.Is(runs[i].err, store.ErrDamaged) {
			return nil, runs[i].err
		}
	}
	return runs, nil
}

// UnfinishedRuns implements store.Store. Ids sort by creation time, so
// key order is oldest first.
func (s *Store) UnfinishedRuns(ctx context.Context) ([]string, error) {
	if err := s.begin(); err != nil {
		return nil, err
	}
	defer s.end()
	var ids []string
	err := s.scanIndex(ctx, s.unfinishedKey(), "", func(page []string) (bool, error) {
		ids = append(ids, page...)
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing unfinished runs: %w", err)
	}
	return ids, nil
}

// scanIndex calls fn with the members of a score-0 sorted set in key
// order, pageSize at a time, until fn returns false.
func (s *Store) scanIndex(ctx context.Context, key, after string, fn func([]string) (bool, error)) error {
	lo := "-"
	if after != "" {
		lo = "(" + after
	}
	for {
		page, err := s.client.ZRangeByLex(ctx, key, &goredis.ZRangeBy{Min: lo, Max: "+", Count: pageSize}).Result()
		if err != nil {
			return err
		}
		if len(page) == 0 {
			return nil
		}
		more, err := fn(page)
		if err != nil || !more || len(page) < pageSize {
			return err
		}
		lo = "(" + page[len(page)-1]
	}
}

// Definition implements store.Store.
func (s *Store) Definition(ctx context.Context, hash string) ([]byte, error) {
	if err := s.begin(); err != nil {
		return nil, err
	}
	defer s.end()
	v, err := s.client.Get(ctx, s.defKey(hash)).Bytes()
	if errors.Is(err, goredis.Nil) {
		return nil, fmt.Errorf("chain definition %s: %w", hash, store.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("reading chain definition %s: %w", hash, err)
	}
	return v, nil
}

// DLQ implements store.Store.
func (s *Store) DLQ(ctx context.Context, id string) (*store.DLQEntry, error) {
	if err := s.begin(); err != nil {
		return nil, err
	}
	defer s.end()
	v, err := s.client.HGet(ctx, s.dlqKey(), id).Result()
	if errors.Is(err, goredis.Nil) {
		return nil, fmt.Errorf("dead-letter entry %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("reading dead-letter entry %s: %w", id, err)
	}
	return s.decodeDLQ(id, v)
}

func (s *Store) decodeDLQ(id, v string) (*store.DLQEntry, error) {
	var d store.DLQEntry
	if err := jsonx.Unmarshal([]byte(v), &d); err != nil {
		return nil, fmt.Errorf("decoding dead-letter entry %s (key %s): %w", id, s.dlqKey(), err)
	}
	return &d, nil
}

// ListDLQ implements store.Store. Entry ids sort by creation time, so key
// order is oldest first.
func (s *Store) ListDLQ(ctx context.Context, f store.DLQFilter) ([]*store.DLQEntry, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = defaultListLimit
	}
	limit = min(limit, maxListLimit)
	if err := s.begin(); err != nil {
		return nil, err
	}
	defer s.end()
	var out []*store.DLQEntry
	err := s.scanIndex(ctx, s.dlqIDsKey(), f.After, func(ids []string) (bool, error) {
		vals, err := s.client.HMGet(ctx, s.dlqKey(), ids...).Result()
		if err != nil {
			return false, err
		}
		for i, v := range vals {
			str, ok := v.(string)
			if !ok {
				continue // deleted since the ids were read
			}
			d, err := s.decodeDLQ(ids[i], str)
			if err != nil {
				return false, err
			}
			if (f.Chain != "" && d.Chain != f.Chain) || (f.Step != "" && d.Step != f.Step) ||
				(!f.Since.IsZero() && d.CreatedAt.Before(f.Since)) {
				continue
			}
			out = append(out, d)
			if len(out) == limit {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing dead-letter entries: %w", err)
	}
	return out, nil
}

// DeleteDLQ implements store.Store.
func (s *Store) DeleteDLQ(ctx context.Context, id string) error {
	if err := s.begin(); err != nil {
		return err
	}
	defer s.end()
	var del *goredis.IntCmd
	_, err := s.client.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		del = p.HDel(ctx, s.dlqKey(), id)
		p.ZRem(ctx, s.dlqIDsKey(), id)
		return nil
	})
	if err != nil {
		return fmt.Errorf("deleting dead-letter entry %s: %w", id, err)
	}
	if del.Val() == 0 {
		return fmt.Errorf("dead-letter entry %s: %w", id, store.ErrNotFound)
	}
	return nil
}

// AddDLQ implements store.Store.
func (s *Store) AddDLQ(ctx context.Context, d *store.DLQEntry) error {
	v, err := jsonx.Marshal(d)
	if err != nil {
		return fmt.Errorf("encoding dead-letter entry %s: %w", d.ID, err)
	}
	return s.putIndexed(ctx, s.dlqKey(), s.dlqIDsKey(), d.ID, v)
}

// putIndexed writes a value under id in a hash and adds id to the sorted
// set that orders the hash's entries, in one transaction.
func (s *Store) putIndexed(ctx context.Context, hash, ids, id string, v []byte) error {
	if err := s.begin(); err != nil {
		return err
	}
	defer s.end()
	_, err := s.client.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		p.HSet(ctx, hash, id, v)
		p.ZAdd(ctx, ids, goredis.Z{Member: id})
		return nil
	})
	if err != nil {
		return fmt.Errorf("writing %s to %s: %w", id, hash, err)
	}
	return nil
}

// PutDelivery implements store.Store.
func (s *Store) PutDelivery(ctx context.Context, d *store.Delivery) error {
	v, err := jsonx.Marshal(d)
	if err != nil {
		return fmt.Errorf("encoding delivery %s: %w", d.ID, err)
	}
	return s.putIndexed(ctx, s.inboxKey(), s.inboxIDsKey(), d.ID, v)
}

// Deliveries implements store.Store.
func (s *Store) Deliveries(ctx context.Context, limit int) ([]*store.Delivery, error) {
	if err := s.begin(); err != nil {
		return nil, err
	}
	defer s.end()
	var out []*store.Delivery
	err := s.scanIndex(ctx, s.inboxIDsKey(), "", func(ids []string) (bool, error) {
		vals, err := s.client.HMGet(ctx, s.inboxKey(), ids...).Result()
		if err != nil {
			return false, err
		}
		for i, v := range vals {
			str, ok := v.(string)
			if !ok {
				continue // done since the ids were read
			}
			var d store.Delivery
			if err := jsonx.Unmarshal([]byte(str), &d); err != nil {
				return false, fmt.Errorf("decoding delivery %s: %w", ids[i], err)
			}
			out = append(out, &d)
			if limit > 0 && len(out) == limit {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing kept deliveries: %w", err)
	}
	return out, nil
}

// DeleteDelivery implements store.Store.
func (s *Store) DeleteDelivery(ctx context.Context, id string) error {
	if err := s.begin(); err != nil {
		return err
	}
	defer s.end()
	_, err := s.client.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		p.HDel(ctx, s.inboxKey(), id)
		p.ZRem(ctx, s.inboxIDsKey(), id)
		return nil
	})
	if err != nil {
		return fmt.Errorf("deleting delivery %s: %w", id, err)
	}
	return nil
}

// CountDLQ implements store.Store.
func (s *Store) CountDLQ(ctx context.Context) (int, error) {
	if err := s.begin(); err != nil {
		return 0, err
	}
	defer s.end()
	n, err := s.client.HLen(ctx, s.dlqKey()).Result()
	if err != nil {
		return 0, fmt.Errorf("counting dead-letter entries: %w", err)
	}
	return int(n), nil
}

// ttlMillis converts a TTL for PX, rounding up so a short TTL is not 0.
func ttlMillis(ttl time.Duration) (int64, error) {
	if ttl <= 0 {
		return 0, fmt.Errorf("ttl %v is not positive", ttl)
	}
	return int64((ttl + time.Millisecond - 1) / time.Millisecond), nil
}

// AcquireLease implements store.Store. Expires is reckoned from before the
// call, so this gateway never believes its lease outlives Redis's.
func (s *Store) AcquireLease(ctx context.Context, runID, owner string, ttl time.Duration) (store.Lease, error) {
	ms, err := ttlMillis(ttl)
	if err != nil {
		return store.Lease{}, fmt.Errorf("leasing run %s: %w", runID, err)
	}
	if err := s.begin(); err != nil {
		return store.Lease{}, err
	}
	defer s.end()
	start := time.Now()
	fence, err := acquireScript.Run(ctx, s.client, []string{s.leaseKey(runID), s.fenceKey(runID)}, owner, ms).Int64()
	switch {
	case err != nil:
		return store.Lease{}, fmt.Errorf("leasing run %s: %w", runID, err)
	case fence == 0:
		return store.Lease{}, fmt.Errorf("leasing run %s: %w", runID, store.ErrLeaseHeld)
	case fence < 0:
		return store.Lease{}, fmt.Errorf("leasing run %s: decoding lease (key %s): not owner|fence", runID, s.leaseKey(runID))
	}
	return store.Lease{RunID: runID, Owner: owner, Fence: uint64(fence), Expires: start.Add(ttl)}, nil
}

// RenewLease implements store.Store.
func (s *Store) RenewLease(ctx context.Context, l store.Lease, ttl time.Duration) (store.Lease, error) {
	ms, err := ttlMillis(ttl)
	if err != nil {
		return store.Lease{}, fmt.Errorf("renewing the lease on run %s: %w", l.RunID, err)
	}
	if err := s.begin(); err != nil {
		return store.Lease{}, err
	}
	defer s.end()
	start := time.Now()
	ok, err := renewScript.Run(ctx, s.client, []string{s.leaseKey(l.RunID)}, leaseToken(&l), ms).Int64()
	if err != nil {
		return store.Lease{}, fmt.Errorf("renewing the lease on run %s: %w", l.RunID, err)
	}
	if ok != 1 {
		return store.Lease{}, fmt.Errorf("renewing the lease on run %s: %w", l.RunID, store.ErrLeaseLost)
	}
	l.Expires = start.Add(ttl)
	return l, nil
}

// ReleaseLease implements store.Store.
func (s *Store) ReleaseLease(ctx context.Context, l store.Lease) error {
	if err := s.begin(); err != nil {
		return err
	}
	defer s.end()
	if err := releaseScript.Run(ctx, s.client, []string{s.leaseKey(l.RunID)}, leaseToken(&l)).Err(); err != nil {
		return fmt.Errorf("releasing the lease on run %s: %w", l.RunID, err)
	}
	return nil
}

// KeyRun implements store.Store.
func (s *Store) KeyRun(ctx context.Context, key string) (string, error) {
	if err := s.begin(); err != nil {
		return "", err
	}
	defer s.end()
	id, err := s.client.Get(ctx, s.idemKey(key)).Result()
	if errors.Is(err, goredis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading idempotency key: %w", err)
	}
	return id, nil
}

// ReleaseKey implements store.Store.
func (s *Store) ReleaseKey(ctx context.Context, key, runID string) error {
	if err := s.begin(); err != nil {
		return err
	}
	defer s.end()
	if err := releaseScript.Run(ctx, s.client, []string{s.idemKey(key)}, runID).Err(); err != nil {
		return fmt.Errorf("releasing idempotency key: %w", err)
	}
	return nil
}

// ForEachKey implements store.Store.
func (s *Store) ForEachKey(ctx context.Context, prefix string, fn func(key, bound string) error) error {
	if err := s.begin(); err != nil {
		return err
	}
	defer s.end()
	at := len(s.idemKey(""))
	seen := map[string]bool{}
	err := s.scanKeys(ctx, globEscape(s.idemKey(prefix))+"*", func(keys []string) error {
		for _, k := range keys {
			// SCAN may name a key twice, and a key may lapse before it
			// is read.
			if seen[k] {
				continue
			}
			seen[k] = true
			bound, err := s.client.Get(ctx, k).Result()
			switch {
			case errors.Is(err, goredis.Nil):
				continue
			case err != nil:
				return err
			}
			if err := fn(k[at:], bound); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("listing idempotency keys: %w", err)
	}
	return nil
}

// ClaimKey implements store.Store.
func (s *Store) ClaimKey(ctx context.Context, key, runID string, ttl time.Duration) (string, error) {
	if err := store.CheckKey(key); err != nil {
		return "", err
	}
	ms, err := ttlMillis(ttl)
	if err != nil {
		return "", fmt.Errorf("claiming idempotency key: %w", err)
	}
	if err := s.begin(); err != nil {
		return "", err
	}
	defer s.end()
	bound, err := claimScript.Run(ctx, s.client, []string{s.idemKey(key)}, runID, ms).Text()
	if errors.Is(err, goredis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("claiming idempotency key: %w", err)
	}
	return bound, nil
}
