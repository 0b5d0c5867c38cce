//go:build unix

package host_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/plugins/host"
)

// socketDirs lists the plugin socket directories in dir.
func socketDirs(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "cg-plugin-") {
			names = append(names, e.Name())
		}
	}
	return names
}

// A plugin that crashes cannot remove its socket; the gateway removes the
// directory holding it once the process is gone, and every other one on
// Close.
func TestPluginSocketsAreRemoved(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
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
}

// A gateway killed with SIGKILL leaves its plugins' socket directories; the
// next gateway removes those of gateways that are gone, once they are old
// enough not to be a launch in progress in another pid namespace.
func TestSocketDirsOfGatewaysGoneAreSwept(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	gone := exec.Command(os.Args[0], "-test.run=^$")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	dead := gone.Process.Pid
	old := time.Now().Add(-2 * time.Hour)
	for _, d := range []struct {
		name string
		old  bool
	}{
		{fmt.Sprintf("cg-plugin-%d-1", dead), true},
		{fmt.Sprintf("cg-plugin-%d-2", dead), false},
		{fmt.Sprintf("cg-plugin-%d-3", os.Getpid()), true},
		{fmt.Sprintf("cg-plugin-%d-4", os.Getppid()), true},
		{"cg-plugin-notapid", true},
		{"plugin-dir-5", true},
	} {
		dir := filepath.Join(tmp, d.name)
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "plugin123"), nil, 0o600); err != nil {
			t.Fatal(err)
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
	for _, want := range []string{
		fmt.Sprintf("cg-plugin-%d-2", dead),
		fmt.Sprintf("cg-plugin-%d-3", os.Getpid()),
		fmt.Sprintf("cg-plugin-%d-4", os.Getppid()),
		"cg-plugin-notapid",
		"plugin-dir-5",
	} {
		if !slices.Contains(left, want) {
			t.Errorf("%s was removed; left: %v", want, left)
		}
	}
	if slices.Contains(left, fmt.Sprintf("cg-plugin-%d-1", dead)) {
		t.Errorf("the old directory of a gateway that is gone was kept: %v", left)
	}
}
