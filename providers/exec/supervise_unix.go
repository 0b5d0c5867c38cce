//go:build unix

package exec

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	osexec "os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/chaingate/gateway/providers"
)

const (
	// superviseEnv marks the gateway's binary started as a command's
	// supervisor; its value is the kill grace in milliseconds.
	superviseEnv = "CHAINGATE_EXEC_SUPERVISE"
	// lockEnv is the path of the step's lock file, when it has one; the
	// supervisor then says on fd 3 how long it waited for it.
	lockEnv = "CHAINGATE_EXEC_LOCK"
)

// The supervisor runs before anything else in the binary it is part of, be
// it the gateway or a test binary serving the built-in providers.
func init() {
	if grace, ok := os.LookupEnv(superviseEnv); ok {
		os.Exit(supervise(grace, os.Getenv(lockEnv), os.Args[1:]))
	}
}

// run runs a job under a supervisor and returns its exit code, and a
// warning when the command's output was not read to its end or it waited
// for an earlier attempt of its step. When ctx ends, the supervisor is
// told to stop the command's process group.
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
	// waited is what the supervisor reports: how long it waited for the
	// step's lock, in milliseconds, if it did.
	waited := make(chan string, 1)
	var report *os.File
	if j.lock == "" {
		waited <- ""
	} else {
		path, err := lockPath(j.lock)
		if err != nil {
			return 0, "", err
		}
		r, w, err := os.Pipe()
		if err != nil {
			return 0, "", fmt.Errorf("making the supervisor's report pipe: %w", err)
		}
		defer r.Close()
		report = w
		cmd.Env = append(cmd.Env, lockEnv+"="+path)
		cmd.ExtraFiles = []*os.File{w}
		go func() {
			text, _ := io.ReadAll(r)
			waited <- strings.TrimSpace(string(text))
		}()
	}
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
	err = cmd.Start()
	if report != nil {
		// The supervisor's copy is all that keeps the pipe open now: the
		// report ends with the supervisor.
		_ = report.Close()
	}
	if err != nil {
		return 0, "", err
	}
	err = cmd.Wait()
	var warnings []string
	if ms, err := strconv.Atoi(<-waited); err == nil {
		warnings = append(warnings, fmt.Sprintf("the command waited %s for the processes of an earlier attempt of the step, which were still being stopped, to end before it started", (time.Duration(ms)*time.Millisecond).Round(time.Second)))
	}
	var exit *osexec.ExitError
	switch {
	case stopped.Load():
		return 0, "", ctx.Err()
	case errors.As(err, &exit):
		return exitCode(exit.ProcessState), strings.Join(warnings, "; "), nil
	case errors.Is(err, osexec.ErrWaitDelay) && cmd.ProcessState != nil:
		warnings = append(warnings, fmt.Sprintf("the command exited, but a process it started in a group of its own (a daemon, setsid) held its output open; output written after %s was not read", cmd.WaitDelay))
		return exitCode(cmd.ProcessState), strings.Join(warnings, "; "), nil
	case err != nil:
		return 0, "", err
	}
	return 0, strings.Join(warnings, "; "), nil
}

// lockPath is the file of a step's lock, named after a hash of its key, in
// a directory of the gateway's user that no one else may write to: in a
// shared one, anyone could take a step's lock, or put a link to a file of
// the gateway's in its place.
func lockPath(key string) (string, error) {
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("chaingate-exec-%d", os.Getuid()))
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("making the directory of the steps' locks: %w", err)
	}
	info, err := os.Lstat(dir)
	if err != nil {
		return "", fmt.Errorf("checking the directory of the steps' locks: %w", err)
	}
	if st, ok := info.Sys().(*syscall.Stat_t); !ok || !info.IsDir() || int(st.Uid) != os.Getuid() || info.Mode().Perm()&0o022 != 0 {
		return "", providers.Permanent("unsafe_lock_dir", "%s, the directory of the steps' locks, must be a directory of the gateway's user (uid %d) that no one else may write to; remove it, and the gateway makes it afresh", dir, os.Getuid())
	}
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(dir, hex.EncodeToString(sum[:16])+".lock"), nil
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
// left running in its group is killed. With a lock, it holds the lock
// from before the command starts until no process of the group runs.
func supervise(graceMS, lock string, argv []string) int {
	ms, err := strconv.Atoi(graceMS)
	if err != nil || len(argv) == 0 {
		fmt.Fprintf(os.Stderr, "chaingate exec supervisor: started without a command or grace (%q)\n", graceMS)
		return 126
	}
	grace := time.Duration(ms) * time.Millisecond
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	_ = os.Unsetenv(superviseEnv)
	_ = os.Unsetenv(lockEnv)
	if lock != "" {
		held, code := takeLock(lock, stop)
		if held == nil {
			return code
		}
		defer held.release()
	}
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
	case <-stop:
		_ = syscall.Kill(group, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(grace):
		}
	}
	_ = syscall.Kill(group, syscall.SIGKILL)
	<-done
	if lock != "" {
		// The lock is a promise that nothing of the step runs: it is kept
		// until the KILL has taken effect.
		for groupRuns(-group) {
			time.Sleep(10 * time.Millisecond)
		}
	}
	return exitCode(cmd.ProcessState)
}

// stepLock is a step's lock, held.
type stepLock struct {
	f    *os.File
	path string
}

// takeLock takes the step's lock at path, waiting for an earlier attempt
// that holds it, and reports on fd 3 how long it waited if it did. It
// returns nil and the supervisor's exit code if it cannot, or if it is
// told to stop while it waits.
func takeLock(path string, stop <-chan os.Signal) (*stepLock, int) {
	report := os.NewFile(3, "report")
	syscall.CloseOnExec(3)
	defer report.Close()
	started := time.Now()
	waited := false
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
		if err != nil {
			fmt.Fprintf(os.Stderr, "chaingate exec supervisor: opening the step's lock: %v\n", err)
			return nil, 75
		}
		err = lockFile(f, false)
		if errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EACCES) {
			waited = true
			locked := make(chan error, 1)
			go func() { locked <- lockFile(f, true) }()
			select {
			case err = <-locked:
			case <-stop:
				return nil, 128 + int(syscall.SIGTERM)
			}
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "chaingate exec supervisor: taking the step's lock: %v\n", err)
			return nil, 75
		}
		// Its holder unlinks the file as it lets go: a lock taken on a
		// file no longer at path is no one's, and path is tried afresh.
		var held, now syscall.Stat_t
		if syscall.Fstat(int(f.Fd()), &held) == nil && syscall.Stat(path, &now) == nil && held.Dev == now.Dev && held.Ino == now.Ino {
			if waited {
				fmt.Fprintf(report, "%d\n", time.Since(started).Milliseconds())
			}
			return &stepLock{f: f, path: path}, 0
		}
		_ = f.Close()
	}
}

// release unlinks the lock's file, while it is still held, then lets go.
func (l *stepLock) release() {
	_ = os.Remove(l.path)
	_ = l.f.Close()
}

// lockFile takes an exclusive lock on the whole of f, waiting for it or
// not. It is a POSIX record lock, which every Unix has (flock(2) is not in
// Go's syscall on Solaris and AIX). Such a lock goes when its process
// closes any descriptor of the file; the supervisor opens it once.
func lockFile(f *os.File, wait bool) error {
	how := syscall.F_SETLK
	if wait {
		how = syscall.F_SETLKW
	}
	lk := syscall.Flock_t{Type: syscall.F_WRLCK, Whence: io.SeekStart}
	for {
		err := syscall.FcntlFlock(f.Fd(), how, &lk)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}
