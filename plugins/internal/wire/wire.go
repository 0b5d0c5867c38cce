// Package wire is the plugin protocol's Go side, shared by the SDK that
// plugins serve with and the host that launches them: the go-plugin
// handshake, the gRPC adapters and the error mapping.
package wire

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/chaingate/gateway/plugins/proto/providerv1"
	"github.com/chaingate/gateway/providers"
)

// The go-plugin handshake. A plugin written in another language must check
// that the environment variable MagicCookieKey equals MagicCookieValue and
// serve chaingate.provider.v1.Provider under ProtocolVersion.
const (
	ProtocolVersion  = 1
	MagicCookieKey   = "CHAINGATE_PLUGIN_COOKIE"
	MagicCookieValue = "b7e0a1f4c2d94c7e8a6f3e1d5c9b2a70"
)

// DefaultMaxMessageBytes bounds one gRPC message in either direction.
const DefaultMaxMessageBytes = 16 << 20

// MaxMessageEnv tells the plugin the host's message limit, so both ends of
// the connection enforce the same one.
const MaxMessageEnv = "CHAINGATE_PLUGIN_MAX_MESSAGE_BYTES"

// PluginName is the single plugin in each versioned set.
const PluginName = "provider"

// Handshake is go-plugin's handshake for both ends.
var Handshake = plugin.HandshakeConfig{
	MagicCookieKey:   MagicCookieKey,
	MagicCookieValue: MagicCookieValue,
}

// PluginSets is keyed by protocol version; a v2 wire protocol is added here
// next to v1 so that old plugins keep working. impl is nil on the host side.
func PluginSets(impl providers.Provider, logger hclog.Logger) map[int]plugin.PluginSet {
	return map[int]plugin.PluginSet{
		ProtocolVersion: {PluginName: &grpcPlugin{impl: impl, logger: logger}},
	}
}

type grpcPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	impl   providers.Provider
	logger hclog.Logger
}

func (p *grpcPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	providerv1.RegisterProviderServer(s, &server{impl: p.impl, logger: p.logger})
	return nil
}

// Dispensed is what the host gets from Dispense: the client and a channel
// that go-plugin closes once the plugin process has exited and been reaped.
type Dispensed struct {
	RPC    providerv1.ProviderClient
	Exited <-chan struct{}
}

func (p *grpcPlugin) GRPCClient(doneCtx context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return &Dispensed{RPC: providerv1.NewProviderClient(c), Exited: doneCtx.Done()}, nil
}

// ServerOptions bound messages and leave streams unbounded on the plugin's server.
func ServerOptions(maxBytes int) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(maxBytes),
		grpc.MaxSendMsgSize(maxBytes),
		// Every Execute of a provider shares this one connection, so the
		// stream limit is the provider's concurrency limit: leave it open.
		grpc.MaxConcurrentStreams(math.MaxUint32),
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(connWindow),
	}
}

// Fixed flow-control windows, large enough that the calls of a session
// never wait for a window update on a local socket. Setting them turns off
// gRPC's bandwidth estimation, a ping for each burst of reads that a
// connection to a process on the same machine has no use for.
const (
	streamWindow = 4 << 20
	connWindow   = 16 << 20
)

// DialOptions bound messages on the host's connection.
func DialOptions(maxBytes int) []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(maxBytes),
			grpc.MaxCallSendMsgSize(maxBytes),
		),
		grpc.WithInitialWindowSize(streamWindow),
		grpc.WithInitialConnWindowSize(connWindow),
	}
}

// MaxMessageFromEnv is the message limit the host passed to this plugin.
func MaxMessageFromEnv() int {
	n, err := strconv.Atoi(os.Getenv(MaxMessageEnv))
	if err != nil || n <= 0 {
		return DefaultMaxMessageBytes
	}
	return n
}

// server runs in the plugin process and adapts gRPC to providers.Provider.
type server struct {
	providerv1.UnimplementedProviderServer
	impl   providers.Provider
	logger hclog.Logger
}

func (s *server) Describe(ctx context.Context, _ *providerv1.DescribeRequest) (resp *providerv1.DescribeResponse, _ error) {
	defer s.recoverInto(func(e *providerv1.Error) { resp = &providerv1.DescribeResponse{Error: e} })
	info, err := s.impl.Describe(ctx)
	if err != nil {
		return &providerv1.DescribeResponse{Error: ToWireError(err)}, nil
	}
	return &providerv1.DescribeResponse{
		Name:         info.Name,
		Version:      info.Version,
		ActionTypes:  info.ActionTypes,
		ConfigSchema: info.ConfigSchema,
		Session:      true,
	}, nil
}

func (s *server) Execute(ctx context.Context, in *providerv1.ExecuteRequest) (*providerv1.ExecuteResponse, error) {
	return s.execute(ctx, in), nil
}

// execute runs one unary call.
func (s *server) execute(ctx context.Context, in *providerv1.ExecuteRequest) *providerv1.ExecuteResponse {
	if in.Deadline != 0 {
		var cancel context.CancelFunc
		ctx, cancel = withDeadline(ctx, time.Unix(0, in.Deadline))
		defer cancel()
	}
	return s.call(ctx, in)
}

// call runs one call for Execute and Session alike, with ctx already
// ending at the call's deadline.
func (s *server) call(ctx context.Context, in *providerv1.ExecuteRequest) (resp *providerv1.ExecuteResponse) {
	defer s.recoverInto(func(e *providerv1.Error) { resp = &providerv1.ExecuteResponse{Error: e} })
	req := providers.Request{
		ActionType: in.ActionType,
		Payload:    in.Payload,
		Config:     in.Config,
		DedupKey:   in.DedupKey,
		Attempt:    int(in.Attempt),
		RunID:      in.RunId,
		Step:       in.Step,
	}
	if in.Deadline != 0 {
		req.Deadline = time.Unix(0, in.Deadline)
	}
	out, err := s.impl.Execute(ctx, req)
	if err != nil {
		return &providerv1.ExecuteResponse{Error: ToWireError(err)}
	}
	return &providerv1.ExecuteResponse{Body: out.Body}
}

// deadlineSlop absorbs the difference between the host's monotonic timer
// and the wall-clock deadline that crosses the wire.
const deadlineSlop = 10 * time.Millisecond

// withDeadline returns a ctx that ends with context.DeadlineExceeded at
// deadline, as the contract promises, and with context.Canceled if the
// gateway cancels the call earlier. A call that reaches its deadline ends
// on the host first, which resets the gRPC stream; that reset can overtake
// the plugin's own timer and would otherwise read as a plain cancellation.
func withDeadline(parent context.Context, deadline time.Time) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithDeadline(context.WithoutCancel(parent), deadline)
	stop := context.AfterFunc(parent, func() {
		if time.Until(deadline) > deadlineSlop {
			cancel()
		}
	})
	return ctx, func() { stop(); cancel() }
}

// recoverInto turns a provider panic into a permanent error for that call
// alone, instead of crashing the process and every call in flight with it.
func (s *server) recoverInto(set func(*providerv1.Error)) {
	if v := recover(); v != nil {
		s.logger.Error("provider panicked", "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
		set(&providerv1.Error{Code: "provider_panic", Message: fmt.Sprintf("provider panicked: %v", v)})
	}
}

// ToWireError carries a provider's error class across the wire.
func ToWireError(err error) *providerv1.Error {
	var pe *providers.Error
	switch {
	case errors.As(err, &pe):
		msg := pe.Message
		if msg == "" && pe.Err != nil {
			msg = pe.Err.Error()
		}
		return &providerv1.Error{Retryable: pe.Retryable, Code: pe.Code, Message: msg, RetryAfterMs: pe.RetryAfter.Milliseconds()}
	case errors.Is(err, context.DeadlineExceeded):
		return &providerv1.Error{Retryable: true, Code: "timeout", Message: err.Error()}
	default:
		return &providerv1.Error{Message: err.Error()}
	}
}

// FromWireError is the host's end of ToWireError.
func FromWireError(e *providerv1.Error) *providers.Error {
	return &providers.Error{Retryable: e.Retryable, Code: e.Code, Message: e.Message, RetryAfter: time.Duration(e.RetryAfterMs) * time.Millisecond}
}
