package host

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/chaingate/gateway/plugins/proto/providerv1"
)

// A session multiplexes every Execute call to one plugin process over a
// single gRPC stream. A unary call costs an HTTP/2 stream, headers and
// trailers per call; on a session a call is two small messages, and under
// load gRPC writes many of them per syscall.

// stuckSend is how long one message may take to send before the session is
// given up: the plugin has stopped reading, so every call behind it would
// wait on a stream whose flow-control window never reopens.
const stuckSend = 2 * time.Second

// brokenSessionError is what every call on a session gets once its stream
// has failed: the plugin process needs replacing, though this call itself
// may have been fine.
type brokenSessionError struct {
	Err error
}

func (e *brokenSessionError) Error() string {
	return "the session with the plugin broke: " + e.Err.Error()
}

func (e *brokenSessionError) Unwrap() error { return e.Err }

// errStuck breaks a session whose plugin stopped reading.
var errStuck = fmt.Errorf("the plugin has read nothing for %v", stuckSend)

// session is the gateway's end.
type session struct {
	stream   providerv1.Provider_SessionClient
	maxBytes int
	cancel   context.CancelFunc
	nextID   atomic.Uint64

	// Messages go out through one writer goroutine, so that a call whose
	// message cannot be sent still ends with its own context.
	qmu   sync.Mutex
	queue []*outgoing
	wake  chan struct{}
	// sendingSince is when the message being sent started, in Unix
	// nanoseconds; 0 while the writer waits for work.
	sendingSince atomic.Int64

	mu       sync.Mutex
	pending  map[uint64]*call
	broken   chan struct{} // closed when the stream fails
	err      error         // why, set before broken is closed
	failOnce sync.Once
}

type answer struct {
	resp *providerv1.ExecuteResponse
	err  error
}

// call is a call on the session until it ends: with the plugin's answer,
// its context's end or the session's, whichever comes first.
type call struct {
	mu    sync.Mutex
	ended bool
	// stop unregisters the watch on the call's context.
	stop func() bool
	done func(*providerv1.ExecuteResponse, error)
}

// end ends the call, unless it has ended already.
func (c *call) end(resp *providerv1.ExecuteResponse, err error) {
	c.mu.Lock()
	if c.ended {
		c.mu.Unlock()
		return
	}
	c.ended = true
	stop := c.stop
	c.mu.Unlock()
	if stop != nil {
		stop()
	}
	c.done(resp, err)
}

// outgoing is a queued message; its call withdraws it when it gives up
// before the writer took it.
type outgoing struct {
	msg   *providerv1.SessionRequest
	state atomic.Int32
}

const (
	outQueued int32 = iota
	outTaken
	outWithdrawn
)

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
		wake:     make(chan struct{}, 1),
		pending:  map[uint64]*call{},
		broken:   make(chan struct{}),
	}
	go s.receive()
	go s.write()
	return s, nil
}

// fail ends the session for every call on it, once.
func (s *session) fail(err error) {
	s.failOnce.Do(func() {
		s.mu.Lock()
		s.err = &brokenSessionError{Err: err}
		calls := s.pending
		s.pending = nil
		s.mu.Unlock()
		close(s.broken)
		s.cancel() // unblocks a Send stuck on flow control
		for _, c := range calls {
			c.end(nil, s.err)
		}
	})
}

// isBroken reports whether the session can take no more calls.
func (s *session) isBroken() bool {
	select {
	case <-s.broken:
		return true
	default:
		return false
	}
}

func (s *session) receive() {
	for {
		m, err := s.stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = status.Error(codes.Unavailable, "the plugin ended the session")
			}
			s.fail(err)
			return
		}
		s.mu.Lock()
		c := s.pending[m.Id]
		delete(s.pending, m.Id)
		s.mu.Unlock()
		if c == nil {
			continue
		}
		if m.Result == nil {
			c.end(nil, &protocolError{msg: fmt.Sprintf("the plugin answered call %d without a result", m.Id)})
			continue
		}
		c.end(m.Result, nil)
	}
}

// protocolError is a plugin answer that breaks the wire contract; it fails
// the call it answers, not the session.
type protocolError struct{ msg string }

func (e *protocolError) Error() string { return e.msg }

func (s *session) enqueue(m *providerv1.SessionRequest) *outgoing {
	o := &outgoing{msg: m}
	s.qmu.Lock()
	s.queue = append(s.queue, o)
	s.qmu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return o
}

// write sends queued messages in order until the session fails.
func (s *session) write() {
	var batch []*outgoing
	for {
		select {
		case <-s.wake:
		case <-s.broken:
			return
		}
		for {
			s.qmu.Lock()
			batch, s.queue = s.queue, batch[:0]
			s.qmu.Unlock()
			if len(batch) == 0 {
				break
			}
			for i, o := range batch {
				batch[i] = nil
				if !o.state.CompareAndSwap(outQueued, outTaken) {
					continue
				}
				s.sendingSince.Store(time.Now().UnixNano())
				err := s.stream.Send(o.msg)
				s.sendingSince.Store(0)
				if errors.Is(err, io.EOF) {
					// The stream has ended; Recv says why.
					return
				}
				if err != nil {
					s.fail(err)
					return
				}
			}
		}
	}
}

// watchWriter breaks the session if the message being sent now is still
// not sent stuckSend after it started. It is called when a call gives up,
// which is when a plugin that stopped reading shows.
func (s *session) watchWriter() {
	started := s.sendingSince.Load()
	if started == 0 {
		return
	}
	check := func() {
		if s.sendingSince.Load() == started {
			s.fail(errStuck)
		}
	}
	if wait := stuckSend - time.Since(time.Unix(0, started)); wait > 0 {
		time.AfterFunc(wait, check)
		return
	}
	check()
}

// execute makes one call. Errors are gRPC status errors or ctx's, as for a
// unary call, so the caller classifies them the same way; once the stream
// has failed, they are *brokenSessionError.
func (s *session) execute(ctx context.Context, in *providerv1.ExecuteRequest) (*providerv1.ExecuteResponse, error) {
	ch := make(chan answer, 1)
	s.start(ctx, in, func(resp *providerv1.ExecuteResponse, err error) { ch <- answer{resp, err} })
	a := <-ch
	return a.resp, a.err
}

// start makes one call as execute does, without waiting for it: done gets
// what execute would return, once, on the goroutine that reads the
// plugin's answers, or the one that sees the call's context or the session
// end, or on this one before start returns. It must not block.
func (s *session) start(ctx context.Context, in *providerv1.ExecuteRequest, done func(*providerv1.ExecuteResponse, error)) {
	id := s.nextID.Add(1)
	msg := &providerv1.SessionRequest{Id: id, Execute: in}
	// gRPC refuses an oversized message by ending the stream, for every
	// call on it, so it is refused here, for this call alone. The size is
	// the whole message on the wire, wrapper included.
	if n := proto.Size(msg); n > s.maxBytes {
		done(nil, status.Errorf(codes.ResourceExhausted, "request of %d bytes exceeds the limit", n))
		return
	}
	c := &call{done: done}
	// Held until the call is set up, so that an end that comes first waits
	// for what it undoes.
	c.mu.Lock()
	s.mu.Lock()
	if s.pending == nil {
		err := s.err
		s.mu.Unlock()
		c.mu.Unlock()
		done(nil, err)
		return
	}
	s.pending[id] = c
	s.mu.Unlock()
	out := s.enqueue(msg)
	c.stop = context.AfterFunc(ctx, func() {
		c.mu.Lock()
		if c.ended {
			c.mu.Unlock()
			return
		}
		c.ended = true
		c.mu.Unlock()
		s.forget(id)
		if !out.state.CompareAndSwap(outQueued, outWithdrawn) {
			// The plugin has the call, or is being sent it: tell it, so
			// its ctx ends too; the answer, if one still comes, is dropped.
			s.enqueue(&providerv1.SessionRequest{Id: id, Cancel: true})
		}
		s.watchWriter()
		done(nil, ctx.Err())
	})
	c.mu.Unlock()
}

func (s *session) forget(id uint64) {
	s.mu.Lock()
	if s.pending != nil {
		delete(s.pending, id)
	}
	s.mu.Unlock()
}

func (s *session) close() { s.fail(errors.New("the session was closed")) }
