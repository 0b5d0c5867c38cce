// Package sshdtest gives tests a real OpenSSH server to run commands on: an
// sshd of their own on a free port of 127.0.0.1, with a host key and a
// client key made for the test, that lets the current user in with the
// client key alone.
package sshdtest

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/chaingate/gateway/internal/testutil"
)

// Path is where Debian's openssh-server puts sshd. sshd must be started by
// its absolute path, since it re-executes itself for each connection.
const Path = "/usr/sbin/sshd"

// Server is a running sshd.
type Server struct {
	// Addr is its address, 127.0.0.1:PORT.
	Addr string
	// User is the user the tests log in as: whoever runs them.
	User string
	// ClientKey is the private key it lets User in with, in OpenSSH's PEM
	// form.
	ClientKey string
	// HostKey is its public host key as an authorized_keys line.
	HostKey string
	// KnownHosts is a known_hosts line for Addr, and KnownHostsFile a file
	// holding that line alone.
	KnownHosts     string
	KnownHostsFile string
	// Dir is the test's directory for its files.
	Dir string

	log *testutil.Buffer
}

// Key is a key pair made for a test.
type Key struct {
	// Private is the private key in OpenSSH's PEM form.
	Private string
	// Public is the public key as an authorized_keys line.
	Public string
}

// NewKey makes an ed25519 key pair.
func NewKey(tb testing.TB) Key {
	tb.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "chaingate test key")
	if err != nil {
		tb.Fatal(err)
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		tb.Fatal(err)
	}
	return Key{
		Private: string(pem.EncodeToMemory(block)),
		Public:  strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sshPub))),
	}
}

// Start starts an sshd and kills it when tb ends. Without sshd it skips
// tb, or fails it when $CI is "true", so that CI cannot pass without
// running the tests.
func Start(tb testing.TB) *Server {
	tb.Helper()
	if _, err := os.Stat(Path); err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("%s not found (%v) — CI must run the ssh tests; install openssh-server", Path, err)
		}
		tb.Skipf("SKIPPING: %s not found (%v) — install openssh-server to run the ssh tests", Path, err)
	}
	me, err := user.Current()
	if err != nil {
		tb.Fatalf("finding the user the tests log in as: %v", err)
	}
	dir := tb.TempDir()
	host, client := NewKey(tb), NewKey(tb)
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		// sshd refuses a host key others can read.
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			tb.Fatal(err)
		}
		return path
	}
	hostKeyFile := write("host_ed25519", host.Private)
	authorized := write("authorized_keys", client.Public+"\n")

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	_, port, _ := net.SplitHostPort(addr)

	config := write("sshd_config", strings.Join([]string{
		"Port " + port,
		"ListenAddress 127.0.0.1",
		"HostKey " + hostKeyFile,
		"AuthorizedKeysFile " + authorized,
		"PidFile " + filepath.Join(dir, "sshd.pid"),
		"UsePAM no",
		"StrictModes no",
		"PasswordAuthentication no",
		"KbdInteractiveAuthentication no",
		"PermitRootLogin prohibit-password",
		"AllowAgentForwarding no",
		"AllowTcpForwarding yes", // the jump host tests go through it
		"PrintMotd no",
		"UseDNS no",
		"LogLevel VERBOSE",
	}, "\n")+"\n")
	// Privilege separation needs its directory, which a container that
	// never ran sshd lacks.
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
		tb.Fatalf("making sshd's privilege separation directory: %v", err)
	}

	hostPub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(host.Public))
	if err != nil {
		tb.Fatal(err)
	}
	known := knownhosts.Line([]string{knownhosts.Normalize(addr)}, hostPub)
	s := &Server{
		Addr: addr, User: me.Username, ClientKey: client.Private, HostKey: host.Public,
		KnownHosts: known, KnownHostsFile: write("known_hosts", known+"\n"), Dir: dir,
		log: &testutil.Buffer{},
	}
	cmd := exec.Command(Path, "-D", "-e", "-f", config)
	cmd.Stdout, cmd.Stderr = s.log, s.log
	// The sshd of each connection holds the log's pipe for as long as the
	// connection lasts, which may be past the listener's end.
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		tb.Fatalf("starting sshd: %v", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	tb.Cleanup(func() {
		// Connections still open keep their own sshd processes until the
		// client closes them.
		_ = cmd.Process.Kill()
		<-done
		if tb.Failed() {
			tb.Logf("sshd log:\n%s", s.log)
		}
	})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			return s
		}
		select {
		case <-done:
			tb.Fatalf("sshd on %s exited at start:\n%s", addr, s.log)
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("sshd on %s did not accept connections within 30 s: %v\n%s", addr, err, s.log)
		}
	}
}

// Log is what sshd has logged so far.
func (s *Server) Log() string { return s.log.String() }

// Port is the port sshd listens on.
func (s *Server) Port() int {
	_, port, _ := net.SplitHostPort(s.Addr)
	var n int
	_, _ = fmt.Sscan(port, &n)
	return n
}
