// Package gateway wires a config, a store, the plugin processes and the
// engine into one running gateway.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/bolt"
	"github.com/chaingate/gateway/plugins"
	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/builtin"
)

// DefaultState is where runs are kept when neither --state nor
// [gateway].state says otherwise.
const DefaultState = "bolt://./data/gateway.db"

// LoadOptions checks provider types against the built-in providers.
func LoadOptions() chain.LoadOptions {
	return chain.LoadOptions{ProviderTypes: builtin.Types()}
}

// LoadConfig loads config files and directories.
func LoadConfig(paths []string) (*chain.Config, error) {
	return chain.Load(paths, LoadOptions())
}

// Options configures a Gateway.
type Options struct {
	Config *chain.Config
	// State overrides [gateway].state: bolt://PATH, or a bare file path.
	State  string
	Logger *slog.Logger
	// Executable is the binary re-executed to serve built-in providers;
	// default os.Executable().
	Executable string
	// OnEvent receives every durable run event.
	OnEvent func(store.Event)
}

// Gateway is a running gateway.
type Gateway struct {
	Config  *chain.Config
	Store   store.Store
	Plugins *plugins.Manager
	Engine  *engine.Engine
	// StoreFile is the embedded store's file; its control socket sits beside it.
	StoreFile string
}

// Open opens the store and prepares the engine. Plugin processes start when
// a step first uses them.
func Open(ctx context.Context, opts Options) (*Gateway, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	state := opts.State
	if state == "" {
		state = opts.Config.Gateway.State
	}
	if state == "" {
		state = DefaultState
	}
	st, file, err := OpenStore(ctx, state, opts.Logger)
	if err != nil {
		return nil, err
	}
	pm := plugins.NewManager(plugins.Options{Executable: opts.Executable, Logger: opts.Logger.With("component", "plugins")})
	eng, err := engine.New(engine.Options{
		Store:       st,
		Config:      opts.Config,
		Providers:   resolver{pm},
		LoadOptions: LoadOptions(),
		Limits:      opts.Config.Gateway.Limits,
		Logger:      opts.Logger.With("component", "engine"),
		OnEvent:     opts.OnEvent,
	})
	if err != nil {
		_ = pm.Close()
		_ = st.Close()
		return nil, err
	}
	return &Gateway{Config: opts.Config, Store: st, Plugins: pm, Engine: eng, StoreFile: file}, nil
}

// OpenStore opens the store a state URL names, and returns its file when it
// is the embedded store.
func OpenStore(_ context.Context, state string, log *slog.Logger) (store.Store, string, error) {
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
	default:
		return nil, "", fmt.Errorf("opening store: unsupported state URL scheme %q (want bolt://PATH)", scheme)
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

// Close stops the engine (runs stay persisted), stops every plugin process
// and closes the store.
func (g *Gateway) Close() error {
	g.Engine.Close()
	return errors.Join(g.Plugins.Close(), g.Store.Close())
}

// resolver hands the engine plugin-backed providers.
type resolver struct{ m *plugins.Manager }

func (r resolver) Resolve(p *chain.Provider) (providers.Provider, error) {
	return r.m.Provider(plugins.Spec{Name: p.Name, Builtin: p.Type, Path: p.Plugin, SHA256: p.SHA256}), nil
}
