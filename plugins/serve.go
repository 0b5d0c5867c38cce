// Package plugins is the SDK for provider plugins. A plugin is a program
// whose main hands a providers.Provider to Serve:
//
//	func main() { plugins.Serve(myProvider{}) }
//
// The gateway starts the program as a subprocess and calls it over gRPC, so
// a provider that crashes or hangs cannot take the gateway down. Execute
// gets a ctx that ends when the step is cancelled or reaches its deadline,
// and returns *providers.Error values to say whether a failure is retryable.
// What the plugin logs with NewLogger, and anything it prints, lands in the
// gateway's log tagged with the provider's name. A plugin exits on its own
// shortly after the gateway dies, however it died.
//
// Plugins in other languages serve chaingate.provider.v1.Provider from
// proto/providerv1/provider.proto over hashicorp/go-plugin's gRPC transport,
// checking that the environment variable MagicCookieKey equals
// MagicCookieValue and speaking ProtocolVersion.
package plugins

import (
	"log/slog"
	"os"

	"github.com/chaingate/gateway/plugins/internal/wire"
	"github.com/chaingate/gateway/providers"
)

// The go-plugin handshake.
const (
	ProtocolVersion  = wire.ProtocolVersion
	MagicCookieKey   = wire.MagicCookieKey
	MagicCookieValue = wire.MagicCookieValue
)

// Serve serves p as a provider plugin and returns when the gateway closes
// the connection. It is the whole main of a plugin.
func Serve(p providers.Provider) { wire.Serve(p) }

// NewLogger returns a logger for code running inside a plugin. Its records
// reach the gateway's log with their level and attributes intact.
func NewLogger(level slog.Leveler) *slog.Logger {
	// Records go to stderr in hclog's JSON form, which go-plugin forwards.
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
				return slog.String("@level", wire.HCLogLevel(a.Value.Any().(slog.Level)).String())
			}
			return a
		},
	}))
}

// currentStderr writes to whatever os.Stderr is at the time: Serve swaps it
// for a pipe to the gateway, and a logger made before Serve must follow.
type currentStderr struct{}

func (currentStderr) Write(p []byte) (int, error) { return os.Stderr.Write(p) }
