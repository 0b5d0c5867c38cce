package wire

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/chaingate/gateway/plugins/proto/providerv1"
)

// Session is the plugin's end: each request runs in its own goroutine and
// answers when it is done.
func (s *server) Session(stream providerv1.Provider_SessionServer) error {
	maxBytes := MaxMessageFromEnv()
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
			out := &providerv1.SessionResponse{Id: id, Result: resp}
			// Measured with its wrapper, as gRPC measures it: an answer
			// gRPC refused would end the session for every call on it.
			if n := proto.Size(out); n > maxBytes {
				out.Result = &providerv1.ExecuteResponse{Error: &providerv1.Error{
					Code: "message_too_large", Message: fmt.Sprintf("the provider's answer of %d bytes exceeds the limit of %d", n, maxBytes),
				}}
			}
			sendMu.Lock()
			err := stream.Send(out)
			sendMu.Unlock()
			if err != nil {
				s.logger.Warn("sending an answer on the session failed", "err", err)
			}
		}(m.Id, m.Execute)
	}
}
