// Package gateway is the core of a running gateway: a config, a store, the
// plugin processes, the provider limits and the engine wired into one
// Gateway, with config loading, secrets and provider checks. The packages
// beside it build on it: the door, schedules, approvals, upkeep, metrics,
// operations and the HTTP server.
//
// It is the gateway's own package, with no compatibility promise.
package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/fanout"
	"github.com/chaingate/gateway/chain/loader"
	"github.com/chaingate/gateway/chain/secrets"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/bolt"
	"github.com/chaingate/gateway/chain/store/crashpoint"
	redisstore "github.com/chaingate/gateway/chain/store/redis"
	"github.com/chaingate/gateway/plugins/host"
	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/builtin"
	"github.com/chaingate/gateway/providers/limits"
)

// DefaultState is where runs are kept when neither --state nor
// [gateway].state says otherwise.
const DefaultState = "bolt://./data/gateway.db"

// LoadOptions checks provider types against the built-in providers.
func LoadOptions() loader.Options {
	return loader.Options{ProviderTypes: builtin.Types()}
}

// LoadConfig loads config files and directories, and checks the steps and
// config of built-in providers against what those providers accept (see
// CheckPlugins for external ones).
func LoadConfig(paths []string) (*chain.Config, error) {
	cfg, err := loader.Load(paths, LoadOptions())
	if err != nil {
		return cfg, err
	}
	if diags := checkBuiltinProviders(cfg); len(diags) > 0 {
		return cfg, &chain.ConfigError{Diagnostics: diags}
	}
	return cfg, nil
}

// Options configures a Gateway.
type Options struct {
	Config *chain.Config
	// State overrides [gateway].state: bolt://PATH, a bare file path, or
	// redis://HOST:PORT/DB.
	State string
	// Logger receives the gateway's logs; secret values are redacted.
	Logger *slog.Logger
	// Executable is the binary re-executed to serve built-in providers;
	// default os.Executable().
	Executable string
	// OnEvent receives every durable run event.
	OnEvent func(store.Event)
	// Observer is told about every provider call.
	Observer engine.Observer
	// FanoutMetrics is told what distributed splits do.
	FanoutMetrics fanout.Metrics
	// Existing refuses to create an embedded store: commands that inspect
	// runs must not leave an empty store behind a mistyped path.
	Existing bool
	// LogOutcomes logs each failed run, failed step and dead-letter entry
	// (engine.Options.LogOutcomes), as a service does.
	LogOutcomes bool
	// ItemsOnly opens a gateway that only works the items of distributed
	// splits (`gateway worker`): it has no store of its own, State is not
	// opened, and Store and Engine are those of the items' runs.
	ItemsOnly bool

	// What `gateway test` replaces. Store, when set, is used in place of
	// the one State names, and closed with the gateway. Secrets, when not
	// nil, are the secret values in place of the environment's and
	// secrets_file's. Providers wraps the resolver steps call providers
	// through. Clock is the engine's (engine.Options.Clock). LocalSplits
	// runs every split in this process (engine.Options.LocalSplits).
	Store       store.Store
	Secrets     map[string]string
	Providers   func(engine.ProviderResolver) engine.ProviderResolver
	Clock       engine.Clock
	LocalSplits bool
}

// Gateway is a running gateway.
type Gateway struct {
	Config   *chain.Config
	Store    store.Store
	Plugins  *host.Manager
	Engine   *engine.Engine
	Log      *slog.Logger
	Redactor *secrets.Redactor
	// StoreFile is the embedded store's file, whose control socket sits
	// beside it; empty for a shared store.
	StoreFile string
	// Fanout hands distributed splits to workers; nil without
	// [gateway.fanout].
	Fanout *fanout.Fanout
	// Items runs the items of distributed splits this process works, and
	// the sub-chain runs they start, which it keeps in the fan-out's Redis
	// (ItemStore) whatever Store is: an item that moves to another worker
	// finds there what its sub-chains recorded. Nil without a Fanout.
	Items     *engine.Engine
	ItemStore store.Store
	// secrets are the values the engine renders <<secrets.NAME>> with.
	secrets map[string]string
	// Limits pace and guard calls to each provider, across all runs.
	Limits *limits.Set
	// Providers are what steps call providers through, for the calls
	// approval steps make while they wait.
	Providers engine.ProviderResolver
	// ApprovalFeed brings what the gateway hears of approval steps to its
	// approval loop (gateway/approvals).
	ApprovalFeed *ApprovalFeed
	// Questions keeps the Slack messages that ask approval steps'
	// questions.
	Questions *SlackQuestions
	// starting are the keyed starts under way here (StartKeyed).
	starting keyedStarts
}

// Open opens the store and prepares the engine. Plugin processes start when
// a step first uses them.
func Open(ctx context.Context, opts Options) (*Gateway, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	cfg := opts.Config
	secretVals, red := opts.Secrets, secrets.NewRedactor(opts.Secrets)
	var err error
	if secretVals == nil {
		if secretVals, red, err = openSecrets(ctx, cfg); err != nil {
			return nil, err
		}
	}
	log := slog.New(red.Handler(opts.Logger.Handler()))
	if opts.ItemsOnly && cfg.Gateway.Fanout == nil {
		return nil, errors.New("opening a worker: the config has no [gateway.fanout]: there is no broker to take items from")
	}
	var fo *fanout.Fanout
	if cfg.Gateway.Fanout != nil {
		fcfg, err := filledFanout(cfg.Gateway.Fanout, secretVals)
		if err != nil {
			return nil, err
		}
		if fo, err = fanout.Open(ctx, fanout.Options{Config: fcfg, Logger: log.With("component", "fanout"), Metrics: opts.FanoutMetrics}); err != nil {
			return nil, err
		}
	}
	closeFanout := func() error {
		if fo == nil {
			return nil
		}
		return fo.Close()
	}
	var itemStore store.Store
	if fo != nil {
		// The fan-out's Redis already holds the items' results: their
		// sub-chains' runs are as safe there as those results are.
		itemStore, err = redisstore.Open(ctx, redisstore.Options{
			Client: fo.Redis(), Prefix: fo.RunsPrefix(), Logger: log.With("component", "store"),
			Durability: redisstore.Durability{Unchecked: true},
		})
		if err != nil {
			return nil, errors.Join(fmt.Errorf("opening the store of split items' runs: %w", err), closeFanout())
		}
	}
	st, file := itemStore, ""
	switch {
	case opts.Store != nil:
		st = opts.Store
	case !opts.ItemsOnly:
		if st, file, err = openState(ctx, cfg, opts, secretVals, log); err != nil {
			return nil, errors.Join(err, closeFanout())
		}
	}
	// Tests of crash safety name the commit at which this process dies.
	armed, err := crashpoint.FromEnv(st)
	if err != nil {
		return nil, errors.Join(err, st.Close(), closeFanout())
	}
	st = armed
	if opts.ItemsOnly {
		itemStore = st
	}
	pm := host.NewManager(host.Options{Executable: opts.Executable, Logger: log.With("component", "plugins")})
	lim := limits.New(log.With("component", "limits"))
	lim.Configure(LimitPolicies(cfg))
	approvals := newApprovalFeed()
	questions := &SlackQuestions{store: st, redactor: red, log: log.With("component", "slack"), look: approvals.look}
	var res engine.ProviderResolver = &resolver{m: pm, limits: lim, first: map[string]host.Spec{}, secrets: secretVals, redactor: red, questions: questions}
	if opts.Providers != nil {
		res = opts.Providers(res)
	}
	onEvent := func(ev store.Event) {
		approvals.heard(ev)
		if opts.OnEvent != nil {
			opts.OnEvent(ev)
		}
	}
	eopts := engine.Options{
		Store:       st,
		Config:      cfg,
		Providers:   res,
		Clock:       opts.Clock,
		LocalSplits: opts.LocalSplits,
		LoadOptions: LoadOptions(),
		Limits:      cfg.Gateway.Limits,
		LeaseTTL:    time.Duration(cfg.Gateway.LeaseTTLSeconds) * time.Second,
		Secrets:     secretVals,
		Logger:      log.With("component", "engine"),
		LogOutcomes: opts.LogOutcomes,
		OnEvent:     onEvent,
		Observer:    opts.Observer,
	}
	if fo != nil {
		eopts.Fanout = fo
	}
	eng, err := engine.New(eopts)
	if err != nil {
		return nil, errors.Join(err, pm.Close(), closeFanout(), st.Close())
	}
	approvals.config = eng.Config
	g := &Gateway{Config: cfg, Store: st, Plugins: pm, Engine: eng, Log: log, Redactor: red, StoreFile: file, Fanout: fo, ItemStore: itemStore, secrets: secretVals, Limits: lim,
		Providers: res, ApprovalFeed: approvals, Questions: questions}
	switch {
	case fo == nil:
	case opts.ItemsOnly:
		g.Items = eng
	default:
		eopts.Store = itemStore
		eopts.Logger = log.With("component", "engine", "runs", "split items")
		if g.Items, err = engine.New(eopts); err != nil {
			eng.Close()
			return nil, errors.Join(err, pm.Close(), closeFanout(), st.Close())
		}
	}
	return g, nil
}

// openState opens the store the config, or opts.State, names, with the
// secrets its URL reads (vals) filled in.
func openState(ctx context.Context, cfg *chain.Config, opts Options, vals map[string]string, log *slog.Logger) (store.Store, string, error) {
	state := opts.State
	if state == "" {
		state = cfg.Gateway.State
	}
	if state == "" {
		state = DefaultState
	}
	state, err := fillURL(state, vals)
	if err != nil {
		return nil, "", fmt.Errorf("filling in the secrets of the state URL: %w", err)
	}
	if file := StateFile(state); opts.Existing && file != "" {
		if _, err := os.Stat(file); errors.Is(err, fs.ErrNotExist) {
			return nil, "", fmt.Errorf("opening store %s: %w; check --state (only serve, run and resume create a store)", file, fs.ErrNotExist)
		}
	}
	return OpenStore(ctx, state, log)
}

// OpenStore opens the store a state URL names, and returns its file when it
// is the embedded store.
func OpenStore(ctx context.Context, state string, log *slog.Logger) (store.Store, string, error) {
	scheme, rest, found := strings.Cut(state, "://")
	if !found {
		scheme, rest = "bolt", state
	}
	switch scheme {
	case "bolt":
		if rest == "" {
			return nil, "", errors.New("opening store: bolt:// needs a file path, e.g. bolt://./data/gateway.db")
		}
		st, err := bolt.Open(rest, bolt.Options{Logger: log.With("component", "store")})
		return st, rest, err
	case "redis", "rediss":
		st, err := openRedis(ctx, state, log.With("component", "store"))
		return st, "", err
	default:
		return nil, "", fmt.Errorf("opening store: unsupported state URL scheme %q (want bolt://PATH or redis://HOST:PORT/DB)", scheme)
	}
}

// StateFile returns the embedded store file a state URL names, or "".
func StateFile(state string) string {
	if scheme, rest, found := strings.Cut(state, "://"); found {
		if scheme == "bolt" {
			return rest
		}
		return ""
	}
	return state
}

// Worker returns a worker for the items of distributed splits, run with
// this gateway's engine and plugins; nil without [gateway.fanout].
func (g *Gateway) Worker() *fanout.Worker {
	if g.Fanout == nil {
		return nil
	}
	return g.Fanout.Worker(g.Items)
}

// WorkItems works the items of distributed splits until ctx ends, and
// takes up the sub-chain runs of items whose worker died; it does nothing
// without [gateway.fanout].
func (g *Gateway) WorkItems(ctx context.Context) error {
	if g.Fanout == nil {
		return nil
	}
	done := make(chan struct{})
	defer func() { <-done }()
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		defer close(done)
		Adopt(actx, g.Items, g.Log.With("component", "worker"), "sub-chain runs of split items", time.Duration(g.Config.Gateway.LeaseTTLSeconds)*time.Second)
	}()
	g.WarmItemProviders(ctx)
	return g.Worker().Run(ctx)
}

// WarmItemProviders starts the plugin processes of the providers that split
// items call, before the worker takes its first batch: that batch would
// otherwise wait for them, and cost several times what later ones do. A
// provider that does not start is logged; its items try again.
func (g *Gateway) WarmItemProviders(ctx context.Context) {
	names := map[string]bool{}
	for _, c := range g.Config.ChainNames {
		g.Config.Chains[c].WalkChain(func(s *chain.Step) {
			if s.Split == nil {
				return
			}
			chain.WalkSteps(s.Split.Steps, func(in *chain.Step) {
				if in.Provider != "" {
					names[in.Provider] = true
				}
			})
		})
	}
	var wg sync.WaitGroup
	for name := range names {
		p := g.Config.Providers[name]
		if p == nil {
			continue
		}
		wg.Go(func() {
			dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			if _, err := g.Plugins.Provider(host.Spec{Name: p.Name, Builtin: p.Type, Path: p.Plugin, SHA256: p.SHA256}).Describe(dctx); err != nil {
				g.Log.Warn("starting a provider split items call; its first item starts it again", "provider", name, "err", err)
			}
		})
	}
	wg.Wait()
}

// Adopt resumes the unfinished runs of eng's store, then keeps taking over
// those whose lease lapses: a few times per lease, so a run resumes well
// within a second of its lease lapsing.
func Adopt(ctx context.Context, eng *engine.Engine, log *slog.Logger, what string, ttl time.Duration) {
	if ttl <= 0 {
		ttl = engine.DefaultLeaseTTL
	}
	t := time.NewTicker(min(ttl/4, time.Second))
	defer t.Stop()
	for {
		ids, err := eng.Adopt(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, engine.ErrClosed):
			return
		case err != nil:
			log.Warn("taking up "+what, "err", err)
		case len(ids) > 0:
			log.Info("took up "+what, "count", len(ids))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// SecretValues are the values the engine renders <<secrets.NAME>> with.
func (g *Gateway) SecretValues() map[string]string { return g.secrets }

// Close stops the engines (runs stay persisted), stops every plugin
// process and closes the stores.
func (g *Gateway) Close() error {
	g.Engine.Close()
	var ierr, ferr error
	if g.Items != nil && g.Items != g.Engine {
		g.Items.Close()
		ierr = g.ItemStore.Close()
	}
	if g.Fanout != nil {
		ferr = g.Fanout.Close()
	}
	return errors.Join(ierr, ferr, g.Plugins.Close(), g.Store.Close())
}

// resolver hands the engine plugin-backed providers. A provider whose
// definition a reload changed gets a process of its own under a new name,
// while runs started before the reload keep calling the old one. Both share
// the provider's limits, which follow the current config.
type resolver struct {
	m      *host.Manager
	limits *limits.Set
	mu     sync.Mutex
	first  map[string]host.Spec
	// secrets and redactor fill in and hide what providers' configs read.
	secrets  map[string]string
	redactor *secrets.Redactor
	checks   pluginChecks
	// questions records the Slack messages that ask approval steps'
	// questions, which Slack providers' calls post.
	questions *SlackQuestions
}

func (r *resolver) Resolve(p *chain.Provider) (providers.Provider, error) {
	prov := r.limits.Wrap(p.Name, r.m.Provider(r.spec(p)))
	if p.Type == "slack" {
		return &questionAsker{Provider: prov, name: p.Name, q: r.questions}, nil
	}
	return prov, nil
}

// LimitPolicies are the limits cfg's providers declare, by name.
func LimitPolicies(cfg *chain.Config) map[string]limits.Policy {
	out := make(map[string]limits.Policy, len(cfg.Providers))
	for name, p := range cfg.Providers {
		var pol limits.Policy
		if rl := p.RateLimit; rl != nil {
			pol.Rate = &limits.Rate{PerSecond: rl.PerSecond, Burst: rl.Burst}
		}
		pol.MaxConcurrency = p.MaxConcurrency
		if cb := p.CircuitBreaker; cb != nil {
			pol.Breaker = &limits.Breaker{Failures: cb.Failures, OpenSeconds: cb.OpenSeconds}
		}
		out[name] = pol
	}
	return out
}

// spec is the plugin process a provider runs in.
func (r *resolver) spec(p *chain.Provider) host.Spec {
	spec := host.Spec{Name: p.Name, Builtin: p.Type, Path: p.Plugin, SHA256: p.SHA256}
	r.mu.Lock()
	first, ok := r.first[p.Name]
	if !ok {
		r.first[p.Name], first = spec, spec
	}
	r.mu.Unlock()
	if first.Builtin != spec.Builtin || first.Path != spec.Path || first.SHA256 != spec.SHA256 {
		sum := sha256.Sum256([]byte(spec.Builtin + "\x00" + spec.Path + "\x00" + spec.SHA256))
		spec.Name = p.Name + "@" + hex.EncodeToString(sum[:4])
	}
	return spec
}

// StateURL is the store a command that works on a store without a gateway
// names: state when given, else the config's [gateway].state, else
// DefaultState, with the secrets its URL reads filled in.
func StateURL(cfg *chain.Config, state string) (string, error) {
	if state == "" && cfg != nil {
		state = cfg.Gateway.State
	}
	if state == "" {
		return DefaultState, nil
	}
	if !strings.Contains(state, "<<") {
		return state, nil
	}
	vals, err := loadSecrets(cfg)
	if err != nil {
		return "", err
	}
	if state, err = fillURL(state, vals); err != nil {
		return "", fmt.Errorf("filling in the secrets of the state URL: %w", err)
	}
	return state, nil
}
