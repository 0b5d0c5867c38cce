package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/chaingate/gateway/chain/engine"
)

// The embedded store admits one process at a time, so commands for runs
// that a gateway is advancing reach it through a unix socket beside the
// store file: one line in ("cancel RUN_ID"), one line out ("ok" or
// "error: ...").

// ControlPath is the control socket of the gateway holding a store file.
func ControlPath(storeFile string) string { return storeFile + ".sock" }

// ServeControl answers control commands until ctx is done or stop is
// called. Closing the listener removes the socket file; stop does so before
// it returns, so a process that calls stop on every way out leaves no socket
// behind (ctx being done only starts the close, which a process exiting at
// once can outrun).
//
// cancelled, when set, is told of each cancel asked for, and what came of
// it, for the audit log.
func ServeControl(ctx context.Context, path string, eng *engine.Engine, log *slog.Logger, cancelled func(ctx context.Context, run string, err error)) (stop func(), err error) {
	// A socket left by a gateway that was killed is stale: the store's file
	// lock, already held by this process, proves nobody else serves it.
	_ = os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listening on control socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("listening on control socket: %w", err)
	}
	var once sync.Once
	stop = func() { once.Do(func() { _ = l.Close() }) }
	context.AfterFunc(ctx, stop)
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go handleControl(ctx, conn, eng, log, cancelled)
		}
	}()
	return stop, nil
}

func handleControl(ctx context.Context, conn net.Conn, eng *engine.Engine, log *slog.Logger, cancelled func(context.Context, string, error)) {
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return
	}
	reply := "ok"
	switch verb, arg, _ := strings.Cut(strings.TrimSpace(line), " "); verb {
	case "cancel":
		err := eng.Cancel(ctx, arg)
		if err != nil {
			reply = "error: " + err.Error()
		}
		if cancelled != nil {
			cancelled(ctx, arg, err)
		}
		log.Info("control command", "command", verb, "run", arg, "reply", reply)
	default:
		reply = fmt.Sprintf("error: unknown command %q", verb)
	}
	_, _ = fmt.Fprintln(conn, reply)
}

// SendControl sends one command to the gateway serving path.
func SendControl(ctx context.Context, path, command string) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return fmt.Errorf("reaching the running gateway: %w", err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := fmt.Fprintln(conn, command); err != nil {
		return fmt.Errorf("sending %q: %w", command, err)
	}
	reply, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return fmt.Errorf("reading the reply to %q: %w", command, err)
	}
	reply = strings.TrimSpace(reply)
	if msg, ok := strings.CutPrefix(reply, "error: "); ok {
		return errors.New(msg)
	}
	return nil
}
