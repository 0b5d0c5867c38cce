package plugins

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/chaingate/gateway/providers"
)

// BuiltinEnv names the built-in provider type that a re-executed gateway
// binary should serve instead of running as the gateway.
const BuiltinEnv = "CHAINGATE_BUILTIN_PROVIDER"

// orphanPoll is how often a plugin checks that the gateway is still alive.
const orphanPoll = 200 * time.Millisecond

// Serve serves p as a provider plugin and returns when the gateway closes the
// connection. It is the whole main of a plugin:
//
//	func main() { plugins.Serve(myProvider{}) }
//
// A plugin exits on its own shortly after the gateway dies, however it died.
// Serve answers ProbeAction itself, for "gateway plugin check".
func Serve(p providers.Provider) {
	go exitWhenOrphaned(os.Getppid())
	// Stderr is the channel go-plugin reads log lines from; JSON keeps the
	// level of each line when the gateway re-logs it.
	logger := hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: os.Stderr, JSONFormat: true})
	maxBytes := maxMessageFromEnv()
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig:  handshake,
		VersionedPlugins: pluginSets(probing{p}, logger), // see ProbeAction
		Logger:           logger,
		GRPCServer: func(opts []grpc.ServerOption) *grpc.Server {
			return grpc.NewServer(append(opts, serverOptions(maxBytes)...)...)
		},
	})
}

// exitWhenOrphaned exits once the process that started this one is gone:
// the kernel reparents an orphan, so its parent pid changes. This catches a
// gateway killed by SIGKILL, which can run no cleanup of its own.
func exitWhenOrphaned(parent int) {
	for range time.Tick(orphanPoll) {
		if os.Getppid() != parent {
			os.Exit(1)
		}
	}
}

// ServeBuiltinIfRequested turns this process into a built-in provider plugin
// when BuiltinEnv is set, and then exits; otherwise it returns at once.
// The gateway's main, and the TestMain of every test that starts plugins,
// call it before anything else.
func ServeBuiltinIfRequested(lookup func(typ string) (providers.Provider, bool)) {
	typ, ok := os.LookupEnv(BuiltinEnv)
	if !ok {
		return
	}
	p, ok := lookup(typ)
	if !ok {
		fmt.Fprintf(os.Stderr, "chaingate: %s=%q: unknown built-in provider type\n", BuiltinEnv, typ)
		os.Exit(2)
	}
	Serve(p)
	os.Exit(0)
}

// NewLogger returns a logger for code running inside a plugin. Its records
// go to stderr in hclog's JSON form, so they reach the gateway's log with
// their level and attributes intact and tagged with the provider's name.
func NewLogger(level slog.Leveler) *slog.Logger {
	return slog.New(slog.NewJSONHandler(currentStderr{}, &slog.HandlerOptions{
		Level: level,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) > 0 {
				return a
			}
			switch a.Key {
			case slog.TimeKey:
				return slog.String("@timestamp", a.Value.Time().Format("2006-01-02T15:04:05.000000Z07:00"))
			case slog.MessageKey:
				return slog.Attr{Key: "@message", Value: a.Value}
			case slog.LevelKey:
				return slog.String("@level", hclogLevel(a.Value.Any().(slog.Level)).String())
			}
			return a
		},
	}))
}

// currentStderr writes to whatever os.Stderr is at the time: Serve swaps it
// for a pipe to the gateway, and a logger made before Serve must follow.
type currentStderr struct{}

func (currentStderr) Write(p []byte) (int, error) { return os.Stderr.Write(p) }
