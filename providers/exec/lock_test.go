//go:build unix

package exec

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chaingate/gateway/internal/testutil/proctest"
	"github.com/chaingate/gateway/providers"
)

// script is a job running a shell script in dir, under the step's lock.
func script(dir, text, lock string, env ...string) (job, *bytes.Buffer) {
	var stdout bytes.Buffer
	return job{
		program: "/bin/sh", args: []string{"-c", text}, dir: dir, env: append([]string{"PATH=" + DefaultPath}, env...),
		stdin: strings.NewReader(""), stdout: &stdout, stderr: &bytes.Buffer{}, grace: 2 * time.Second, lock: lock,
	}, &stdout
}

// TestLockWaitsForTheGroup runs a step's command again while the first
// run's group is being stopped, as a crash of the gateway stops it: the
// second starts once no process of the first runs, the one that ignores
// TERM included.
func TestLockWaitsForTheGroup(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("needs /proc to see the processes")
	}
	dir := t.TempDir()
	pids := filepath.Join(dir, "pids")
	first, _ := script(dir, `trap "" TERM; sleep 300 & echo $! >> pids; echo $$ >> pids; while :; do sleep 0.1; done`, "run1/step1")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	firstDone := make(chan error, 1)
	go func() {
		_, _, err := run(ctx, first)
		firstDone <- err
	}()
	for deadline := time.Now().Add(time.Minute); len(proctest.ReadPIDs(pids)) < 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first command did not start within a minute")
		}
	}
	firstPIDs := proctest.ReadPIDs(pids)
	// Told to stop, as its supervisor is when the gateway dies.
	cancel()

	// The second says which of the first's processes it finds running,
	// zombies aside, as it starts.
	var list []string
	for _, p := range firstPIDs {
		list = append(list, strconv.Itoa(p))
	}
	second, stdout := script(dir, `for p in $FIRST; do s=$(sed 's/.*) //' /proc/$p/stat 2>/dev/null | cut -d' ' -f1); case $s in ""|Z|X) ;; *) echo "running: $p $s" ;; esac; done; echo started`,
		"run1/step1", "FIRST="+strings.Join(list, " "))
	exit, warning, err := run(context.Background(), second)
	if err != nil || exit != 0 || stdout.String() != "started\n" {
		t.Fatalf("second: exit %d, stdout %q, err %v; it ran beside the first", exit, stdout.String(), err)
	}
	if !strings.Contains(warning, "waited") || !strings.Contains(warning, "earlier attempt of the step") {
		t.Errorf("warning %q does not say the command waited", warning)
	}
	if err := <-firstDone; !errors.Is(err, context.Canceled) {
		t.Errorf("first: %v, want it cancelled", err)
	}
	proctest.WaitGone(t, 30*time.Second, proctest.Seen(firstPIDs...))
	if left, _ := filepath.Glob(filepath.Join(os.TempDir(), fmt.Sprintf("chaingate-exec-%d", os.Getuid()), "*")); len(left) != 0 {
		t.Errorf("lock files left: %v", left)
	}
}

// TestLocksOfOtherSteps: commands of different steps, and commands with no
// lock, do not wait for each other.
func TestLocksOfOtherSteps(t *testing.T) {
	dir := t.TempDir()
	for _, locks := range [][2]string{{"run1/a", "run1/b"}, {"", ""}} {
		hold, _ := script(dir, `: > held; while [ ! -e release ]; do sleep 0.05; done; rm release held`, locks[0])
		done := make(chan error, 1)
		go func() {
			_, _, err := run(context.Background(), hold)
			done <- err
		}()
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
			if _, err := os.Stat(filepath.Join(dir, "held")); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the first command did not start within a minute")
			}
		}
		other, _ := script(dir, `: > release`, locks[1])
		if exit, warning, err := run(context.Background(), other); err != nil || exit != 0 || warning != "" {
			t.Fatalf("locks %q: exit %d, warning %q, err %v", locks, exit, warning, err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// TestUnsafeLockDirectory: a directory of locks that someone else could
// write to is refused, and nothing runs.
func TestUnsafeLockDirectory(t *testing.T) {
	for _, tc := range []struct {
		name string
		make func(t *testing.T, path string)
	}{
		{"writable by its group", func(t *testing.T, path string) {
			if err := os.Mkdir(path, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, 0o770); err != nil {
				t.Fatal(err)
			}
		}},
		{"writable by all", func(t *testing.T, path string) {
			if err := os.Mkdir(path, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, 0o1777); err != nil {
				t.Fatal(err)
			}
		}},
		{"a link to a directory", func(t *testing.T, path string) {
			if err := os.Symlink(t.TempDir(), path); err != nil {
				t.Fatal(err)
			}
		}},
		{"another user's", func(t *testing.T, path string) {
			if os.Getuid() != 0 {
				t.Skip("only root can give a directory away")
			}
			if err := os.Mkdir(path, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(path, 65534, 65534); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmp := t.TempDir()
			t.Setenv("TMPDIR", tmp)
			tc.make(t, filepath.Join(tmp, fmt.Sprintf("chaingate-exec-%d", os.Getuid())))
			dir := t.TempDir()
			j, _ := script(dir, `: > ran`, "run1/step1")
			_, _, err := run(context.Background(), j)
			var pe *providers.Error
			if !errors.As(err, &pe) || pe.Code != "unsafe_lock_dir" || pe.Retryable {
				t.Fatalf("err %v, want a permanent unsafe_lock_dir", err)
			}
			if _, err := os.Stat(filepath.Join(dir, "ran")); !errors.Is(err, syscall.ENOENT) {
				t.Fatal("the command ran")
			}
		})
	}
}
