// Package sshdtest gives tests a real OpenSSH server to run commands on: an
// sshd of their own on a free port of 127.0.0.1, with a host key and a
// client key made for the test, that lets the current user in with the
// client key alone.
package sshdtest

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
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
	// HostCA is the public key of the CA that signed its host certificate,
	// as an authorized_keys line; empty without Options.HostCertificate.
	HostCA string
	// KnownHosts is a known_hosts line for Addr, and KnownHostsFile a file
	// holding that line alone.
	KnownHosts     string
	KnownHostsFile string
	// Home is HOME in the sessions' environment: a directory of the
	// test's own, so that what a command keeps under ~ stays out of the
	// real user's home. The login directory is still the user's own.
	Home string

	logFile string
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
	k, _ := newKey(tb)
	return k
}

func newKey(tb testing.TB) (Key, ssh.Signer) {
	tb.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "chaingate test key")
	if err != nil {
		tb.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		tb.Fatal(err)
	}
	return Key{
		Private: string(pem.EncodeToMemory(block)),
		Public:  strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey()))),
	}, signer
}

// Options change how sshd is set up.
type Options struct {
	// HostCertificate has sshd offer, besides its plain host key, a
	// certificate for it signed by a CA of the test's own (Server.HostCA),
	// for the principal 127.0.0.1.
	HostCertificate bool
	// ECDSAHostKey gives sshd an ECDSA host key besides the ed25519 one,
	// which Server's fields describe. Go's client asks for ECDSA first.
	ECDSAHostKey bool
	// ClientAliveInterval and ClientAliveCountMax are sshd's options of
	// those names: how often sshd asks a client it has heard nothing from
	// whether it is still there, and how many questions left unanswered
	// end the connection. The interval is rounded up to whole seconds;
	// zero leaves sshd's defaults, which never ask.
	ClientAliveInterval time.Duration
	ClientAliveCountMax int
}

// Start starts an sshd and kills it when tb ends. Without sshd it skips
// tb, or fails it when $CI is "true", so that CI cannot pass without
// running the tests.
func Start(tb testing.TB) *Server {
	tb.Helper()
	return StartWith(tb, Options{})
}

// StartWith is Start with options.
func StartWith(tb testing.TB, o Options) *Server {
	tb.Helper()
	if _, err := os.Stat(Path); err != nil {
		unavailable(tb, "%s not found (%v): install openssh-server", Path, err)
	}
	me, err := user.Current()
	if err != nil {
		tb.Fatalf("finding the user the tests log in as: %v", err)
	}
	dir := tb.TempDir()
	host, hostSigner := newKey(tb)
	client := NewKey(tb)
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

	var extra []string
	var hostCA string
	if o.HostCertificate {
		ca, caSigner := newKey(tb)
		cert := &ssh.Certificate{
			Key: hostSigner.PublicKey(), Serial: 1, CertType: ssh.HostCert, KeyId: "chaingate test host",
			ValidPrincipals: []string{"127.0.0.1"}, ValidBefore: ssh.CertTimeInfinity,
		}
		if err := cert.SignCert(rand.Reader, caSigner); err != nil {
			tb.Fatal(err)
		}
		extra = append(extra, "HostCertificate "+write("host_ed25519-cert.pub", string(ssh.MarshalAuthorizedKey(cert))))
		hostCA = ca.Public
	}
	if o.ECDSAHostKey {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			tb.Fatal(err)
		}
		block, err := ssh.MarshalPrivateKey(key, "chaingate test host")
		if err != nil {
			tb.Fatal(err)
		}
		extra = append(extra, "HostKey "+write("host_ecdsa", string(pem.EncodeToMemory(block))))
	}
	if o.ClientAliveInterval > 0 {
		extra = append(extra, fmt.Sprintf("ClientAliveInterval %d", int(math.Ceil(o.ClientAliveInterval.Seconds()))))
	}
	if o.ClientAliveCountMax > 0 {
		extra = append(extra, fmt.Sprintf("ClientAliveCountMax %d", o.ClientAliveCountMax))
	}
	home := filepath.Join(dir, "home")
	if err := os.Mkdir(home, 0o700); err != nil {
		tb.Fatal(err)
	}
	config := write("sshd_config", strings.Join(append([]string{
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
		`SetEnv "HOME=` + home + `"`,
	}, extra...), "\n")+"\n")
	// Privilege separation needs its directory, which a container that
	// never ran sshd lacks.
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
		unavailable(tb, "making sshd's privilege separation directory: %v: run the tests as root, or make /run/sshd", err)
	}

	known := knownhosts.Line([]string{knownhosts.Normalize(addr)}, hostSigner.PublicKey())
	s := &Server{
		Addr: addr, User: me.Username, ClientKey: client.Private, HostKey: host.Public, HostCA: hostCA,
		KnownHosts: known, KnownHostsFile: write("known_hosts", known+"\n"), Home: home,
		logFile: filepath.Join(dir, "sshd.log"),
	}
	cmd := exec.Command(Path, "-D", "-e", "-f", config)
	// A file, not a pipe: the sshd of each connection holds its log open
	// for as long as the connection lasts, past the listener's end.
	log, err := os.Create(s.logFile)
	if err != nil {
		tb.Fatal(err)
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
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
			tb.Logf("sshd log:\n%s", s.Log())
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
			tb.Fatalf("sshd on %s exited at start:\n%s", addr, s.Log())
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("sshd on %s did not accept connections within 30 s: %v\n%s", addr, err, s.Log())
		}
	}
}

// unavailable skips tb for want of what an sshd needs, or fails it when
// $CI is "true", so that CI cannot pass without running the ssh tests.
func unavailable(tb testing.TB, format string, args ...any) {
	tb.Helper()
	if os.Getenv("CI") == "true" {
		tb.Fatalf("CI must run the ssh tests: "+format, args...)
	}
	tb.Skipf("SKIPPING the ssh tests: "+format, args...)
}

// Log is what sshd has logged so far.
func (s *Server) Log() string {
	data, _ := os.ReadFile(s.logFile)
	return string(data)
}

// Port is the port it listens on.
func (s *Server) Port() int {
	_, port, _ := net.SplitHostPort(s.Addr)
	n, _ := strconv.Atoi(port)
	return n
}
