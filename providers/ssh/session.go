package ssh

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	xssh "golang.org/x/crypto/ssh"

	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/internal/command"
)

// job is one command to run: its remote line, and the standard input the
// line's wrapper reads from the channel before the command starts.
type job struct {
	line   string
	stdin  string
	stdout *command.Output
	stderr *command.Output
}

// run runs a job on t and returns its exit code, and a warning when the
// command had to wait for an earlier attempt of its step. A job stopped
// because ctx ended fails with a *stoppedError, or a *lockWaitError if it
// had not started yet.
func (p *Provider) run(ctx context.Context, s *settings, t target, j job) (int, string, error) {
	c, sess, err := p.open(ctx, s, t)
	if err != nil {
		return 0, "", err
	}
	defer p.pool.put(c)
	pids := newPIDWriter(j.stderr)
	sess.Stdout, sess.Stderr = j.stdout, pids
	// The wrapper's watchdog takes the end of the channel's input for the
	// end of the connection: the input is written, and never closed while
	// the command runs.
	stdin, err := sess.StdinPipe()
	if err != nil {
		_ = sess.Close()
		return 0, "", providers.Retryable("session_failed", "opening the command's input on %s: %v", t.addr, err)
	}
	if err := ctx.Err(); err != nil {
		_ = sess.Close()
		return 0, "", err
	}
	if err := sess.Start(j.line); err != nil {
		_ = sess.Close()
		return 0, "", providers.Retryable("session_failed", "starting the command on %s: %v", t.addr, err)
	}
	// The write ends when the wrapper has read it all, or when the session
	// closes.
	go func() { _, _ = io.WriteString(stdin, j.stdin) }()
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
			err := stop(ctx, c.client, sess, pids, finished, s)
			if pids.holder != 0 && !pids.ran {
				return 0, "", &lockWaitError{addr: t.addr, holder: pids.holder, err: err}
			}
			return 0, "", &stoppedError{addr: t.addr, err: err}
		}
	}
	_ = sess.Close()
	pids.flush()
	warning := ""
	if pids.holder != 0 && pids.ran {
		warning = fmt.Sprintf("the command waited %s on %s for the processes of an earlier attempt of the step (process group %d), which were still being stopped, to end before it started", pids.waited.Round(time.Second), t.addr, pids.holder)
		p.log.Warn("ssh: "+warning, "host", t.addr)
	}
	var exit *xssh.ExitError
	switch {
	case waitErr == nil:
		return 0, warning, nil
	case errors.As(waitErr, &exit):
		return exit.ExitStatus(), warning, nil
	case errors.As(waitErr, new(*xssh.ExitMissingError)):
		return 0, "", providers.Retryable("no_exit_status", "the command on %s ended without an exit status, as when the connection drops: it may or may not have done its work", t.addr)
	}
	return 0, "", providers.Retryable("session_failed", "running the command on %s: %v", t.addr, waitErr)
}

// lockWaitError is a command stopped because its step ended while it
// waited for an earlier attempt's processes to end.
type lockWaitError struct {
	addr   string
	holder int
	// err says why the command may still start, if it may; nil when its
	// wrapper was stopped.
	err error
}

func (e *lockWaitError) Error() string {
	what := fmt.Sprintf("while the command waited on %s for the processes of an earlier attempt of the step (process group %d) to end, before it started", e.addr, e.holder)
	if e.err != nil {
		return what + "; it may still start there, until sshd sees the connection end: " + e.err.Error()
	}
	return what + "; it was stopped there"
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
		// kill -s SIG -- -PID is POSIX, but dash's and busybox's kill take
		// neither -s before a negative PID nor --.
		group := fmt.Sprintf("-%d", pids.pid)
		err = remote(ctx, client, "kill -TERM "+group)
		select {
		case <-finished:
		case <-grace:
		case <-ctx.Done():
		}
		if killErr := remote(ctx, client, "kill -KILL "+group); err == nil {
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
