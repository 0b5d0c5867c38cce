package ssh

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"

	xssh "golang.org/x/crypto/ssh"

	"github.com/chaingate/gateway/providers"
)

// dial connects and logs in to t, through the jump host when there is
// one, within connect_timeout_seconds. Its failures are *providers.Error
// unless ctx ended.
func (p *Provider) dial(ctx context.Context, s *settings, t target) (*xssh.Client, error) {
	dctx, cancel := context.WithTimeout(ctx, s.connectTimeout)
	defer cancel()
	c, err := p.dialVia(dctx, s, t)
	if err != nil && ctx.Err() == nil && dctx.Err() != nil {
		where := t.addr
		if s.jumpAddr != "" {
			where += " through the jump host " + s.jumpAddr
		}
		return nil, providers.Retryable("connect_timeout", "connecting to %s: no answer within connect_timeout_seconds = %g", where, s.connectTimeout.Seconds())
	}
	return c, err
}

func (p *Provider) dialVia(ctx context.Context, s *settings, t target) (*xssh.Client, error) {
	if s.jumpAddr == "" {
		return p.login(ctx, s, t.addr, t.user, t.addr, func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", t.addr)
		})
	}
	jumpUser := s.cfg.JumpUser
	if jumpUser == "" {
		jumpUser = t.user
	}
	jump, err := p.login(ctx, s, s.jumpAddr, jumpUser, "the jump host "+s.jumpAddr, func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", s.jumpAddr)
	})
	if err != nil {
		return nil, err
	}
	c, err := p.login(ctx, s, t.addr, t.user, t.addr+" through the jump host "+s.jumpAddr, func(ctx context.Context) (net.Conn, error) {
		conn, err := jump.DialContext(ctx, "tcp", t.addr)
		var refused *xssh.OpenChannelError
		if errors.As(err, &refused) && refused.Reason == xssh.Prohibited {
			return nil, providers.Permanent("jump_refused", "the jump host %s refused to forward to %s (%v); its sshd needs AllowTcpForwarding for %s", s.jumpAddr, t.addr, err, jumpUser)
		}
		if err != nil {
			return nil, providers.Retryable("connect_failed", "the jump host %s could not reach %s: %v", s.jumpAddr, t.addr, err)
		}
		return conn, nil
	})
	if err != nil {
		_ = jump.Close()
		return nil, err
	}
	go func() {
		_ = c.Wait()
		_ = jump.Close()
	}()
	return c, nil
}

// login opens a connection with open and logs in to addr over it as user;
// where names addr in messages.
func (p *Provider) login(ctx context.Context, s *settings, addr, user, where string, open func(context.Context) (net.Conn, error)) (*xssh.Client, error) {
	check, err := s.hostKeyCheck(p.log)
	if err != nil {
		return nil, providers.Permanent("bad_config", "%v", err)
	}
	cfg := &xssh.ClientConfig{User: user, Auth: s.auth, HostKeyCallback: check}
	// At most a certificate, then a key of a type not on record, before
	// the key that is.
	for attempt := 1; ; attempt++ {
		conn, err := open(ctx)
		if err != nil {
			return nil, netError(where, err)
		}
		c, err := handshake(ctx, conn, addr, cfg)
		var refused *hostKeyError
		if errors.As(err, &refused) && attempt < 3 {
			if algos := refused.algorithms(); algos != nil && !slices.Equal(algos, cfg.HostKeyAlgorithms) {
				cfg.HostKeyAlgorithms = algos
				continue
			}
		}
		switch {
		case err == nil:
			return c, nil
		case ctx.Err() != nil:
			return nil, err
		case errors.As(err, &refused):
			return nil, &providers.Error{Code: refused.code(), Message: refused.Error(), Err: err}
		case strings.Contains(err.Error(), "unable to authenticate"):
			// x/crypto/ssh gives a refused login no type of its own.
			return nil, &providers.Error{Code: "auth_failed", Message: fmt.Sprintf("logging in to %s as %s: %v", where, user, err), Err: err}
		}
		return nil, &providers.Error{Retryable: true, Code: "connect_failed", Message: fmt.Sprintf("connecting to %s: %v", where, err), Err: err}
	}
}

// handshake runs the SSH handshake over conn, giving up when ctx ends.
func handshake(ctx context.Context, conn net.Conn, addr string, cfg *xssh.ClientConfig) (*xssh.Client, error) {
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	c, chans, reqs, err := xssh.NewClientConn(conn, addr, cfg)
	if !stop() {
		if err == nil {
			_ = c.Close()
		}
		return nil, ctx.Err()
	}
	if err != nil {
		return nil, err
	}
	return xssh.NewClient(c, chans, reqs), nil
}

// netError classes a failure to open a connection: a name that does not
// resolve will not on a retry either; the rest may pass.
func netError(where string, err error) error {
	var pe *providers.Error
	var dnsErr *net.DNSError
	switch {
	case errors.As(err, &pe):
		return err
	case errors.As(err, &dnsErr) && dnsErr.IsNotFound:
		return &providers.Error{Code: "no_such_host", Message: fmt.Sprintf("connecting to %s: %v", where, err), Err: err}
	}
	return &providers.Error{Retryable: true, Code: "connect_failed", Message: fmt.Sprintf("connecting to %s: %v", where, err), Err: err}
}
