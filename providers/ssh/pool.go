package ssh

import (
	"context"
	"sync"
	"time"

	xssh "golang.org/x/crypto/ssh"
)

// poolKey is what one connection serves: a config, a user and a host.
type poolKey struct {
	config, user, addr string
}

// pool keeps connections open between calls. A connection is dialed once
// however many calls want it at the same time, shared by the calls that
// run on it, dropped when it fails and closed when no call has used it for
// the idle time.
type pool struct {
	idle  time.Duration
	mu    sync.Mutex
	conns map[poolKey]*conn
}

type conn struct {
	key   poolKey
	ready chan struct{} // closed once the dial is over
	// client and err are the dial's outcome, set before ready is closed.
	client *xssh.Client
	err    error
	users  int
	timer  *time.Timer // closes the connection once idle
}

func newPool(idle time.Duration) *pool {
	return &pool{idle: idle, conns: map[poolKey]*conn{}}
}

// get returns the pool's connection for key, dialing one when there is
// none, and whether it was dialed for this call. Each connection it
// returns is handed back with put.
func (p *pool) get(ctx context.Context, key poolKey, dial func(context.Context) (*xssh.Client, error)) (*conn, bool, error) {
	for {
		p.mu.Lock()
		c := p.conns[key]
		if c == nil {
			c = &conn{key: key, ready: make(chan struct{}), users: 1}
			p.conns[key] = c
			p.mu.Unlock()
			if err := p.dial(ctx, c, dial); err != nil {
				return nil, true, err
			}
			return c, true, nil
		}
		p.mu.Unlock()
		select {
		case <-c.ready:
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
		p.mu.Lock()
		if c.err == nil && p.conns[key] == c {
			c.users++
			if c.timer != nil {
				c.timer.Stop()
				c.timer = nil
			}
			p.mu.Unlock()
			return c, false, nil
		}
		// The dial that call made failed, or the connection has since
		// gone: this call dials, or waits for another's dial, afresh.
		p.mu.Unlock()
	}
}

func (p *pool) dial(ctx context.Context, c *conn, dial func(context.Context) (*xssh.Client, error)) error {
	client, err := dial(ctx)
	p.mu.Lock()
	c.client, c.err = client, err
	if err != nil {
		delete(p.conns, c.key)
	}
	close(c.ready)
	p.mu.Unlock()
	if err == nil {
		go func() {
			// A connection the server or the network closed is dropped
			// at once, not found broken by the next call.
			_ = client.Wait()
			p.drop(c)
		}()
	}
	return err
}

// put hands a connection back after a call.
func (p *pool) put(c *conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c.users--
	if c.users > 0 || p.conns[c.key] != c {
		return
	}
	c.timer = time.AfterFunc(p.idle, func() {
		p.mu.Lock()
		idle := c.users == 0 && p.conns[c.key] == c
		if idle {
			delete(p.conns, c.key)
		}
		p.mu.Unlock()
		if idle {
			_ = c.client.Close()
		}
	})
}

// drop closes a connection that failed, so that no call gets it again.
func (p *pool) drop(c *conn) {
	p.mu.Lock()
	if p.conns[c.key] == c {
		delete(p.conns, c.key)
	}
	if c.timer != nil {
		c.timer.Stop()
	}
	p.mu.Unlock()
	_ = c.client.Close()
}

// slots caps the sessions open at once per host: a semaphore per key,
// kept while a call holds or waits for it.
type slots struct {
	mu sync.Mutex
	m  map[string]*slot
}

type slot struct {
	sem  chan struct{}
	refs int
}

func newSlots() *slots { return &slots{m: map[string]*slot{}} }

// acquire waits for one of n slots under key, or for ctx to end, and
// returns what gives it back.
func (s *slots) acquire(ctx context.Context, key string, n int) (func(), error) {
	s.mu.Lock()
	sl := s.m[key]
	if sl == nil {
		sl = &slot{sem: make(chan struct{}, n)}
		s.m[key] = sl
	}
	sl.refs++
	s.mu.Unlock()
	select {
	case sl.sem <- struct{}{}:
		return func() {
			<-sl.sem
			s.unref(key, sl)
		}, nil
	case <-ctx.Done():
		s.unref(key, sl)
		return nil, ctx.Err()
	}
}

func (s *slots) unref(key string, sl *slot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sl.refs--; sl.refs == 0 {
		delete(s.m, key)
	}
}
