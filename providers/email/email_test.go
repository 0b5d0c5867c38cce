package email_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/internal/testutil"
	"github.com/chaingate/gateway/plugins/host"
	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/email"
)

func TestMain(m *testing.M) {
	host.ServeBuiltinIfRequested(func(typ string) (providers.Provider, bool) {
		if typ == "email" {
			return email.New(), true
		}
		return nil, false
	})
	testutil.QuickRaceExit()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "email-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	buildErr = setUp(dir)
	return m.Run()
}

type result struct {
	MessageID  string   `json:"message_id"`
	Recipients []string `json:"recipients"`
	Count      int      `json:"count"`
	Reply      string   `json:"reply"`
}

func execute(ctx context.Context, p providers.Provider, cfg json.RawMessage, payload, key string) (result, error) {
	resp, err := p.Execute(ctx, providers.Request{ActionType: "send", Config: cfg, Payload: json.RawMessage(payload), DedupKey: key, Attempt: 1})
	if err != nil {
		return result{}, err
	}
	var r result
	if err := json.Unmarshal(resp.Body, &r); err != nil {
		return result{}, fmt.Errorf("body %s: %w", resp.Body, err)
	}
	return r, nil
}

// msgID is the Message-ID syntax of RFC 5322 (section 3.6.4) with a
// dot-atom on the left and a domain on the right, obsolete forms excluded.
var msgID = regexp.MustCompile(`^<[A-Za-z0-9!#$%&'*+/=?^_` + "`" + `{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_` + "`" + `{|}~-]+)*@[A-Za-z0-9.-]+>$`)

func TestSend(t *testing.T) {
	starttlsAuth := startServer(t, serverOpts{mode: "starttls", auth: true})
	implicit := startServer(t, serverOpts{mode: "implicit"})
	implicitAuth := startServer(t, serverOpts{mode: "implicit", auth: true})
	loginOnly := startServer(t, serverOpts{mode: "starttls", auth: true, mechs: "LOGIN"})
	plain := startServer(t, serverOpts{mode: "none"})
	plainAuth := startServer(t, serverOpts{mode: "none", auth: true})

	const text = "Disk full on db-1.\nSee the runbook.\n.\n..and a line that starts with dots\n"
	const html = "<p>Disk full on <b>db-1</b> &amp; friends</p>\n<p>caf\u00e9 = 100%</p>"

	// checks is run on every message the server accepted.
	type checks func(t *testing.T, r result, rec record, m parsed)
	for _, tc := range []struct {
		name    string
		srv     *smtpServer
		cfg     map[string]any
		payload string
		check   checks
	}{
		{
			name: "starttls with auth, text only", srv: starttlsAuth,
			payload: `{"to":"On Call <oncall@example.com>","subject":"Disk full on db-1","text":` + quote(text) + `}`,
			check: func(t *testing.T, r result, rec record, m parsed) {
				if !rec.TLS || rec.AuthUser != testUser || rec.From != "alerts@example.com" || !slices.Equal(rec.To, []string{"oncall@example.com"}) {
					t.Errorf("envelope: tls %v, auth %q, from %q, to %q", rec.TLS, rec.AuthUser, rec.From, rec.To)
				}
				if rec.Helo == "" {
					t.Error("no EHLO name")
				}
				wantHeader(t, m, "From", `"Chaingate Alerts" <alerts@example.com>`)
				wantHeader(t, m, "To", `"On Call" <oncall@example.com>`)
				wantHeader(t, m, "Subject", "Disk full on db-1")
				wantHeader(t, m, "MIME-Version", "1.0")
				wantHeader(t, m, "Auto-Submitted", "auto-generated")
				wantHeader(t, m, "Cc", "")
				wantHeader(t, m, "Bcc", "")
				if d, err := m.header.Date(); err != nil || time.Since(d).Abs() > time.Minute {
					t.Errorf("Date %q: %v", m.header.Get("Date"), err)
				}
				wantParts(t, m, part{"text/plain; charset=utf-8", strings.ReplaceAll(text, "\n", "\r\n")})
				if r.Count != 1 || !slices.Equal(r.Recipients, []string{"oncall@example.com"}) || !strings.HasPrefix(r.Reply, "250 2.0.0 Ok: queued as Q") {
					t.Errorf("result = %+v", r)
				}
			},
		},
		{
			name: "implicit tls, html only", srv: implicit,
			payload: `{"to":["oncall@example.com"],"subject":"html","html":` + quote(html) + `}`,
			check: func(t *testing.T, r result, rec record, m parsed) {
				if !rec.TLS || rec.AuthUser != "" {
					t.Errorf("tls %v, auth %q", rec.TLS, rec.AuthUser)
				}
				// SMTP ends the data with a line break when the body does not.
				wantParts(t, m, part{"text/html; charset=utf-8", strings.ReplaceAll(html, "\n", "\r\n") + "\r\n"})
			},
		},
		{
			name: "implicit tls with auth, text and html", srv: implicitAuth,
			payload: `{"to":"oncall@example.com","subject":"both","text":"plain version","html":` + quote(html) + `}`,
			check: func(t *testing.T, r result, rec record, m parsed) {
				if !rec.TLS || rec.AuthUser != testUser {
					t.Errorf("tls %v, auth %q", rec.TLS, rec.AuthUser)
				}
				if mt, _, _ := mime.ParseMediaType(m.header.Get("Content-Type")); mt != "multipart/alternative" {
					t.Errorf("Content-Type = %q", m.header.Get("Content-Type"))
				}
				wantParts(t, m, part{"text/plain; charset=utf-8", "plain version"}, part{"text/html; charset=utf-8", strings.ReplaceAll(html, "\n", "\r\n")})
			},
		},
		{
			name: "non-ascii subject", srv: starttlsAuth,
			payload: `{"to":"oncall@example.com","subject":"Störung: Festplatte voll auf db-1 — bitte sofort prüfen, sonst fällt die Datenbank aus 🔥\nzweite Zeile","text":"x"}`,
			check: func(t *testing.T, r result, rec record, m parsed) {
				raw := m.header.Get("Subject")
				if !strings.HasPrefix(raw, "=?utf-8?q?") {
					t.Errorf("Subject is not RFC 2047-encoded: %q", raw)
				}
				wantHeader(t, m, "Subject", "Störung: Festplatte voll auf db-1 — bitte sofort prüfen, sonst fällt die Datenbank aus 🔥 zweite Zeile")
				head, _, _ := strings.Cut(rec.Data, "\r\n\r\n")
				for _, l := range strings.Split(head, "\r\n") {
					if len(l) > 76 {
						t.Errorf("header line of %d characters: %q", len(l), l)
					}
				}
			},
		},
		{
			name: "cc and bcc", srv: starttlsAuth,
			payload: `{"to":"a@example.com, B <b@example.com>","cc":["Zoë Ops <c@example.com>",""],"bcc":["hidden@example.net","a@example.com"],"reply_to":"noc@example.com","text":"x"}`,
			check: func(t *testing.T, r result, rec record, m parsed) {
				want := []string{"a@example.com", "b@example.com", "c@example.com", "hidden@example.net"}
				if !slices.Equal(rec.To, want) || !slices.Equal(r.Recipients, want) || r.Count != 4 {
					t.Errorf("envelope %q, result %+v, want %q", rec.To, r, want)
				}
				wantHeader(t, m, "To", `<a@example.com>, "B" <b@example.com>`)
				wantHeader(t, m, "Cc", `Zoë Ops <c@example.com>`)
				wantHeader(t, m, "Reply-To", `<noc@example.com>`)
				wantHeader(t, m, "Subject", "")
				if strings.Contains(rec.Data, "hidden") {
					t.Errorf("the bcc address is in the message:\n%s", rec.Data)
				}
			},
		},
		{
			name: "extra headers", srv: starttlsAuth,
			payload: `{"to":"oncall@example.com","text":"x","headers":{"X-Incident":"INC-42 Größe","In-Reply-To":"<first@example.com>"}}`,
			check: func(t *testing.T, r result, rec record, m parsed) {
				wantHeader(t, m, "X-Incident", "INC-42 Größe")
				wantHeader(t, m, "In-Reply-To", "<first@example.com>")
			},
		},
		{
			name: "auth login when plain is not offered", srv: loginOnly,
			payload: `{"to":"oncall@example.com","text":"x"}`,
			check: func(t *testing.T, r result, rec record, m parsed) {
				if rec.AuthUser != testUser || !rec.TLS {
					t.Errorf("tls %v, auth %q", rec.TLS, rec.AuthUser)
				}
			},
		},
		{
			name: "plain text relay", srv: plain,
			payload: `{"to":"oncall@example.com","text":"x"}`,
			check: func(t *testing.T, r result, rec record, m parsed) {
				if rec.TLS || rec.AuthUser != "" {
					t.Errorf("tls %v, auth %q", rec.TLS, rec.AuthUser)
				}
			},
		},
		{
			name: "auth without tls to a loopback relay", srv: plainAuth,
			payload: `{"to":"oncall@example.com","text":"x"}`,
			check: func(t *testing.T, r result, rec record, m parsed) {
				if rec.TLS || rec.AuthUser != testUser {
					t.Errorf("tls %v, auth %q", rec.TLS, rec.AuthUser)
				}
			},
		},
		{
			name: "local_name and server_name", srv: starttlsAuth, cfg: map[string]any{"host": "localhost", "server_name": "localhost", "local_name": "gateway.example.com"},
			payload: `{"to":"oncall@example.com","text":"x"}`,
			check: func(t *testing.T, r result, rec record, m parsed) {
				if rec.Helo != "gateway.example.com" {
					t.Errorf("EHLO name = %q", rec.Helo)
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "01JTESTRUN/send/" + strings.ReplaceAll(tc.name, " ", "-")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			r, err := execute(ctx, email.New(), tc.srv.config(tc.cfg), tc.payload, key)
			if err != nil {
				t.Fatalf("Execute: %v", err)
			}
			recs := tc.srv.received(t, key)
			if len(recs) != 1 {
				t.Fatalf("the server accepted %d messages with dedup key %q, want 1", len(recs), key)
			}
			m := parseMessage(t, recs[0].Data)
			wantHeader(t, m, "X-Chaingate-Dedup-Key", key)
			if id := m.header.Get("Message-ID"); id != r.MessageID || !msgID.MatchString(id) || !strings.HasSuffix(id, "@example.com>") {
				t.Errorf("Message-ID %q, result's %q", id, r.MessageID)
			}
			tc.check(t, r, recs[0], m)
		})
	}
}

func TestErrors(t *testing.T) {
	starttlsAuth := startServer(t, serverOpts{mode: "starttls", auth: true})
	implicit := startServer(t, serverOpts{mode: "implicit"})
	plain := startServer(t, serverOpts{mode: "none"})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := l.Addr().(*net.TCPAddr).Port
	l.Close()

	const ok = `{"to":"oncall@example.com","text":"x"}`
	for _, tc := range []struct {
		name       string
		srv        *smtpServer
		actionType string // default "send"
		cfg        map[string]any
		payload    string
		wantCode   string
		retryable  bool
		wantInMsg  string
	}{
		{name: "451 at rcpt is retryable", srv: starttlsAuth, payload: `{"to":"tempfail@example.com","text":"x"}`, wantCode: "smtp_451", retryable: true, wantInMsg: "<tempfail@example.com>: 451 4.3.0"},
		{name: "550 at rcpt is permanent", srv: starttlsAuth, payload: `{"to":["oncall@example.com","reject@example.com"],"text":"x"}`, wantCode: "smtp_550", wantInMsg: "refused 1 of 2 recipients, nothing was sent: <reject@example.com>: 550 5.1.1 No such user"},
		{name: "550 outweighs 451", srv: starttlsAuth, payload: `{"to":"tempfail@example.com","bcc":"reject@example.com","text":"x"}`, wantCode: "smtp_550", wantInMsg: "refused 2 of 2"},
		{name: "421 at mail from is retryable", srv: starttlsAuth, cfg: map[string]any{"from": "mailtemp@example.com"}, payload: ok, wantCode: "smtp_421", retryable: true, wantInMsg: "MAIL FROM:<mailtemp@example.com>"},
		{name: "553 at mail from is permanent", srv: starttlsAuth, cfg: map[string]any{"from": "mailreject@example.com"}, payload: ok, wantCode: "smtp_553"},
		{name: "452 at data is retryable", srv: starttlsAuth, payload: `{"to":"datatemp@example.com","text":"x"}`, wantCode: "smtp_452", retryable: true, wantInMsg: "sending the message"},
		{name: "554 at data is permanent", srv: starttlsAuth, payload: `{"to":"datareject@example.com","text":"x"}`, wantCode: "smtp_554"},
		{name: "535 wrong password is permanent", srv: starttlsAuth, cfg: map[string]any{"password": "wrong"}, payload: ok, wantCode: "smtp_535", wantInMsg: "check the username and password"},
		{name: "no username for a relay that wants one", srv: starttlsAuth, cfg: map[string]any{"username": nil, "password": nil}, payload: ok, wantCode: "smtp_530"},
		{name: "username for a relay that offers no auth", srv: implicit, cfg: map[string]any{"username": "u", "password": "p"}, payload: ok, wantCode: "auth_unavailable"},
		{name: "server without starttls is refused", srv: plain, cfg: map[string]any{"tls": "starttls"}, payload: ok, wantCode: "starttls_unavailable", wantInMsg: "refusing to send in clear text"},
		{name: "untrusted certificate", srv: starttlsAuth, cfg: map[string]any{"ca_file": nil}, payload: ok, wantCode: "tls_certificate", wantInMsg: "ca_file"},
		{name: "certificate for another name", srv: implicit, cfg: map[string]any{"server_name": "mail.example.net"}, payload: ok, wantCode: "tls_certificate", wantInMsg: "mail.example.net"},
		{name: "implicit tls on a starttls port", srv: starttlsAuth, cfg: map[string]any{"tls": "implicit"}, payload: ok, wantCode: "tls", wantInMsg: "does not speak TLS"},
		{name: "connection refused is retryable", srv: plain, cfg: map[string]any{"port": closedPort}, payload: ok, wantCode: "network", retryable: true, wantInMsg: "dialling 127.0.0.1:"},

		{name: "no recipient", srv: plain, payload: `{"to":[],"cc":"","text":"x"}`, wantCode: "bad_payload", wantInMsg: "no recipient"},
		{name: "no body", srv: plain, payload: `{"to":"a@example.com","subject":"s"}`, wantCode: "bad_payload", wantInMsg: "text or html is required"},
		{name: "unknown field", srv: plain, payload: `{"to":"a@example.com","body":"x"}`, wantCode: "bad_payload", wantInMsg: `"body"`},
		{name: "bad address", srv: plain, payload: `{"to":"not an address","text":"x"}`, wantCode: "bad_payload", wantInMsg: "to: parsing"},
		{name: "non-ascii address", srv: plain, payload: `{"to":"ops@exämple.com","text":"x"}`, wantCode: "bad_payload", wantInMsg: "xn--"},
		{name: "recipients of the wrong type", srv: plain, payload: `{"to":"a@example.com","cc":42,"text":"x"}`, wantCode: "bad_payload", wantInMsg: "cc: want a string or an array"},
		{name: "owned header", srv: plain, payload: `{"to":"a@example.com","text":"x","headers":{"message-id":"<x@y>"}}`, wantCode: "bad_payload", wantInMsg: "message-id is set by the email provider"},
		{name: "bcc header", srv: plain, payload: `{"to":"a@example.com","text":"x","headers":{"Bcc":"b@example.com"}}`, wantCode: "bad_payload", wantInMsg: "Bcc is set by"},
		{name: "content header", srv: plain, payload: `{"to":"a@example.com","text":"x","headers":{"Content-Type":"text/html"}}`, wantCode: "bad_payload"},
		{name: "header injection", srv: plain, payload: `{"to":"a@example.com","text":"x","headers":{"X-A":"v\r\nBcc: evil@example.com"}}`, wantCode: "bad_payload", wantInMsg: "control character"},
		{name: "bad header name", srv: plain, payload: `{"to":"a@example.com","text":"x","headers":{"X A":"v"}}`, wantCode: "bad_payload", wantInMsg: "not a valid header field name"},
		{name: "payload not an object", srv: plain, payload: `"a@example.com"`, wantCode: "bad_payload"},
		{name: "other action type", srv: plain, actionType: "post", payload: ok, wantCode: "bad_action"},

		{name: "no host", srv: plain, cfg: map[string]any{"host": nil}, payload: ok, wantCode: "bad_config", wantInMsg: "host is required"},
		{name: "host with port", srv: plain, cfg: map[string]any{"host": "127.0.0.1:25"}, payload: ok, wantCode: "bad_config", wantInMsg: "the port goes in port"},
		{name: "no from", srv: plain, cfg: map[string]any{"from": nil}, payload: ok, wantCode: "bad_config", wantInMsg: "from is required"},
		{name: "unknown tls mode", srv: plain, cfg: map[string]any{"tls": "ssl"}, payload: ok, wantCode: "bad_config", wantInMsg: `tls "ssl"`},
		{name: "credentials in clear text to a remote host", srv: plain, cfg: map[string]any{"host": "mail.example.com", "username": "u", "password": "p"}, payload: ok, wantCode: "bad_config", wantInMsg: "refusing to send credentials in clear text"},
		{name: "ca_file without tls", srv: plain, cfg: map[string]any{"ca_file": certFile}, payload: ok, wantCode: "bad_config", wantInMsg: "ca_file"},
		{name: "missing ca_file", srv: implicit, cfg: map[string]any{"ca_file": "/nonexistent/ca.pem"}, payload: ok, wantCode: "bad_config", wantInMsg: "reading ca_file"},
		{name: "password without username", srv: plain, cfg: map[string]any{"password": "p"}, payload: ok, wantCode: "bad_config"},
		{name: "bad local_name", srv: plain, cfg: map[string]any{"local_name": "my host"}, payload: ok, wantCode: "bad_config", wantInMsg: "local_name"},
		{name: "unknown config key", srv: plain, cfg: map[string]any{"pasword": "p"}, payload: ok, wantCode: "bad_config", wantInMsg: `"pasword"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "01JTESTRUN/errors/" + strings.ReplaceAll(tc.name, " ", "-")
			at := cmp.Or(tc.actionType, "send")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := email.New().Execute(ctx, providers.Request{ActionType: at, Config: tc.srv.config(tc.cfg), Payload: json.RawMessage(tc.payload), DedupKey: key, Attempt: 1})
			var pe *providers.Error
			if !errors.As(err, &pe) {
				t.Fatalf("error %v (%T) is not a *providers.Error", err, err)
			}
			if pe.Code != tc.wantCode || pe.Retryable != tc.retryable || !strings.Contains(pe.Message, tc.wantInMsg) {
				t.Errorf("error = {code %q, retryable %v, %q}, want code %q, retryable %v, message holding %q", pe.Code, pe.Retryable, pe.Message, tc.wantCode, tc.retryable, tc.wantInMsg)
			}
			if strings.Contains(pe.Message, testPassword) {
				t.Errorf("the message shows the password: %q", pe.Message)
			}
			if n := len(tc.srv.received(t, key)); n != 0 {
				t.Errorf("the server accepted %d messages", n)
			}
		})
	}
}

// TestSameDedupKey checks that a resend, such as a retry after a lost
// answer, carries the Message-ID of the first send, and another step's does not.
func TestSameDedupKey(t *testing.T) {
	srv := startServer(t, serverOpts{mode: "starttls", auth: true})
	const key = "01JD5ZK3Q8N2/notify-all/email-alert[2].x"
	const want = "<01JD5ZK3Q8N2/notify-all/email-alert%5B2%5D%2Ex@example.com>"
	payload := `{"to":"oncall@example.com","subject":"same","text":"x"}`
	for i := range 2 {
		r, err := execute(context.Background(), email.New(), srv.config(nil), payload, key)
		if err != nil {
			t.Fatalf("send %d: %v", i+1, err)
		}
		if r.MessageID != want {
			t.Errorf("send %d: message_id %q, want %q", i+1, r.MessageID, want)
		}
	}
	recs := srv.received(t, key)
	if len(recs) != 2 {
		t.Fatalf("the server has %d messages, want 2", len(recs))
	}
	for _, rec := range recs {
		if id := parseMessage(t, rec.Data).header.Get("Message-ID"); id != want {
			t.Errorf("Message-ID %q, want %q", id, want)
		}
	}
	other, err := execute(context.Background(), email.New(), srv.config(nil), payload, key+"-other")
	if err != nil {
		t.Fatal(err)
	}
	if other.MessageID == want {
		t.Error("another dedup key gave the same Message-ID")
	}
}

// TestStalledServer checks that a server that never answers DATA holds
// the call no longer than the step's context.
func TestStalledServer(t *testing.T) {
	for _, tc := range []struct {
		name      string
		timeout   time.Duration // 0: cancel once the server stalls
		wantErr   error
		retryable bool
	}{
		{name: "cancelled", wantErr: context.Canceled},
		{name: "deadline", timeout: 2 * time.Second, wantErr: context.DeadlineExceeded, retryable: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := startServer(t, serverOpts{mode: "starttls", auth: true})
			ctx, cancel := context.WithCancel(context.Background())
			if tc.timeout > 0 {
				ctx, cancel = context.WithTimeout(context.Background(), tc.timeout)
			}
			defer cancel()
			ended := make(chan time.Time, 1)
			go func() {
				if tc.timeout > 0 {
					<-ctx.Done()
					ended <- time.Now()
					return
				}
				for limit := time.Now().Add(10 * time.Second); !strings.Contains(srv.stderr.String(), "stalling on DATA") && time.Now().Before(limit); {
					time.Sleep(10 * time.Millisecond)
				}
				ended <- time.Now()
				cancel()
			}()
			_, err := execute(ctx, email.New(), srv.config(nil), `{"to":"stall@example.com","text":"x"}`, "run/stall-"+tc.name)
			returned := time.Now()
			// The server stalls for good: only the context ends the call.
			if took := returned.Sub(<-ended); took > 30*time.Second {
				t.Errorf("Execute returned %v after the context ended", took)
			}
			if !errors.Is(err, tc.wantErr) || providers.IsRetryable(err) != tc.retryable {
				t.Errorf("error %v: want %v, retryable %v", err, tc.wantErr, tc.retryable)
			}
			if !strings.Contains(fmt.Sprint(err), "sending the message to 127.0.0.1:") {
				t.Errorf("error %q does not say where it stalled", err)
			}
		})
	}
}

// TestPluginProcess runs the provider the way the gateway does: in a plugin
// subprocess (this test binary, re-executed), with errors crossing the wire.
func TestPluginProcess(t *testing.T) {
	srv := startServer(t, serverOpts{mode: "starttls", auth: true})
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	m := host.NewManager(host.Options{Executable: exe})
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("closing the manager: %v", err)
		}
	})
	p := m.Provider(host.Spec{Name: "mail", Builtin: "email"})

	info, err := p.Describe(context.Background())
	if err != nil || info.Name != "email" || !slices.Equal(info.ActionTypes, []string{"send"}) || len(info.ConfigSchema) == 0 {
		t.Fatalf("Describe = %+v, %v", info, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := execute(ctx, p, srv.config(nil), `{"to":"oncall@example.com","subject":"via plugin","text":"x"}`, "run-p/notify")
	if err != nil {
		t.Fatalf("Execute: %v", err)
	}
	if r.MessageID != "<run-p/notify@example.com>" || r.Count != 1 || len(srv.received(t, "run-p/notify")) != 1 {
		t.Errorf("result %+v", r)
	}
	_, err = execute(ctx, p, srv.config(nil), `{"to":"reject@example.com","text":"x"}`, "run-p/reject")
	var pe *providers.Error
	if !errors.As(err, &pe) || pe.Code != "smtp_550" || pe.Retryable || !strings.Contains(pe.Message, "No such user") {
		t.Errorf("error %#v", err)
	}
}

func TestDescribe(t *testing.T) {
	info, err := email.New().Describe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Schema               string                     `json:"$schema"`
		Type                 string                     `json:"type"`
		AdditionalProperties *bool                      `json:"additionalProperties"`
		Required             []string                   `json:"required"`
		Properties           map[string]json.RawMessage `json:"properties"`
	}
	if err := json.Unmarshal(info.ConfigSchema, &schema); err != nil {
		t.Fatalf("schema: %v", err)
	}
	if info.Name != "email" || info.Version == "" || !slices.Equal(info.ActionTypes, []string{"send"}) {
		t.Errorf("info = %+v", info)
	}
	if schema.Schema != "https://json-schema.org/draft/2020-12/schema" || schema.Type != "object" || schema.AdditionalProperties == nil || *schema.AdditionalProperties ||
		!slices.Equal(schema.Required, []string{"host", "from"}) {
		t.Errorf("schema = %s", info.ConfigSchema)
	}
	for name, prop := range schema.Properties {
		var p struct {
			Secret bool `json:"x-secret"`
		}
		if err := json.Unmarshal(prop, &p); err != nil {
			t.Fatal(err)
		}
		if p.Secret != (name == "password") {
			t.Errorf("property %s: x-secret = %v", name, p.Secret)
		}
	}
	if len(schema.Properties) != 9 {
		t.Errorf("%d properties: %s", len(schema.Properties), info.ConfigSchema)
	}
}

func wantHeader(t *testing.T, m parsed, name, want string) {
	t.Helper()
	got, err := new(mime.WordDecoder).DecodeHeader(m.header.Get(name))
	if err != nil {
		t.Errorf("decoding %s %q: %v", name, m.header.Get(name), err)
	}
	if got != want {
		t.Errorf("%s = %q, want %q", name, got, want)
	}
}

func wantParts(t *testing.T, m parsed, want ...part) {
	t.Helper()
	if !slices.Equal(m.parts, want) {
		t.Errorf("parts = %q, want %q", m.parts, want)
	}
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
