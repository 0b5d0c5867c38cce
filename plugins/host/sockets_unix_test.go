//go:build unix

package host_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-plugin"

	"github.com/chaingate/gateway/plugins/host"
	"github.com/chaingate/gateway/plugins/internal/wire"
)

// shortTempDir is a temporary directory for plugin sockets: a socket's
// whole path must fit in 104 bytes, which one under t.TempDir may not.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "cg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// socketDirs lists the plugin socket directories in dir.
func socketDirs(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), wire.SocketDirPrefix) {
			names = append(names, e.Name())
		}
	}
	return names
}

// A plugin that crashes cannot remove its socket; the gateway removes the
// directory holding it once the process is gone, and every other one on
// Close. The directory is the gateway's choice, whatever its own
// environment says.
func TestPluginSocketsAreRemoved(t *testing.T) {
	tmp := shortTempDir(t)
	t.Setenv("TMPDIR", tmp)
	elsewhere := shortTempDir(t)
	t.Setenv(plugin.EnvUnixSocketDir, elsewhere)
	m, _ := newManager(t, host.Options{})
	p := m.Provider(host.Spec{Name: "faulty", Builtin: "faulty"})
	mustCall(t, p, `{}`)
	first := socketDirs(t, tmp)
	if len(first) != 1 {
		t.Fatalf("socket directories with one plugin running: %v, want one", first)
	}
	if sockets, _ := filepath.Glob(filepath.Join(tmp, first[0], "plugin*")); len(sockets) != 1 {
		t.Fatalf("the directory holds %v, want the plugin's socket", sockets)
	}

	if _, err := call(t, p, `{"crash":true}`); err == nil {
		t.Fatal("the crashing call succeeded")
	}
	mustCall(t, p, `{}`)
	waitFor(t, 10*time.Second, func() bool {
		now := socketDirs(t, tmp)
		return len(now) == 1 && now[0] != first[0]
	}, "the crashed plugin's socket directory to go, leaving the new one's: %v", first)

	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if left := socketDirs(t, tmp); len(left) != 0 {
		t.Errorf("socket directories left after Close: %v", left)
	}
	if stray, _ := os.ReadDir(elsewhere); len(stray) != 0 {
		t.Errorf("a plugin used the gateway's %s: %v", plugin.EnvUnixSocketDir, stray)
	}
}

// A plugin killed from outside while no call is out is noticed only by the
// goroutine that reaps it, which removes its socket too.
func TestKilledPluginsSocketIsRemoved(t *testing.T) {
	tmp := shortTempDir(t)
	t.Setenv("TMPDIR", tmp)
	m, _ := newManager(t, host.Options{})
	p := m.Provider(host.Spec{Name: "echo", Builtin: "echo"})
	mustCall(t, p, `1`)
	if dirs := socketDirs(t, tmp); len(dirs) != 1 {
		t.Fatalf("socket directories with one plugin running: %v, want one", dirs)
	}
	if err := syscall.Kill(host.PID(p), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { return len(socketDirs(t, tmp)) == 0 }, "the killed plugin's socket directory to go")
}

// A gateway killed with SIGKILL leaves its plugins' socket directories; the
// next gateway removes those of gateways that are gone, once they are old
// enough not to be a launch in progress in another pid namespace, and its
// own pid's from before it started, as a restarted container's gateway
// has the same pid.
func TestSocketDirsOfGatewaysGoneAreSwept(t *testing.T) {
	tmp := shortTempDir(t)
	t.Setenv("TMPDIR", tmp)
	gone := exec.Command(os.Args[0], "-test.run=^$")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	dead, self, parent := gone.Process.Pid, os.Getpid(), os.Getppid()
	old := time.Now().Add(-2 * time.Hour)
	dirs := []struct {
		name      string
		old, kept bool
		otherUser bool
	}{
		{name: fmt.Sprintf("cgp-%d-1", dead), old: true},
		{name: fmt.Sprintf("cgp-%d-2", dead), kept: true},
		{name: fmt.Sprintf("cgp-%d-3", self), old: true},
		{name: fmt.Sprintf("cgp-%d-4", parent), old: true, kept: true},
		{name: fmt.Sprintf("cgp-%d-5", dead), old: true, kept: true, otherUser: true},
		{name: "cgp-notapid", old: true, kept: true},
		{name: "plugin-dir-6", old: true, kept: true},
	}
	for _, d := range dirs {
		dir := filepath.Join(tmp, d.name)
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "plugin123"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if d.otherUser {
			if os.Getuid() != 0 {
				continue
			}
			if err := os.Chown(dir, os.Getuid()+1000, -1); err != nil {
				t.Fatal(err)
			}
		}
		if d.old {
			if err := os.Chtimes(dir, old, old); err != nil {
				t.Fatal(err)
			}
		}
	}

	m, _ := newManager(t, host.Options{})
	mustCall(t, m.Provider(host.Spec{Name: "echo", Builtin: "echo"}), `1`)
	entries, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	for _, d := range dirs {
		if d.otherUser && os.Getuid() != 0 {
			continue
		}
		if got := slices.Contains(left, d.name); got != d.kept {
			t.Errorf("%s kept: %v, want %v; left: %v", d.name, got, d.kept, left)
		}
	}
}
