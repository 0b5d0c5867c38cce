package wire

import (
	"os"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/chaingate/gateway/providers"
)

// orphanPoll is how often a plugin checks that the gateway is still alive.
const orphanPoll = 200 * time.Millisecond

// Serve serves p as a provider plugin and returns when the gateway closes
// the connection; ProbeAction is answered before p sees it.
func Serve(p providers.Provider) {
	go exitWhenOrphaned(os.Getppid())
	// Stderr is the channel go-plugin reads log lines from; JSON keeps the
	// level of each line when the gateway re-logs it.
	logger := hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: os.Stderr, JSONFormat: true})
	maxBytes := MaxMessageFromEnv()
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig:  Handshake,
		VersionedPlugins: PluginSets(Probing{p}, logger),
		Logger:           logger,
		GRPCServer: func(opts []grpc.ServerOption) *grpc.Server {
			return grpc.NewServer(append(opts, ServerOptions(maxBytes)...)...)
		},
	})
}

// exitWhenOrphaned exits once the process that started this one is gone:
// the kernel reparents an orphan, so its parent pid changes. This catches a
// gateway killed by SIGKILL, which can run no cleanup of its own.
func exitWhenOrphaned(parent int) {
	for range time.Tick(orphanPoll) {
		if os.Getppid() != parent {
			removeOwnSocketDir()
			os.Exit(1)
		}
	}
}

// SocketDirEnv adds to env the name of the directory the plugin is to make
// its socket in, if there is one (see MakeSocketDir).
func SocketDirEnv(env []string, dir string) []string {
	if dir == "" {
		return env
	}
	return append(env, plugin.EnvUnixSocketDir+"="+dir)
}
