//go:build unix

package exec

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	osexec "os/exec"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
)

// superviseEnv marks the gateway's binary started as a command's
// supervisor; its value is the kill grace in milliseconds.
const superviseEnv = "CHAINGATE_EXEC_SUPERVISE"

// The supervisor runs before anything else in the binary it is part of, be
// it the gateway or a test binary serving the built-in providers.
func init() {
	if grace, ok := os.LookupEnv(superviseEnv); ok {
		os.Exit(supervise(grace, os.Args[1:]))
	}
}

// run runs a job under a supervisor and returns its exit code, and a
// warning when the command's output was not read to its end. When ctx
// ends, the supervisor is told to stop the command's process group.
func run(ctx context.Context, j job) (int, string, error) {
	self, err := os.Executable()
	if err != nil {
		return 0, "", fmt.Errorf("finding the gateway's binary to supervise the command: %w", err)
	}
	cmd := osexec.CommandContext(ctx, self, append([]string{j.program}, j.args...)...)
	cmd.Dir = j.dir
	cmd.Env = append(j.env, fmt.Sprintf("%s=%d", superviseEnv, j.grace.Milliseconds()))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = j.stdin, j.stdout, j.stderr
	cmd.SysProcAttr = supervisorAttr()
	// A command that ends as its step's time runs out keeps its result:
	// only one the supervisor was told to stop is reported stopped.
	var stopped atomic.Bool
	cmd.Cancel = func() error {
		stopped.Store(true)
		return cmd.Process.Signal(syscall.SIGTERM)
	}
	// The supervisor kills the group after the grace; past that, something
	// is wrong with it, and it goes too. A process that left the group (a
	// daemon, setsid) holding the output open is not waited for longer.
	cmd.WaitDelay = j.grace + 5*time.Second
	err = cmd.Run()
	var exit *osexec.ExitError
	switch {
	case stopped.Load():
		return 0, "", ctx.Err()
	case errors.As(err, &exit):
		return exitCode(exit.ProcessState), "", nil
	case errors.Is(err, osexec.ErrWaitDelay) && cmd.ProcessState != nil:
		return exitCode(cmd.ProcessState), fmt.Sprintf("the command exited, but a process it started in a group of its own (a daemon, setsid) held its output open; output written after %s was not read", cmd.WaitDelay), nil
	case err != nil:
		return 0, "", err
	}
	return 0, "", nil
}

// exitCode is a process's exit code, or 128 plus the signal that killed
// it, as a shell reports it.
func exitCode(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// supervise runs argv in a process group of its own and returns its exit
// code. On TERM, INT or HUP — the provider cancelling the step, or the
// process that started the supervisor going away — it sends TERM to the
// group, and KILL after the grace; when the command exits, whatever it
// left running in its group is killed.
func supervise(graceMS string, argv []string) int {
	ms, err := strconv.Atoi(graceMS)
	if err != nil || len(argv) == 0 {
		fmt.Fprintf(os.Stderr, "chaingate exec supervisor: started without a command or grace (%q)\n", graceMS)
		return 126
	}
	grace := time.Duration(ms) * time.Millisecond
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	_ = os.Unsetenv(superviseEnv)
	cmd := osexec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = commandAttr()
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "chaingate exec supervisor: starting %s: %v\n", argv[0], err)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return 127
		case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.ENOEXEC):
			return 126
		}
		// Out of processes or memory, a script being rewritten: worth
		// trying again (EX_TEMPFAIL, retryable by default).
		return 75
	}
	group := -cmd.Process.Pid
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
		_ = syscall.Kill(group, syscall.SIGKILL)
		return exitCode(cmd.ProcessState)
	case <-stop:
	}
	_ = syscall.Kill(group, syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(grace):
	}
	_ = syscall.Kill(group, syscall.SIGKILL)
	<-done
	return exitCode(cmd.ProcessState)
}
