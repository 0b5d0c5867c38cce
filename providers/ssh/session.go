package ssh

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	xssh "golang.org/x/crypto/ssh"

	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/internal/command"
)

// job is one command to run.
type job struct {
	line   string
	stdin  string
	stdout *command.Output
	stderr *command.Output
}

// run runs a job on t and returns its exit code. A job stopped because
// ctx ended fails with a *stoppedError.
func (p *Provider) run(ctx context.Context, s *settings, t target, j job) (int, error) {
	c, sess, err := p.open(ctx, s, t)
	if err != nil {
		return 0, err
	}
	defer p.pool.put(c)
	pids := newPIDWriter(j.stderr)
	sess.Stdin, sess.Stdout, sess.Stderr = strings.NewReader(j.stdin), j.stdout, pids
	if err := ctx.Err(); err != nil {
		_ = sess.Close()
		return 0, err
	}
	if err := sess.Start(j.line); err != nil {
		_ = sess.Close()
		return 0, providers.Retryable("session_failed", "starting the command on %s: %v", t.addr, err)
	}
	finished := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = sess.Wait()
		close(finished)
	}()
	select {
	case <-finished:
	case <-ctx.Done():
		select {
		case <-finished: // it ended as its step did: its result stands
		default:
			return 0, &stoppedError{addr: t.addr, err: stop(ctx, c.client, sess, pids, finished, s)}
		}
	}
	_ = sess.Close()
	pids.flush()
	var exit *xssh.ExitError
	switch {
	// Unread stdin meets the closed channel: the command exited 0
	// without reading all of it.
	case waitErr == nil || errors.Is(waitErr, io.EOF):
		return 0, nil
	case errors.As(waitErr, &exit):
		return exit.ExitStatus(), nil
	case errors.As(waitErr, new(*xssh.ExitMissingError)):
		return 0, providers.Retryable("no_exit_status", "the command on %s ended without an exit status, as when the connection drops: it may or may not have done its work", t.addr)
	}
	return 0, providers.Retryable("session_failed", "running the command on %s: %v", t.addr, waitErr)
}

// open returns a session on a connection to t, from the pool or newly
// dialed. A pooled connection that turns out dead is dropped for a new
// one.
func (p *Provider) open(ctx context.Context, s *settings, t target) (*conn, *xssh.Session, error) {
	key := poolKey{config: s.fingerprint, user: t.user, addr: t.addr}
	dial := func(ctx context.Context) (*xssh.Client, error) { return p.dial(ctx, s, t) }
	for {
		c, fresh, err := p.pool.get(ctx, key, dial)
		if err != nil {
			return nil, nil, err
		}
		sctx, cancel := context.WithTimeout(ctx, s.connectTimeout)
		sess, err := newSession(sctx, c.client)
		cancel()
		if err == nil {
			return c, sess, nil
		}
		p.pool.put(c)
		var refused *xssh.OpenChannelError
		switch {
		case ctx.Err() != nil:
			return nil, nil, ctx.Err()
		case errors.As(err, &refused):
			// The connection is sound; the server wants no more
			// sessions on it.
			return nil, nil, providers.Retryable("session_refused", "%s refused a session: %v; is its sshd's MaxSessions below what max_sessions_per_host = %d needs?", t.addr, err, s.maxSessions)
		}
		p.pool.drop(c)
		if fresh {
			return nil, nil, providers.Retryable("session_failed", "opening a session on %s: %v", t.addr, err)
		}
	}
}

// newSession opens a session, giving up when ctx ends: a connection that
// died without a word while idle answers nothing.
func newSession(ctx context.Context, c *xssh.Client) (*xssh.Session, error) {
	type opened struct {
		s   *xssh.Session
		err error
	}
	ch := make(chan opened, 1)
	go func() {
		s, err := c.NewSession()
		ch <- opened{s, err}
	}()
	select {
	case o := <-ch:
		return o.s, o.err
	case <-ctx.Done():
		go func() {
			if o := <-ch; o.s != nil {
				_ = o.s.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// stop ends a command whose step ended, as the exec provider's supervisor
// does: TERM to its process group, KILL once the command has exited or
// the grace is over, and the session closed. OpenSSH passes a signal
// request on to the session's process group, but not for every login
// (never for root's, which skip privilege separation); kill(1), over
// sessions of their own, reaches the group wherever the user may signal
// it, and reaches what the command left behind once it exited. stop
// returns why the command may still be running, if it may.
func stop(ctx context.Context, client *xssh.Client, sess *xssh.Session, pids *pidWriter, finished <-chan struct{}, s *settings) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.KillGrace()+2*s.connectTimeout)
	defer cancel()
	grace := make(chan struct{})
	timer := time.AfterFunc(s.cfg.KillGrace(), func() { close(grace) })
	defer timer.Stop()

	_ = sess.Signal(xssh.SIGTERM)
	// The shell reports its PID before anything else: a command that
	// ends without it reported never started.
	select {
	case <-pids.known:
	case <-finished:
	case <-grace:
	case <-ctx.Done():
	}
	var err error
	select {
	case <-pids.known:
		group := fmt.Sprintf("-- -%d", pids.pid)
		err = remote(ctx, client, "kill -s TERM "+group)
		select {
		case <-finished:
		case <-grace:
		case <-ctx.Done():
		}
		if killErr := remote(ctx, client, "kill -s KILL "+group); err == nil {
			err = killErr
		}
	default:
		select {
		case <-finished:
		default:
			_ = sess.Signal(xssh.SIGKILL)
			err = errors.New("the remote shell never reported its process ID, so only sshd could pass the signals on")
		}
	}
	_ = sess.Close()
	select {
	case <-finished:
	case <-ctx.Done():
		// A connection that does not answer a close is dead; closing
		// it ends the wait.
		_ = client.Close()
		<-finished
	}
	return err
}

// remote runs a short command on client in a session of its own. Its exit
// status does not matter: kill(1) fails for a group already gone.
func remote(ctx context.Context, client *xssh.Client, cmd string) error {
	sess, err := newSession(ctx, client)
	if err != nil {
		return fmt.Errorf("opening a session for %q: %w", cmd, err)
	}
	defer sess.Close()
	ran := make(chan error, 1)
	go func() { ran <- sess.Run(cmd) }()
	select {
	case err := <-ran:
		var exit *xssh.ExitError
		if err != nil && !errors.As(err, &exit) {
			return fmt.Errorf("running %q: %w", cmd, err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("running %q: %w", cmd, ctx.Err())
	}
}
