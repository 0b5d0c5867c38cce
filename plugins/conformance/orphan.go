package conformance

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/chaingate/gateway/plugins"
	"github.com/chaingate/gateway/plugins/host"
	"github.com/chaingate/gateway/plugins/internal/wire"
)

// orphanHostEnv makes a re-executed gateway binary the short-lived parent
// of a plugin: it launches the plugin as the gateway would, prints its pid,
// and waits to be killed.
const orphanHostEnv = "CHAINGATE_CONFORMANCE_ORPHAN_HOST"

// orphanWait is how long a plugin may outlive its parent. plugins.Serve
// notices within 200 ms; the rest is room for a loaded machine.
const orphanWait = 5 * time.Second

// orphanHost is what the check tells the intermediate parent.
type orphanHost struct {
	Target    Target `json:"target"`
	TimeoutMS int64  `json:"timeout_ms"`
	// SocketDir is where the plugin makes its socket; the check removes it.
	SocketDir string `json:"socket_dir,omitempty"`
}

// ServeOrphanHostIfRequested turns this process into the intermediate
// parent of the orphan check when the check asks for one, and never
// returns then; otherwise it returns at once. The gateway's main calls it,
// after host.ServeBuiltinIfRequested, as does the TestMain of every test
// that runs Check.
func ServeOrphanHostIfRequested() {
	raw, ok := os.LookupEnv(orphanHostEnv)
	if !ok {
		return
	}
	// The plugin must not become a host in turn when it is this binary.
	os.Unsetenv(orphanHostEnv)
	var h orphanHost
	if err := json.Unmarshal([]byte(raw), &h); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", orphanHostEnv, err)
		os.Exit(2)
	}
	pid, err := startOrphan(h.Target, time.Duration(h.TimeoutMS)*time.Millisecond, h.SocketDir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(pid)
	// The check kills this process long before.
	time.Sleep(time.Minute)
	os.Exit(0)
}

// startOrphan launches the plugin and waits for its handshake line. It sets
// no parent-death signal, unlike the gateway on Linux: the check is about
// what the plugin does by itself, as it must on every system.
func startOrphan(t Target, timeout time.Duration, socketDir string) (int, error) {
	var cmd *exec.Cmd
	if t.Builtin != "" {
		cmd = exec.Command(t.Executable, "plugin", t.Builtin)
		cmd.Env = append(cmd.Env, host.BuiltinEnv+"="+t.Builtin)
	} else {
		cmd = exec.Command(t.Path, t.Args...)
	}
	cmd.Env = append(wire.SocketDirEnv(append(os.Environ(), cmd.Env...), socketDir),
		plugins.MagicCookieKey+"="+plugins.MagicCookieValue,
		"PLUGIN_PROTOCOL_VERSIONS="+strconv.Itoa(plugins.ProtocolVersion),
		"PLUGIN_MIN_PORT=10000", "PLUGIN_MAX_PORT=25000")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("starting the plugin: %w", err)
	}
	line, err := readLine(out, timeout)
	if err != nil {
		_ = cmd.Process.Kill()
		return 0, fmt.Errorf("reading the plugin's handshake: %w", err)
	}
	// CORE-VERSION|APP-VERSION|NETWORK|ADDRESS|PROTOCOL[|CERT]
	if f := strings.Split(line, "|"); len(f) < 5 || f[1] != strconv.Itoa(plugins.ProtocolVersion) {
		_ = cmd.Process.Kill()
		return 0, fmt.Errorf("the plugin's handshake line %q is not go-plugin's for protocol version %d", line, plugins.ProtocolVersion)
	}
	return cmd.Process.Pid, nil
}

// readLine reads one line, waiting at most timeout.
func readLine(r io.Reader, timeout time.Duration) (string, error) {
	type result struct {
		line string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		line, err := bufio.NewReader(r).ReadString('\n')
		done <- result{strings.TrimSpace(line), err}
	}()
	select {
	case res := <-done:
		return res.line, res.err
	case <-time.After(timeout):
		return "", fmt.Errorf("nothing within %s", ms(timeout))
	}
}

// orphan checks that the plugin exits by itself once its parent is
// killed outright, as a gateway killed with SIGKILL or by the OOM killer
// is: no orphan processes, ever.
func (c *checker) orphan(ctx context.Context) {
	if runtime.GOOS == "windows" {
		c.skip(checkOrphan, "not checked on Windows")
		return
	}
	if err := ctx.Err(); err != nil {
		c.skip(checkOrphan, "%v", err)
		return
	}
	if c.t.Executable == "" {
		c.skip(checkOrphan, "the gateway binary, which acts as the plugin's parent, could not be found")
		return
	}
	// Made here, so that it goes whether or not the plugin removes it.
	socketDir, err := wire.MakeSocketDir()
	if err != nil {
		c.fail(checkOrphan, "%v", err)
		return
	}
	if socketDir != "" {
		defer os.RemoveAll(socketDir)
	}
	spec, err := json.Marshal(orphanHost{Target: c.t, TimeoutMS: c.opts.Timeout.Milliseconds(), SocketDir: socketDir})
	if err != nil {
		c.fail(checkOrphan, "encoding the target: %v", err)
		return
	}
	host := exec.Command(c.t.Executable)
	host.Env = append(os.Environ(), orphanHostEnv+"="+string(spec))
	var stderr bytes.Buffer
	host.Stderr = &stderr
	out, err := host.StdoutPipe()
	if err != nil {
		c.fail(checkOrphan, "%v", err)
		return
	}
	// Should the check itself die, the host must not outlive it.
	setParentDeathSignal(host)
	runtime.LockOSThread()
	err = host.Start()
	runtime.UnlockOSThread()
	if err != nil {
		c.fail(checkOrphan, "starting %s as the plugin's parent: %v", c.t.Executable, err)
		return
	}
	line, err := readLine(out, c.opts.Timeout+c.opts.Grace)
	if err != nil {
		_ = host.Process.Kill()
		_ = host.Wait()
		c.fail(checkOrphan, "starting the plugin under an intermediate parent: %s", hostError(err, stderr.String()))
		return
	}
	pid, err := strconv.Atoi(line)
	if err != nil || pid <= 0 {
		_ = host.Process.Kill()
		_ = host.Wait()
		c.fail(checkOrphan, "the intermediate parent printed %q, not the plugin's pid", line)
		return
	}
	defer killPID(pid)
	if processGone(pid) {
		_ = host.Process.Kill()
		_ = host.Wait()
		c.fail(checkOrphan, "the plugin exited right after its handshake")
		return
	}
	killed := time.Now()
	_ = host.Process.Kill()
	_ = host.Wait()
	for !processGone(pid) {
		if time.Since(killed) > orphanWait {
			c.fail(checkOrphan, "the plugin was still running %s after its parent was killed with SIGKILL; a plugin must exit when the gateway dies: plugins.Serve watches its parent process, and a plugin in another language must too (poll its parent pid and exit when it changes)", ms(orphanWait))
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.pass(checkOrphan, "the plugin exited %s after its parent was killed with SIGKILL", ms(time.Since(killed)))
}

func hostError(err error, stderr string) string {
	if stderr = strings.TrimSpace(stderr); stderr != "" {
		return errors.Join(err, errors.New(stderr)).Error()
	}
	return err.Error()
}

// killPID ends a plugin that outlived its parent, so the check leaves no
// process behind whatever the verdict.
func killPID(pid int) {
	if p, err := os.FindProcess(pid); err == nil {
		_ = p.Kill()
	}
}
