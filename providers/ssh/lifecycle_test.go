//go:build unix

package ssh

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	xssh "golang.org/x/crypto/ssh"

	"github.com/chaingate/gateway/internal/testutil/proctest"
	"github.com/chaingate/gateway/internal/testutil/sshdtest"
	"github.com/chaingate/gateway/providers/internal/command"
)

// caller makes calls to srv, reached at addr: srv's own address or a
// proxy's before it.
type caller struct {
	p *Provider
	s *settings
	t target
}

func newCaller(t *testing.T, srv *sshdtest.Server, addr string, over map[string]any) *caller {
	t.Helper()
	_, port, _ := net.SplitHostPort(addr)
	n, _ := strconv.Atoi(port)
	// A pinned key: a proxy's address is not the one known_hosts names.
	cfg := map[string]any{"user": srv.User, "private_key": srv.ClientKey, "host_keys": []string{srv.HostKey}, "allowed_hosts": []string{"127.0.0.1"}, "port": n}
	maps.Copy(cfg, over)
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := decodeConfig(raw)
	if err != nil {
		t.Fatal(err)
	}
	tgt, err := s.target("127.0.0.1", "")
	if err != nil {
		t.Fatal(err)
	}
	c := &caller{p: New().(*Provider), s: s, t: tgt}
	t.Cleanup(func() {
		for _, client := range c.clients() {
			_ = client.Close()
		}
	})
	return c
}

// clients are the connections the caller's pool holds.
func (c *caller) clients() []*xssh.Client {
	c.p.pool.mu.Lock()
	defer c.p.pool.mu.Unlock()
	var out []*xssh.Client
	for _, conn := range c.p.pool.conns {
		select {
		case <-conn.ready:
			if conn.client != nil {
				out = append(out, conn.client)
			}
		default:
		}
	}
	return out
}

// outcome is what run returned, and what the command printed.
type outcome struct {
	exit           int
	warning        string
	err            error
	stdout, stderr string
}

// run runs rc through the provider's run, as Execute does.
func (c *caller) run(ctx context.Context, rc remoteCommand) outcome {
	line, err := remoteLine(rc)
	if err != nil {
		return outcome{err: err}
	}
	stdout, stderr := command.NewOutput(1<<20), command.NewOutput(1<<20)
	exit, warning, err := c.p.run(ctx, c.s, c.t, job{line: line, stdin: rc.stdin, stdout: stdout, stderr: stderr})
	return outcome{exit: exit, warning: warning, err: err, stdout: string(stdout.Bytes()), stderr: string(stderr.Bytes())}
}

// start runs rc in the background; the outcome arrives on the channel.
func (c *caller) start(rc remoteCommand) <-chan outcome {
	done := make(chan outcome, 1)
	go func() { done <- c.run(context.Background(), rc) }()
	return done
}

// proxy passes TCP connections on to an address until it drops them
// (both ends closed at once, as a killed gateway's are) or black-holes
// them (nothing forwarded, nothing closed: a cable cut).
type proxy struct {
	ln    net.Listener
	to    string
	holed atomic.Bool
	mu    sync.Mutex
	conns []net.Conn
}

func newProxy(t *testing.T, to string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, to: to}
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.drop()
	})
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) accept() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.to)
		if err != nil {
			_ = in.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, in, out)
		p.mu.Unlock()
		go p.pass(out, in)
		go p.pass(in, out)
	}
}

// pass copies src to dst while the proxy forwards, and reads src into
// nothing once it black-holes.
func (p *proxy) pass(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.holed.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !p.holed.Load() {
				_ = dst.Close()
			}
			return
		}
	}
}

// drop closes every connection, both ends.
func (p *proxy) drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// blackhole stops forwarding, closing nothing.
func (p *proxy) blackhole() { p.holed.Store(true) }

// pgid is the process group of a process.
func pgid(t *testing.T, pid int) int {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	n, _ := strconv.Atoi(fields[2])
	return n
}

// Commands whose three processes write their PIDs to $PIDS.
const (
	// lingering's last process ignores TERM, and goes with the KILL that
	// follows the command's end.
	lingering = `sleep 300 & echo $! >> "$PIDS"; echo $$ >> "$PIDS"; sh -c 'trap "" TERM; echo $$ >> "$PIDS"; while :; do sleep 1; done'`
	// deaf ignores TERM, all of it, and goes with the KILL after the
	// grace.
	deaf = `trap "" TERM; ` + lingering
)

// TestRunResults runs commands on a real sshd through run: what they
// print and exit with, and values that stay literal.
func TestRunResults(t *testing.T) {
	srv := sshdtest.Start(t)
	c := newCaller(t, srv, srv.Addr, nil)
	dir := filepath.Join(t.TempDir(), `-x $(touch pwned) '"`)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	stdin := "a\x00b'\"$(touch pwned)\n`id`\nno newline at the end"
	for _, tc := range []struct {
		name   string
		rc     remoteCommand
		exit   int
		stdout string
		stderr string
	}{
		{name: "exit status", rc: remoteCommand{argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}}, exit: 3, stdout: "out\n", stderr: "err\n"},
		{name: "killed by a signal", rc: remoteCommand{argv: []string{"sh", "-c", "kill -9 $$"}}, exit: 137},
		{name: "stdin, literally", rc: remoteCommand{argv: []string{"cat"}, stdin: stdin}, stdout: stdin},
		{name: "stdin larger than a command line", rc: remoteCommand{argv: []string{"wc", "-c"}, stdin: strings.Repeat("x", 8<<20)}, stdout: "8388608\n"},
		{name: "stdin left unread", rc: remoteCommand{argv: []string{"true"}, stdin: strings.Repeat("x", 8<<20)}},
		{name: "hostile arguments and values", rc: remoteCommand{argv: append([]string{"sh", "-c", `printf '%s\n' "$V" "$@"`, "sh"}, hostile...), env: map[string]string{"V": hostile[0]}},
			stdout: strings.Join(append([]string{hostile[0]}, hostile...), "\n") + "\n"},
		{name: "a hostile working directory", rc: remoteCommand{argv: []string{"pwd"}}, stdout: dir + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.rc.dir, tc.rc.lock, tc.rc.grace = dir, "run1/"+tc.name, time.Second
			o := c.run(context.Background(), tc.rc)
			if o.err != nil || o.exit != tc.exit || o.stdout != tc.stdout || o.stderr != tc.stderr || o.warning != "" {
				t.Errorf("exit %d, stdout %q, stderr %q, warning %q, err %v; want exit %d, stdout %q, stderr %q", o.exit, o.stdout, o.stderr, o.warning, o.err, tc.exit, tc.stdout, tc.stderr)
			}
			for _, d := range []string{dir, srv.Home} {
				if _, err := os.Stat(filepath.Join(d, "pwned")); err == nil {
					t.Fatalf("a hostile value ran a command in %s", d)
				}
			}
		})
	}
}

// TestConnectionDropped ends the connection under a running command, as a
// gateway killed outright does: every process of the command's group on
// the host goes, the one that ignores TERM after the grace.
func TestConnectionDropped(t *testing.T) {
	needProc(t)
	srv := sshdtest.Start(t)
	for _, tc := range []struct {
		name, script string
		drop         func(*proxy, *caller)
	}{
		{"the connection is dropped between", lingering, func(p *proxy, _ *caller) { p.drop() }},
		{"the gateway's end closes", lingering, func(_ *proxy, c *caller) {
			for _, client := range c.clients() {
				_ = client.Close()
			}
		}},
		{"the connection is dropped under a command deaf to TERM", deaf, func(p *proxy, _ *caller) { p.drop() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			px := newProxy(t, srv.Addr)
			c := newCaller(t, srv, px.addr(), nil)
			pids := filepath.Join(t.TempDir(), "pids")
			done := c.start(remoteCommand{argv: []string{"sh", "-c", tc.script}, dir: filepath.Dir(pids), env: map[string]string{"PIDS": pids}, lock: "run1/step1", grace: 2 * time.Second})
			waitFor(t, "command running", func() bool { return len(proctest.ReadPIDs(pids)) == 3 })
			procs := group(t, pgid(t, proctest.ReadPIDs(pids)[0]))
			if len(procs) < 5 { // the wrapper, its watchdog, and the command's three
				t.Fatalf("%d processes in the group, want at least 5", len(procs))
			}
			tc.drop(px, c)
			proctest.WaitGone(t, 30*time.Second, procs)
			select {
			case o := <-done:
				if o.err == nil {
					t.Errorf("the call succeeded: %+v", o)
				}
			case <-time.After(time.Minute):
				t.Fatal("the call did not return within a minute of its connection's end")
			}
		})
	}
}

// TestRunAgainAfterADrop starts a step's command again right after the
// connection of its first run dropped, while the first is still being
// stopped on the host: the second waits until the first's group is gone.
func TestRunAgainAfterADrop(t *testing.T) {
	needProc(t)
	srv := sshdtest.Start(t)
	dir := t.TempDir()
	px := newProxy(t, srv.Addr)
	first := newCaller(t, srv, px.addr(), nil)
	pids := filepath.Join(dir, "pids")
	done := first.start(remoteCommand{argv: []string{"sh", "-c", deaf}, dir: dir, env: map[string]string{"PIDS": pids}, lock: "run1/step1", grace: 3 * time.Second})
	waitFor(t, "first command running", func() bool { return len(proctest.ReadPIDs(pids)) == 3 })
	procs := group(t, pgid(t, proctest.ReadPIDs(pids)[0]))
	var list []string
	for _, p := range procs {
		list = append(list, strconv.Itoa(p.PID))
	}
	px.drop()

	// The second says which of the first's processes it finds running,
	// zombies aside, as it starts.
	second := newCaller(t, srv, srv.Addr, nil)
	o := second.run(context.Background(), remoteCommand{
		argv: []string{"sh", "-c", `for p in $FIRST; do s=$(sed 's/.*) //' /proc/$p/stat 2>/dev/null | cut -d' ' -f1); case $s in ""|Z|X) ;; *) echo "running: $p $s" ;; esac; done; echo started`},
		dir:  dir, env: map[string]string{"FIRST": strings.Join(list, " ")}, lock: "run1/step1", grace: time.Second,
	})
	if o.err != nil || o.exit != 0 || o.stdout != "started\n" {
		t.Fatalf("second: exit %d, stdout %q, stderr %q, err %v; it ran beside the first", o.exit, o.stdout, o.stderr, o.err)
	}
	if want := fmt.Sprintf("for the processes of an earlier attempt of the step (process group %d)", pgid(t, procs[0].PID)); !strings.Contains(o.warning, want) {
		t.Errorf("warning %q does not say %q", o.warning, want)
	}
	proctest.WaitGone(t, 30*time.Second, procs)
	<-done
	if entries, _ := os.ReadDir(filepath.Join(srv.Home, ".chaingate")); len(entries) != 0 {
		t.Errorf("left in the lock directory: %v", entries)
	}
}

// TestStoppedWhileWaiting ends a call whose command waits for an earlier
// attempt: it fails saying so, and never starts.
func TestStoppedWhileWaiting(t *testing.T) {
	srv := sshdtest.Start(t)
	dir := t.TempDir()
	holder := newCaller(t, srv, srv.Addr, nil)
	release := filepath.Join(dir, "release")
	done := holder.start(remoteCommand{argv: []string{"sh", "-c", `: > started; while [ ! -e release ]; do sleep 0.05; done`}, dir: dir, lock: "run1/step1", grace: time.Second})
	waitFor(t, "first command running", func() bool { _, err := os.Stat(filepath.Join(dir, "started")); return err == nil })

	c := newCaller(t, srv, srv.Addr, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		// Cancelled whatever happens, so that a wrapper that never waits
		// fails the test rather than hangs it.
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline) && !waiting(srv.Home, "run1/step1"); {
			time.Sleep(20 * time.Millisecond)
		}
		cancel()
	}()
	o := c.run(ctx, remoteCommand{argv: []string{"sh", "-c", ": > ran"}, dir: dir, lock: "run1/step1", grace: time.Second})
	var waiting *lockWaitError
	if !errors.As(o.err, &waiting) || waiting.err != nil || !strings.Contains(o.err.Error(), "before it started; it was stopped there") {
		t.Fatalf("err %v, want a *lockWaitError saying the command was stopped before it started", o.err)
	}
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if o := <-done; o.err != nil || o.exit != 0 {
		t.Fatalf("first: %+v", o)
	}
	if _, err := os.Stat(filepath.Join(dir, "ran")); err == nil {
		t.Fatal("the stopped command ran")
	}
}

// TestNetworkCut stops forwarding under a running command without closing
// anything: sshd gives the client up after ClientAliveInterval ×
// ClientAliveCountMax, and then the command's group goes.
func TestNetworkCut(t *testing.T) {
	needProc(t)
	srv := sshdtest.StartWith(t, sshdtest.Options{ClientAliveInterval: time.Second, ClientAliveCountMax: 2})
	px := newProxy(t, srv.Addr)
	c := newCaller(t, srv, px.addr(), nil)
	pids := filepath.Join(t.TempDir(), "pids")
	done := c.start(remoteCommand{argv: []string{"sh", "-c", lingering}, dir: filepath.Dir(pids), env: map[string]string{"PIDS": pids}, lock: "run1/step1", grace: time.Second})
	waitFor(t, "command running", func() bool { return len(proctest.ReadPIDs(pids)) == 3 })
	procs := group(t, pgid(t, proctest.ReadPIDs(pids)[0]))
	px.blackhole()
	proctest.WaitGone(t, 30*time.Second, procs)
	if !strings.Contains(srv.Log(), "Timeout, client not responding") {
		t.Errorf("sshd did not say it gave the client up:\n%s", srv.Log())
	}
	// The gateway's end learns of it when the cable is mended, or never:
	// the test ends its wait.
	px.drop()
	<-done
}

// waiting says whether a wrapper waits for the lock of key under home: its
// own file is there, named after its PID, and it sleeps between looks,
// which it does once it has said that it waits.
func waiting(home, key string) bool {
	mine, _ := filepath.Glob(filepath.Join(home, ".chaingate", lockName(key)+".[0-9]*"))
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, m := range mine {
		wrapper := strings.TrimPrefix(filepath.Ext(m), ".")
		for _, f := range stats {
			data, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
			if len(fields) > 1 && fields[1] == wrapper && strings.Contains(string(data), "(sleep)") {
				return true
			}
		}
	}
	return false
}
