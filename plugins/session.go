package plugins

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/chaingate/gateway/plugins/proto/providerv1"
)

// A session multiplexes every Execute call to one plugin process over a
// single gRPC stream. A unary call costs an HTTP/2 stream, headers and
// trailers per call; on a session a call is two small messages, and under
// load gRPC writes many of them per syscall.

// session is the gateway's end.
type session struct {
	stream   providerv1.Provider_SessionClient
	maxBytes int
	cancel   context.CancelFunc

	sendMu sync.Mutex
	nextID atomic.Uint64

	mu      sync.Mutex
	pending map[uint64]chan *providerv1.ExecuteResponse
	broken  chan struct{} // closed when the stream fails
	err     error         // why, set before broken is closed
}

func openSession(rpc providerv1.ProviderClient, maxBytes int) (*session, error) {
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := rpc.Session(ctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("opening a session: %w", err)
	}
	s := &session{
		stream:   stream,
		maxBytes: maxBytes,
		cancel:   cancel,
		pending:  map[uint64]chan *providerv1.ExecuteResponse{},
		broken:   make(chan struct{}),
	}
	go s.receive()
	return s, nil
}

func (s *session) receive() {
	for {
		m, err := s.stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = status.Error(codes.Unavailable, "the plugin ended the session")
			}
			s.mu.Lock()
			s.err = err
			s.pending = nil
			s.mu.Unlock()
			close(s.broken)
			return
		}
		s.mu.Lock()
		ch := s.pending[m.Id]
		delete(s.pending, m.Id)
		s.mu.Unlock()
		if ch != nil {
			ch <- m.Result
		}
	}
}

func (s *session) send(m *providerv1.SessionRequest) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	return s.stream.Send(m)
}

// execute makes one call. Errors are gRPC status errors or ctx's, as for a
// unary call, so the caller classifies them the same way.
func (s *session) execute(ctx context.Context, in *providerv1.ExecuteRequest) (*providerv1.ExecuteResponse, error) {
	// An oversized message would break the stream for every call on it, so
	// it is refused here, for this call alone.
	if n := proto.Size(in); n > s.maxBytes {
		return nil, status.Errorf(codes.ResourceExhausted, "request of %d bytes exceeds the limit", n)
	}
	id := s.nextID.Add(1)
	ch := make(chan *providerv1.ExecuteResponse, 1)
	s.mu.Lock()
	if s.pending == nil {
		err := s.err
		s.mu.Unlock()
		return nil, err
	}
	s.pending[id] = ch
	s.mu.Unlock()

	if err := s.send(&providerv1.SessionRequest{Id: id, Execute: in}); err != nil {
		s.forget(id)
		<-s.broken
		return nil, s.err
	}
	select {
	case resp := <-ch:
		return resp, nil
	case <-s.broken:
		return nil, s.err
	case <-ctx.Done():
		s.forget(id)
		// Tell the plugin, so its ctx ends too; the answer, if one still
		// comes, is dropped.
		_ = s.send(&providerv1.SessionRequest{Id: id, Cancel: true})
		return nil, ctx.Err()
	}
}

func (s *session) forget(id uint64) {
	s.mu.Lock()
	if s.pending != nil {
		delete(s.pending, id)
	}
	s.mu.Unlock()
}

func (s *session) close() { s.cancel() }

// Session is the plugin's end: each request runs in its own goroutine and
// answers when it is done.
func (s *server) Session(stream providerv1.Provider_SessionServer) error {
	maxBytes := maxMessageFromEnv()
	var (
		sendMu  sync.Mutex
		mu      sync.Mutex
		cancels = map[uint64]context.CancelFunc{}
		wg      sync.WaitGroup
	)
	defer func() {
		mu.Lock()
		for _, cancel := range cancels {
			cancel()
		}
		mu.Unlock()
		wg.Wait()
	}()
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if m.Cancel {
			mu.Lock()
			if cancel := cancels[m.Id]; cancel != nil {
				cancel()
			}
			mu.Unlock()
			continue
		}
		if m.Execute == nil {
			continue
		}
		ctx, cancel := context.WithCancel(stream.Context())
		mu.Lock()
		cancels[m.Id] = cancel
		mu.Unlock()
		wg.Add(1)
		go func(id uint64, in *providerv1.ExecuteRequest) {
			defer wg.Done()
			resp := s.execute(ctx, in)
			mu.Lock()
			delete(cancels, id)
			mu.Unlock()
			cancel()
			if n := proto.Size(resp); n > maxBytes {
				resp = &providerv1.ExecuteResponse{Error: &providerv1.Error{
					Code: "message_too_large", Message: fmt.Sprintf("the provider's answer of %d bytes exceeds the limit of %d", n, maxBytes),
				}}
			}
			sendMu.Lock()
			err := stream.Send(&providerv1.SessionResponse{Id: id, Result: resp})
			sendMu.Unlock()
			if err != nil {
				s.logger.Warn("sending an answer on the session failed", "err", err)
			}
		}(m.Id, m.Execute)
	}
}
