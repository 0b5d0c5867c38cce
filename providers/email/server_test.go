package email_test

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"mime"
	"mime/multipart"
	"mime/quotedprintable"
	"net"
	"net/mail"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/internal/testutil"
)

// Built once by TestMain: the test SMTP server and the certificate it
// presents, which the provider trusts through ca_file.
var (
	smtpdBin     string
	buildErr     error
	certFile     string
	keyFile      string
	testUser     = "alice"
	testPassword = "s3cret-p@ss"
)

// setUp builds internal/smtpd and writes a self-signed certificate into dir.
func setUp(dir string) error {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("no go toolchain on PATH to build the test SMTP server: %w", err)
	}
	bin := filepath.Join(dir, "smtpd")
	if out, err := exec.Command(goBin, "build", "-o", bin, "./internal/smtpd").CombinedOutput(); err != nil {
		return fmt.Errorf("building internal/smtpd: %w\n%s", err, out)
	}
	smtpdBin = bin
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	return writeCert(certFile, keyFile)
}

func writeCert(certFile, keyFile string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "chaingate test relay"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)
}

// smtpServer is one running internal/smtpd process.
type smtpServer struct {
	mode   string // tls mode: none, starttls, implicit
	auth   bool
	port   int
	out    string
	stderr *testutil.Buffer
}

type serverOpts struct {
	mode  string
	auth  bool
	mechs string
}

func startServer(t *testing.T, o serverOpts) *smtpServer {
	t.Helper()
	if buildErr != nil {
		t.Skipf("SKIPPING: %v", buildErr)
	}
	s := &smtpServer{mode: o.mode, auth: o.auth, out: filepath.Join(t.TempDir(), "messages.jsonl"), stderr: &testutil.Buffer{}}
	args := []string{"-tls", o.mode, "-cert", certFile, "-key", keyFile, "-out", s.out}
	if o.auth {
		args = append(args, "-user", testUser, "-pass", testPassword)
	}
	if o.mechs != "" {
		args = append(args, "-mechs", o.mechs)
	}
	cmd := exec.Command(smtpdBin, args...)
	cmd.Stderr = s.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting smtpd: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("smtpd %s stderr:\n%s", o.mode, s.stderr)
		}
	})
	// The server picks a free port itself and reports it, which leaves no
	// window for another process to take a port chosen here.
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- l
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case l := <-line:
		addr, ok := strings.CutPrefix(strings.TrimSpace(l), "listening ")
		if !ok {
			t.Fatalf("smtpd said %q; stderr:\n%s", l, s.stderr)
		}
		_, port, _ := net.SplitHostPort(addr)
		s.port, _ = strconv.Atoi(port)
	case <-time.After(10 * time.Second):
		t.Fatalf("smtpd did not start; stderr:\n%s", s.stderr)
	}
	return s
}

// config returns a provider config for s, with overrides applied; a nil
// override removes the key.
func (s *smtpServer) config(overrides map[string]any) json.RawMessage {
	cfg := map[string]any{
		"host": "127.0.0.1",
		"port": s.port,
		"tls":  s.mode,
		"from": "Chaingate Alerts <alerts@example.com>",
	}
	if s.mode != "none" {
		cfg["ca_file"] = certFile
	}
	if s.auth {
		cfg["username"], cfg["password"] = testUser, testPassword
	}
	for k, v := range overrides {
		if v == nil {
			delete(cfg, k)
		} else {
			cfg[k] = v
		}
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		panic(err)
	}
	return b
}

// record is one message the server accepted (see internal/smtpd).
type record struct {
	Helo     string   `json:"helo"`
	TLS      bool     `json:"tls"`
	AuthUser string   `json:"auth_user"`
	From     string   `json:"from"`
	To       []string `json:"to"`
	Data     string   `json:"data"`
}

// received returns the messages s accepted whose X-Chaingate-Dedup-Key is key.
func (s *smtpServer) received(t *testing.T, key string) []record {
	t.Helper()
	data, err := os.ReadFile(s.out)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []record
	for line := range bytes.Lines(data) {
		var r record
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatalf("bad line %q in %s: %v", line, s.out, err)
		}
		if m, err := mail.ReadMessage(strings.NewReader(r.Data)); err == nil && m.Header.Get("X-Chaingate-Dedup-Key") == key {
			out = append(out, r)
		}
	}
	return out
}

// parsed is a received message taken apart.
type parsed struct {
	header mail.Header
	parts  []part // one for a single-part message
}

type part struct {
	contentType string
	body        string // transfer-decoded
}

func parseMessage(t *testing.T, data string) parsed {
	t.Helper()
	for i := 0; i < len(data); i++ {
		if data[i] == '\n' && (i == 0 || data[i-1] != '\r') {
			t.Fatalf("bare LF at byte %d of the message:\n%s", i, data)
		}
	}
	m, err := mail.ReadMessage(strings.NewReader(data))
	if err != nil {
		t.Fatalf("parsing the message: %v\n%s", err, data)
	}
	p := parsed{header: m.Header}
	mt, params, err := mime.ParseMediaType(m.Header.Get("Content-Type"))
	if err != nil {
		t.Fatalf("Content-Type %q: %v", m.Header.Get("Content-Type"), err)
	}
	if !strings.HasPrefix(mt, "multipart/") {
		p.parts = []part{{m.Header.Get("Content-Type"), decodeBody(t, m.Header.Get("Content-Transfer-Encoding"), m.Body)}}
		return p
	}
	mr := multipart.NewReader(m.Body, params["boundary"])
	for {
		// NextRawPart: NextPart would undo the quoted-printable unseen.
		mp, err := mr.NextRawPart()
		if err == io.EOF {
			return p
		}
		if err != nil {
			t.Fatalf("reading a MIME part: %v", err)
		}
		p.parts = append(p.parts, part{mp.Header.Get("Content-Type"), decodeBody(t, mp.Header.Get("Content-Transfer-Encoding"), mp)})
	}
}

func decodeBody(t *testing.T, cte string, r io.Reader) string {
	t.Helper()
	if cte != "quoted-printable" {
		t.Fatalf("Content-Transfer-Encoding %q, want quoted-printable", cte)
	}
	b, err := io.ReadAll(quotedprintable.NewReader(r))
	if err != nil {
		t.Fatalf("decoding quoted-printable: %v", err)
	}
	return string(b)
}
