package ssh

import (
	"bytes"
	"strings"
	"testing"
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

func TestRemoteLineRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    remoteCommand
		says string
	}{
		{"no program", remoteCommand{}, "names no program"},
		{"an assignment as the program", remoteCommand{argv: []string{"A=b", "x"}}, "env(1)"},
		{"a NUL in an argument", remoteCommand{argv: []string{"echo", "a\x00b"}}, "NUL"},
		{"a NUL in a value", remoteCommand{argv: []string{"true"}, env: map[string]string{"V": "\x00"}}, "NUL"},
		{"a name that is not one", remoteCommand{argv: []string{"true"}, env: map[string]string{"A B": "x"}}, "not a variable name"},
		{"a NUL in the directory", remoteCommand{argv: []string{"true"}, dir: "/tmp\x00"}, "NUL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := remoteLine(tc.c); err == nil || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("err %v, want one saying %q", err, tc.says)
			}
		})
	}
}

func TestPIDWriter(t *testing.T) {
	for _, tc := range []struct {
		name   string
		writes []string
		pid    int
		out    string
		holder int
		ran    bool
	}{
		{name: "marker first", writes: []string{"chaingate-pid:4242\nboom\n"}, pid: 4242, out: "boom\n"},
		{name: "marker split across writes", writes: []string{"chaing", "ate-pid:42", "42\nbo", "om"}, pid: 4242, out: "boom"},
		{name: "a login script's lines first", writes: []string{"welcome\nchaingate-pid:7\nerr\n"}, pid: 7, out: "welcome\nerr\n"},
		{name: "no marker", writes: []string{"just errors\n", "more"}, out: "just errors\nmore"},
		{name: "a marker the command prints is its own", writes: []string{"chaingate-pid:9\nchaingate-pid:10\n"}, pid: 9, out: "chaingate-pid:10\n"},
		{name: "never group 1", writes: []string{"chaingate-pid:1\nx\n"}, out: "chaingate-pid:1\nx\n"},
		{name: "not a number", writes: []string{"chaingate-pid:$$\n"}, out: "chaingate-pid:$$\n"},
		{name: "a long first line is given up on", writes: []string{strings.Repeat("x", maxPreamble+1), "\nchaingate-pid:5\n"}, out: strings.Repeat("x", maxPreamble+1) + "\nchaingate-pid:5\n"},
		{name: "the wrapper's lines", writes: []string{"chaingate-pid:5\nchaingate-wait:77\n", "chaingate-run:\nout\nchaingate-wait:8\nchaingate-run:\n"},
			pid: 5, holder: 77, ran: true, out: "out\nchaingate-wait:8\nchaingate-run:\n"},
		{name: "the wrapper's own error", writes: []string{"chaingate-pid:5\nchaingate: cannot make the lock\n"}, pid: 5, out: "chaingate: cannot make the lock\n"},
		{name: "waiting still", writes: []string{"chaingate-pid:5\nchaingate-wait:77\n"}, pid: 5, holder: 77},
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
			if w.pid != tc.pid || out.String() != tc.out || w.holder != tc.holder || w.ran != tc.ran {
				t.Errorf("pid %d, out %q, holder %d, ran %v; want %d, %q, %d, %v", w.pid, out.String(), w.holder, w.ran, tc.pid, tc.out, tc.holder, tc.ran)
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
