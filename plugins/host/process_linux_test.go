package host_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chaingate/gateway/plugins"
	"github.com/chaingate/gateway/plugins/host"
	"github.com/chaingate/gateway/plugins/internal/wire"
	"github.com/chaingate/gateway/providers"
)

// hostModeEnv makes the test binary act as a gateway that starts a plugin,
// prints the plugin's pid and waits to be killed.
const hostModeEnv = "CHAINGATE_TEST_HOST_MODE"

func runHostModeIfRequested() {
	mode := os.Getenv(hostModeEnv)
	if mode == "" {
		return
	}
	pid, err := startPluginAsHost(mode)
	if err != nil {
		fmt.Fprintln(os.Stderr, "host mode:", err)
		os.Exit(1)
	}
	fmt.Println(pid)
	time.Sleep(time.Hour)
	os.Exit(0)
}

func startPluginAsHost(mode string) (int, error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, err
	}
	switch mode {
	case "manager":
		m := host.NewManager(host.Options{Executable: exe})
		p := m.Provider(host.Spec{Name: "echo", Builtin: "echo"})
		if _, err := p.Execute(context.Background(), providers.Request{Payload: json.RawMessage(`1`)}); err != nil {
			return 0, err
		}
		return host.PID(p), nil
	case "raw":
		// Launch the plugin the way a host that knows nothing of parent-death
		// signals would, so that only Serve's own watch can end it.
		cmd := exec.Command(exe, "plugin", "echo")
		dir, err := wire.MakeSocketDir()
		if err != nil {
			return 0, err
		}
		cmd.Env = append(wire.SocketDirEnv(os.Environ(), dir),
			host.BuiltinEnv+"=echo",
			plugins.MagicCookieKey+"="+plugins.MagicCookieValue,
			"PLUGIN_PROTOCOL_VERSIONS="+strconv.Itoa(plugins.ProtocolVersion))
		out, err := cmd.StdoutPipe()
		if err != nil {
			return 0, err
		}
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
			return 0, fmt.Errorf("reading the plugin handshake: %w", err)
		}
		return cmd.Process.Pid, nil
	}
	return 0, fmt.Errorf("unknown host mode %q", mode)
}

// TestOrphanedPluginExits kills a gateway with SIGKILL, so that it can clean
// nothing up, and checks that its plugin goes away by itself. A plugin that
// notices it is orphaned removes its socket; one the kernel kills leaves it
// to the next gateway (TestSocketDirsOfGatewaysGoneAreSwept).
func TestOrphanedPluginExits(t *testing.T) {
	for _, mode := range []string{"manager", "raw"} {
		t.Run(mode, func(t *testing.T) {
			tmp := shortTempDir(t)
			t.Setenv("TMPDIR", tmp)
			host := exec.Command(os.Args[0], "-test.run=^$")
			host.Env = append(os.Environ(), hostModeEnv+"="+mode)
			host.Stderr = os.Stderr
			// Should this test die first, the host must not outlive it.
			host.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			out, err := host.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			runtime.LockOSThread()
			err = host.Start()
			runtime.UnlockOSThread()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = host.Process.Kill(); _ = host.Wait() })

			line, err := bufio.NewReader(out).ReadString('\n')
			if err != nil {
				t.Fatalf("reading the plugin pid from the host: %v", err)
			}
			pid, err := strconv.Atoi(strings.TrimSpace(line))
			if err != nil || pid <= 0 {
				t.Fatalf("host printed %q, not a pid", line)
			}
			t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
			if processGone(pid) {
				t.Fatalf("plugin pid %d is not running before the host is killed", pid)
			}

			if err := host.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			_ = host.Wait()
			waitGone(t, pid, 2*time.Second)
			if left := socketDirs(t, tmp); mode == "raw" && len(left) != 0 {
				t.Errorf("the orphaned plugin left its socket directory: %v", left)
			}
		})
	}
}

// processGone reports whether pid has exited; a zombie awaiting its reaper
// counts as gone.
func processGone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// The state follows the command name, which is in parentheses and may
	// itself contain spaces or parentheses.
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(fields) == 0 || fields[0] == "Z" || fields[0] == "X"
}
