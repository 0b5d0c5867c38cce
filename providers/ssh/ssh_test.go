package ssh_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
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
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/chaingate/gateway/internal/testutil/proctest"
	"github.com/chaingate/gateway/internal/testutil/sshdtest"
	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/ssh"
)

// config is a config that logs in to srv, with over set on top.
func config(srv *sshdtest.Server, over map[string]any) map[string]any {
	cfg := map[string]any{
		"user":          srv.User,
		"private_key":   srv.ClientKey,
		"known_hosts":   srv.KnownHostsFile,
		"allowed_hosts": []string{"127.0.0.1"},
		"port":          srv.Port(),
	}
	for k, v := range over {
		if v == nil {
			delete(cfg, k)
		} else {
			cfg[k] = v
		}
	}
	return cfg
}

// call is a call of the command cmd, which the test config declares as
// "c", on host with args.
type call struct {
	host string
	cmd  map[string]any
	args map[string]any
}

func argv(a ...string) map[string]any { return map[string]any{"argv": a} }

// script declares a script taking the string arguments named.
func script(text string, args ...string) map[string]any {
	cmd := map[string]any{"script": text}
	if len(args) > 0 {
		decl := map[string]any{}
		for _, a := range args {
			decl[a] = map[string]any{"type": "string"}
		}
		cmd["args"] = decl
	}
	return cmd
}

func execute(t *testing.T, ctx context.Context, p providers.Provider, c call, cfg map[string]any) (map[string]any, error) {
	t.Helper()
	return executeStep(t, ctx, p, c, cfg, "step1")
}

// executeStep is execute for a step of another name: calls of one step
// run one at a time on a host, each waiting for the last one's processes.
func executeStep(t *testing.T, ctx context.Context, p providers.Provider, c call, cfg map[string]any, step string) (map[string]any, error) {
	t.Helper()
	withCmd := maps.Clone(cfg)
	withCmd["commands"] = map[string]any{"c": c.cmd}
	return request(t, ctx, p, providers.Request{ActionType: "c", Payload: mustJSON(t, map[string]any{"host": c.host, "args": c.args}), Config: mustJSON(t, withCmd),
		DedupKey: "run1/" + step, RunID: "run1", Step: step, Attempt: 2})
}

func request(t *testing.T, ctx context.Context, p providers.Provider, req providers.Request) (map[string]any, error) {
	t.Helper()
	resp, err := p.Execute(ctx, req)
	if err != nil {
		return nil, err
	}
	var body map[string]any
	if err := json.Unmarshal(resp.Body, &body); err != nil {
		t.Fatalf("result %s: %v", resp.Body, err)
	}
	return body, nil
}

func mustJSON(t *testing.T, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// code is err's code, and whether it is retryable; "" for no *providers.Error.
func code(err error) (string, bool) {
	var pe *providers.Error
	if !errors.As(err, &pe) {
		return "", false
	}
	return pe.Code, pe.Retryable
}

func TestResults(t *testing.T) {
	srv := sshdtest.Start(t)
	p := ssh.New()
	cfg := config(srv, nil)
	for _, tc := range []struct {
		name   string
		cmd    map[string]any
		args   map[string]any
		config map[string]any
		check  func(t *testing.T, body map[string]any, err error)
	}{
		{"stdout, stderr and exit code", script("echo out; echo err >&2"), nil, nil, func(t *testing.T, body map[string]any, err error) {
			if err != nil {
				t.Fatal(err)
			}
			if body["stdout"] != "out\n" || body["stderr"] != "err\n" || body["exit_code"] != 0.0 || body["host"] != srv.Addr || body["stderr_bytes"] != 4.0 || body["warning"] != nil {
				t.Errorf("body %v", body)
			}
		}},
		{"json stdout is parsed", argv("printf", `{"used": 93, "mount": "/var"}`), nil, nil, func(t *testing.T, body map[string]any, err error) {
			if err != nil {
				t.Fatal(err)
			}
			if out, _ := body["stdout"].(map[string]any); out["used"] != 93.0 {
				t.Errorf("body %v", body)
			}
		}},
		{"arguments", map[string]any{"script": `printf '%s|%s|%s' "$CHAINGATE_ARG_UNIT" "$CHAINGATE_ARG_N" "$CHAINGATE_ARG_DIR"`, "args": map[string]any{
			"unit": map[string]any{"type": "string", "enum": []string{"nginx", "php-fpm"}}, "n": map[string]any{"type": "integer", "default": 3}, "dir": map[string]any{"type": "path", "roots": []string{"/var/log"}}}},
			map[string]any{"unit": "nginx", "dir": "/var/log//nginx/"}, nil, func(t *testing.T, body map[string]any, err error) {
				if err != nil || body["stdout"] != "nginx|3|/var/log/nginx" {
					t.Errorf("body %v, err %v", body, err)
				}
			}},
		{"a refused argument connects nowhere", map[string]any{"script": "true", "args": map[string]any{"dir": map[string]any{"type": "path", "roots": []string{"/var/log"}}}},
			map[string]any{"dir": "-delete"}, map[string]any{"port": 1}, func(t *testing.T, _ map[string]any, err error) {
				if c, retry := code(err); c != "bad_argument" || retry || !strings.Contains(err.Error(), `argument "dir": "-delete" is not an absolute path`) {
					t.Errorf("err %v", err)
				}
			}},
		{"stdin", map[string]any{"argv": []string{"tr", "a-z", "A-Z"}, "stdin": "disk full\n"}, nil, nil, func(t *testing.T, body map[string]any, err error) {
			if err != nil || body["stdout"] != "DISK FULL\n" {
				t.Errorf("body %v, err %v", body, err)
			}
		}},
		{"stdin the command does not read", map[string]any{"argv": []string{"true"}, "stdin": strings.Repeat("x", 8<<20)}, nil, nil, func(t *testing.T, body map[string]any, err error) {
			if err != nil || body["exit_code"] != 0.0 {
				t.Errorf("body %v, err %v", body, err)
			}
		}},
		{"the command's dir", map[string]any{"argv": []string{"pwd"}, "dir": "/usr"}, nil, nil, func(t *testing.T, body map[string]any, err error) {
			if err != nil || body["stdout"] != "/usr\n" {
				t.Errorf("body %v, err %v", body, err)
			}
		}},
		{"the command's shell", map[string]any{"script": `echo "$0" "${BASH_VERSION:+bash}"`, "shell": "bash"}, nil, nil, func(t *testing.T, body map[string]any, err error) {
			if err != nil || body["stdout"] != "chaingate:step1 bash\n" {
				t.Errorf("body %v, err %v", body, err)
			}
		}},
		{"the environment", map[string]any{"argv": []string{"env"}, "env": map[string]string{"FROM_COMMAND": "c"}}, nil, nil, func(t *testing.T, body map[string]any, err error) {
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(body["stdout"].(string), "\n")
			for _, want := range []string{"CHAINGATE_DEDUP_KEY=run1/step1", "CHAINGATE_RUN_ID=run1", "CHAINGATE_STEP=step1", "CHAINGATE_ATTEMPT=2", "FROM_COMMAND=c"} {
				if !contains(lines, want) {
					t.Errorf("no %s in\n%s", want, body["stdout"])
				}
			}
		}},
		{"a failing exit is permanent", script("echo disk full >&2; exit 3"), nil, nil, func(t *testing.T, _ map[string]any, err error) {
			if c, retry := code(err); c != "exit_3" || retry || !strings.Contains(err.Error(), "the command exited with 3 on "+srv.Addr+": disk full") {
				t.Errorf("err %v", err)
			}
		}},
		{"EX_TEMPFAIL is retryable", script("exit 75"), nil, nil, func(t *testing.T, _ map[string]any, err error) {
			if c, retry := code(err); c != "exit_75" || !retry {
				t.Errorf("err %v", err)
			}
		}},
		{"exit codes as configured", argv("false"), nil, map[string]any{"ok_exit_codes": []int{0, 1}}, func(t *testing.T, body map[string]any, err error) {
			if err != nil || body["exit_code"] != 1.0 {
				t.Errorf("body %v, err %v", body, err)
			}
		}},
		{"a signal is 128 and its number", script("kill -9 $$"), nil, map[string]any{"retryable_exit_codes": []int{137}}, func(t *testing.T, _ map[string]any, err error) {
			if c, retry := code(err); c != "exit_137" || !retry {
				t.Errorf("err %v", err)
			}
		}},
		{"an unknown program", argv("no-such-program-here"), nil, nil, func(t *testing.T, _ map[string]any, err error) {
			if c, retry := code(err); c != "exit_127" || retry || !strings.Contains(err.Error(), "no-such-program-here") {
				t.Errorf("err %v", err)
			}
		}},
		{"output past the cap is cut and flagged", script("head -c 5000000 /dev/zero | tr '\\0' a; echo err >&2"), nil, map[string]any{"max_output_bytes": 1000}, func(t *testing.T, body map[string]any, err error) {
			if err != nil {
				t.Fatal(err)
			}
			if s := body["stdout"].(string); len(s) != 1000 || strings.Trim(s, "a") != "" || body["stdout_truncated"] != true || body["stdout_bytes"] != 5000000.0 || body["stderr"] != "err\n" || body["stderr_truncated"] != nil {
				rest := maps.Clone(body)
				delete(rest, "stdout")
				t.Errorf("stdout %d bytes, the rest: %v", len(s), rest)
			}
		}},
		{"the command's user", map[string]any{"argv": []string{"id", "-un"}, "user": srv.User}, nil, map[string]any{"user": nil}, func(t *testing.T, body map[string]any, err error) {
			if err != nil || body["stdout"] != srv.User+"\n" {
				t.Errorf("body %v, err %v", body, err)
			}
		}},
		{"no user at all", argv("true"), nil, map[string]any{"user": nil}, func(t *testing.T, _ map[string]any, err error) {
			if c, retry := code(err); c != "bad_config" || retry || !strings.Contains(err.Error(), "no user to log in as") {
				t.Errorf("err %v", err)
			}
		}},
		{"undeclared argument", argv("true"), map[string]any{"cmd": "id"}, nil, func(t *testing.T, _ map[string]any, err error) {
			if c, retry := code(err); c != "bad_argument" || retry {
				t.Errorf("err %v", err)
			}
		}},
		{"bad config", argv("true"), nil, map[string]any{"allowed_hosts": []string{}}, func(t *testing.T, _ map[string]any, err error) {
			if c, retry := code(err); c != "bad_config" || retry {
				t.Errorf("err %v", err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cfg
			if tc.config != nil {
				c = config(srv, tc.config)
			}
			body, err := execute(t, context.Background(), p, call{srv.Addr, tc.cmd, tc.args}, c)
			tc.check(t, body, err)
		})
	}
}

// TestPayloads: a call names a declared command and gives its host and
// arguments; the forms that once gave a command whole are refused with
// the new one, before any connection.
func TestPayloads(t *testing.T) {
	cfg := map[string]any{"user": "ops", "password": "x", "insecure_ignore_host_key": true, "allowed_hosts": []string{"*.example.com"}, "port": 1,
		"commands": map[string]any{"df": map[string]any{"argv": []string{"df", "-h"}}}}
	for _, tc := range []struct {
		name, action string
		payload      any
		err          string
	}{
		{"undeclared command", "rm", map[string]any{"host": "a.example.com"}, `the config declares no command "rm"; it declares "df"`},
		{"the command given whole", "df", map[string]any{"host": "a.example.com", "command": []string{"sh", "-c", "id"}}, "the payload gives command, which a step no longer may"},
		{"the user given by a call", "df", map[string]any{"host": "a.example.com", "user": "root"}, "the payload gives user"},
		{"no host", "df", map[string]any{}, "no host"},
		{"a host not allowed", "df", map[string]any{"host": "evil.example.net"}, "matches no allowed_hosts pattern"},
		{"keys are exact", "df", map[string]any{"host": "a.example.com", "Args": map[string]any{}}, `unknown payload key "Args"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := request(t, context.Background(), ssh.New(), providers.Request{ActionType: tc.action, Payload: mustJSON(t, tc.payload), Config: mustJSON(t, cfg), DedupKey: "r/s", RunID: "r", Step: "s", Attempt: 1})
			if c, retry := code(err); c == "" || retry || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("err %v, want %q", err, tc.err)
			}
			call := providers.Call{Name: "s", ActionType: tc.action, Payload: mustJSON(t, tc.payload)}
			if cerr := ssh.New().(providers.CallChecker).CheckCall(context.Background(), mustJSON(t, cfg), call); tc.err != "no host" && (cerr == nil || cerr.Error() != err.Error()) {
				t.Errorf("CheckCall says %v, Execute %v", cerr, err)
			}
		})
	}
}

func contains(lines []string, s string) bool {
	for _, l := range lines {
		if l == s {
			return true
		}
	}
	return false
}

// TestHostileValuesStayLiteral gives hostile values to a script that reads
// its arguments as the docs say, quoted: each is printed as the text it
// is, on the host.
func TestHostileValuesStayLiteral(t *testing.T) {
	srv := sshdtest.Start(t)
	p := ssh.New()
	var r [8]byte
	_, _ = rand.Read(r[:])
	// The sshd is this machine's, so what a hostile value made it run
	// would show here.
	pwned := "/tmp/pwned-" + hex.EncodeToString(r[:])
	t.Cleanup(func() { _ = os.Remove(pwned) })
	hostile := []string{`"; touch ` + pwned + ` #`, `$(touch ` + pwned + `)`, "`touch " + pwned + "`", "*", `'; touch ` + pwned + `; '`, `${IFS}touch${IFS}` + pwned, `\'`, "a'b\"c\\d", "$HOME"}
	cmd := map[string]any{"script": `printf '%s\n' "$CHAINGATE_ARG_V"`, "args": map[string]any{"v": map[string]any{"type": "string"}}}
	for _, v := range hostile {
		body, err := execute(t, context.Background(), p, call{srv.Addr, cmd, map[string]any{"v": v}}, config(srv, nil))
		if err != nil {
			t.Fatalf("%q: %v", v, err)
		}
		if got := body["stdout"]; got != v+"\n" {
			t.Errorf("stdout %q, want %q", got, v+"\n")
		}
	}
	for _, v := range []string{"-delete", "--help", "a\ntouch " + pwned, strings.Repeat("x", 100<<10)} {
		_, err := execute(t, context.Background(), p, call{srv.Addr, cmd, map[string]any{"v": v}}, config(srv, nil))
		if c, retry := code(err); c != "bad_argument" || retry {
			t.Errorf("%.20q: err %v, want a permanent bad_argument", v, err)
		}
	}
	if _, err := os.Stat(pwned); err == nil {
		t.Fatal("a hostile value ran a command")
	}
}

func TestHostKeysAndLogins(t *testing.T) {
	srv := sshdtest.Start(t)
	hostKey, _, _, _, err := xssh.ParseAuthorizedKey([]byte(srv.HostKey))
	if err != nil {
		t.Fatal(err)
	}
	fingerprint := xssh.FingerprintSHA256(hostKey)
	other := sshdtest.NewKey(t)
	otherKey, _, _, _, _ := xssh.ParseAuthorizedKey([]byte(other.Public))
	writeFile := func(name, content string) string {
		path := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	otherHost := writeFile("known_hosts", "other.example.com "+srv.HostKey+"\n")
	otherKeyHere := writeFile("known_hosts", strings.Fields(srv.KnownHosts)[0]+" "+other.Public+"\n")

	for _, tc := range []struct {
		name  string
		over  map[string]any
		code  string // "" for success
		retry bool
		says  []string
	}{
		{name: "known_hosts", over: nil},
		{name: "pinned key", over: map[string]any{"known_hosts": nil, "host_keys": []string{other.Public, srv.HostKey}}},
		{name: "pinned key and known_hosts", over: map[string]any{"known_hosts": otherHost, "host_keys": []string{srv.HostKey}}},
		{name: "a different pinned key", over: map[string]any{"known_hosts": nil, "host_keys": []string{other.Public}},
			code: "host_key_mismatch", says: []string{srv.Addr, "ssh-ed25519", fingerprint, "it is not the key pinned in host_keys"}},
		{name: "unknown host", over: map[string]any{"known_hosts": otherHost},
			code: "host_key_unknown", says: []string{srv.Addr, "ssh-ed25519", fingerprint, "known_hosts " + otherHost + " has no entry for it"}},
		{name: "another key on record", over: map[string]any{"known_hosts": otherKeyHere},
			code: "host_key_mismatch", says: []string{srv.Addr, fingerprint, "known_hosts " + otherKeyHere + " holds ssh-ed25519 " + xssh.FingerprintSHA256(otherKey) + " (line 1)"}},
		{name: "insecure", over: map[string]any{"known_hosts": nil, "insecure_ignore_host_key": true}},
		{name: "a key the host does not take", over: map[string]any{"private_key": other.Private},
			code: "auth_failed", says: []string{"logging in to " + srv.Addr + " as " + srv.User, "unable to authenticate"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body, err := execute(t, context.Background(), ssh.New(), call{host: srv.Addr, cmd: argv("echo", "hi")}, config(srv, tc.over))
			if tc.code == "" {
				if err != nil || body["stdout"] != "hi\n" {
					t.Fatalf("body %v, err %v", body, err)
				}
				insecure := tc.over["insecure_ignore_host_key"] == true
				if w, _ := body["warning"].(string); insecure != strings.Contains(w, "insecure_ignore_host_key is set") {
					t.Errorf("warning %q", w)
				}
				return
			}
			if c, retry := code(err); c != tc.code || retry != tc.retry {
				t.Fatalf("err %v, want code %s retryable %v", err, tc.code, tc.retry)
			}
			for _, s := range tc.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
		})
	}
}

// TestHostCertificates runs against a host that offers a certificate
// before its plain key, as hosts under an SSH CA do.
func TestHostCertificates(t *testing.T) {
	srv := sshdtest.StartWith(t, sshdtest.Options{HostCertificate: true})
	dir := t.TempDir()
	caLine := filepath.Join(dir, "ca_known_hosts")
	if err := os.WriteFile(caLine, []byte("@cert-authority "+knownhosts.Normalize(srv.Addr)+" "+srv.HostCA+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	other := sshdtest.NewKey(t)
	otherCA := filepath.Join(dir, "other_ca_known_hosts")
	if err := os.WriteFile(otherCA, []byte("@cert-authority "+knownhosts.Normalize(srv.Addr)+" "+other.Public+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		over map[string]any
		code string
	}{
		{name: "the CA on record", over: map[string]any{"known_hosts": caLine}},
		{name: "the plain key on record", over: nil},
		{name: "the plain key pinned", over: map[string]any{"known_hosts": nil, "host_keys": []string{srv.HostKey}}},
		// x/crypto's known_hosts counts a CA's line as a key on record.
		{name: "another CA on record", over: map[string]any{"known_hosts": otherCA}, code: "host_key_mismatch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body, err := execute(t, context.Background(), ssh.New(), call{host: srv.Addr, cmd: argv("echo", "hi")}, config(srv, tc.over))
			if tc.code == "" && (err != nil || body["stdout"] != "hi\n") {
				t.Fatalf("body %v, err %v", body, err)
			}
			if c, retry := code(err); c != tc.code || retry {
				t.Fatalf("err %v, want code %q", err, tc.code)
			}
		})
	}
}

// TestHostKeyTypes runs against a host with keys of two types, only one
// of them on record: the one Go's client prefers is not.
func TestHostKeyTypes(t *testing.T) {
	srv := sshdtest.StartWith(t, sshdtest.Options{ECDSAHostKey: true})
	for _, over := range []map[string]any{nil, {"known_hosts": nil, "host_keys": []string{srv.HostKey}}} {
		body, err := execute(t, context.Background(), ssh.New(), call{host: srv.Addr, cmd: argv("echo", "hi")}, config(srv, over))
		if err != nil || body["stdout"] != "hi\n" {
			t.Errorf("config %v: body %v, err %v", over, body, err)
		}
	}
}

func TestUnreachableHosts(t *testing.T) {
	srv := sshdtest.Start(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	_ = closed.Close()

	t.Run("not allowed: refused before connecting", func(t *testing.T) {
		_, err := execute(t, context.Background(), ssh.New(), call{host: l.Addr().String(), cmd: argv("true")},
			config(srv, map[string]any{"allowed_hosts": []string{"10.0.0.*", "web-*.prod.example.com"}}))
		if c, retry := code(err); c != "host_not_allowed" || retry || !strings.Contains(err.Error(), "10.0.0.*, web-*.prod.example.com") {
			t.Fatalf("err %v", err)
		}
		// A connection made would be queued by now: connect returns once
		// the kernel has it.
		_ = l.(*net.TCPListener).SetDeadline(time.Now())
		if c, err := l.Accept(); err == nil {
			c.Close()
			t.Fatal("the provider connected to a host allowed_hosts does not allow")
		}
	})
	t.Run("refused connection is retryable", func(t *testing.T) {
		_, err := execute(t, context.Background(), ssh.New(), call{host: closedAddr, cmd: argv("true")}, config(srv, map[string]any{"payload_port": true}))
		if c, retry := code(err); c != "connect_failed" || !retry || !strings.Contains(err.Error(), closedAddr) {
			t.Fatalf("err %v", err)
		}
	})
}

func TestStoppingACommand(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("needs /proc to see the remote processes")
	}
	srv := sshdtest.Start(t)
	// A shell, a child in the background and one in the foreground, each
	// writing its PID first.
	const text = `sleep 300 & echo $! >> "$CHAINGATE_ARG_PIDS"; echo $$ >> "$CHAINGATE_ARG_PIDS"; sh -c 'echo $$ >> "$CHAINGATE_ARG_PIDS"; exec sleep 301'`
	for _, tc := range []struct {
		name    string
		trap    string
		timeout float64 // timeout_seconds; 0 to cancel the call's ctx instead
	}{
		{name: "cancelled"},
		{name: "cancelled, TERM ignored", trap: `trap "" TERM; `},
		{name: "timed out", timeout: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := ssh.New()
			cfg := config(srv, map[string]any{"kill_grace_seconds": 1})
			// A connection in the pool first, so that the timeout goes to
			// the command rather than to logging in.
			if _, err := execute(t, context.Background(), p, call{host: srv.Addr, cmd: argv("true")}, cfg); err != nil {
				t.Fatal(err)
			}
			pidFile := filepath.Join(t.TempDir(), "pids")
			cmd := script(tc.trap+text, "pids")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			watched := make(chan struct{})
			if tc.timeout > 0 {
				cmd["timeout_seconds"] = tc.timeout
				close(watched)
			} else {
				go func() {
					defer close(watched)
					// Cancelled whatever happens, so that a script that never
					// writes them fails the test rather than hangs it.
					for deadline := time.Now().Add(60 * time.Second); len(proctest.ReadPIDs(pidFile)) < 3 && time.Now().Before(deadline); {
						time.Sleep(20 * time.Millisecond)
					}
					cancel()
				}()
			}
			_, err := execute(t, ctx, p, call{srv.Addr, cmd, map[string]any{"pids": pidFile}}, cfg)
			cancel()
			<-watched
			want := "cancelled"
			if tc.timeout > 0 {
				want = "timeout"
			}
			pids := proctest.ReadPIDs(pidFile)
			if err == nil {
				t.Fatal("the call succeeded")
			}
			c, retry := code(err)
			stopped := strings.Contains(err.Error(), "its process group there was stopped")
			// A loaded machine may not have started the command before the
			// timeout.
			unstarted := tc.timeout > 0 && len(pids) == 0 && strings.Contains(err.Error(), "before the command started")
			if c != want || !retry || !stopped && !unstarted {
				t.Fatalf("err %v, want a retryable %s saying the process group was stopped", err, want)
			}
			if len(pids) < 3 {
				if tc.timeout == 0 {
					t.Fatalf("the script wrote %d PIDs", len(pids))
				}
				// A loaded machine may not have started them all in time;
				// those that did start must be gone all the same.
				t.Logf("only %d of 3 processes started before the timeout", len(pids))
			}
			proctest.WaitGone(t, 30*time.Second, proctest.Seen(pids...))
		})
	}
}

func TestMaxSessionsPerHost(t *testing.T) {
	srv := sshdtest.Start(t)
	p := ssh.New()
	dir := t.TempDir()
	const limit, calls = 2, 6
	cfg := config(srv, map[string]any{"max_sessions_per_host": limit})
	// Each command marks itself running, counts the commands running with
	// it, and holds on until the test lets go.
	const text = `D=$CHAINGATE_ARG_D N=$CHAINGATE_ARG_N; mkdir "$D/running.$N"; ls -d "$D"/running.* | wc -l > "$D/seen.$N"; while [ ! -e "$D/release" ]; do sleep 0.05; done; rmdir "$D/running.$N"`
	running := func() int {
		m, _ := filepath.Glob(filepath.Join(dir, "running.*"))
		return len(m)
	}
	var wg sync.WaitGroup
	var failed atomic.Int32
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := call{srv.Addr, script(text, "d", "n"), map[string]any{"d": dir, "n": strconv.Itoa(i)}}
			if _, err := executeStep(t, context.Background(), p, c, cfg, "step"+strconv.Itoa(i)); err != nil {
				t.Errorf("call %d: %v", i, err)
				failed.Add(1)
			}
		}()
	}
	for deadline := time.Now().Add(60 * time.Second); running() < limit && failed.Load() == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d commands running after 60 s, want %d", running(), limit)
		}
	}
	// Time for a call past the limit to start, were it let in; a slow
	// machine makes this test weaker, never wrong.
	time.Sleep(300 * time.Millisecond)
	if n := running(); n > limit {
		t.Errorf("%d commands running at once, want at most %d", n, limit)
	}
	if err := os.WriteFile(filepath.Join(dir, "release"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i := range calls {
		data, err := os.ReadFile(filepath.Join(dir, "seen."+strconv.Itoa(i)))
		if n, _ := strconv.Atoi(strings.TrimSpace(string(data))); err != nil || n < 1 || n > limit {
			t.Errorf("command %d saw %q commands running (%v), want 1 to %d", i, data, err, limit)
		}
	}
}

func TestConnectionsAreReused(t *testing.T) {
	srv := sshdtest.Start(t)
	p := ssh.New()
	cfg := config(srv, nil)
	// SSH_CONNECTION holds the client's port: one port, one connection.
	clientPort := func() string {
		t.Helper()
		body, err := execute(t, context.Background(), p, call{host: srv.Addr, cmd: script(`printf '%s' "$SSH_CONNECTION"`)}, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Fields(body["stdout"].(string))[1]
	}
	first := clientPort()
	if again := clientPort(); again != first {
		t.Errorf("the second call came from port %s, the first from %s: the connection was not reused", again, first)
	}
	// The connection's own sshd process is the login shell's parent, and
	// the login shell became the wrapper, the command's parent; killing
	// it breaks the connection under the pool.
	_, err := execute(t, context.Background(), p, call{host: srv.Addr, cmd: script("kill -9 $(ps -o ppid= -p $PPID); sleep 5")}, cfg)
	if c, retry := code(err); !retry {
		t.Fatalf("err %v (%s), want a retryable error", err, c)
	}
	if after := clientPort(); after == first {
		t.Errorf("a call after the connection broke came from its port %s", after)
	}
}

// forwarder passes TCP connections on to addr and counts them.
type forwarder struct {
	net.Listener
	accepted atomic.Int32
}

func forward(t *testing.T, addr string) *forwarder {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &forwarder{Listener: l}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			f.accepted.Add(1)
			out, err := net.Dial("tcp", addr)
			if err != nil {
				_ = in.Close()
				continue
			}
			go func() { _, _ = io.Copy(out, in); _ = out.Close() }()
			go func() { _, _ = io.Copy(in, out); _ = in.Close() }()
		}
	}()
	return f
}

func TestJumpHost(t *testing.T) {
	srv := sshdtest.Start(t)
	t.Run("the host is its own jump host", func(t *testing.T) {
		body, err := execute(t, context.Background(), ssh.New(), call{host: srv.Addr, cmd: argv("echo", "hi")},
			config(srv, map[string]any{"jump_host": srv.Addr, "jump_user": srv.User}))
		if err != nil || body["stdout"] != "hi\n" || body["host"] != srv.Addr {
			t.Fatalf("body %v, err %v", body, err)
		}
	})
	t.Run("through a jump host only", func(t *testing.T) {
		// The jump host is the same sshd behind a forwarder that counts
		// connections; the target is reached from the jump host.
		jump := forward(t, srv.Addr)
		body, err := execute(t, context.Background(), ssh.New(), call{host: srv.Addr, cmd: argv("echo", "hi")},
			config(srv, map[string]any{"known_hosts": nil, "host_keys": []string{srv.HostKey}, "jump_host": jump.Addr().String()}))
		if err != nil || body["stdout"] != "hi\n" {
			t.Fatalf("body %v, err %v", body, err)
		}
		if n := jump.accepted.Load(); n != 1 {
			t.Errorf("%d connections to the jump host, want 1", n)
		}
	})
	t.Run("an unknown jump host is refused", func(t *testing.T) {
		jump := forward(t, srv.Addr)
		_, err := execute(t, context.Background(), ssh.New(), call{host: srv.Addr, cmd: argv("true")},
			config(srv, map[string]any{"jump_host": jump.Addr().String()}))
		if c, retry := code(err); c != "host_key_unknown" || retry || !strings.Contains(err.Error(), jump.Addr().String()) {
			t.Fatalf("err %v", err)
		}
	})
}

// TestPayloadPort: the port in a payload's host, such as the exporter's
// port an alert's instance label carries, is dialled only when the config
// says payload_port = true; otherwise the config's port is.
func TestPayloadPort(t *testing.T) {
	srv := sshdtest.Start(t)
	body, err := execute(t, context.Background(), ssh.New(), call{host: "127.0.0.1:9100", cmd: argv("echo", "hi")}, config(srv, nil))
	if err != nil || body["host"] != srv.Addr {
		t.Fatalf("the config's port: body %v, err %v", body, err)
	}
	body, err = execute(t, context.Background(), ssh.New(), call{host: srv.Addr, cmd: argv("echo", "hi")}, config(srv, map[string]any{"port": 1, "payload_port": true}))
	if err != nil || body["host"] != srv.Addr {
		t.Fatalf("the payload's port: body %v, err %v", body, err)
	}
}
