// Package engine runs chains as persisted state machines. Each run is
// advanced by one goroutine that loads state, decides the next action,
// persists the intent, acts, and persists the outcome; the goroutine never
// holds anything the store does not, so a run resumes from the store after
// a crash.
//
// It is the gateway's own package, with no compatibility promise.
package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/loader"
	"github.com/chaingate/gateway/chain/secrets"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/internal/jsonx"
	"github.com/chaingate/gateway/providers"
)

// ProviderResolver hands the engine a callable provider for a configured one.
type ProviderResolver interface {
	Resolve(p *chain.Provider) (providers.Provider, error)
}

// ProviderChecker is implemented by a ProviderResolver that can tell,
// before a run starts, that a provider it may call cannot work with its
// config; the run is then refused, with an error wrapping
// ErrProviderConfig, rather than failing after earlier steps acted.
type ProviderChecker interface {
	CheckProvider(ctx context.Context, p *chain.Provider) error
}

// ErrNestedTooDeep marks a value refused because it nests deeper than
// store.MaxNesting: kept, it could not be read back.
var ErrNestedTooDeep = errors.New("nested too deeply")

// checkNesting refuses a value nested deeper than a run may keep.
func checkNesting(what string, data []byte) error {
	if d := jsonx.Nesting(data); d > store.MaxNesting {
		return fmt.Errorf("%w: %s nests %d levels deep; at most %d are kept", ErrNestedTooDeep, what, d, store.MaxNesting)
	}
	return nil
}

// ErrProviderConfig marks a run refused because a provider's config, with
// its secrets filled in, is not one the provider can use.
var ErrProviderConfig = errors.New("a provider's config is not usable")

// Options configures an Engine.
type Options struct {
	Store     store.Store
	Config    *chain.Config
	Providers ProviderResolver
	// LoadOptions are used to load a stored definition when a run resumes
	// on a chain whose definition has changed since it started.
	LoadOptions loader.Options
	// Limits bound split sizes and step bodies; zero fields take the
	// defaults (chain.DefaultMaxSplitItems, chain.DefaultMaxBodyBytes).
	Limits chain.Limits
	// Owner names this engine in run leases; default host:pid:random.
	Owner string
	// LeaseTTL is how long a run stays leased to this engine without a
	// renewal; another gateway takes the run over after it lapses. Default
	// 15 s; leases are renewed every third of it.
	LeaseTTL time.Duration
	// Linger bounds how long a run's results wait for those of its calls
	// still out before they are committed together, while nothing waits on
	// them; default DefaultRunLinger.
	Linger time.Duration
	// Secrets are what <<secrets.NAME>> reads. They are never written to the
	// store: any secret value found in what is written is replaced by
	// [REDACTED].
	Secrets map[string]string
	Logger  *slog.Logger
	// LogOutcomes logs, once durable, each run that fails or times out and
	// each step that does (after its retries) at error and warn, and each
	// dead-letter entry, with run, chain, step and error: what a service's
	// operators alert on. Commands that print every event leave it off.
	LogOutcomes bool
	// OnEvent receives every event once it is durable, in order within a
	// run. It runs on the run's goroutine and must not block.
	OnEvent func(store.Event)
	// Observer is told about every provider call, for metrics.
	Observer Observer
	// Fanout, when set, is where distributed splits hand their items.
	Fanout Fanout
	// Clock is what runs read the time from and wait on; default the
	// system's.
	Clock Clock
	// LocalSplits runs every split's items in this process, whatever its
	// mode, as `gateway test` does with no broker.
	LocalSplits bool
}

// Observer watches provider calls. Its methods run on whichever goroutine
// starts or ends a call, a plugin's answer reader among them, and must not
// block.
type Observer interface {
	CallStarted(provider string)
	CallEnded(provider string, took time.Duration, err error)
}

type noObserver struct{}

func (noObserver) CallStarted(string)                     {}
func (noObserver) CallEnded(string, time.Duration, error) {}

// Engine advances runs.
type Engine struct {
	store     store.Store
	cfgPtr    atomic.Pointer[chain.Config]
	providers ProviderResolver
	owner     string
	leaseTTL  time.Duration
	linger    time.Duration
	secrets   map[string]any
	redactor  *secrets.Redactor
	loadOpts  loader.Options
	limits    chain.Limits
	log       *slog.Logger
	outcomes  bool
	onEvent   func(store.Event)
	observer  Observer

	defMu   sync.Mutex
	sources map[string][]byte        // chain name → definition document
	defs    map[string]*chain.Config // hash → definitions loaded from the store

	mu      sync.Mutex
	runners map[string]*runner
	// reserved holds runs being started or taken up, between the check
	// that no runner here advances them and the runner's start; the
	// channel closes when the reservation ends.
	reserved map[string]chan struct{}
	// workers are the runners running items handed to this gateway.
	workers map[*runner]*workerItems
	// damaged are the unfinished runs whose records cannot be read back,
	// reported once and passed over by later resumes.
	damaged map[string]string
	fanout  Fanout
	closed  bool
	wg      sync.WaitGroup

	stopKeeper chan struct{}
	keeperDone chan struct{}

	clock       Clock
	act         Activity
	localSplits bool
	// now is the clock answers to approval steps are timed by.
	now       func() time.Time
	approvals approvalCounts
	// slots keeps concurrency keys' slots, when the store does.
	slots store.Slots
}

var (
	// ErrUnknownChain is returned by Start for a chain the config lacks.
	ErrUnknownChain = errors.New("unknown chain")
	// ErrNotActive is returned by Wait for a run this engine is not
	// advancing.
	ErrNotActive = errors.New("run is not active in this gateway")
	// ErrClosed is returned after Close.
	ErrClosed = errors.New("engine is closed")
	// ErrFinished is returned when cancelling a run that already ended.
	ErrFinished = errors.New("run already finished")
)

// New returns an engine; runs start with Start.
func New(opts Options) (*Engine, error) {
	if opts.Store == nil || opts.Config == nil || opts.Providers == nil {
		return nil, errors.New("creating engine: Store, Config and Providers are required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.OnEvent == nil {
		opts.OnEvent = func(store.Event) {}
	}
	if opts.Observer == nil {
		opts.Observer = noObserver{}
	}
	if opts.Limits.MaxSplitItems <= 0 {
		opts.Limits.MaxSplitItems = chain.DefaultMaxSplitItems
	}
	if opts.Limits.MaxBodyBytes <= 0 {
		opts.Limits.MaxBodyBytes = chain.DefaultMaxBodyBytes
	}
	if opts.Owner == "" {
		host, _ := os.Hostname()
		opts.Owner = fmt.Sprintf("%s:%d:%s", host, os.Getpid(), store.NewID()[20:])
	}
	if opts.LeaseTTL <= 0 {
		opts.LeaseTTL = DefaultLeaseTTL
	}
	if opts.Linger <= 0 {
		opts.Linger = DefaultRunLinger
	}
	if opts.Clock == nil {
		opts.Clock = SystemClock{}
	}
	act, ok := opts.Clock.(Activity)
	if !ok {
		act = noActivity{}
	}
	secretVals := make(map[string]any, len(opts.Secrets))
	for k, v := range opts.Secrets {
		secretVals[k] = v
	}
	e := &Engine{
		store:       opts.Store,
		providers:   opts.Providers,
		owner:       opts.Owner,
		leaseTTL:    opts.LeaseTTL,
		linger:      opts.Linger,
		secrets:     secretVals,
		redactor:    secrets.NewRedactor(opts.Secrets),
		stopKeeper:  make(chan struct{}),
		keeperDone:  make(chan struct{}),
		loadOpts:    opts.LoadOptions,
		limits:      opts.Limits,
		log:         opts.Logger,
		outcomes:    opts.LogOutcomes,
		onEvent:     opts.OnEvent,
		observer:    opts.Observer,
		runners:     map[string]*runner{},
		reserved:    map[string]chan struct{}{},
		workers:     map[*runner]*workerItems{},
		damaged:     map[string]string{},
		fanout:      opts.Fanout,
		sources:     map[string][]byte{},
		defs:        map[string]*chain.Config{},
		clock:       opts.Clock,
		localSplits: opts.LocalSplits,
		act:         act,
		now:         opts.Clock.Now,
	}
	e.cfgPtr.Store(opts.Config)
	e.slots, _ = opts.Store.(store.Slots)
	go e.keepLeases()
	return e, nil
}

// DefaultLeaseTTL is how long a run stays leased without renewal.
const DefaultLeaseTTL = 15 * time.Second

// config is the configuration new runs start with.
func (e *Engine) config() *chain.Config { return e.cfgPtr.Load() }

// SetConfig makes cfg the configuration for runs started from now on.
// Running runs keep the definition they started with.
func (e *Engine) SetConfig(cfg *chain.Config) {
	e.defMu.Lock()
	clear(e.sources)
	e.defMu.Unlock()
	e.cfgPtr.Store(cfg)
}

// Owner is the name this engine leases runs under.
func (e *Engine) Owner() string { return e.owner }

// Config is the configuration new runs start with.
func (e *Engine) Config() *chain.Config { return e.config() }

// ProviderNames lists the configured providers.
func (e *Engine) ProviderNames() []string { return e.config().ProviderNames }

// Active returns how many runs this engine is advancing.
func (e *Engine) Active() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.runners)
}

// Definition returns the chain a run started with: the configured one if
// its hash matches, else the one the run stored.
func (e *Engine) Definition(ctx context.Context, name, hash string) (*chain.Chain, error) {
	c, _, err := e.definition(ctx, name, hash)
	return c, err
}

// Input is what starts a run.
type Input struct {
	// Payload becomes origin.payload; it must be JSON (empty means {}).
	Payload json.RawMessage
	// Metadata becomes origin.metadata.
	Metadata json.RawMessage
	// OriginID identifies the triggering event; a new id when empty.
	OriginID string
	// StartedBy says how the run started (store.Run.StartedBy).
	StartedBy string
	// Key, when set, is an idempotency key the run's creation binds to it
	// until KeyUntil, in the same commit: a key bound to another run fails
	// the start with a *store.KeyBoundError naming that run.
	Key string
	// KeyUntil is when the idempotency key the run starts under lapses.
	KeyUntil time.Time
	// Labels are the run's (store.Run.Labels); a sub-chain's run has its
	// parent's.
	Labels map[string]string
}

// Start persists a new run of the named chain and starts advancing it. The
// run is durable when Start returns.
func (e *Engine) Start(ctx context.Context, chainName string, in Input) (*store.Run, error) {
	return e.startRun(ctx, e.config(), chainName, in, store.NewID(), nil, time.Time{})
}

// StartWithID is Start with the run's id chosen by the caller, as for an
// idempotency key bound to an id before the run exists. It fails with
// store.ErrExists, or store.ErrLeaseHeld while another gateway creates it,
// if the run is already there.
func (e *Engine) StartWithID(ctx context.Context, chainName string, in Input, id string) (*store.Run, error) {
	return e.startRun(ctx, e.config(), chainName, in, id, nil, time.Time{})
}

// ParentRef links a sub-chain's run to the step that started it.
type ParentRef struct {
	Run  string
	Step string
}

// startRun creates a run of a chain of cfg with the given id; a sub-chain's
// run also has a parent, and a deadline no later than the parent's.
func (e *Engine) startRun(ctx context.Context, cfg *chain.Config, chainName string, in Input, id string, parent *ParentRef, deadline time.Time) (*store.Run, error) {
	def := cfg.Chains[chainName]
	if def == nil {
		return nil, fmt.Errorf("starting run: %w %q%s", ErrUnknownChain, chainName, cfg.ChainHint(chainName))
	}
	payload := in.Payload
	if len(payload) == 0 {
		payload = json.RawMessage(`{}`)
	}
	if !json.Valid(payload) {
		return nil, errors.New("starting run: payload is not valid JSON")
	}
	if len(in.Metadata) > 0 && !json.Valid(in.Metadata) {
		return nil, errors.New("starting run: metadata is not valid JSON")
	}
	if err := errors.Join(checkNesting("the payload", payload), checkNesting("the metadata", in.Metadata)); err != nil {
		return nil, fmt.Errorf("starting run: %w", err)
	}
	// Every run starts here, whoever asks: what it keeps is UTF-8 that
	// strict JSON parsers read, whatever bytes the sender brought.
	payload, metadata := jsonx.ValidUTF8(payload), jsonx.ValidUTF8(in.Metadata)
	// A sub-chain's input was checked before its parent recorded the call,
	// and its providers when the parent started.
	if parent == nil {
		if err := def.Input.Check(def.Name, payload); err != nil {
			return nil, fmt.Errorf("starting run: %w", err)
		}
		if pc, ok := e.providers.(ProviderChecker); ok {
			for _, name := range cfg.ProvidersUsed(def.Name) {
				if err := pc.CheckProvider(ctx, cfg.Providers[name]); err != nil {
					return nil, fmt.Errorf("starting run: provider %q: %w", name, err)
				}
			}
		}
	}
	now := e.clock.Now().UTC()
	originID := in.OriginID
	if originID == "" {
		originID = id
	}
	run := &store.Run{
		ID:        id,
		Chain:     def.Name,
		ChainHash: def.Hash,
		Status:    store.RunRunning,
		Origin:    store.Origin{ID: originID, Payload: payload, Metadata: metadata, ReceivedAt: now, Subject: startedBy(ctx)},
		Path:      []string{},
		Cursor:    def.Steps[0].Name,
		CreatedAt: now,
		UpdatedAt: now,
		StartedBy: in.StartedBy,
		KeyUntil:  in.KeyUntil,
		Labels:    e.labels(in.Labels),
	}
	if parent != nil {
		run.ParentRun, run.ParentStep = parent.Run, parent.Step
		run.StartedBy = store.StartedBySubChain
	}
	if def.TimeoutSeconds > 0 {
		run.Deadline = now.Add(time.Duration(def.TimeoutSeconds) * time.Second)
	}
	if !deadline.IsZero() && (run.Deadline.IsZero() || deadline.Before(run.Deadline)) {
		run.Deadline = deadline
	}
	src, err := e.source(cfg, def.Name)
	if err != nil {
		return nil, fmt.Errorf("starting run: %w", err)
	}
	if err := e.reserveStart(ctx, id); err != nil {
		return nil, err
	}
	defer e.unreserve(id)
	lease, err := e.store.AcquireLease(ctx, id, e.owner, e.leaseTTL)
	if err != nil {
		return nil, fmt.Errorf("starting run: %w", err)
	}
	r := e.newRunner(def, cfg, run, nil)
	r.lease = lease
	if err := r.enterQueue(); err != nil {
		_ = e.store.ReleaseLease(context.WithoutCancel(ctx), lease)
		return nil, fmt.Errorf("starting run: %w", err)
	}
	r.event(store.EventRunStarted, "", 0, "")
	if err := e.admit(r); err != nil {
		_ = e.store.ReleaseLease(context.WithoutCancel(ctx), lease)
		return nil, err
	}
	var claim *store.KeyClaim
	if in.Key != "" {
		claim = &store.KeyClaim{Key: in.Key, TTL: time.Until(in.KeyUntil)}
	}
	// A run under a concurrency key takes its slot once it exists
	// (askSlot below), and only then advances.
	if r.slot == nil && !r.advanceFirst(e.clock.Now()) {
		r.detach()
		e.forget(r)
		_ = e.store.ReleaseLease(context.WithoutCancel(ctx), lease)
		return nil, errors.New("starting run: advancing its first steps hit a bug; the gateway's log has the details")
	}
	if err := r.flushCreate(ctx, &store.Definition{Hash: def.Hash, Source: src}, claim); err != nil {
		r.detach()
		e.forget(r)
		_ = e.store.ReleaseLease(context.WithoutCancel(ctx), lease)
		return nil, fmt.Errorf("starting run: %w", err)
	}
	if r.slot != nil {
		// Before the answer, so that it says whether the run waits.
		r.askSlot(ctx, r.e.clock.Now())
	}
	snapshot := *run
	if q := run.Queue; q != nil {
		c := *q
		c.WaitingFor = slices.Clone(q.WaitingFor)
		snapshot.Queue = &c
	}
	e.launch(r)
	return &snapshot, nil
}

// labels are a run's labels as it keeps them: a copy, secrets redacted,
// bytes that are not UTF-8 replaced as the run's JSON record has them.
func (e *Engine) labels(in map[string]string) map[string]string {
	if len(in) == 0 {
		return nil
	}
	out := make(map[string]string, len(in))
	for k, v := range in {
		out[validUTF8(e.redactor.String(k))] = validUTF8(e.redactor.String(v))
	}
	return out
}

func validUTF8(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

// source returns the definition document a run of the chain stores. The
// current config's documents are kept; an older config's (a sub-chain of a
// run started before a reload) are made each time.
func (e *Engine) source(cfg *chain.Config, name string) ([]byte, error) {
	if cfg != e.config() {
		return cfg.Definition(name)
	}
	e.defMu.Lock()
	defer e.defMu.Unlock()
	if src, ok := e.sources[name]; ok {
		return src, nil
	}
	src, err := cfg.Definition(name)
	if err != nil {
		return nil, err
	}
	e.sources[name] = src
	return src, nil
}

// errNoDefinition marks a run whose definition is gone or unreadable, as
// opposed to a store that did not answer this time.
var errNoDefinition = errors.New("no usable definition")

// definition returns the chain a run started with, and the config that
// holds it, whose providers the run calls: the current config if the
// chain's hash matches, else the definition stored when the run started.
func (e *Engine) definition(ctx context.Context, name, hash string) (*chain.Chain, *chain.Config, error) {
	cur := e.config()
	if c := cur.Chains[name]; c != nil && c.Hash == hash {
		return c, cur, nil
	}
	e.defMu.Lock()
	defer e.defMu.Unlock()
	if cfg := e.defs[hash]; cfg != nil {
		return cfg.Chains[name], cfg, nil
	}
	src, err := e.store.Definition(ctx, hash)
	if errors.Is(err, store.ErrNotFound) {
		err = fmt.Errorf("%w: %w", errNoDefinition, err)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("loading the definition of chain %q the run started with: %w", name, err)
	}
	cfg, err := e.loadStored(name, src)
	if err != nil {
		return nil, nil, err
	}
	e.defs[hash] = cfg
	return cfg.Chains[name], cfg, nil
}

// Resume finds every unfinished run in the store and advances it again from
// its persisted state: steps with a recorded result are not called again,
// steps that were in flight are dispatched again with the same dedup key.
// It returns the ids of the resumed runs.
func (e *Engine) Resume(ctx context.Context) ([]string, error) {
	ids, err := e.store.UnfinishedRuns(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing unfinished runs: %w", err)
	}
	var (
		mu      sync.Mutex
		resumed []string
		errs    []error
		wg      sync.WaitGroup
		sem     = make(chan struct{}, 8)
	)
	for _, id := range ids {
		if e.active(id) != nil || e.isDamaged(id) {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			err := e.resume(ctx, id)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, store.ErrLeaseHeld), errors.Is(err, errTaken):
				// Another gateway, or another resume here, is advancing it.
			case errors.Is(err, store.ErrDamaged):
				e.noteDamaged(id, err)
			case err != nil:
				errs = append(errs, err)
			default:
				resumed = append(resumed, id)
			}
		}()
	}
	wg.Wait()
	return resumed, errors.Join(errs...)
}

// noteDamaged reports, once, a run that cannot be resumed because its
// records cannot be read back; the other runs go on.
func (e *Engine) noteDamaged(id string, err error) {
	e.mu.Lock()
	_, seen := e.damaged[id]
	e.damaged[id] = err.Error()
	e.mu.Unlock()
	if !seen {
		e.log.Error("a run's record cannot be read back, so the run cannot be resumed; it is skipped, and listed as damaged", "run", id, "err", err)
	}
}

func (e *Engine) isDamaged(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, ok := e.damaged[id]
	return ok
}

// Damaged lists the unfinished runs resumes have passed over because
// their records cannot be read back.
func (e *Engine) Damaged() []store.DamagedRun {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]store.DamagedRun, 0, len(e.damaged))
	for id, msg := range e.damaged {
		out = append(out, store.DamagedRun{ID: id, Error: msg})
	}
	slices.SortFunc(out, func(a, b store.DamagedRun) int { return strings.Compare(a.ID, b.ID) })
	return out
}

func (e *Engine) resume(ctx context.Context, id string) error {
	if !e.reserve(id) {
		return errTaken
	}
	defer e.unreserve(id)
	lease, err := e.store.AcquireLease(ctx, id, e.owner, e.leaseTTL)
	if err != nil {
		return fmt.Errorf("resuming run %s: %w", id, err)
	}
	started, err := e.resumeLeased(ctx, id, lease)
	if !started {
		_ = e.store.ReleaseLease(context.WithoutCancel(ctx), lease)
	}
	return err
}

// resumeLeased starts advancing a run whose lease is held; it reports
// whether a runner took the lease over.
func (e *Engine) resumeLeased(ctx context.Context, id string, lease store.Lease) (bool, error) {
	// Read only once the lease is held: whatever another gateway wrote
	// before losing the run is in.
	run, err := e.store.Run(ctx, id)
	if err != nil {
		return false, fmt.Errorf("resuming run %s: %w", id, err)
	}
	if run.Status.Final() {
		return false, nil
	}
	recs, done, err := e.loadLive(ctx, id)
	if err != nil {
		return false, fmt.Errorf("resuming run %s: %w", id, err)
	}
	def, cfg, err := e.definition(ctx, run.Chain, run.ChainHash)
	if err != nil && !errors.Is(err, errNoDefinition) {
		// The store may answer next time: the run stays as it is.
		return false, fmt.Errorf("resuming run %s: %w", id, err)
	}
	if err != nil {
		// Nothing can advance this run; end it with the reason rather than
		// leave it unfinished for ever.
		r := e.newRunner(&chain.Chain{Name: run.Chain}, e.config(), run, recs)
		r.lease = lease
		r.finishRun(store.RunFailed, &store.ErrorInfo{Message: "cannot resume: " + err.Error(), Code: "definition"})
		if ferr := r.flush(ctx); ferr != nil {
			return false, errors.Join(err, ferr)
		}
		return false, fmt.Errorf("resuming run %s: %w", id, err)
	}
	r := e.newRunner(def, cfg, run, recs)
	r.lease = lease
	r.doneItems = done
	r.resumeSlot(ctx)
	r.event(store.EventRunResumed, "", 0, "")
	if err := e.admit(r); err != nil {
		return false, err
	}
	e.launch(r)
	return true, nil
}

// loadLive reads what a resumed run needs in memory: every record except
// those of split items that had finished, which are only counted, per split.
// A finished item's slot record sorts just before its steps' records, so
// one pass in key order can skip them.
func (e *Engine) loadLive(ctx context.Context, id string) ([]*store.StepRecord, map[string]*bitset, error) {
	l := newLiveScan()
	err := e.store.ForEachStep(ctx, id, store.StepScan{}, func(rec *store.StepRecord) error {
		l.add(rec)
		return nil
	})
	return l.recs, l.done, err
}

// splitLive is loadLive over records already read, in key order.
func splitLive(recs []*store.StepRecord) ([]*store.StepRecord, map[string]*bitset) {
	l := newLiveScan()
	for _, rec := range recs {
		l.add(rec)
	}
	return l.recs, l.done
}

// liveScan sorts records, met in key order, into those a runner holds and
// the finished items it only counts.
type liveScan struct {
	recs []*store.StepRecord
	done map[string]*bitset
	skip string
}

func newLiveScan() *liveScan { return &liveScan{done: map[string]*bitset{}} }

func (l *liveScan) add(rec *store.StepRecord) {
	if l.skip != "" && strings.HasPrefix(rec.Key, l.skip) {
		return
	}
	if splitKey, index, ok := itemSlot(rec.Key); ok && rec.Status.Final() {
		b := l.done[splitKey]
		if b == nil {
			b = &bitset{}
			l.done[splitKey] = b
		}
		b.set(index)
		l.skip = rec.Key + "/"
		return
	}
	l.recs = append(l.recs, rec)
}

// itemSlot parses an item's slot key, "STEP[INDEX]".
func itemSlot(key string) (string, int, bool) {
	if !strings.HasSuffix(key, "]") {
		return "", 0, false
	}
	open := strings.LastIndexByte(key, '[')
	if open < 0 {
		return "", 0, false
	}
	i, err := strconv.Atoi(key[open+1 : len(key)-1])
	if err != nil || strings.Contains(key[open:], "/") {
		return "", 0, false
	}
	return key[:open], i, true
}

// CancelStored cancels a run that no engine is advancing, straight in the
// store. It takes the run's lease first, so it fails with store.ErrLeaseHeld
// while another gateway advances the run.
func (e *Engine) CancelStored(ctx context.Context, id string) error {
	lease, err := e.store.AcquireLease(ctx, id, e.owner, e.leaseTTL)
	if err != nil {
		return fmt.Errorf("cancelling run %s: %w", id, err)
	}
	defer func() { _ = e.store.ReleaseLease(context.WithoutCancel(ctx), lease) }()
	run, err := e.store.Run(ctx, id)
	if err != nil {
		return fmt.Errorf("cancelling run %s: %w", id, err)
	}
	if run.Status.Final() {
		return fmt.Errorf("cancelling run %s: %w (%s)", id, ErrFinished, run.Status)
	}
	recs, err := e.store.Steps(ctx, id, "")
	if err != nil {
		return fmt.Errorf("cancelling run %s: %w", id, err)
	}
	r := e.newRunner(&chain.Chain{Name: run.Chain}, e.config(), run, recs)
	r.lease = lease
	r.finishRun(store.RunCancelled, &store.ErrorInfo{Message: "run cancelled" + by(ctx), Code: "cancelled"})
	if err := r.flush(ctx); err != nil {
		return fmt.Errorf("cancelling run %s: %w", id, err)
	}
	return nil
}

// admit registers a runner. A run has at most one runner in an engine: a
// store lease cannot tell two of them apart, since both hold the engine's
// own lease, so a second would advance the run beside the first.
func (e *Engine) admit(r *runner) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return ErrClosed
	}
	if e.runners[r.run.ID] != nil {
		return errTaken
	}
	e.runners[r.run.ID] = r
	return nil
}

// errTaken is a resume of a run that this engine advances, or is taking
// up, already.
var errTaken = errors.New("the run is already being advanced here")

// reserve claims a run for one start, resume or replay here at a time.
func (e *Engine) reserve(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.runners[id] != nil || e.reserved[id] != nil {
		return false
	}
	e.reserved[id] = make(chan struct{})
	return true
}

// reserveStart reserves a run id for its start. While another start of
// the same id is under way here, it waits for that one to end: if it
// created the run, or a runner here advances it, the run exists (ErrExists);
// if it failed, this start may try.
func (e *Engine) reserveStart(ctx context.Context, id string) error {
	for {
		e.mu.Lock()
		// The reservation first: a start under way has admitted its runner
		// before its create is durable, and a caller told ErrExists then
		// would look for a run that is not there yet.
		busy := e.reserved[id]
		if busy == nil {
			if e.runners[id] != nil {
				e.mu.Unlock()
				return fmt.Errorf("starting run %s: %w", id, store.ErrExists)
			}
			e.reserved[id] = make(chan struct{})
			e.mu.Unlock()
			return nil
		}
		e.mu.Unlock()
		select {
		case <-busy:
		case <-ctx.Done():
			return fmt.Errorf("starting run %s: waiting for its other start: %w", id, ctx.Err())
		}
	}
}

func (e *Engine) unreserve(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if ch := e.reserved[id]; ch != nil {
		close(ch)
		delete(e.reserved, id)
	}
}

func (e *Engine) forget(r *runner) {
	e.mu.Lock()
	if e.runners[r.run.ID] == r {
		delete(e.runners, r.run.ID)
	}
	e.mu.Unlock()
}

func (e *Engine) launch(r *runner) {
	e.wg.Add(1)
	e.act.Begin()
	go func() {
		defer e.wg.Done()
		defer e.act.End()
		r.loop()
		e.releaseRunSlot(r)
		if r.run.Status.Final() && r.run.ParentRun != "" {
			e.notifyParent(r.run, r.top.result)
		}
	}()
}

// notifyParent tells a sub-chain's parent run, if this engine advances it,
// that the child has ended, with its result. A parent that is not active
// reads the child's record when it resumes.
func (e *Engine) notifyParent(child *store.Run, result json.RawMessage) {
	parents := e.workersOf(child.ParentRun)
	if p := e.active(child.ParentRun); p != nil {
		parents = append(parents, p)
	}
	for _, p := range parents {
		snapshot := *child
		if snapshot.Status == store.RunSucceeded {
			snapshot.Body = result
		}
		p.give(outcome{key: child.ParentStep, attempt: -1, child: &snapshot}, nil)
	}
}

func (e *Engine) active(id string) *runner {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.runners[id]
}

// Advancing reports whether this engine advances the run now: every event
// the run gets, it gets from here.
func (e *Engine) Advancing(id string) bool { return e.active(id) != nil }

// Wait blocks until the run reaches a final status and returns its record,
// without its origin.
// A run this engine does not advance, or stopped advancing because another
// took it over, returns its stored record with ErrNotActive unless final.
func (e *Engine) Wait(ctx context.Context, id string) (*store.Run, error) {
	if err := e.AwaitEnd(ctx, id); err != nil {
		return nil, err
	}
	run, err := e.store.RunHeader(ctx, id)
	if err != nil {
		return nil, err
	}
	if !run.Status.Final() {
		return run, fmt.Errorf("waiting for run %s: %w", id, ErrNotActive)
	}
	return run, nil
}

// AwaitEnd blocks while this engine advances the run: until the run ends,
// or another engine takes it over. It returns at once for a run this engine
// does not advance. A caller that reads the run anyway afterwards uses it
// in place of Wait, which reads the run's header.
func (e *Engine) AwaitEnd(ctx context.Context, id string) error {
	r := e.active(id)
	if r == nil {
		return nil
	}
	select {
	case <-r.done:
		if r.err != nil && !errors.Is(r.err, store.ErrLeaseLost) {
			return r.err
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close stops advancing runs. Runs stay as persisted, to be resumed by the
// next engine on the same store; in-flight provider calls are cancelled.
func (e *Engine) Close() {
	for _, r := range e.closeIntake() {
		r.stop()
	}
	e.wg.Wait()
	<-e.keeperDone
}

// closeIntake stops new runs and lease renewals, and returns the runners
// still advancing runs.
func (e *Engine) closeIntake() []*runner {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.closed {
		e.closed = true
		close(e.stopKeeper)
	}
	rs := make([]*runner, 0, len(e.runners)+len(e.workers))
	for _, r := range e.runners {
		rs = append(rs, r)
	}
	for r := range e.workers {
		rs = append(rs, r)
	}
	return rs
}

// Shutdown stops taking new runs and lets the calls in flight finish, up to
// ctx's deadline, recording their results; then it stops as Close does.
// Runs stay as persisted and resume on the next start, or on another
// gateway sharing the store.
func (e *Engine) Shutdown(ctx context.Context) {
	rs := e.closeIntake()
	for _, r := range rs {
		r.drain()
	}
	for _, r := range rs {
		select {
		case <-r.done:
		case <-ctx.Done():
		}
	}
	e.Close()
}

// StepResult is one step of a Result.
type StepResult struct {
	Status   store.StepStatus `json:"status"`
	Body     json.RawMessage  `json:"body"`
	Error    *store.ErrorInfo `json:"error"`
	Attempts int              `json:"attempts"`
}

// Result is a run as reported to its caller.
type Result struct {
	ID     string                `json:"id"`
	Chain  string                `json:"chain"`
	Status store.RunStatus       `json:"status"`
	Error  *store.ErrorInfo      `json:"error,omitempty"`
	Path   []string              `json:"path"`
	Steps  map[string]StepResult `json:"steps"`
}

// Result reads a run and its steps from the store. The records of split
// items are left out unless items is set: the split's own body holds their
// results, and there may be a million of them.
func (e *Engine) Result(ctx context.Context, id string, items bool) (*Result, error) {
	run, err := e.store.RunHeader(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("reading run: %w", err)
	}
	res := &Result{ID: run.ID, Chain: run.Chain, Status: run.Status, Error: run.Error, Path: run.Path, Steps: map[string]StepResult{}}
	err = e.store.ForEachStep(ctx, id, store.StepScan{SkipItems: !items}, func(rec *store.StepRecord) error {
		body := rec.Body
		if len(body) == 0 {
			body = json.RawMessage("null")
		}
		res.Steps[rec.Key] = StepResult{Status: rec.Status, Body: body, Error: rec.Error, Attempts: rec.Attempts}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading steps of run %s: %w", id, err)
	}
	return res, nil
}
