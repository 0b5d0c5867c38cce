// Command badplugin is a plugin that breaks the session protocol on
// request, for the tests of package host. It serves the gRPC service
// itself instead of through plugins.Serve, as a plugin in another language
// would.
package main

import (
	"context"
	"strings"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/chaingate/gateway/plugins"
	"github.com/chaingate/gateway/plugins/proto/providerv1"
)

type server struct {
	providerv1.UnimplementedProviderServer
}

func (server) Describe(context.Context, *providerv1.DescribeRequest) (*providerv1.DescribeResponse, error) {
	return &providerv1.DescribeResponse{Name: "bad", Version: "test", Session: true}, nil
}

// Session answers by action type: no_result answers without a result,
// oversized answers with 100 KiB whatever the gateway's limit, anything
// else echoes the payload.
func (server) Session(stream providerv1.Provider_SessionServer) error {
	for {
		m, err := stream.Recv()
		if err != nil {
			return err
		}
		if m.Execute == nil {
			continue
		}
		out := &providerv1.SessionResponse{Id: m.Id}
		switch m.Execute.ActionType {
		case "no_result":
		case "oversized":
			out.Result = &providerv1.ExecuteResponse{Body: []byte(`"` + strings.Repeat("x", 100<<10) + `"`)}
		default:
			out.Result = &providerv1.ExecuteResponse{Body: m.Execute.Payload}
		}
		if err := stream.Send(out); err != nil {
			return err
		}
	}
}

type grpcPlugin struct{ plugin.NetRPCUnsupportedPlugin }

func (grpcPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	providerv1.RegisterProviderServer(s, server{})
	return nil
}

func (grpcPlugin) GRPCClient(context.Context, *plugin.GRPCBroker, *grpc.ClientConn) (any, error) {
	return nil, nil
}

func main() {
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig:  plugin.HandshakeConfig{MagicCookieKey: plugins.MagicCookieKey, MagicCookieValue: plugins.MagicCookieValue},
		VersionedPlugins: map[int]plugin.PluginSet{plugins.ProtocolVersion: {"provider": grpcPlugin{}}},
		GRPCServer:       plugin.DefaultGRPCServer,
	})
}
