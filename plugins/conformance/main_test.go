package conformance_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/chaingate/gateway/internal/testutil"
	"github.com/chaingate/gateway/plugins"
	"github.com/chaingate/gateway/plugins/conformance"
	"github.com/chaingate/gateway/plugins/host"
	"github.com/chaingate/gateway/plugins/proto/providerv1"
	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/builtin"
)

// foreignArg makes the test binary a plugin that speaks the wire protocol
// without plugins.Serve, as one written in another language does.
const foreignArg = "foreign-plugin"

func TestMain(m *testing.M) {
	host.ServeBuiltinIfRequested(func(typ string) (providers.Provider, bool) {
		if p, ok := testProviders[typ]; ok {
			return p, true
		}
		return builtin.New(typ)
	})
	conformance.ServeOrphanHostIfRequested()
	if len(os.Args) > 1 && os.Args[1] == foreignArg {
		serveForeign()
		os.Exit(0)
	}
	testutil.QuickRaceExit()
	os.Exit(m.Run())
}

// testProviders are served by this test binary like built-ins.
var testProviders = map[string]providers.Provider{
	"conformant":  conformant{},
	"misbehaving": misbehaving{},
}

// conformant keeps every rule.
type conformant struct{}

func (conformant) Describe(context.Context) (providers.Info, error) {
	return providers.Info{Name: "conformant", Version: "1.0.0", ActionTypes: []string{"open", "close"},
		ConfigSchema: json.RawMessage(`{"type": "object", "additionalProperties": false, "required": ["project"], "properties": {"project": {"type": "string"}}}`)}, nil
}

func (conformant) Execute(ctx context.Context, req providers.Request) (providers.Response, error) {
	var p struct {
		Title string `json:"title"`
	}
	if err := json.Unmarshal(req.Payload, &p); err != nil || p.Title == "" {
		return providers.Response{}, providers.Permanent("bad_payload", "want {\"title\": TEXT}")
	}
	// Stands in for a call to a slow system that honours ctx.
	select {
	case <-time.After(20 * time.Millisecond):
	case <-ctx.Done():
		return providers.Response{}, ctx.Err()
	}
	return providers.Response{Body: json.RawMessage(`{"ticket": "OPS-1", "action": "` + req.ActionType + `"}`)}, nil
}

// misbehaving breaks a rule with each action.
type misbehaving struct{}

func (misbehaving) Describe(context.Context) (providers.Info, error) {
	return providers.Info{Name: "misbehaving", Version: "0.1", ActionTypes: []string{"slow", "flaky", "fragile", "brittle", "lenient"},
		ConfigSchema: json.RawMessage(`{"type": "object", "required": ["endpoint"], "properties": {"endpoint": {"type": "string"}}}`)}, nil
}

func (misbehaving) Execute(ctx context.Context, req providers.Request) (providers.Response, error) {
	var p map[string]any
	bad := json.Unmarshal(req.Payload, &p) != nil
	switch req.ActionType {
	case "slow":
		// Ignores ctx, for well past the checks' grace period, so that the
		// well-behaved actions' checks have that whole grace on a loaded
		// machine and this one still fails.
		time.Sleep(5 * time.Second)
	case "flaky":
		if bad {
			return providers.Response{}, providers.Retryable("bad_payload", "cannot decode the payload")
		}
	case "fragile":
		if bad {
			panic("decoding the payload")
		}
	case "brittle":
		if bad {
			os.Exit(3)
		}
	case "lenient":
	}
	return providers.Response{Body: json.RawMessage(`{"ok": true}`)}, nil
}

// serveForeign serves a well-behaved provider over go-plugin without
// plugins.Serve: no session, no probe, no watch on its parent.
func serveForeign() {
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: plugin.HandshakeConfig{MagicCookieKey: plugins.MagicCookieKey, MagicCookieValue: plugins.MagicCookieValue},
		GRPCServer:      plugin.DefaultGRPCServer,
		VersionedPlugins: map[int]plugin.PluginSet{
			plugins.ProtocolVersion: {"provider": foreignPlugin{}},
		},
	})
}

type foreignPlugin struct{ plugin.NetRPCUnsupportedPlugin }

func (foreignPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	providerv1.RegisterProviderServer(s, foreignServer{})
	return nil
}

func (foreignPlugin) GRPCClient(context.Context, *plugin.GRPCBroker, *grpc.ClientConn) (any, error) {
	return nil, errors.New("the foreign plugin has no client side")
}

type foreignServer struct {
	providerv1.UnimplementedProviderServer
}

func (foreignServer) Describe(context.Context, *providerv1.DescribeRequest) (*providerv1.DescribeResponse, error) {
	return &providerv1.DescribeResponse{Name: "foreign", Version: "2", ActionTypes: []string{"ping"}}, nil
}

func (foreignServer) Execute(ctx context.Context, in *providerv1.ExecuteRequest) (*providerv1.ExecuteResponse, error) {
	var p struct {
		Host string `json:"host"`
	}
	if in.ActionType != "ping" || json.Unmarshal(in.Payload, &p) != nil || p.Host == "" {
		return &providerv1.ExecuteResponse{Error: &providerv1.Error{Code: "bad_request", Message: "want ping with {\"host\": NAME}"}}, nil
	}
	return &providerv1.ExecuteResponse{Body: []byte(`{"pong": "` + p.Host + `"}`)}, nil
}
