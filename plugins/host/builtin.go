package host

import (
	"fmt"
	"os"

	"github.com/chaingate/gateway/plugins/internal/wire"
	"github.com/chaingate/gateway/providers"
)

// BuiltinEnv names the built-in provider type that a re-executed gateway
// binary should serve instead of running as the gateway.
const BuiltinEnv = "CHAINGATE_BUILTIN_PROVIDER"

// DefaultMaxMessageBytes bounds one gRPC message in either direction.
const DefaultMaxMessageBytes = wire.DefaultMaxMessageBytes

// ProbeAction is the action type the plugin SDK answers itself, before the
// provider sees the call, so that "gateway plugin check" can see what
// reaches a plugin. Chains cannot call it.
const ProbeAction = wire.ProbeAction

// ProbeRequest is the payload of a ProbeAction call.
type ProbeRequest = wire.ProbeRequest

// ProbeReply is the answer to a ProbeAction call: what arrived.
type ProbeReply = wire.ProbeReply

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
	wire.Serve(p)
	os.Exit(0)
}
