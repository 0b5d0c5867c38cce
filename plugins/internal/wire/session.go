package wire

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/chaingate/gateway/plugins/proto/providerv1"
)

// idleWorker is how long a session keeps a goroutine that has no call to
// run. Calls come in waves; a goroutine kept from the last one has the
// stack a call grows, where a new one grows it again, copy by copy.
const idleWorker = 10 * time.Second

// sessionCall is one call on a session.
type sessionCall struct {
	id       uint64
	in       *providerv1.ExecuteRequest
	ctx      context.Context
	cancel   context.CancelFunc
	deadline time.Time
}

func newSessionCall(base context.Context, id uint64, in *providerv1.ExecuteRequest) *sessionCall {
	c := &sessionCall{id: id, in: in}
	if in.Deadline != 0 {
		c.deadline = time.Unix(0, in.Deadline)
		c.ctx, c.cancel = context.WithDeadline(base, c.deadline)
	} else {
		c.ctx, c.cancel = context.WithCancel(base)
	}
	return c
}

// stop ends the call's context because the gateway gave up on it. Close to
// the deadline that is the deadline passing on the gateway first, so the
// call is left to end with DeadlineExceeded, as the contract promises.
func (c *sessionCall) stop() {
	if c.deadline.IsZero() || time.Until(c.deadline) > deadlineSlop {
		c.cancel()
	}
}

// Session is the plugin's end: each request runs on a goroutine of its
// own, kept for the next request once it is done, and answers when it is
// done.
func (s *server) Session(stream providerv1.Provider_SessionServer) error {
	maxBytes := MaxMessageFromEnv()
	// A call ends with its deadline, a cancel message or the session; the
	// session's end is the loop below returning.
	base := context.WithoutCancel(stream.Context())
	var (
		sendMu sync.Mutex
		mu     sync.Mutex
		calls  = map[uint64]*sessionCall{}
		wg     sync.WaitGroup
	)
	jobs := make(chan *sessionCall)
	done := make(chan struct{})
	defer func() {
		close(done)
		mu.Lock()
		for _, c := range calls {
			c.stop()
		}
		mu.Unlock()
		wg.Wait()
	}()
	answer := func(c *sessionCall) {
		resp := s.call(c.ctx, c.in)
		mu.Lock()
		delete(calls, c.id)
		mu.Unlock()
		c.cancel()
		out := &providerv1.SessionResponse{Id: c.id, Result: resp}
		// Measured with its wrapper, as gRPC measures it: an answer gRPC
		// refused would end the session for every call on it.
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
	}
	worker := func(c *sessionCall) {
		defer wg.Done()
		idle := time.NewTimer(idleWorker)
		defer idle.Stop()
		for {
			answer(c)
			idle.Reset(idleWorker)
			select {
			case c = <-jobs:
			case <-idle.C:
				return
			case <-done:
				return
			}
		}
	}
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
			c := calls[m.Id]
			mu.Unlock()
			if c != nil {
				c.stop()
			}
			continue
		}
		if m.Execute == nil {
			continue
		}
		c := newSessionCall(base, m.Id, m.Execute)
		mu.Lock()
		calls[m.Id] = c
		mu.Unlock()
		select {
		case jobs <- c:
		default:
			wg.Add(1)
			go worker(c)
		}
	}
}
