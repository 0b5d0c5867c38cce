package ssh

import (
	"bytes"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/chaingate/gateway/providers/internal/command"
)

// hostile are values an alert's labels may carry, meant to make a shell
// run something.
var hostile = []string{`"; touch pwned #`, `$(touch pwned)`, "`touch pwned`", "a\ntouch pwned", "*", `'; touch pwned; '`, `${IFS}touch${IFS}pwned`, `\'`, "'", "''", `a'b"c\d`, "-n", "", " "}

func TestQuote(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", `''`},
		{"df", `'df'`},
		{"it's", `'it'\''s'`},
		{"'", `''\'''`},
		{`"; touch /tmp/pwned #`, `'"; touch /tmp/pwned #'`},
		{"$(touch x)", `'$(touch x)'`},
		{"`id`", "'`id`'"},
		{"a\nb", "'a\nb'"},
		{`\`, `'\'`},
	} {
		if got := quote(tc.in); got != tc.want {
			t.Errorf("quote(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// shells are the POSIX shells on this machine that a remote login shell
// may be.
func shells(t testing.TB) []string {
	var found []string
	for _, sh := range []string{"sh", "dash", "bash", "zsh", "ksh", "mksh", "busybox"} {
		if _, err := exec.LookPath(sh); err == nil {
			found = append(found, sh)
		}
	}
	if len(found) == 0 {
		t.Skip("no POSIX shell on this machine")
	}
	return found
}

// viaShell runs a remote line as sshd would, with the login shell's -c,
// and returns what it printed.
func viaShell(t testing.TB, shell, line string) (stdout, stderr string) {
	t.Helper()
	args := []string{"-c", line}
	if shell == "busybox" {
		args = append([]string{"sh"}, args...)
	}
	cmd := exec.Command(shell, args...)
	cmd.Dir = t.TempDir()
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s -c %q: %v\n%s", shell, line, err, errOut.String())
	}
	return out.String(), errOut.String()
}

// roundTrip checks that args and an env value reach a program through the
// remote line exactly as given, in argv and in the environment.
func roundTrip(t *testing.T, shell string, args []string, value string) {
	t.Helper()
	spec := command.Spec{
		Command: append([]string{"sh", "-c", `printf '%s\0' "$V" "$@"`, "sh"}, args...),
		Env:     map[string]string{"V": value},
	}
	line, err := remoteLine(spec, spec.Env, "step")
	if err != nil {
		t.Fatal(err)
	}
	stdout, stderr := viaShell(t, shell, line)
	got := strings.Split(strings.TrimSuffix(stdout, "\x00"), "\x00")
	if want := append([]string{value}, args...); !slices.Equal(got, want) {
		t.Errorf("%s: argv %q, want %q\nline: %s", shell, got, want, line)
	}
	if !strings.HasPrefix(stderr, pidMarker) {
		t.Errorf("%s: stderr %q does not start with the PID line", shell, stderr)
	}
}

func TestRemoteLineRoundTrip(t *testing.T) {
	for _, sh := range shells(t) {
		t.Run(sh, func(t *testing.T) {
			roundTrip(t, sh, hostile, strings.Join(hostile, "\n"))
			for _, v := range hostile {
				roundTrip(t, sh, []string{v}, v)
			}
		})
	}
}

func FuzzRemoteLineRoundTrip(f *testing.F) {
	for _, v := range hostile {
		f.Add(v, v)
	}
	f.Add("\xff\xfe", "ünïcödé")
	f.Fuzz(func(t *testing.T, arg, value string) {
		// No argument or variable can carry a NUL; Spec.Check refuses one.
		if strings.ContainsRune(arg, 0) || strings.ContainsRune(value, 0) || len(arg)+len(value) > 1<<16 {
			t.Skip()
		}
		roundTrip(t, "sh", []string{arg}, value)
	})
}

func TestRemoteLineShell(t *testing.T) {
	spec := command.Spec{Shell: true, Script: `printf '%s|%s|%s' "$0" "$V" "$CHAINGATE_STEP"`}
	env := map[string]string{"V": `$(touch pwned)'`, "CHAINGATE_STEP": "df"}
	line, err := remoteLine(spec, env, "df")
	if err != nil {
		t.Fatal(err)
	}
	for _, sh := range shells(t) {
		if stdout, _ := viaShell(t, sh, line); stdout != `chaingate:df|$(touch pwned)'|df` {
			t.Errorf("%s: stdout %q", sh, stdout)
		}
	}
}

func TestRemoteLineRefusesAssignmentAsProgram(t *testing.T) {
	if _, err := remoteLine(command.Spec{Command: []string{"A=b", "x"}}, nil, "s"); err == nil || !strings.Contains(err.Error(), "env(1)") {
		t.Errorf("err %v", err)
	}
}

func TestPIDWriter(t *testing.T) {
	for _, tc := range []struct {
		name   string
		writes []string
		pid    int
		out    string
	}{
		{"marker first", []string{"chaingate-pid:4242\nboom\n"}, 4242, "boom\n"},
		{"marker split across writes", []string{"chaing", "ate-pid:42", "42\nbo", "om"}, 4242, "boom"},
		{"a login script's lines first", []string{"welcome\nchaingate-pid:7\nerr\n"}, 7, "welcome\nerr\n"},
		{"no marker", []string{"just errors\n", "more"}, 0, "just errors\nmore"},
		{"a marker the command prints is its own", []string{"chaingate-pid:9\nchaingate-pid:10\n"}, 9, "chaingate-pid:10\n"},
		{"never group 1", []string{"chaingate-pid:1\nx\n"}, 0, "chaingate-pid:1\nx\n"},
		{"not a number", []string{"chaingate-pid:$$\n"}, 0, "chaingate-pid:$$\n"},
		{"a long first line is given up on", []string{strings.Repeat("x", maxPreamble+1), "\nchaingate-pid:5\n"}, 0, strings.Repeat("x", maxPreamble+1) + "\nchaingate-pid:5\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			w := newPIDWriter(&out)
			for _, s := range tc.writes {
				if n, err := w.Write([]byte(s)); n != len(s) || err != nil {
					t.Fatalf("Write = %d, %v", n, err)
				}
			}
			w.flush()
			if w.pid != tc.pid || out.String() != tc.out {
				t.Errorf("pid %d, out %q; want %d, %q", w.pid, out.String(), tc.pid, tc.out)
			}
			select {
			case <-w.known:
				if tc.pid == 0 {
					t.Error("known closed without a PID")
				}
			default:
				if tc.pid != 0 {
					t.Error("known not closed")
				}
			}
		})
	}
}

func TestTargets(t *testing.T) {
	s := &settings{patterns: []string{"web-*.prod.example.com", "10.0.0.*", "db-[12]", "fd00::*"}}
	s.cfg.Port = 22
	s.cfg.User = "ops"
	s.cfg.PayloadPort = true
	for _, tc := range []struct {
		host, addr, err string
	}{
		{host: "web-1.prod.example.com", addr: "web-1.prod.example.com:22"},
		{host: "WEB-1.Prod.Example.com:2222", addr: "web-1.prod.example.com:2222"},
		{host: "10.0.0.7", addr: "10.0.0.7:22"},
		{host: "db-2", addr: "db-2:22"},
		{host: "[fd00::1]:2200", addr: "[fd00::1]:2200"},
		{host: "fd00::1", addr: "[fd00::1]:22"},
		{host: "[fd00::1]", addr: "[fd00::1]:22"},
		// A wildcard does not cross a dot.
		{host: "web-1.evil.prod.example.com", err: "host_not_allowed"},
		{host: "10.0.0.7.evil.example.net", err: "host_not_allowed"},
		{host: "web-.prod.example.com.evil.net", err: "host_not_allowed"},
		{host: "db-3", err: "host_not_allowed"},
		// An address pattern lets in addresses, not names that look alike.
		{host: "10.0.0.evil.example.com", err: "host_not_allowed"},
		{host: "10.0.0.xyz", err: "host_not_allowed"},
		{host: "fd00::evil", err: "host_not_allowed"},
		{host: "", err: "host is empty"},
		{host: "web-1.prod.example.com:0", err: "not a TCP port"},
		{host: "web-1.prod.example.com:ssh", err: "not a TCP port"},
		{host: "-oProxyCommand=x", err: "not a host name"},
		{host: "web-1.prod.example.com; touch pwned", err: "not a host name"},
		{host: "a b", err: "not a host name"},
	} {
		got, err := s.target(tc.host, "")
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%q: %v", tc.host, err)
		case tc.err == "" && (got.addr != tc.addr || got.user != "ops"):
			t.Errorf("%q: %+v, want addr %s", tc.host, got, tc.addr)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: %v, want an error with %q", tc.host, err, tc.err)
		}
	}
	// By default the port is the config's: an instance label's is the
	// exporter's.
	s.cfg.PayloadPort = false
	if got, err := s.target("web-1.prod.example.com:9100", ""); err != nil || got.addr != "web-1.prod.example.com:22" {
		t.Errorf("without payload_port: %+v, %v", got, err)
	}
	if all := (&settings{patterns: []string{"*"}}); !all.allowed("anything.example.com") {
		t.Error(`"*" does not allow every host`)
	}
}
