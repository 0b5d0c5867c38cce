//go:build unix

package ssh

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chaingate/gateway/internal/testutil/proctest"
)

// shells are the POSIX shells on this machine that a remote login shell
// may be.
func shells(t testing.TB) []string {
	var found []string
	for _, sh := range []string{"sh", "dash", "bash", "zsh", "ksh", "mksh", "busybox"} {
		if _, err := exec.LookPath(sh); err == nil {
			found = append(found, sh)
		}
	}
	if len(found) == 0 {
		t.Skip("no POSIX shell on this machine")
	}
	return found
}

// wrapperShells are the shells on this machine that the wrapper's sh may
// be.
func wrapperShells(t testing.TB) []string {
	var found []string
	for _, sh := range []string{"dash", "bash", "busybox"} {
		if _, err := exec.LookPath(sh); err == nil {
			found = append(found, sh)
		}
	}
	if len(found) == 0 {
		t.Skip("none of dash, bash and busybox on this machine")
	}
	return found
}

// local is a remote line run on this machine as sshd runs it: the login
// shell's -c, as the leader of a session of its own, with the channel's
// input a pipe held open until the line has exited. Its login directory
// and HOME are directories of the test's own, and the wrapper's sh is the
// shell asked for.
type local struct {
	cmd            *exec.Cmd
	stdin          io.WriteCloser
	stdout, stderr lockedBuffer
	login, home    string
}

// lockedBuffer is a buffer a test may read while a command writes to it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// shellArgs is how a shell is started with -c: busybox by its applet.
func shellArgs(shell string, args ...string) (string, []string) {
	if shell == "busybox" {
		return shell, append([]string{"sh"}, args...)
	}
	return shell, args
}

// startLocal starts c's line with login as the login shell and wrapper
// as sh; home is HOME, "" for a new directory.
func startLocal(t *testing.T, login, wrapperSh, home string, c remoteCommand) *local {
	t.Helper()
	line, err := remoteLine(c)
	if err != nil {
		t.Fatal(err)
	}
	path, err := exec.LookPath(wrapperSh)
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	if err := os.Symlink(path, filepath.Join(bin, "sh")); err != nil {
		t.Fatal(err)
	}
	if home == "" {
		home = t.TempDir()
	}
	l := &local{login: t.TempDir(), home: home}
	name, args := shellArgs(login, "-c", line)
	l.cmd = exec.Command(name, args...)
	l.cmd.Dir = l.login
	l.cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "HOME="+home)
	l.cmd.Stdout, l.cmd.Stderr = &l.stdout, &l.stderr
	l.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if l.stdin, err = l.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := l.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-l.cmd.Process.Pid, syscall.SIGKILL)
		_ = l.cmd.Wait()
	})
	go func() { _, _ = io.WriteString(l.stdin, c.stdin) }()
	return l
}

// wait waits for the line to exit and returns its exit code, 128 plus
// the signal's number if one killed it.
func (l *local) wait(t *testing.T) int {
	t.Helper()
	err := l.cmd.Wait()
	if ws, ok := l.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatal(err)
	}
	return l.cmd.ProcessState.ExitCode()
}

// commandStderr is what the command wrote to stderr: what the gateway
// passes on.
func (l *local) commandStderr() string {
	var out bytes.Buffer
	w := newPIDWriter(&out)
	_, _ = w.Write([]byte(l.stderr.String()))
	w.flush()
	return out.String()
}

// roundTrip checks that args and an env value reach a program through the
// remote line exactly as given, in argv and in the environment.
func roundTrip(t *testing.T, login, wrapperSh string, args []string, value string) {
	t.Helper()
	l := startLocal(t, login, wrapperSh, "", remoteCommand{
		argv: append([]string{"sh", "-c", `printf '%s\0' "$V" "$@"`, "sh"}, args...),
		env:  map[string]string{"V": value},
	})
	if code := l.wait(t); code != 0 {
		t.Fatalf("%s/%s: exit %d: %s", login, wrapperSh, code, l.stderr.String())
	}
	got := strings.Split(strings.TrimSuffix(l.stdout.String(), "\x00"), "\x00")
	if want := append([]string{value}, args...); !slices.Equal(got, want) {
		t.Errorf("%s/%s: argv %q, want %q", login, wrapperSh, got, want)
	}
	if stderr := l.stderr.String(); !strings.HasPrefix(stderr, pidMarker) {
		t.Errorf("%s/%s: stderr %q does not start with the PID line", login, wrapperSh, stderr)
	}
}

func TestRemoteLineRoundTrip(t *testing.T) {
	for _, login := range shells(t) {
		t.Run("login "+login, func(t *testing.T) {
			roundTrip(t, login, "dash", hostile, strings.Join(hostile, "\n"))
			for _, v := range hostile {
				roundTrip(t, login, "dash", []string{v}, v)
			}
		})
	}
	for _, sh := range wrapperShells(t) {
		t.Run("sh "+sh, func(t *testing.T) {
			roundTrip(t, "sh", sh, hostile, strings.Join(hostile, "\n"))
		})
	}
}

func FuzzRemoteLineRoundTrip(f *testing.F) {
	for _, v := range hostile {
		f.Add(v, v)
	}
	f.Add("\xff\xfe", "ünïcödé")
	f.Fuzz(func(t *testing.T, arg, value string) {
		// No argument or variable can carry a NUL; remoteLine refuses one.
		if strings.ContainsRune(arg, 0) || strings.ContainsRune(value, 0) || len(arg)+len(value) > 1<<16 {
			t.Skip()
		}
		roundTrip(t, "sh", "sh", []string{arg}, value)
	})
}

// TestWrapper runs commands through the wrapper under each sh it may be,
// as sshd would run them.
func TestWrapper(t *testing.T) {
	weird := filepath.Join(t.TempDir(), `-x $(touch pwned) '"`)
	if err := os.Mkdir(weird, 0o700); err != nil {
		t.Fatal(err)
	}
	stdin := "a\x00b'\"$(touch pwned)\n`id`\nno newline at the end"
	for _, tc := range []struct {
		name   string
		c      remoteCommand
		code   int
		stdout string // "" to leave unchecked
		check  func(t *testing.T, l *local)
		proc   bool // needs /proc
	}{
		{name: "exit status", c: remoteCommand{argv: []string{"sh", "-c", "exit 3"}}, code: 3},
		{name: "killed by a signal", c: remoteCommand{argv: []string{"sh", "-c", "kill -9 $$"}}, code: 137, check: func(t *testing.T, l *local) {
			if s := l.commandStderr(); s != "" {
				t.Errorf("stderr %q, want nothing: no shell's notice of the kill", s)
			}
		}},
		{name: "stdin, literally", c: remoteCommand{argv: []string{"cat"}, stdin: stdin}, stdout: stdin},
		// A command that waited for more input would hang.
		{name: "no stdin is an empty one", c: remoteCommand{argv: []string{"sh", "-c", "cat; echo end"}}, stdout: "end\n"},
		{name: "stdin left unread", c: remoteCommand{argv: []string{"true"}, stdin: strings.Repeat("x", 1<<20)}},
		{name: "hostile arguments and values", c: remoteCommand{argv: append([]string{"sh", "-c", `printf '%s\n' "$V" "$@"`, "sh"}, hostile...), env: map[string]string{"V": hostile[1]}},
			stdout: strings.Join(append([]string{hostile[1]}, hostile...), "\n") + "\n"},
		{name: "a working directory, hostile", c: remoteCommand{argv: []string{"pwd"}, dir: weird}, stdout: weird + "\n"},
		{name: "a missing working directory", c: remoteCommand{argv: []string{"pwd"}, dir: weird + "/nope"}, code: 125, check: func(t *testing.T, l *local) {
			if s := l.commandStderr(); !strings.Contains(s, "nope") {
				t.Errorf("stderr %q does not name the directory", s)
			}
		}},
		{name: "a relative working directory is the login directory's", c: remoteCommand{argv: []string{"sh", "-c", `mkdir -p sub && cd sub && pwd`}}, check: func(t *testing.T, l *local) {
			if got := strings.TrimSpace(l.stdout.String()); got != filepath.Join(l.login, "sub") {
				t.Errorf("pwd %q, want under the login directory %s", got, l.login)
			}
		}},
		{name: "the step's environment is the command's alone", c: remoteCommand{
			argv: []string{"env"}, lock: "k", stdin: "x",
			env: map[string]string{"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "IFS": "/", "CDPATH": "/", "SHELLOPTS": "xtrace"},
		}, check: func(t *testing.T, l *local) {
			lines := strings.Split(l.stdout.String(), "\n")
			for _, want := range []string{"PATH=/usr/bin:/bin", "HOME=/nonexistent", "IFS=/", "CDPATH=/", "SHELLOPTS=xtrace"} {
				if !slices.Contains(lines, want) {
					t.Errorf("no %s in the command's environment:\n%s", want, l.stdout.String())
				}
			}
			if strings.Contains(l.stdout.String(), envPrefix) {
				t.Errorf("the wrapper's variables reached the command:\n%s", l.stdout.String())
			}
			// The wrapper kept its lock and input under the login's HOME.
			if entries, err := os.ReadDir(filepath.Join(l.home, ".chaingate")); err != nil || len(entries) != 0 {
				t.Errorf("the wrapper's directory: %v, %v; want it there and empty", entries, err)
			}
		}},
		{name: "TERM is not ignored", proc: true, c: remoteCommand{argv: []string{"grep", "^SigIgn", "/proc/self/status"}}, check: func(t *testing.T, l *local) {
			// Ignored signals are inherited across exec; the watchdog's
			// ignored TERM must not reach the command.
			mask, err := strconv.ParseUint(strings.TrimSpace(strings.TrimPrefix(l.stdout.String(), "SigIgn:")), 16, 64)
			if err != nil || mask&(1<<(syscall.SIGTERM-1)) != 0 {
				t.Errorf("%q: the command ignores TERM", l.stdout.String())
			}
		}},
		{name: "a program whose name starts with a dash", c: remoteCommand{argv: []string{"-x"}}, code: 127},
		{name: "a program that is not there", c: remoteCommand{argv: []string{"no-such-program-here"}}, code: 127, check: func(t *testing.T, l *local) {
			if s := l.commandStderr(); !strings.Contains(s, "no-such-program-here") {
				t.Errorf("stderr %q does not name the program", s)
			}
		}},
	} {
		for _, sh := range wrapperShells(t) {
			t.Run(tc.name+"/"+sh, func(t *testing.T) {
				if tc.proc {
					needProc(t)
				}
				l := startLocal(t, "sh", sh, "", tc.c)
				if code := l.wait(t); code != tc.code {
					t.Fatalf("exit %d, want %d; stderr %q", code, tc.code, l.stderr.String())
				}
				if tc.stdout != "" && l.stdout.String() != tc.stdout {
					t.Errorf("stdout %q, want %q", l.stdout.String(), tc.stdout)
				}
				if tc.check != nil {
					tc.check(t, l)
				}
				for _, dir := range []string{l.login, l.home, weird} {
					if _, err := os.Stat(filepath.Join(dir, "pwned")); err == nil {
						t.Fatalf("a hostile value ran a command in %s", dir)
					}
				}
			})
		}
	}
}

// TestWrapperDirectory: the lock and the input are kept in ~/.chaingate,
// which must be the user's own and no one else's to write to.
func TestWrapperDirectory(t *testing.T) {
	for _, tc := range []struct {
		name  string
		home  func(t *testing.T) string
		lock  string
		code  int
		says  string
		after func(t *testing.T, home string)
	}{
		{name: "a HOME that is not there", home: func(t *testing.T) string { return filepath.Join(t.TempDir(), "nope") }, lock: "k", code: 125, says: "cannot make",
			after: func(t *testing.T, home string) {
				if _, err := os.Stat(home); err == nil {
					t.Error("the wrapper made HOME")
				}
			}},
		{name: "no lock and no input need none", home: func(t *testing.T) string { return filepath.Join(t.TempDir(), "nope") }},
		{name: "a directory others may write to", lock: "k", code: 125, says: "no one else may write to", home: func(t *testing.T) string {
			home := t.TempDir()
			if err := os.Mkdir(filepath.Join(home, ".chaingate"), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(filepath.Join(home, ".chaingate"), 0o777); err != nil {
				t.Fatal(err)
			}
			return home
		}},
		{name: "a link in its place", lock: "k", code: 125, says: "no one else may write to", home: func(t *testing.T) string {
			home := t.TempDir()
			if err := os.Symlink(t.TempDir(), filepath.Join(home, ".chaingate")); err != nil {
				t.Fatal(err)
			}
			return home
		}},
	} {
		for _, sh := range wrapperShells(t) {
			t.Run(tc.name+"/"+sh, func(t *testing.T) {
				home := tc.home(t)
				l := startLocal(t, "sh", sh, home, remoteCommand{argv: []string{"echo", "ran"}, lock: tc.lock})
				if code := l.wait(t); code != tc.code || !strings.Contains(l.commandStderr(), tc.says) {
					t.Fatalf("exit %d, stderr %q; want %d and a message saying %q", code, l.commandStderr(), tc.code, tc.says)
				}
				if ran := l.stdout.String() == "ran\n"; ran != (tc.code == 0) {
					t.Errorf("stdout %q", l.stdout.String())
				}
				if tc.after != nil {
					tc.after(t, home)
				}
			})
		}
	}
}

// group returns the processes of a process group, from /proc.
func group(t *testing.T, id int) []proctest.Process {
	t.Helper()
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var pids []int
	for _, f := range stats {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		fields := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
		if len(fields) > 2 && fields[2] == strconv.Itoa(id) && fields[0] != "Z" {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(f)))
			pids = append(pids, pid)
		}
	}
	return proctest.Seen(pids...)
}

// waitFor polls cond for up to a minute, failing t if it never holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after a minute", what)
		}
	}
}

func needProc(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("needs /proc to see the processes")
	}
}

// TestWrapperWatchdog ends the channel's input under a running command,
// as sshd does when the connection ends: the whole group goes, a command
// that ignores TERM after the grace.
func TestWrapperWatchdog(t *testing.T) {
	needProc(t)
	for _, tc := range []struct{ name, trap string }{
		{"TERM ends it", ""},
		{"TERM ignored", `trap "" TERM; `},
	} {
		for _, sh := range wrapperShells(t) {
			t.Run(tc.name+"/"+sh, func(t *testing.T) {
				pids := filepath.Join(t.TempDir(), "pids")
				l := startLocal(t, "sh", sh, "", remoteCommand{
					argv:  []string{"sh", "-c", tc.trap + `sleep 300 & echo $! >> "$PIDS"; echo $$ >> "$PIDS"; while :; do sleep 1; done`},
					env:   map[string]string{"PIDS": pids},
					lock:  "run1/step1",
					grace: time.Second,
				})
				waitFor(t, "command running", func() bool { return len(proctest.ReadPIDs(pids)) == 2 })
				procs := group(t, l.cmd.Process.Pid)
				if len(procs) < 4 { // the wrapper, its watchdog, the command and its child
					t.Fatalf("%d processes in the group, want at least 4", len(procs))
				}
				_ = l.stdin.Close()
				proctest.WaitGone(t, 30*time.Second, procs)
				_ = l.wait(t)
			})
		}
	}
}

// TestWrapperLock runs a step's command while an earlier one holds its
// lock, and after one that left its lock behind.
func TestWrapperLock(t *testing.T) {
	needProc(t)
	for _, sh := range wrapperShells(t) {
		t.Run(sh, func(t *testing.T) {
			home, dir := t.TempDir(), t.TempDir()
			c := func(script string) remoteCommand {
				return remoteCommand{argv: []string{"sh", "-c", script}, env: map[string]string{"D": dir}, lock: "run1/step1", grace: time.Second}
			}
			first := startLocal(t, "sh", sh, home, c(`: > "$D/first"; while [ ! -e "$D/release" ]; do sleep 0.05; done; : > "$D/first-done"`))
			waitFor(t, "first command running", func() bool { _, err := os.Stat(filepath.Join(dir, "first")); return err == nil })
			second := startLocal(t, "sh", sh, home, c(`[ -e "$D/first-done" ] && echo after`))
			marker := fmt.Sprintf("%s%d\n", waitMarker, first.cmd.Process.Pid)
			waitFor(t, "wait line", func() bool { return strings.Contains(second.stderr.String(), marker) })
			if err := os.WriteFile(filepath.Join(dir, "release"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if code := first.wait(t); code != 0 {
				t.Fatalf("first: exit %d: %s", code, first.stderr.String())
			}
			if code := second.wait(t); code != 0 || second.stdout.String() != "after\n" {
				t.Fatalf("second: exit %d, stdout %q, stderr %q: it ran beside the first", code, second.stdout.String(), second.stderr.String())
			}

			// A lock whose group is gone, or that holds no group, is taken over.
			lock := filepath.Join(home, ".chaingate", lockName("run1/step1")+".lock")
			gone := exec.Command("true")
			if err := gone.Run(); err != nil {
				t.Fatal(err)
			}
			// Others' locks: one left by a group that is gone is swept away
			// as a command ends; one held by a group that runs stays.
			others := filepath.Join(home, ".chaingate", lockName("run0/gone")+".lock")
			live := filepath.Join(home, ".chaingate", lockName("run0/live")+".lock")
			if err := os.WriteFile(others, []byte(strconv.Itoa(gone.Process.Pid)+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(live, []byte(strconv.Itoa(syscall.Getpgrp())+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			for _, held := range []string{strconv.Itoa(gone.Process.Pid) + "\n", "garbage\n", ""} {
				if err := os.WriteFile(lock, []byte(held), 0o600); err != nil {
					t.Fatal(err)
				}
				l := startLocal(t, "sh", sh, home, c("echo ran"))
				if code := l.wait(t); code != 0 || l.stdout.String() != "ran\n" || strings.Contains(l.stderr.String(), waitMarker) {
					t.Fatalf("lock holding %q: exit %d, stdout %q, stderr %q", held, code, l.stdout.String(), l.stderr.String())
				}
				if _, err := os.Stat(lock); err == nil {
					t.Fatalf("lock holding %q: the lock was not released", held)
				}
			}
			if _, err := os.Stat(others); err == nil {
				t.Error("a lock left by a group that is gone was not swept away")
			}
			if _, err := os.Stat(live); err != nil {
				t.Errorf("a lock held by a live group was swept away: %v", err)
			}
			if entries, _ := os.ReadDir(filepath.Join(home, ".chaingate")); len(entries) != 1 {
				t.Errorf("left in the lock directory: %v", entries)
			}
		})
	}
}
