// Package memory is a store kept in the process's memory: nothing survives
// the process. It is what `gateway test` runs chains on, many test cases at
// once in one process, with no store file.
//
// It is the gateway's own package, with no compatibility promise.
package memory

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/chaingate/gateway/chain/store"
)

// Records are copied on the way in and on the way out, so that neither
// the engine, which changes a run's record after committing it, nor a
// caller changing what it read, reaches the store's own. A stored record
// is never changed afterwards, only replaced: a read takes pointers under
// the lock and copies them after it, and a commit waits for no copy.

// Store is a store.Store in memory.
type Store struct {
	mu     sync.Mutex
	closed bool
	runs   map[string]*runState
	// index holds every run by creation time, then id, oldest first: the
	// order listings go through backwards.
	index      []indexEntry
	unfinished map[string]struct{}
	// finished files each run that has ended by how and when it ended.
	finished    map[string]finishedEntry
	dlq         map[string]*store.DLQEntry
	dlqIDs      []string // sorted, the order entries are listed in
	deliveries  map[string]*store.Delivery
	deliveryIDs []string // sorted, oldest first
	defs        map[string][]byte
	keys        map[string]binding
	// sweepAt is how many keys there may be before lapsed ones are swept.
	sweepAt int
	leases  map[string]store.Lease
	fence   uint64 // one counter for all runs: it only has to grow
	// slots are the concurrency keys held or queued for (slots.go).
	slots map[string]*store.SlotState
	// audit is the audit log by id, auditIDs its ids in order.
	audit    map[string]*store.AuditEntry
	auditIDs []string
}

var _ store.Store = (*Store)(nil)

type runState struct {
	header *store.Run // without its origin
	origin store.Origin
	// created is the run's place in the index, as it was created: a later
	// commit may say otherwise.
	created uint64
	steps   map[string]*store.StepRecord
	// order is the steps' keys in order while ordered; a key added out of
	// order, or removed, leaves it to be sorted again by the next scan.
	order   []string
	ordered bool
	events  []store.Event // events[i].Seq is i+1
}

type indexEntry struct {
	created uint64 // unixNano
	id      string
}

func compareEntries(a, b indexEntry) int {
	return cmp.Or(cmp.Compare(a.created, b.created), strings.Compare(a.id, b.id))
}

type finishedEntry struct {
	status store.RunStatus
	ended  uint64
}

type binding struct {
	runID   string
	expires time.Time
}

// New returns an empty store.
func New() *Store {
	return &Store{
		runs: map[string]*runState{}, unfinished: map[string]struct{}{}, finished: map[string]finishedEntry{},
		dlq: map[string]*store.DLQEntry{}, deliveries: map[string]*store.Delivery{}, defs: map[string][]byte{},
		keys: map[string]binding{}, sweepAt: minSweep, leases: map[string]store.Lease{}, audit: map[string]*store.AuditEntry{},
	}
}

// Close implements store.Store.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

// lock takes the store's lock, or fails once the store is closed.
func (s *Store) lock() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return store.ErrClosed
	}
	return nil
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
	c, err := copyBatch(b)
	if err != nil {
		return fmt.Errorf("committing run %s: %w", b.Run.ID, err)
	}
	if err := s.lock(); err != nil {
		return err
	}
	defer s.mu.Unlock()
	return s.apply(c, b)
}

// copyBatch copies what a batch stores, and checks that its JSON values
// are JSON, as the stores that encode them refuse one that is not.
func copyBatch(b *store.Batch) (*store.Batch, error) {
	c := &store.Batch{Run: copyRun(b.Run)}
	if notJSON(c.Run.Body) {
		return nil, errNotJSON("its body")
	}
	if b.Create {
		// The origin is written once, with the run; later commits' is not read.
		c.Run.Origin = copyOrigin(b.Run.Origin)
		if notJSON(c.Run.Origin.Payload) || notJSON(c.Run.Origin.Metadata) {
			return nil, errNotJSON("its origin")
		}
	}
	c.Steps = make([]*store.StepRecord, len(b.Steps))
	for i, st := range b.Steps {
		if notJSON(st.Body) {
			return nil, errNotJSON("the body of step " + st.Key)
		}
		c.Steps[i] = copyStep(st)
	}
	c.Events = make([]store.Event, len(b.Events))
	for i := range b.Events {
		ev := &c.Events[i]
		if notJSON(b.Events[i].Data) {
			return nil, errNotJSON(fmt.Sprintf("the data of event %d", b.Events[i].Seq))
		}
		*ev = copyEvent(&b.Events[i])
		ev.RunID = b.Run.ID
	}
	c.DLQ = make([]*store.DLQEntry, len(b.DLQ))
	for i, d := range b.DLQ {
		if err := checkDLQ(d); err != nil {
			return nil, err
		}
		c.DLQ[i] = copyDLQ(d)
	}
	if d := b.Definition; d != nil {
		if d.Hash == "" {
			return nil, fmt.Errorf("a chain definition has no hash: %w", store.ErrInvalid)
		}
		c.Definition = &store.Definition{Hash: d.Hash, Source: bytes.Clone(d.Source)}
	}
	return c, nil
}

// notJSON reports whether a value is not JSON, which the stores that
// encode their records refuse: a run must read the same on every store.
func notJSON(v json.RawMessage) bool { return len(v) > 0 && !json.Valid(v) }

func errNotJSON(what string) error {
	return fmt.Errorf("%s is not valid JSON: %w", what, store.ErrInvalid)
}

// apply checks a copied batch against the stored state, then writes it;
// b is the batch as handed in, for what is only read. Checks come first,
// so that a rejected batch leaves nothing behind.
func (s *Store) apply(c, b *store.Batch) error {
	run := c.Run
	if l := b.Lease; l != nil && !s.leaseCurrent(*l) {
		return fmt.Errorf("committing run %s: %w", run.ID, store.ErrLeaseLost)
	}
	r, exists := s.runs[run.ID]
	switch {
	case b.Create && exists:
		return fmt.Errorf("creating run %s: %w", run.ID, store.ErrExists)
	case !b.Create && !exists:
		return fmt.Errorf("committing run %s: %w", run.ID, store.ErrNotFound)
	}
	now := time.Now()
	if cl := b.Claim; cl != nil {
		if bound := s.keyHolder(cl.Key, now); bound != "" && bound != run.ID {
			return fmt.Errorf("creating run %s: %w", run.ID, &store.KeyBoundError{Key: cl.Key, Run: bound})
		}
	}
	var last uint64
	if exists {
		last = r.header.Seq
	}
	for _, ev := range c.Events {
		if ev.Seq != last+1 {
			return fmt.Errorf("committing run %s: event seq %d does not follow %d: %w", run.ID, ev.Seq, last, store.ErrConflict)
		}
		last = ev.Seq
	}
	if run.Seq != last {
		return fmt.Errorf("committing run %s: run seq %d, last event %d: %w", run.ID, run.Seq, last, store.ErrConflict)
	}

	if cl := b.Claim; cl != nil {
		s.bindKey(cl.Key, run.ID, cl.TTL, now)
	}
	if b.Create {
		r = &runState{origin: run.Origin, created: unixNano(run.CreatedAt), steps: map[string]*store.StepRecord{}, ordered: true}
		run.Origin = store.Origin{}
		s.runs[run.ID] = r
		e := indexEntry{r.created, run.ID}
		i, _ := slices.BinarySearchFunc(s.index, e, compareEntries)
		s.index = slices.Insert(s.index, i, e)
		if !run.Status.Final() {
			s.unfinished[run.ID] = struct{}{}
		}
	}
	_, wasUnfinished := s.unfinished[run.ID]
	switch {
	case run.Status.Final():
		delete(s.unfinished, run.ID)
		s.finished[run.ID] = finishedEntry{run.Status, unixNano(ended(run))}
	case !wasUnfinished:
		// A replayed run is unfinished again.
		s.unfinished[run.ID] = struct{}{}
		delete(s.finished, run.ID)
	}
	r.header = run
	for _, k := range b.DeleteSteps {
		if _, ok := r.steps[k]; ok {
			delete(r.steps, k)
			r.ordered = false
		}
	}
	for _, st := range c.Steps {
		if _, ok := r.steps[st.Key]; !ok && r.ordered {
			if n := len(r.order); n == 0 || st.Key > r.order[n-1] {
				r.order = append(r.order, st.Key)
			} else {
				r.ordered = false
			}
		}
		r.steps[st.Key] = st
	}
	r.events = append(r.events, c.Events...)
	for _, d := range c.DLQ {
		s.dlqIDs = insertID(s.dlqIDs, s.dlq, d.ID)
		s.dlq[d.ID] = d
	}
	if d := c.Definition; d != nil {
		if _, ok := s.defs[d.Hash]; !ok {
			s.defs[d.Hash] = d.Source
		}
	}
	return nil
}

// ended is when a run ended, as the finished index files it.
func ended(run *store.Run) time.Time {
	if run.FinishedAt.IsZero() {
		return run.UpdatedAt
	}
	return run.FinishedAt
}

// unixNano orders times as the bbolt store's keys do.
func unixNano(t time.Time) uint64 { return uint64(t.UnixNano()) }

// insertID adds id to ids, sorted, unless m holds it already.
func insertID[V any](ids []string, m map[string]V, id string) []string {
	if _, ok := m[id]; ok {
		return ids
	}
	i, _ := slices.BinarySearch(ids, id)
	return slices.Insert(ids, i, id)
}

// deleteID removes id from ids, sorted.
func deleteID(ids []string, id string) []string {
	if i, ok := slices.BinarySearch(ids, id); ok {
		return slices.Delete(ids, i, i+1)
	}
	return ids
}

// RunHeader implements store.Store.
func (s *Store) RunHeader(ctx context.Context, id string) (*store.Run, error) {
	r, err := s.run(id)
	if err != nil {
		return nil, err
	}
	return copyRun(r.header), nil
}

// Run implements store.Store.
func (s *Store) Run(ctx context.Context, id string) (*store.Run, error) {
	r, err := s.run(id)
	if err != nil {
		return nil, err
	}
	run := copyRun(r.header)
	run.Origin = copyOrigin(r.origin)
	return run, nil
}

// run returns a run's state as it is now; what it points to is not changed
// afterwards, so it may be read without the lock.
func (s *Store) run(id string) (runState, error) {
	if err := s.lock(); err != nil {
		return runState{}, err
	}
	defer s.mu.Unlock()
	r, ok := s.runs[id]
	if !ok {
		return runState{}, fmt.Errorf("run %s: %w", id, store.ErrNotFound)
	}
	return runState{header: r.header, origin: r.origin}, nil
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

// ForEachStep implements store.Store. It calls fn without the lock held,
// with the records as they were when it was called.
func (s *Store) ForEachStep(ctx context.Context, runID string, scan store.StepScan, fn func(*store.StepRecord) error) error {
	recs, err := s.scanSteps(runID, scan)
	if err != nil {
		return err
	}
	for _, st := range recs {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := fn(copyStep(st)); err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) scanSteps(runID string, scan store.StepScan) ([]*store.StepRecord, error) {
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	r, ok := s.runs[runID]
	if !ok {
		return nil, nil
	}
	if scan.Exact {
		st, ok := r.steps[scan.Prefix]
		if !ok || scan.Prefix == "" || scan.SkipItems && store.IsItemKey(st.Key) {
			return nil, nil
		}
		return []*store.StepRecord{st}, nil
	}
	if !r.ordered {
		r.order = slices.AppendSeq(r.order[:0], maps.Keys(r.steps))
		slices.Sort(r.order)
		r.ordered = true
	}
	i, _ := slices.BinarySearch(r.order, scan.Prefix)
	var out []*store.StepRecord
	for _, k := range r.order[i:] {
		if !strings.HasPrefix(k, scan.Prefix) {
			break
		}
		if scan.SkipItems && store.IsItemKey(k) {
			continue
		}
		out = append(out, r.steps[k])
	}
	return out, nil
}

// Events implements store.Store.
func (s *Store) Events(ctx context.Context, runID string, after uint64, limit int) ([]store.Event, error) {
	if err := s.lock(); err != nil {
		return nil, err
	}
	var evs []store.Event
	if r, ok := s.runs[runID]; ok && after < uint64(len(r.events)) {
		// Appends to the run's log leave these elements as they are.
		evs = r.events[after:]
	}
	s.mu.Unlock()
	if len(evs) == 0 {
		return nil, nil
	}
	if limit > 0 && len(evs) > limit {
		evs = evs[:limit]
	}
	out := make([]store.Event, len(evs))
	for i := range evs {
		out[i] = copyEvent(&evs[i])
	}
	return out, nil
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
	var start indexEntry
	if f.Cursor != "" {
		k, err := base64.RawURLEncoding.DecodeString(f.Cursor)
		if err != nil || len(k) <= 8 {
			return store.RunPage{}, badCursor(f.Cursor)
		}
		start = indexEntry{binary.BigEndian.Uint64(k), string(k[8:])}
	}
	if err := s.lock(); err != nil {
		return store.RunPage{}, err
	}
	i := len(s.index)
	if f.Cursor != "" {
		// A cursor is the index entry of a run listed before.
		var found bool
		if i, found = slices.BinarySearchFunc(s.index, start, compareEntries); !found {
			s.mu.Unlock()
			return store.RunPage{}, badCursor(f.Cursor)
		}
	}
	type listedRun struct {
		entry indexEntry
		runState
	}
	var listed []listedRun
	var next string
	for i--; i >= 0; i-- {
		if err := ctx.Err(); err != nil {
			s.mu.Unlock()
			return store.RunPage{}, err
		}
		e := s.index[i]
		if !f.Since.IsZero() && time.Unix(0, int64(e.created)).Before(f.Since) {
			break
		}
		r := s.runs[e.id]
		if !f.Keeps(r.header) {
			continue
		}
		if len(listed) == limit {
			last := listed[limit-1].entry
			next = base64.RawURLEncoding.EncodeToString(append(binary.BigEndian.AppendUint64(nil, last.created), last.id...))
			break
		}
		listed = append(listed, listedRun{e, runState{header: r.header, origin: r.origin}})
	}
	s.mu.Unlock()
	page := store.RunPage{Next: next}
	for _, r := range listed {
		run := copyRun(r.header)
		if !f.NoOrigins {
			run.Origin = copyOrigin(r.origin)
		}
		page.Runs = append(page.Runs, run)
	}
	return page, nil
}

func badCursor(c string) error {
	return fmt.Errorf("listing runs: cursor %q was not returned by this store: %w", c, store.ErrInvalid)
}

// UnfinishedRuns implements store.Store. Ids sort by creation time, so
// in id order is oldest first.
func (s *Store) UnfinishedRuns(ctx context.Context) ([]string, error) {
	if err := s.lock(); err != nil {
		return nil, err
	}
	ids := slices.Collect(maps.Keys(s.unfinished))
	s.mu.Unlock()
	slices.Sort(ids)
	return ids, nil
}

// Definition implements store.Store.
func (s *Store) Definition(ctx context.Context, hash string) ([]byte, error) {
	if err := s.lock(); err != nil {
		return nil, err
	}
	src, ok := s.defs[hash]
	s.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("chain definition %s: %w", hash, store.ErrNotFound)
	}
	return bytes.Clone(src), nil
}

// DLQ implements store.Store.
func (s *Store) DLQ(ctx context.Context, id string) (*store.DLQEntry, error) {
	if err := s.lock(); err != nil {
		return nil, err
	}
	d, ok := s.dlq[id]
	s.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("dead-letter entry %s: %w", id, store.ErrNotFound)
	}
	return copyDLQ(d), nil
}

// ListDLQ implements store.Store.
func (s *Store) ListDLQ(ctx context.Context, f store.DLQFilter) ([]*store.DLQEntry, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = defaultListLimit
	}
	limit = min(limit, maxListLimit)
	if err := s.lock(); err != nil {
		return nil, err
	}
	i := 0
	if f.After != "" {
		var found bool
		if i, found = slices.BinarySearch(s.dlqIDs, f.After); found {
			i++
		}
	}
	var listed []*store.DLQEntry
	for _, id := range s.dlqIDs[i:] {
		if len(listed) == limit {
			break
		}
		d := s.dlq[id]
		if (f.Chain != "" && d.Chain != f.Chain) || (f.Step != "" && d.Step != f.Step) ||
			(!f.Since.IsZero() && d.CreatedAt.Before(f.Since)) {
			continue
		}
		listed = append(listed, d)
	}
	s.mu.Unlock()
	out := make([]*store.DLQEntry, len(listed))
	for i, d := range listed {
		out[i] = copyDLQ(d)
	}
	return out, nil
}

// DeleteDLQ implements store.Store.
func (s *Store) DeleteDLQ(ctx context.Context, id string) error {
	if err := s.lock(); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if _, ok := s.dlq[id]; !ok {
		return fmt.Errorf("dead-letter entry %s: %w", id, store.ErrNotFound)
	}
	delete(s.dlq, id)
	s.dlqIDs = deleteID(s.dlqIDs, id)
	return nil
}

// CountDLQ implements store.Store.
func (s *Store) CountDLQ(ctx context.Context) (int, error) {
	if err := s.lock(); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	return len(s.dlq), nil
}

// AddDLQ implements store.Store.
func (s *Store) AddDLQ(ctx context.Context, d *store.DLQEntry) error {
	if err := checkDLQ(d); err != nil {
		return fmt.Errorf("parking a dead-letter entry: %w", err)
	}
	c := copyDLQ(d)
	if err := s.lock(); err != nil {
		return err
	}
	defer s.mu.Unlock()
	s.dlqIDs = insertID(s.dlqIDs, s.dlq, c.ID)
	s.dlq[c.ID] = c
	return nil
}

// PutDelivery implements store.Store.
func (s *Store) PutDelivery(ctx context.Context, d *store.Delivery) error {
	switch {
	case d.ID == "":
		return fmt.Errorf("keeping a delivery: it has no id: %w", store.ErrInvalid)
	case notJSON(d.Body) || notJSON(d.Metadata):
		return fmt.Errorf("keeping delivery %s: %w", d.ID, errNotJSON("a value of it"))
	}
	c := copyDelivery(d)
	if err := s.lock(); err != nil {
		return err
	}
	defer s.mu.Unlock()
	s.deliveryIDs = insertID(s.deliveryIDs, s.deliveries, c.ID)
	s.deliveries[c.ID] = c
	return nil
}

// Deliveries implements store.Store.
func (s *Store) Deliveries(ctx context.Context, limit int) ([]*store.Delivery, error) {
	if err := s.lock(); err != nil {
		return nil, err
	}
	ids := s.deliveryIDs
	if limit > 0 && len(ids) > limit {
		ids = ids[:limit]
	}
	listed := make([]*store.Delivery, len(ids))
	for i, id := range ids {
		listed[i] = s.deliveries[id]
	}
	s.mu.Unlock()
	for i, d := range listed {
		listed[i] = copyDelivery(d)
	}
	return listed, nil
}

// DeleteDelivery implements store.Store.
func (s *Store) DeleteDelivery(ctx context.Context, id string) error {
	if err := s.lock(); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if _, ok := s.deliveries[id]; ok {
		delete(s.deliveries, id)
		s.deliveryIDs = deleteID(s.deliveryIDs, id)
	}
	return nil
}

// AcquireLease implements store.Store.
func (s *Store) AcquireLease(ctx context.Context, runID, owner string, ttl time.Duration) (store.Lease, error) {
	if err := s.lock(); err != nil {
		return store.Lease{}, err
	}
	defer s.mu.Unlock()
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
	if err := s.lock(); err != nil {
		return store.Lease{}, err
	}
	defer s.mu.Unlock()
	if !s.leaseCurrent(l) {
		return store.Lease{}, fmt.Errorf("renewing the lease on run %s: %w", l.RunID, store.ErrLeaseLost)
	}
	l.Expires = time.Now().Add(ttl)
	s.leases[l.RunID] = l
	return l, nil
}

// ReleaseLease implements store.Store.
func (s *Store) ReleaseLease(ctx context.Context, l store.Lease) error {
	if err := s.lock(); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if s.leaseCurrent(l) {
		delete(s.leases, l.RunID)
	}
	return nil
}

// leaseCurrent reports whether l is its run's live lease; s.mu is held.
func (s *Store) leaseCurrent(l store.Lease) bool {
	cur, ok := s.leases[l.RunID]
	return ok && cur.Owner == l.Owner && cur.Fence == l.Fence && time.Now().Before(cur.Expires)
}

// KeyRun implements store.Store.
func (s *Store) KeyRun(ctx context.Context, key string) (string, error) {
	if err := s.lock(); err != nil {
		return "", err
	}
	defer s.mu.Unlock()
	return s.keyHolder(key, time.Now()), nil
}

// ClaimKey implements store.Store.
func (s *Store) ClaimKey(ctx context.Context, key, runID string, ttl time.Duration) (string, error) {
	if err := store.CheckKey(key); err != nil {
		return "", err
	}
	if err := s.lock(); err != nil {
		return "", err
	}
	defer s.mu.Unlock()
	now := time.Now()
	if bound := s.keyHolder(key, now); bound != "" && bound != runID {
		return bound, nil
	}
	s.bindKey(key, runID, ttl, now)
	return "", nil
}

// keyHolder is the run a live binding of key holds it for, or ""; the
// caller holds the lock.
func (s *Store) keyHolder(key string, now time.Time) string {
	if b, ok := s.keys[key]; ok && now.Before(b.expires) {
		return b.runID
	}
	return ""
}

// bindKey binds key to runID for ttl from now; the caller holds the lock
// and has found no live binding of key to another run.
func (s *Store) bindKey(key, runID string, ttl time.Duration, now time.Time) {
	s.keys[key] = binding{runID, now.Add(ttl)}
	if len(s.keys) >= s.sweepAt {
		s.sweepKeys(now)
	}
}

// minSweep is how many keys there are at least before lapsed ones are
// swept.
const minSweep = 1024

// sweepKeys removes the keys that have lapsed. It runs when the keys have
// doubled since the last sweep, so a claim pays for it a little at a time.
func (s *Store) sweepKeys(now time.Time) {
	maps.DeleteFunc(s.keys, func(_ string, b binding) bool { return !now.Before(b.expires) })
	s.sweepAt = max(2*len(s.keys), minSweep)
}

// ReleaseKey implements store.Store.
func (s *Store) ReleaseKey(ctx context.Context, key, runID string) error {
	if err := s.lock(); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if b, ok := s.keys[key]; ok && b.runID == runID {
		delete(s.keys, key)
	}
	return nil
}

// ForEachKey implements store.Store. It calls fn without the lock held.
func (s *Store) ForEachKey(ctx context.Context, prefix string, fn func(key, bound string) error) error {
	if err := s.lock(); err != nil {
		return err
	}
	now := time.Now()
	var found [][2]string
	for k, b := range s.keys {
		if strings.HasPrefix(k, prefix) && now.Before(b.expires) {
			found = append(found, [2]string{k, b.runID})
		}
	}
	s.mu.Unlock()
	for _, kv := range found {
		if err := fn(kv[0], kv[1]); err != nil {
			return err
		}
	}
	return nil
}

// statuses are the ones a run ends with, which FinishedRuns lists.
var statuses = store.FinalRunStatuses

// FinishedRuns implements store.Store. It calls fn without the lock held,
// with the runs that had ended with status when it was called and are
// still filed so.
func (s *Store) FinishedRuns(ctx context.Context, status store.RunStatus, fn func(*store.Run) (bool, error)) error {
	if !slices.Contains(statuses, status) {
		return fmt.Errorf("listing finished runs: status %q is not a final one: %w", status, store.ErrInvalid)
	}
	type filed struct {
		id    string
		entry finishedEntry
	}
	if err := s.lock(); err != nil {
		return fmt.Errorf("listing finished runs: %w", err)
	}
	var runs []filed
	for id, e := range s.finished {
		if e.status == status {
			runs = append(runs, filed{id, e})
		}
	}
	s.mu.Unlock()
	slices.SortFunc(runs, func(a, b filed) int {
		return cmp.Or(cmp.Compare(a.entry.ended, b.entry.ended), strings.Compare(a.id, b.id))
	})
	for _, f := range runs {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := s.lock(); err != nil {
			return fmt.Errorf("listing finished runs: %w", err)
		}
		var header *store.Run
		if e, ok := s.finished[f.id]; ok && e == f.entry {
			header = s.runs[f.id].header
		}
		s.mu.Unlock()
		if header == nil {
			continue // deleted, or replayed, since
		}
		if more, err := fn(copyRun(header)); err != nil || !more {
			return err
		}
	}
	return nil
}

// DeleteRun implements store.Store. The run goes at once; what it freed is
// counted after, without the lock.
func (s *Store) DeleteRun(ctx context.Context, id string) (store.Freed, error) {
	if err := s.lock(); err != nil {
		return store.Freed{}, err
	}
	r, ok := s.runs[id]
	switch {
	case !ok:
		s.mu.Unlock()
		return store.Freed{}, fmt.Errorf("run %s: %w", id, store.ErrNotFound)
	case !r.header.Status.Final():
		s.mu.Unlock()
		return store.Freed{}, fmt.Errorf("deleting run %s: it is %s: %w", id, r.header.Status, store.ErrUnfinished)
	}
	delete(s.runs, id)
	if i, ok := slices.BinarySearchFunc(s.index, indexEntry{r.created, id}, compareEntries); ok {
		s.index = slices.Delete(s.index, i, i+1)
	}
	delete(s.unfinished, id)
	delete(s.finished, id)
	s.mu.Unlock()
	return r.freed(), nil
}

// freed counts a run's records, and the bytes of their keys and JSON
// values: what grows with a run, where its fixed fields do not.
func (r *runState) freed() store.Freed {
	f := store.Freed{
		Records: 2 + len(r.steps) + len(r.events), // the header, the origin
		Bytes:   int64(len(r.header.ID) + len(r.header.Body) + len(r.origin.Payload) + len(r.origin.Metadata)),
	}
	for k, st := range r.steps {
		f.Bytes += int64(len(k) + len(st.Body))
	}
	for i := range r.events {
		f.Bytes += int64(8 + len(r.events[i].Data))
	}
	return f
}

func copyRun(r *store.Run) *store.Run {
	c := *r
	c.Origin = store.Origin{}
	c.Path = slices.Clone(r.Path)
	c.Labels = maps.Clone(r.Labels)
	c.Failure = r.Failure.Clone()
	c.Error = copyError(r.Error)
	c.Body = cloneRaw(r.Body)
	return &c
}

func copyOrigin(o store.Origin) store.Origin {
	o.Payload, o.Metadata = cloneRaw(o.Payload), cloneRaw(o.Metadata)
	return o
}

func copyStep(st *store.StepRecord) *store.StepRecord {
	c := *st
	c.Body = cloneRaw(st.Body)
	c.Error = copyError(st.Error)
	if st.Split != nil {
		split := *st.Split
		c.Split = &split
	}
	return &c
}

func copyEvent(ev *store.Event) store.Event {
	c := *ev
	c.Data = cloneRaw(ev.Data)
	return c
}

func checkDLQ(d *store.DLQEntry) error {
	switch {
	case d.ID == "":
		return fmt.Errorf("a dead-letter entry has no id: %w", store.ErrInvalid)
	case notJSON(d.Payload) || notJSON(d.Metadata):
		return errNotJSON("a value of dead-letter entry " + d.ID)
	}
	return nil
}

func copyDLQ(d *store.DLQEntry) *store.DLQEntry {
	c := *d
	c.Payload, c.Metadata = cloneRaw(d.Payload), cloneRaw(d.Metadata)
	c.Headers = nil
	if len(d.Headers) > 0 {
		c.Headers = maps.Clone(d.Headers)
	}
	return &c
}

func copyDelivery(d *store.Delivery) *store.Delivery {
	c := *d
	c.Body, c.Metadata = cloneRaw(d.Body), cloneRaw(d.Metadata)
	return &c
}

func copyError(e *store.ErrorInfo) *store.ErrorInfo {
	if e == nil {
		return nil
	}
	c := *e
	return &c
}

// cloneRaw copies a JSON value; an empty one is none, as a store that
// encodes its records leaves it out and reads it back as nil.
func cloneRaw(v json.RawMessage) json.RawMessage {
	if len(v) == 0 {
		return nil
	}
	return bytes.Clone(v)
}

// AppendAudit implements store.Store.
func (s *Store) AppendAudit(ctx context.Context, e *store.AuditEntry) error {
	if err := store.CheckAudit(e); err != nil {
		return err
	}
	c := *e
	c.Roles, c.Groups = slices.Clone(e.Roles), slices.Clone(e.Groups)
	if err := s.lock(); err != nil {
		return err
	}
	defer s.mu.Unlock()
	s.auditIDs = insertID(s.auditIDs, s.audit, c.ID)
	s.audit[c.ID] = &c
	return nil
}

// WalkAudit implements store.Store.
func (s *Store) WalkAudit(ctx context.Context, scan store.AuditScan, fn func(*store.AuditEntry) (bool, error)) error {
	if err := s.lock(); err != nil {
		return err
	}
	lo, hi := scan.Bounds()
	i, _ := slices.BinarySearch(s.auditIDs, lo)
	j := len(s.auditIDs)
	if hi != "" {
		j, _ = slices.BinarySearch(s.auditIDs, hi)
	}
	var picked []store.AuditEntry
	if i < j {
		for _, id := range s.auditIDs[i:j] {
			picked = append(picked, *s.audit[id])
		}
	}
	s.mu.Unlock()
	if !scan.Oldest {
		slices.Reverse(picked)
	}
	for k := range picked {
		if more, err := fn(&picked[k]); err != nil || !more {
			return err
		}
	}
	return nil
}

// PruneAudit implements store.Store.
func (s *Store) PruneAudit(ctx context.Context, before time.Time) (int, error) {
	if err := s.lock(); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	n, _ := slices.BinarySearch(s.auditIDs, store.IDFloor(before))
	for _, id := range s.auditIDs[:n] {
		delete(s.audit, id)
	}
	s.auditIDs = slices.Delete(s.auditIDs, 0, n)
	return n, nil
}
