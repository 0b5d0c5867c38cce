package conformance

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/chaingate/gateway/plugins/host"
	"github.com/chaingate/gateway/plugins/proto/providerv1"
)

// stream is the check's own Session stream. Unlike the gateway, which drops
// a call's answer once it gives up on it, the check keeps listening, so it
// sees when a cancelled call or one past its deadline really returns.
type stream struct {
	s    providerv1.Provider_SessionClient
	stop context.CancelFunc

	sendMu sync.Mutex
	mu     sync.Mutex
	nextID uint64
	// pending holds the calls not yet answered; nil once the stream broke.
	pending map[uint64]chan answer
	err     error
}

type answer struct {
	resp *providerv1.ExecuteResponse
	err  error // the stream broke, or the answer broke the protocol
	at   time.Time
}

func openStream(rpc providerv1.ProviderClient) (*stream, error) {
	ctx, cancel := context.WithCancel(context.Background())
	s, err := rpc.Session(ctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("opening a session: %w", err)
	}
	st := &stream{s: s, stop: cancel, pending: map[uint64]chan answer{}}
	go st.receive()
	return st, nil
}

func (st *stream) receive() {
	for {
		m, err := st.s.Recv()
		now := time.Now()
		if err != nil {
			st.mu.Lock()
			pending := st.pending
			st.pending, st.err = nil, err
			st.mu.Unlock()
			for _, ch := range pending {
				ch <- answer{err: err, at: now}
			}
			return
		}
		a := answer{resp: m.Result, at: now}
		if m.Result == nil {
			a.err = fmt.Errorf("the plugin answered call %d without a result", m.Id)
		}
		st.deliver(m.Id, a)
	}
}

// deliver hands a to the call with that id, if it is still waiting.
func (st *stream) deliver(id uint64, a answer) {
	st.mu.Lock()
	ch := st.pending[id]
	delete(st.pending, id)
	st.mu.Unlock()
	if ch != nil {
		ch <- a
	}
}

// start sends a call; its answer arrives on the channel.
func (st *stream) start(in *providerv1.ExecuteRequest) (uint64, <-chan answer) {
	ch := make(chan answer, 1)
	st.mu.Lock()
	if st.pending == nil {
		err := st.err
		st.mu.Unlock()
		ch <- answer{err: err, at: time.Now()}
		return 0, ch
	}
	st.nextID++
	id := st.nextID
	st.pending[id] = ch
	st.mu.Unlock()
	if err := st.send(&providerv1.SessionRequest{Id: id, Execute: in}); err != nil {
		st.deliver(id, answer{err: err, at: time.Now()})
	}
	return id, ch
}

// cancel tells the plugin to end call id's ctx.
func (st *stream) cancel(id uint64) error {
	return st.send(&providerv1.SessionRequest{Id: id, Cancel: true})
}

func (st *stream) send(m *providerv1.SessionRequest) error {
	st.sendMu.Lock()
	defer st.sendMu.Unlock()
	return st.s.Send(m)
}

func (st *stream) close() { st.stop() }

// session is one running plugin process and the check's way of calling it.
type session struct {
	conn *host.Conn
	st   *stream // nil when the plugin serves only unary Execute
}

// outcome is how one call ended, as the check saw it.
type outcome struct {
	resp    *providerv1.ExecuteResponse // nil when there was no answer
	err     error                       // no answer: the transport failed, or waiting ran out
	crashed string                      // the process exited during the call: how
	at      time.Time                   // when the answer or failure came
}

// errNoAnswer is an outcome's err when waiting ran out.
var errNoAnswer = errors.New("no answer")

// exec makes one call and waits at most wait for its answer.
func (s *session) exec(ctx context.Context, in *providerv1.ExecuteRequest, wait time.Duration) outcome {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if s.st == nil {
		resp, err := s.conn.RPC.Execute(ctx, in)
		return s.settle(ctx, outcome{resp: resp, err: err, at: time.Now()})
	}
	id, ch := s.st.start(in)
	select {
	case a := <-ch:
		return s.settle(ctx, outcome{resp: a.resp, err: a.err, at: a.at})
	case <-ctx.Done():
		// The plugin's ctx for the call ends too, as when the gateway gives up.
		_ = s.st.cancel(id)
		return outcome{err: errNoAnswer, at: time.Now()}
	}
}

// settle tells a crash apart from other failures: a process that died is
// reaped within moments.
func (s *session) settle(ctx context.Context, o outcome) outcome {
	switch {
	case o.err == nil:
		return o
	case ctx.Err() != nil:
		o.err = errNoAnswer
		if s.exited() {
			o.crashed = s.conn.ExitStatus()
		}
		return o
	}
	select {
	case <-s.conn.Exited():
		o.crashed = s.conn.ExitStatus()
	case <-time.After(2 * time.Second):
	}
	return o
}

// exited reports whether the plugin process has exited.
func (s *session) exited() bool {
	select {
	case <-s.conn.Exited():
		return true
	default:
		return false
	}
}

func (s *session) close() {
	if s.st != nil {
		s.st.close()
	}
	s.conn.Close()
}
