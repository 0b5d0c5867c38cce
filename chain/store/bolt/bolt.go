// Package bolt is the embedded default store: one bbolt file, written by one
// process at a time, with concurrent commits grouped into one transaction
// and one fsync.
//
// It is the gateway's own package, with no compatibility promise.
package bolt

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	bbolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/internal/jsonx"
)

// A run's header, step records and events sit under one bucket, keyed by
// the run id, so a commit dirties few pages: bbolt rewrites every page from
// a changed leaf up to the root, and a step's commit writes the header and
// the run's newest events, which sort side by side (kindHeader), on one
// leaf and one path where a bucket of headers took a second. Its origin,
// written once but possibly large, lives in a bucket of its own, as a
// header next to a megabyte of origin would rewrite the megabyte with every
// step.
var (
	bucketMeta       = []byte("meta")
	bucketOrigins    = []byte("run_origins")
	bucketRuns       = []byte("runs")
	bucketRunIndex   = []byte("run_index") // created-at | id → nothing, for listing
	bucketUnfinished = []byte("unfinished")
	bucketDLQ        = []byte("dlq")
	bucketDefs       = []byte("definitions")
	bucketKeys       = []byte("idempotency_keys")
	bucketKeyExpiry  = []byte("idempotency_expiry") // expires-at | key → nothing, for sweeping
	bucketInbox      = []byte("deliveries")         // id → a kept trigger delivery
	allBuckets       = [][]byte{bucketMeta, bucketOrigins, bucketRuns, bucketRunIndex, bucketUnfinished, bucketDLQ, bucketDefs, bucketKeys, bucketKeyExpiry, bucketInbox,
		bucketFinished, bucketFinishedBy, bucketDeleting, bucketAudit}
)

// formatKey holds the file's layout version in the meta bucket.
var formatKey = []byte("format")

// format is the layout this code writes; a file in a format it does not
// know is refused rather than misread. Format 4 keeps a run's header beside
// its records; formats 2 and 3 (3 added values kept apart, apartMark) kept
// headers in a bucket of their own, which Open moves (moveHeaders).
const format = "4"

// movedFormats are the formats whose files Open brings to format.
var movedFormats = []string{"2", "3"}

// bucketOldHeaders held run headers before format 4.
var bucketOldHeaders = []byte("run_headers")

// A step record's body or an origin's payload above apartAbove is kept as
// a value of its own, under the record's key followed by a zero byte, and
// the record, encoded without it, starts with apartMark. bbolt takes the
// value as it is, so a split's 64 MB of results or a million hosts' payload
// is not copied into one encoding with its record first; and the key sorts
// right after the record's, so a scan finds it next.
const (
	apartMark  = 0x01
	apartAbove = 64 << 10
)

// apartKey is the key of the value kept apart from the record at key.
func apartKey(key []byte) []byte { return append(key[:len(key):len(key)], 0) }

// Record kinds within a run's key range. The header sorts right after the
// events, the newest of which a commit writes with it.
const (
	kindEvent  = 'e'
	kindHeader = 'h'
	kindStep   = 's'
)

func headerKey(runID string) []byte { return runKey(runID, kindHeader, nil) }

func runKey(runID string, kind byte, suffix []byte) []byte {
	b := make([]byte, 0, len(runID)+2+len(suffix))
	b = append(b, runID...)
	b = append(b, 0, kind)
	return append(b, suffix...)
}

// collectBefore is the size of a transaction from which the writer collects
// garbage, and gives the memory back, before it commits.
const collectBefore = 16 << 20

// maxGroup bounds how many commits share one transaction, so one fsync
// never waits behind an unbounded amount of work.
const maxGroup = 512

// Options tunes the store.
type Options struct {
	Logger *slog.Logger
	// LockTimeout is how long Open waits for another process to release the
	// file before giving up with store.ErrInUse. Default 500 ms.
	LockTimeout time.Duration
}

// Store is a store.Store on a bbolt file.
type Store struct {
	db     *bbolt.DB
	log    *slog.Logger
	reqs   chan *commitReq
	mu     sync.RWMutex // guards closed and sends on reqs
	closed bool
	done   chan struct{}
	// applying is held by whoever applies a group of commits: the writer
	// goroutine, or a committer that found no commit under way and writes
	// its own, with any that queue meanwhile, without waking the writer.
	// It guards seqs and written.
	applying sync.Mutex
	// seqs caches each unfinished run's last event sequence number.
	seqs map[string]uint64
	// written counts bytes committed since the mapping's pages were last
	// handed back.
	written int
	// background finishes, after a restart, the deletions of runs a
	// gateway began and did not finish.
	background     sync.WaitGroup
	stopBackground context.CancelFunc

	// Leases live in memory: the file lock already makes this process the
	// only writer, so they only keep the contract the engine relies on.
	leaseMu sync.Mutex
	leases  map[string]store.Lease
	fence   uint64 // one counter for all runs: it only has to grow
}

var _ store.Store = (*Store)(nil)

type commitReq struct {
	b    *store.Batch
	enc  encodedBatch
	done chan error
	// purge, set instead of b, deletes up to deleteChunk records of this
	// deleted run's, in the transaction of the commits waiting with it:
	// a large run goes without an fsync of its own for each chunk.
	purge string
	// purged is what the chunk deleted, and purgedAll whether it was the
	// last of them.
	purged    store.Freed
	purgedAll bool
	// write, set instead of b, is a small write (an audit entry, a key's
	// claim) that shares the transaction of the commits waiting with it.
	// What it changed before failing commits with the others, so it may
	// only change what stands on its own (ClaimKey's sweep of lapsed keys).
	write func(tx *bbolt.Tx) error
	what  string // what write does, for its error
}

// failed words the error of a transaction that did not commit.
func (r *commitReq) failed(err error) error {
	switch {
	case r.purge != "":
		return fmt.Errorf("deleting records of run %s: %w", r.purge, err)
	case r.write != nil:
		return fmt.Errorf("%s: %w", r.what, err)
	default:
		return fmt.Errorf("committing run %s: %w", r.b.Run.ID, err)
	}
}

// encodedBatch is a batch marshalled by the committing goroutine, so JSON
// encoding runs in parallel and the single writer only copies bytes.
type encodedBatch struct {
	header []byte
	origin []byte // only when the batch creates the run
	// payload is the origin's payload when it is kept apart.
	payload []byte
	steps   [][2][]byte
	// bodies are the step bodies kept apart, under their apartKey.
	bodies [][2][]byte
	events [][2][]byte
	dlq    [][2][]byte
}

// size is about how many bytes the batch writes.
func (e *encodedBatch) size() int {
	n := len(e.header) + len(e.origin) + len(e.payload)
	for _, kvs := range [][][2][]byte{e.steps, e.bodies, e.events, e.dlq} {
		for _, kv := range kvs {
			n += len(kv[0]) + len(kv[1])
		}
	}
	return n
}

// Open opens or creates the store file at path.
func Open(path string, opts Options) (*Store, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.LockTimeout <= 0 {
		opts.LockTimeout = 500 * time.Millisecond
	}
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, fmt.Errorf("creating store directory: %w", err)
		}
	}
	// The freelist is written with every commit, so that opening the file
	// reads it instead of every page: a store that had held a million-item
	// split took 12 s to open, and mapped all 420 MB of it in, for a runs
	// list.
	db, err := openCurrent(path, &bbolt.Options{
		Timeout:         opts.LockTimeout,
		FreelistType:    bbolt.FreelistMapType,
		InitialMmapSize: initialMmapSize(),
	})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, fmt.Errorf("opening store %s: %w (is another gateway running on this file?)", path, store.ErrInUse)
	}
	if err != nil {
		return nil, fmt.Errorf("opening store %s: %w", path, err)
	}
	// Idempotency claims batch; a lone one should not wait long for company.
	db.MaxBatchDelay = 2 * time.Millisecond
	var fileFormat string
	move := false
	indexFinished := func(tx *bbolt.Tx) error {
		if err := buildFinishedIndex(tx); err != nil {
			return fmt.Errorf("indexing the runs that ended: %w", err)
		}
		return nil
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		var err error
		if fileFormat, err = checkFormat(tx); err != nil {
			return err
		}
		for _, b := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		if fileFormat == "" {
			fileFormat = format
			if err := tx.Bucket(bucketMeta).Put(formatKey, []byte(format)); err != nil {
				return err
			}
		}
		// The index of finished runs reads headers where format 4 keeps
		// them, so it waits for the move.
		if move = fileFormat != format || tx.Bucket(bucketOldHeaders) != nil; move {
			return nil
		}
		return indexFinished(tx)
	})
	if err == nil && move {
		if err = moveHeaders(db, fileFormat, opts.Logger); err == nil {
			err = db.Update(indexFinished)
		}
	}
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("initialising store %s: %w", path, err)
	}
	s := &Store{
		db: db, log: opts.Logger, reqs: make(chan *commitReq, maxGroup), done: make(chan struct{}), seqs: map[string]uint64{},
		leases: map[string]store.Lease{},
	}
	go s.writer()
	var bg context.Context
	bg, s.stopBackground = context.WithCancel(context.Background())
	s.background.Go(func() { s.finishDeletes(bg) })
	return s, nil
}

// checkFormat returns the format of the file's layout, "" for a new file,
// and refuses one laid out by a version of the store this one cannot read.
func checkFormat(tx *bbolt.Tx) (string, error) {
	got := "1"
	if meta := tx.Bucket(bucketMeta); meta != nil {
		got = string(meta.Get(formatKey))
	} else if tx.Bucket(bucketRuns) == nil {
		return "", nil
	}
	if got != format && !slices.Contains(movedFormats, got) {
		return "", fmt.Errorf("the file is in store format %s, and this gateway reads %s: finish its runs with the gateway that wrote it, or start on a new file", got, readFormats())
	}
	return got, nil
}

// readFormats names the formats this gateway opens, for errors.
func readFormats() string {
	return "formats " + strings.Join(movedFormats, ", ") + " and " + format
}

// Moving headers takes transactions of up to moveChunk headers or
// moveBytes bytes, so a store of a million runs is not moved in one.
const (
	moveChunk = 10000
	moveBytes = 16 << 20
)

// moveHeaders brings a file laid out before format 4 to it: every run's
// header moves from the bucket of headers to its place beside the run's
// records. The first transaction marks the file format 4, so that no
// earlier gateway opens it half moved; a gateway that stops midway goes on
// at its next open, which finds the old bucket.
func moveHeaders(db *bbolt.DB, fileFormat string, log *slog.Logger) error {
	var moved, total int
	for {
		done := false
		err := db.Update(func(tx *bbolt.Tx) error {
			old := tx.Bucket(bucketOldHeaders)
			if old == nil {
				done = true
				if fileFormat == format {
					return nil
				}
				return tx.Bucket(bucketMeta).Put(formatKey, []byte(format))
			}
			if moved == 0 {
				total = old.Stats().KeyN
				log.Info("moving run headers beside their records (store format 4)", "from_format", fileFormat, "runs", total)
				if err := tx.Bucket(bucketMeta).Put(formatKey, []byte(format)); err != nil {
					return err
				}
			}
			runs := tx.Bucket(bucketRuns)
			c := old.Cursor()
			n, size := 0, 0
			for k, v := c.First(); k != nil; k, v = c.First() {
				if n == moveChunk || size >= moveBytes {
					return nil
				}
				if err := runs.Put(headerKey(string(k)), bytes.Clone(v)); err != nil {
					return err
				}
				if err := c.Delete(); err != nil {
					return err
				}
				n++
				size += len(v)
				moved++
			}
			done = true
			return tx.DeleteBucket(bucketOldHeaders)
		})
		if err != nil {
			return fmt.Errorf("moving run headers to store format %s: %w", format, err)
		}
		if done {
			if moved > 0 {
				log.Info("moved run headers beside their records", "runs", moved)
			}
			return nil
		}
		log.Info("moving run headers: part written", "moved", moved, "runs", total)
	}
}

// Path returns the store file's path.
func (s *Store) Path() string { return s.db.Path() }

// Close waits for queued commits, then closes the file.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.reqs)
	s.mu.Unlock()
	s.stopBackground()
	s.background.Wait()
	<-s.done
	return s.db.Close()
}

// Commit implements store.Store.
func (s *Store) Commit(ctx context.Context, b *store.Batch) error {
	if b == nil || b.Run == nil || b.Run.ID == "" {
		return errors.New("committing batch: batch has no run")
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := store.CheckClaim(b); err != nil {
		return fmt.Errorf("committing run %s: %w", b.Run.ID, err)
	}
	enc, err := encode(b)
	if err != nil {
		return fmt.Errorf("committing run %s: %w", b.Run.ID, err)
	}
	return s.submit(ctx, &commitReq{b: b, enc: enc, done: make(chan error, 1)})
}

// writeShared runs fn in the transaction of the commits waiting with it:
// one fsync for all of them. See commitReq.write for what fn may do.
func (s *Store) writeShared(ctx context.Context, what string, fn func(tx *bbolt.Tx) error) error {
	return s.submit(ctx, &commitReq{write: fn, what: what, done: make(chan error, 1)})
}

// submit has req applied in the next transaction: by the caller itself when
// none is under way, by the writer goroutine otherwise.
func (s *Store) submit(ctx context.Context, req *commitReq) error {
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return store.ErrClosed
	}
	if s.applying.TryLock() {
		s.applyHeld(s.collect(req))
		s.mu.RUnlock()
		return <-req.done
	}
	select {
	case s.reqs <- req:
	case <-ctx.Done():
		s.mu.RUnlock()
		return ctx.Err()
	}
	s.mu.RUnlock()
	// Once queued, the write happens; report its real outcome rather than
	// ctx's, so a caller never believes a durable write was lost.
	return <-req.done
}

func encode(b *store.Batch) (encodedBatch, error) {
	var e encodedBatch
	var err error
	// The origin never changes, so it is written once, apart from the
	// header that every commit rewrites.
	if e.header, err = store.MarshalHeader(b.Run); err != nil {
		return e, fmt.Errorf("encoding run: %w", err)
	}
	if b.Create {
		o := b.Run.Origin
		if len(o.Payload) > apartAbove {
			e.payload, o.Payload = o.Payload, nil
		}
		if e.origin, err = jsonx.Marshal(&o); err == nil {
			e.origin, err = markApart(e.origin, e.payload)
		}
		if err != nil {
			return e, fmt.Errorf("encoding origin: %w", err)
		}
	}
	for _, st := range b.Steps {
		key := runKey(b.Run.ID, kindStep, []byte(st.Key))
		rec, body := st, []byte(nil)
		if len(st.Body) > apartAbove {
			head := *st
			head.Body, body = nil, st.Body
			rec = &head
			e.bodies = append(e.bodies, [2][]byte{apartKey(key), body})
		}
		v, err := store.MarshalStep(rec)
		if err == nil {
			v, err = markApart(v, body)
		}
		if err != nil {
			return e, fmt.Errorf("encoding step %s: %w", st.Key, err)
		}
		e.steps = append(e.steps, [2][]byte{key, v})
	}
	for i := range b.Events {
		ev := &b.Events[i]
		ev.RunID = b.Run.ID
		v, err := store.MarshalEvent(ev)
		if err != nil {
			return e, fmt.Errorf("encoding event %d: %w", ev.Seq, err)
		}
		e.events = append(e.events, [2][]byte{eventKey(b.Run.ID, ev.Seq), v})
	}
	for _, d := range b.DLQ {
		v, err := jsonx.Marshal(d)
		if err != nil {
			return e, fmt.Errorf("encoding dead-letter entry: %w", err)
		}
		e.dlq = append(e.dlq, [2][]byte{[]byte(d.ID), v})
	}
	return e, nil
}

// markApart checks a value kept apart from its record, and marks the
// record's encoding as having one.
func markApart(head, apart []byte) ([]byte, error) {
	if apart == nil {
		return head, nil
	}
	if !json.Valid(apart) {
		return nil, errors.New("a value of it is not valid JSON")
	}
	return append([]byte{apartMark}, head...), nil
}

// writer applies queued commits, as many as are waiting, in one transaction.
func (s *Store) writer() {
	defer close(s.done)
	for req := range s.reqs {
		s.applying.Lock()
		s.applyHeld(s.collect(req))
	}
}

// applyHeld applies group and lets go of applying, which the caller holds.
// A bug met while applying fails the group's writes with an error that
// says so: the store is left unlocked and every caller answered, rather
// than the process brought down or the next commit left waiting for ever.
func (s *Store) applyHeld(group []*commitReq) {
	defer s.applying.Unlock()
	defer func() {
		p := recover()
		if p == nil {
			return
		}
		s.log.Error("writing to the store hit a bug; the writes of this transaction are reported failed", "panic", p, "stack", string(debug.Stack()))
		err := fmt.Errorf("writing to the store hit a bug: %v", p)
		for _, r := range group {
			select {
			case r.done <- r.failed(err):
			default: // answered already
			}
		}
	}()
	s.apply(group)
}

// yieldFrom is how many commits collect finds queued before it yields the
// processor for more, and groupYields how many times it does so at most.
const (
	yieldFrom   = 4
	groupYields = 2
)

// collect is first and the commits queued behind it, up to maxGroup; the
// caller holds applying. With several queued, other runs are busy
// committing too, and on a busy machine some of them wait for a processor
// with their commit ready: collect yields its own, while that brings more,
// so they join this transaction. A lone commit never waits for company.
func (s *Store) collect(first *commitReq) []*commitReq {
	group := make([]*commitReq, 1, 8)
	group[0] = first
	group, open := s.drain(group)
	for i := 0; open && i < groupYields && len(group) >= yieldFrom; i++ {
		n := len(group)
		runtime.Gosched()
		if group, open = s.drain(group); len(group) == n {
			break
		}
	}
	return group
}

// drain adds the commits queued now to group, up to maxGroup, and reports
// false once the queue is closed.
func (s *Store) drain(group []*commitReq) ([]*commitReq, bool) {
	for len(group) < maxGroup {
		select {
		case r, ok := <-s.reqs:
			if !ok {
				return group, false
			}
			group = append(group, r)
		default:
			return group, true
		}
	}
	return group, true
}

func (s *Store) apply(group []*commitReq) {
	size := 0
	for _, r := range group {
		size += r.enc.size()
	}
	if size >= collectBefore {
		// bbolt copies what it writes into pages of its own, here tens of
		// megabytes in one piece. The heap has grown to twice what is live,
		// in pieces too small for it: without this, the copy would come on
		// top of all that. Collecting and handing the free memory back
		// first costs a few milliseconds on a commit this large.
		debug.FreeOSMemory()
	}
	results := make([]error, len(group))
	// seqs seen in this transaction; they reach the cache only if it commits.
	pending := map[string]uint64{}
	err := s.db.Update(func(tx *bbolt.Tx) error {
		for i, r := range group {
			if r.purge != "" {
				results[i] = purgeChunk(tx, r)
				continue
			}
			if r.write != nil {
				if err := r.write(tx); err != nil {
					results[i] = r.failed(err)
				}
				continue
			}
			results[i] = s.applyOne(tx, r, pending)
		}
		return nil
	})
	if err == nil {
		for _, r := range group {
			if r.b == nil {
				continue
			}
			id := r.b.Run.ID
			if seq, ok := pending[id]; ok {
				if r.b.Run.Status.Final() {
					delete(s.seqs, id)
				} else {
					s.seqs[id] = seq
				}
			}
		}
	}
	for i, r := range group {
		switch {
		case err != nil:
			r.done <- r.failed(err)
		default:
			r.done <- results[i]
		}
		s.written += r.enc.size()
	}
	if s.written >= releaseEveryWrite {
		s.written = 0
		_ = s.db.View(func(tx *bbolt.Tx) error {
			releaseMapping(tx)
			return nil
		})
	}
}

// lastSeq returns the run's last event sequence number, and whether the
// run exists.
func (s *Store) lastSeq(runs *bbolt.Bucket, id string, pending map[string]uint64) (uint64, bool, error) {
	if seq, ok := pending[id]; ok {
		return seq, true, nil
	}
	if seq, ok := s.seqs[id]; ok {
		return seq, true, nil
	}
	v := runs.Get(headerKey(id))
	if v == nil {
		return 0, false, nil
	}
	var h struct {
		Seq uint64 `json:"seq"`
	}
	if err := jsonx.Unmarshal(v, &h); err != nil {
		return 0, true, fmt.Errorf("decoding run %s: %w", id, err)
	}
	return h.Seq, true, nil
}

// applyOne checks one batch against the stored state, then writes it.
// Checks come first so a rejected batch leaves nothing behind.
func (s *Store) applyOne(tx *bbolt.Tx, r *commitReq, pending map[string]uint64) error {
	run := r.b.Run
	if l := r.b.Lease; l != nil && !s.leaseCurrent(*l) {
		return fmt.Errorf("committing run %s: %w", run.ID, store.ErrLeaseLost)
	}
	runs := tx.Bucket(bucketRuns)
	// A run's records mostly arrive in key order (events by sequence, split
	// items by index), so full pages keep the file small; bbolt's default
	// of half-full pages suits random keys.
	runs.FillPercent = 0.9
	last, exists, err := s.lastSeq(runs, run.ID, pending)
	switch {
	case err != nil:
		return err
	case r.b.Create && exists:
		return fmt.Errorf("creating run %s: %w", run.ID, store.ErrExists)
	case !r.b.Create && !exists:
		return fmt.Errorf("committing run %s: %w", run.ID, store.ErrNotFound)
	}
	now := time.Now()
	if c := r.b.Claim; c != nil {
		if bound := keyHolder(tx, c.Key, now); bound != "" && bound != run.ID {
			return fmt.Errorf("creating run %s: %w", run.ID, &store.KeyBoundError{Key: c.Key, Run: bound})
		}
	}
	for _, ev := range r.b.Events {
		if ev.Seq != last+1 {
			return fmt.Errorf("committing run %s: event seq %d does not follow %d: %w", run.ID, ev.Seq, last, store.ErrConflict)
		}
		last = ev.Seq
	}
	if run.Seq != last {
		return fmt.Errorf("committing run %s: run seq %d, last event %d: %w", run.ID, run.Seq, last, store.ErrConflict)
	}

	id := []byte(run.ID)
	if err := runs.Put(headerKey(run.ID), r.enc.header); err != nil {
		return err
	}
	if r.b.Create {
		origins := tx.Bucket(bucketOrigins)
		if err := origins.Put(id, r.enc.origin); err != nil {
			return err
		}
		if r.enc.payload != nil {
			if err := origins.Put(apartKey(id), r.enc.payload); err != nil {
				return err
			}
		}
		if err := tx.Bucket(bucketRunIndex).Put(indexKey(run.CreatedAt, run.ID), nil); err != nil {
			return err
		}
		if !run.Status.Final() {
			if err := tx.Bucket(bucketUnfinished).Put(id, nil); err != nil {
				return err
			}
		}
	}
	unfinished := tx.Bucket(bucketUnfinished)
	switch {
	case run.Status.Final():
		if err := errors.Join(unfinished.Delete(id), indexFinished(tx, run)); err != nil {
			return err
		}
	case !r.b.Create && unfinished.Get(id) == nil:
		// A replayed run is unfinished again.
		if err := errors.Join(unfinished.Put(id, nil), unindexFinished(tx, id)); err != nil {
			return err
		}
	}
	for _, k := range r.b.DeleteSteps {
		key := runKey(run.ID, kindStep, []byte(k))
		if err := errors.Join(runs.Delete(key), runs.Delete(apartKey(key))); err != nil {
			return err
		}
	}
	for _, kv := range r.enc.steps {
		if kv[1][0] != apartMark {
			// A body kept apart is dropped with the record that had it.
			if old := runs.Get(kv[0]); len(old) > 0 && old[0] == apartMark {
				if err := runs.Delete(apartKey(kv[0])); err != nil {
					return err
				}
			}
		}
		if err := runs.Put(kv[0], kv[1]); err != nil {
			return err
		}
	}
	for _, kv := range r.enc.bodies {
		if err := runs.Put(kv[0], kv[1]); err != nil {
			return err
		}
	}
	for _, kv := range r.enc.events {
		if err := runs.Put(kv[0], kv[1]); err != nil {
			return err
		}
	}
	for _, kv := range r.enc.dlq {
		if err := tx.Bucket(bucketDLQ).Put(kv[0], kv[1]); err != nil {
			return err
		}
	}
	if d := r.b.Definition; d != nil {
		defs := tx.Bucket(bucketDefs)
		if defs.Get([]byte(d.Hash)) == nil {
			if err := defs.Put([]byte(d.Hash), d.Source); err != nil {
				return err
			}
		}
	}
	if c := r.b.Claim; c != nil {
		if _, err := bindKey(tx, c.Key, run.ID, c.TTL, now); err != nil {
			return err
		}
	}
	pending[run.ID] = last
	return nil
}

func eventKey(runID string, seq uint64) []byte {
	return runKey(runID, kindEvent, binary.BigEndian.AppendUint64(make([]byte, 0, 8), seq))
}

func indexKey(t time.Time, id string) []byte {
	b := binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(id)), uint64(t.UnixNano()))
	return append(b, id...)
}

func (s *Store) view(fn func(tx *bbolt.Tx) error) error {
	s.mu.RLock()
	closed := s.closed
	s.mu.RUnlock()
	if closed {
		return store.ErrClosed
	}
	return s.db.View(fn)
}

// RunHeader implements store.Store.
func (s *Store) RunHeader(ctx context.Context, id string) (*store.Run, error) {
	var run *store.Run
	err := s.view(func(tx *bbolt.Tx) error {
		var err error
		run, err = readHeader(tx, id)
		return err
	})
	return run, err
}

// Run implements store.Store.
func (s *Store) Run(ctx context.Context, id string) (*store.Run, error) {
	var run *store.Run
	err := s.view(func(tx *bbolt.Tx) error {
		var err error
		if run, err = readHeader(tx, id); err != nil {
			return err
		}
		return readOrigin(tx, run)
	})
	return run, err
}

// readHeader reads a run without its origin.
// labelNeedles are the bytes a run's header must hold to carry labels, as
// its JSON writes them: a search by label decodes only the headers that
// hold them, not every run's.
func labelNeedles(labels map[string]string) [][]byte {
	var out [][]byte
	for k, v := range labels {
		if v == "" {
			continue
		}
		kb, _ := jsonx.Marshal(k)
		vb, _ := jsonx.Marshal(v)
		out = append(out, append(append(kb, ':'), vb...))
	}
	return out
}

// holdsAll reports whether raw holds every needle; a header that is not
// there passes, for readHeader to report.
func holdsAll(raw []byte, needles [][]byte) bool {
	if raw == nil {
		return true
	}
	for _, n := range needles {
		if !bytes.Contains(raw, n) {
			return false
		}
	}
	return true
}

func readHeader(tx *bbolt.Tx, id string) (*store.Run, error) {
	return decodeHeader(id, tx.Bucket(bucketRuns).Get(headerKey(id)))
}

// decodeHeader decodes the header v read for run id.
func decodeHeader(id string, v []byte) (*store.Run, error) {
	if v == nil {
		return nil, fmt.Errorf("run %s: %w", id, store.ErrNotFound)
	}
	var run store.Run
	if err := jsonx.Unmarshal(v, &run); err != nil {
		return nil, fmt.Errorf("decoding run %s: %w: %w", id, store.ErrDamaged, err)
	}
	return &run, nil
}

func readOrigin(tx *bbolt.Tx, run *store.Run) error {
	origins := tx.Bucket(bucketOrigins)
	o := origins.Get([]byte(run.ID))
	if o == nil {
		return nil
	}
	read := mappedRead{tx: tx}
	defer read.done()
	apart := len(o) > 0 && o[0] == apartMark
	if apart {
		o = o[1:]
	}
	if err := jsonx.Unmarshal(o, &run.Origin); err != nil {
		return fmt.Errorf("decoding origin of run %s: %w: %w", run.ID, store.ErrDamaged, err)
	}
	read.note(len(o))
	if apart {
		p := origins.Get(apartKey([]byte(run.ID)))
		if p == nil {
			return fmt.Errorf("reading origin of run %s: its payload is missing: %w", run.ID, store.ErrDamaged)
		}
		run.Origin.Payload = read.copyOut(p)
	}
	return nil
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

// ForEachStep implements store.Store.
func (s *Store) ForEachStep(ctx context.Context, runID string, scan store.StepScan, fn func(*store.StepRecord) error) error {
	return s.view(func(tx *bbolt.Tx) error {
		p := runKey(runID, kindStep, []byte(scan.Prefix))
		c := tx.Bucket(bucketRuns).Cursor()
		read := mappedRead{tx: tx}
		defer read.done()
		for k, v := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, v = c.Next() {
			if err := ctx.Err(); err != nil {
				return err
			}
			if scan.Exact && len(k) != len(p) {
				break
			}
			read.note(len(k))
			if k[len(k)-1] == 0 {
				continue // a value kept apart, read with its record
			}
			if scan.SkipItems && bytes.IndexByte(k[len(p)-len(scan.Prefix):], '[') >= 0 { // store.IsItemKey without a copy
				continue
			}
			apart := len(v) > 0 && v[0] == apartMark
			if apart {
				v = v[1:]
			}
			var st store.StepRecord
			if err := jsonx.Unmarshal(v, &st); err != nil {
				return fmt.Errorf("decoding step %q of run %s: %w: %w", k[len(p)-len(scan.Prefix):], runID, store.ErrDamaged, err)
			}
			read.note(len(v))
			if apart {
				bk, body := c.Next()
				if !bytes.Equal(bk, apartKey(k)) {
					return fmt.Errorf("reading step %q of run %s: its body is missing: %w", k[len(p)-len(scan.Prefix):], runID, store.ErrDamaged)
				}
				st.Body = read.copyOut(body)
			}
			if err := fn(&st); err != nil {
				return err
			}
			if scan.Exact {
				break
			}
		}
		return nil
	})
}

// Events implements store.Store.
func (s *Store) Events(ctx context.Context, runID string, after uint64, limit int) ([]store.Event, error) {
	var out []store.Event
	if after == math.MaxUint64 {
		return nil, nil // nothing comes after; after+1 would wrap to the start
	}
	err := s.view(func(tx *bbolt.Tx) error {
		p := runKey(runID, kindEvent, nil)
		c := tx.Bucket(bucketRuns).Cursor()
		for k, v := c.Seek(eventKey(runID, after+1)); k != nil && bytes.HasPrefix(k, p); k, v = c.Next() {
			if limit > 0 && len(out) >= limit {
				break
			}
			var ev store.Event
			if err := jsonx.Unmarshal(v, &ev); err != nil {
				return fmt.Errorf("decoding an event of run %s: %w: %w", runID, store.ErrDamaged, err)
			}
			out = append(out, ev)
		}
		return nil
	})
	return out, err
}

const (
	defaultListLimit = 50
	maxListLimit     = 1000
)

// ListRuns implements store.Store.
func (s *Store) ListRuns(ctx context.Context, f store.RunFilter) (store.RunPage, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = defaultListLimit
	}
	limit = min(limit, maxListLimit)
	var start []byte
	if f.Cursor != "" {
		var err error
		start, err = base64.RawURLEncoding.DecodeString(f.Cursor)
		if err != nil || len(start) <= 8 {
			return store.RunPage{}, badCursor(f.Cursor)
		}
	}
	var page store.RunPage
	err := s.view(func(tx *bbolt.Tx) error {
		// A cursor is the index entry of a run listed before.
		if start != nil && tx.Bucket(bucketRunIndex).Get(start) == nil {
			return badCursor(f.Cursor)
		}
		c := tx.Bucket(bucketRunIndex).Cursor()
		var k []byte
		if start == nil {
			k, _ = c.Last()
		} else {
			// The cursor is the last key returned; continue just before it.
			if k, _ = c.Seek(start); k == nil {
				k, _ = c.Last()
			}
			if k != nil && bytes.Compare(k, start) >= 0 {
				k, _ = c.Prev()
			}
		}
		needles := labelNeedles(f.Labels)
		runs := tx.Bucket(bucketRuns)
		for ; k != nil; k, _ = c.Prev() {
			if err := ctx.Err(); err != nil {
				return err
			}
			created := time.Unix(0, int64(binary.BigEndian.Uint64(k[:8])))
			if !f.Since.IsZero() && created.Before(f.Since) {
				break
			}
			raw := runs.Get(headerKey(string(k[8:])))
			if !holdsAll(raw, needles) {
				continue
			}
			run, err := decodeHeader(string(k[8:]), raw)
			if errors.Is(err, store.ErrDamaged) {
				page.Damaged = append(page.Damaged, store.DamagedRun{ID: string(k[8:]), Error: err.Error()})
				continue
			}
			if err != nil {
				return err
			}
			if !f.Keeps(run) {
				continue
			}
			if len(page.Runs) == limit {
				page.Next = base64.RawURLEncoding.EncodeToString(indexKey(page.Runs[limit-1].CreatedAt, page.Runs[limit-1].ID))
				break
			}
			if f.NoOrigins {
				page.Runs = append(page.Runs, run)
				continue
			}
			if err := readOrigin(tx, run); errors.Is(err, store.ErrDamaged) {
				page.Damaged = append(page.Damaged, store.DamagedRun{ID: run.ID, Error: err.Error()})
				continue
			} else if err != nil {
				return err
			}
			page.Runs = append(page.Runs, run)
		}
		return nil
	})
	return page, err
}

func badCursor(c string) error {
	return fmt.Errorf("listing runs: cursor %q was not returned by this store: %w", c, store.ErrInvalid)
}

// UnfinishedRuns implements store.Store.
func (s *Store) UnfinishedRuns(ctx context.Context) ([]string, error) {
	var ids []string
	err := s.view(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketUnfinished).ForEach(func(k, _ []byte) error {
			ids = append(ids, string(k))
			return nil
		})
	})
	return ids, err
}

// Definition implements store.Store.
func (s *Store) Definition(ctx context.Context, hash string) ([]byte, error) {
	var out []byte
	err := s.view(func(tx *bbolt.Tx) error {
		v := tx.Bucket(bucketDefs).Get([]byte(hash))
		if v == nil {
			return fmt.Errorf("chain definition %s: %w", hash, store.ErrNotFound)
		}
		out = append([]byte(nil), v...)
		return nil
	})
	return out, err
}

// DLQ implements store.Store.
func (s *Store) DLQ(ctx context.Context, id string) (*store.DLQEntry, error) {
	var d store.DLQEntry
	err := s.view(func(tx *bbolt.Tx) error {
		v := tx.Bucket(bucketDLQ).Get([]byte(id))
		if v == nil {
			return fmt.Errorf("dead-letter entry %s: %w", id, store.ErrNotFound)
		}
		return jsonx.Unmarshal(v, &d)
	})
	if err != nil {
		return nil, err
	}
	return &d, nil
}

// ListDLQ implements store.Store.
func (s *Store) ListDLQ(ctx context.Context, f store.DLQFilter) ([]*store.DLQEntry, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = defaultListLimit
	}
	limit = min(limit, maxListLimit)
	var out []*store.DLQEntry
	err := s.view(func(tx *bbolt.Tx) error {
		c := tx.Bucket(bucketDLQ).Cursor()
		k, v := c.First()
		if f.After != "" {
			if k, v = c.Seek([]byte(f.After)); k != nil && string(k) == f.After {
				k, v = c.Next()
			}
		}
		for ; k != nil && len(out) < limit; k, v = c.Next() {
			var d store.DLQEntry
			if err := jsonx.Unmarshal(v, &d); err != nil {
				return fmt.Errorf("decoding dead-letter entry %s: %w", k, err)
			}
			if (f.Chain != "" && d.Chain != f.Chain) || (f.Step != "" && d.Step != f.Step) ||
				(!f.Since.IsZero() && d.CreatedAt.Before(f.Since)) {
				continue
			}
			out = append(out, &d)
		}
		return nil
	})
	return out, err
}

// DeleteDLQ implements store.Store.
func (s *Store) DeleteDLQ(ctx context.Context, id string) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return store.ErrClosed
	}
	return s.db.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketDLQ)
		if b.Get([]byte(id)) == nil {
			return fmt.Errorf("dead-letter entry %s: %w", id, store.ErrNotFound)
		}
		return b.Delete([]byte(id))
	})
}

// AddDLQ implements store.Store.
func (s *Store) AddDLQ(ctx context.Context, d *store.DLQEntry) error {
	v, err := jsonx.Marshal(d)
	if err != nil {
		return fmt.Errorf("encoding dead-letter entry %s: %w", d.ID, err)
	}
	return s.batch(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketDLQ).Put([]byte(d.ID), v)
	})
}

// batch runs fn in a write transaction shared with other writes arriving
// together: one fsync for all of them. fn may run more than once.
func (s *Store) batch(fn func(tx *bbolt.Tx) error) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return store.ErrClosed
	}
	return s.db.Batch(fn)
}

// PutDelivery implements store.Store.
func (s *Store) PutDelivery(ctx context.Context, d *store.Delivery) error {
	v, err := jsonx.Marshal(d)
	if err != nil {
		return fmt.Errorf("encoding delivery %s: %w", d.ID, err)
	}
	if err := s.batch(func(tx *bbolt.Tx) error { return tx.Bucket(bucketInbox).Put([]byte(d.ID), v) }); err != nil {
		return fmt.Errorf("keeping delivery %s: %w", d.ID, err)
	}
	return nil
}

// Deliveries implements store.Store.
func (s *Store) Deliveries(ctx context.Context, limit int) ([]*store.Delivery, error) {
	var out []*store.Delivery
	err := s.view(func(tx *bbolt.Tx) error {
		c := tx.Bucket(bucketInbox).Cursor()
		for k, v := c.First(); k != nil && (limit <= 0 || len(out) < limit); k, v = c.Next() {
			var d store.Delivery
			if err := jsonx.Unmarshal(v, &d); err != nil {
				return fmt.Errorf("decoding delivery %s: %w", k, err)
			}
			out = append(out, &d)
		}
		return nil
	})
	return out, err
}

// DeleteDelivery implements store.Store.
func (s *Store) DeleteDelivery(ctx context.Context, id string) error {
	return s.batch(func(tx *bbolt.Tx) error { return tx.Bucket(bucketInbox).Delete([]byte(id)) })
}

// CountDLQ implements store.Store.
func (s *Store) CountDLQ(ctx context.Context) (int, error) {
	var n int
	err := s.view(func(tx *bbolt.Tx) error {
		n = tx.Bucket(bucketDLQ).Stats().KeyN
		return nil
	})
	return n, err
}

// AcquireLease implements store.Store.
func (s *Store) AcquireLease(ctx context.Context, runID, owner string, ttl time.Duration) (store.Lease, error) {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	now := time.Now()
	if cur, ok := s.leases[runID]; ok && now.Before(cur.Expires) {
		if cur.Owner != owner {
			return store.Lease{}, fmt.Errorf("leasing run %s: %w", runID, store.ErrLeaseHeld)
		}
		cur.Expires = now.Add(ttl)
		s.leases[runID] = cur
		return cur, nil
	}
	s.fence++
	l := store.Lease{RunID: runID, Owner: owner, Fence: s.fence, Expires: now.Add(ttl)}
	s.leases[runID] = l
	return l, nil
}

// RenewLease implements store.Store.
func (s *Store) RenewLease(ctx context.Context, l store.Lease, ttl time.Duration) (store.Lease, error) {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	if !s.leaseCurrentLocked(l) {
		return store.Lease{}, fmt.Errorf("renewing the lease on run %s: %w", l.RunID, store.ErrLeaseLost)
	}
	l.Expires = time.Now().Add(ttl)
	s.leases[l.RunID] = l
	return l, nil
}

// ReleaseLease implements store.Store.
func (s *Store) ReleaseLease(ctx context.Context, l store.Lease) error {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	if s.leaseCurrentLocked(l) {
		delete(s.leases, l.RunID)
	}
	return nil
}

func (s *Store) leaseCurrent(l store.Lease) bool {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	return s.leaseCurrentLocked(l)
}

func (s *Store) leaseCurrentLocked(l store.Lease) bool {
	cur, ok := s.leases[l.RunID]
	return ok && cur.Owner == l.Owner && cur.Fence == l.Fence && time.Now().Before(cur.Expires)
}

// KeyRun implements store.Store.
func (s *Store) KeyRun(ctx context.Context, key string) (string, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return "", store.ErrClosed
	}
	var id string
	err := s.db.View(func(tx *bbolt.Tx) error {
		id = keyHolder(tx, key, time.Now())
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("reading idempotency key: %w", err)
	}
	return id, nil
}

// ClaimKey implements store.Store.
func (s *Store) ClaimKey(ctx context.Context, key, runID string, ttl time.Duration) (string, error) {
	if err := store.CheckKey(key); err != nil {
		return "", err
	}
	var existing string
	// Claims share the transaction of the commits waiting with them.
	err := s.writeShared(ctx, "claiming idempotency key", func(tx *bbolt.Tx) error {
		var err error
		existing, err = bindKey(tx, key, runID, ttl, time.Now())
		return err
	})
	if err != nil {
		return "", err
	}
	return existing, nil
}

// keyHolder is the run a live binding of key holds it for, or "".
func keyHolder(tx *bbolt.Tx, key string, now time.Time) string {
	if v := tx.Bucket(bucketKeys).Get([]byte(key)); len(v) > 8 && now.Before(time.Unix(0, int64(binary.BigEndian.Uint64(v[:8])))) {
		return string(v[8:])
	}
	return ""
}

// bindKey binds key to runID for ttl from now, unless a live binding holds
// it for another run, which it returns; one holding it for runID is bound
// anew.
func bindKey(tx *bbolt.Tx, key, runID string, ttl time.Duration, now time.Time) (string, error) {
	keys, expiry := tx.Bucket(bucketKeys), tx.Bucket(bucketKeyExpiry)
	if err := sweepKeys(keys, expiry, now); err != nil {
		return "", err
	}
	if v := keys.Get([]byte(key)); len(v) > 8 {
		if exp := time.Unix(0, int64(binary.BigEndian.Uint64(v[:8]))); now.Before(exp) {
			if bound := string(v[8:]); bound != runID {
				return bound, nil
			}
			if err := expiry.Delete(append(append([]byte(nil), v[:8]...), key...)); err != nil {
				return "", err
			}
		}
	}
	exp := binary.BigEndian.AppendUint64(nil, uint64(now.Add(ttl).UnixNano()))
	if err := keys.Put([]byte(key), append(exp, runID...)); err != nil {
		return "", err
	}
	return "", expiry.Put(append(exp, key...), nil)
}

// ReleaseKey implements store.Store.
func (s *Store) ReleaseKey(ctx context.Context, key, runID string) error {
	err := s.batch(func(tx *bbolt.Tx) error {
		keys, expiry := tx.Bucket(bucketKeys), tx.Bucket(bucketKeyExpiry)
		v := keys.Get([]byte(key))
		if len(v) <= 8 || string(v[8:]) != runID {
			return nil
		}
		if err := expiry.Delete(append(append([]byte(nil), v[:8]...), key...)); err != nil {
			return err
		}
		return keys.Delete([]byte(key))
	})
	if err != nil {
		return fmt.Errorf("releasing idempotency key: %w", err)
	}
	return nil
}

// ForEachKey implements store.Store. fn runs inside a read transaction:
// it must not write to the store.
func (s *Store) ForEachKey(ctx context.Context, prefix string, fn func(key, bound string) error) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return store.ErrClosed
	}
	now := time.Now()
	err := s.db.View(func(tx *bbolt.Tx) error {
		c := tx.Bucket(bucketKeys).Cursor()
		for k, v := c.Seek([]byte(prefix)); k != nil && bytes.HasPrefix(k, []byte(prefix)); k, v = c.Next() {
			if len(v) <= 8 || !now.Before(time.Unix(0, int64(binary.BigEndian.Uint64(v[:8])))) {
				continue
			}
			if err := fn(string(k), string(v[8:])); err != nil {
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

// sweepBatch bounds how many expired keys one claim removes, so a claim
// after a long quiet spell stays quick; later claims remove the rest.
const sweepBatch = 64

// sweepKeys removes idempotency keys that have expired, oldest first.
func sweepKeys(keys, expiry *bbolt.Bucket, now time.Time) error {
	c := expiry.Cursor()
	for range sweepBatch {
		k, _ := c.First()
		if len(k) <= 8 {
			return nil
		}
		exp := k[:8]
		if !now.After(time.Unix(0, int64(binary.BigEndian.Uint64(exp)))) {
			return nil
		}
		// The key may have been claimed again since, with a later expiry.
		if v := keys.Get(k[8:]); len(v) > 8 && bytes.Equal(v[:8], exp) {
			if err := keys.Delete(k[8:]); err != nil {
				return err
			}
		}
		if err := c.Delete(); err != nil {
			return err
		}
	}
	return nil
}
