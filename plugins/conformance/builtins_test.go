package conformance_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/internal/testutil/sshdtest"
	"github.com/chaingate/gateway/plugins/conformance"
	"github.com/chaingate/gateway/providers/builtin"
	"github.com/chaingate/gateway/providers/opsgenie/opsgenietest"
	"github.com/chaingate/gateway/providers/pagerduty/pagerdutytest"
	"github.com/chaingate/gateway/providers/slack/slacktest"
	"github.com/chaingate/gateway/providers/webhook/webhooktest"
)

// builtinRows says how to check each built-in provider: the options, with
// whatever local server its payloads need started by setup. Every built-in
// type must have a row.
var builtinRows = []struct {
	typ   string
	setup func(t *testing.T) conformance.Options
}{
	{"echo", func(*testing.T) conformance.Options {
		return conformance.Options{
			AcceptsAnyPayload: true, // echo answers with whatever it is sent
			Payloads:          map[string]json.RawMessage{"echo": json.RawMessage(`{"text": "hello"}`)},
		}
	}},
	{"exec", func(*testing.T) conformance.Options {
		return conformance.Options{
			Config:   json.RawMessage(`{"commands": {"run": {"script": "printf '{\"free_pct\": %d}' \"$CHAINGATE_ARG_PCT\"", "args": {"pct": {"type": "integer", "max": 100}}}}}`),
			Payloads: map[string]json.RawMessage{"run": json.RawMessage(`{"args": {"pct": 7}}`)},
		}
	}},
	{"faulty", func(*testing.T) conformance.Options {
		return conformance.Options{
			AcceptsAnyPayload: true, // a payload that is not an object has no controls
			Payloads:          map[string]json.RawMessage{"succeed": json.RawMessage(`{"note": "no faults asked for"}`)},
		}
	}},
	{"http", func(t *testing.T) conformance.Options {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"ok": true}`))
		}))
		t.Cleanup(srv.Close)
		return conformance.Options{
			Config:   json.RawMessage(`{"base_url": "` + srv.URL + `"}`),
			Payloads: map[string]json.RawMessage{"get": json.RawMessage(`{"url": "/healthz"}`)},
		}
	}},
	{"slack", func(t *testing.T) conformance.Options {
		srv := slacktest.NewServer()
		t.Cleanup(srv.Close)
		ts := postSlackMessage(t, srv)
		return conformance.Options{
			Config: json.RawMessage(fmt.Sprintf(`{"token": %q, "webhook_url": %q, "base_url": %q}`, slacktest.Token, srv.WebhookURL(), srv.BaseURL())),
			Payloads: map[string]json.RawMessage{
				"post_message":    json.RawMessage(`{"channel": "C0123456789", "text": "disk-full on db-1"}`),
				"update_message":  json.RawMessage(`{"channel": "C0123456789", "ts": "` + ts + `", "text": "resolved"}`),
				"webhook_message": json.RawMessage(`{"text": "disk-full on db-1"}`),
			},
		}
	}},
	{"pagerduty", func(t *testing.T) conformance.Options {
		srv := pagerdutytest.NewServer()
		t.Cleanup(srv.Close)
		return conformance.Options{
			Config: json.RawMessage(fmt.Sprintf(`{"routing_key": %q, "base_url": %q}`, pagerdutytest.RoutingKey, srv.URL)),
			Payloads: map[string]json.RawMessage{
				"trigger":     json.RawMessage(`{"summary": "disk-full on db-1", "source": "db-1", "severity": "critical"}`),
				"acknowledge": json.RawMessage(`{"dedup_key": "conformance/page"}`),
				"resolve":     json.RawMessage(`{"dedup_key": "conformance/page"}`),
				"change":      json.RawMessage(`{"summary": "deployed v2", "source": "ci"}`),
			},
		}
	}},
	{"opsgenie", func(t *testing.T) conformance.Options {
		srv := opsgenietest.NewServer()
		t.Cleanup(srv.Close)
		return conformance.Options{
			Config: json.RawMessage(fmt.Sprintf(`{"api_key": %q, "base_url": %q}`, opsgenietest.APIKey, srv.URL)),
			Payloads: map[string]json.RawMessage{
				"create_alert":      json.RawMessage(`{"message": "disk-full on db-1"}`),
				"acknowledge_alert": json.RawMessage(`{"alias": "conformance/page"}`),
				"close_alert":       json.RawMessage(`{"alias": "conformance/page"}`),
			},
		}
	}},
	{"webhook", func(t *testing.T) conformance.Options {
		srv := webhooktest.NewServer()
		t.Cleanup(srv.Close)
		return conformance.Options{
			AcceptsAnyPayload: true, // the payload is the request body, whatever it holds
			Config:            json.RawMessage(fmt.Sprintf(`{"url": %q, "secret": %q}`, srv.URL+"/hooks/alerts", webhooktest.Secret)),
			Payloads:          map[string]json.RawMessage{"post": json.RawMessage(`{"alert": "disk-full"}`)},
		}
	}},
	{"ssh", func(t *testing.T) conformance.Options {
		srv := sshdtest.Start(t)
		cfg, err := json.Marshal(map[string]any{"user": srv.User, "private_key": srv.ClientKey, "known_hosts": srv.KnownHostsFile, "allowed_hosts": []string{"127.0.0.1"}, "port": srv.Port(),
			"commands": map[string]any{"run": map[string]any{"script": `echo "disk-full on $CHAINGATE_ARG_HOST"`, "args": map[string]any{"host": map[string]any{"type": "hostname"}}}}})
		if err != nil {
			t.Fatal(err)
		}
		return conformance.Options{
			Config:   cfg,
			Payloads: map[string]json.RawMessage{"run": json.RawMessage(`{"host": "` + srv.Addr + `", "args": {"host": "db-1"}}`)},
		}
	}},
	{"email", func(t *testing.T) conformance.Options {
		return conformance.Options{
			Config:   json.RawMessage(fmt.Sprintf(`{"host": "127.0.0.1", "port": %d, "tls": "none", "from": "alerts@example.com"}`, startSMTP(t))),
			Payloads: map[string]json.RawMessage{"send": json.RawMessage(`{"to": "oncall@example.com", "subject": "disk-full", "text": "on db-1"}`)},
		}
	}},
}

// postSlackMessage posts a message for update_message to update, as Slack's
// API takes it, and returns its ts.
func postSlackMessage(t *testing.T, srv *slacktest.Server) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, srv.BaseURL()+"/chat.postMessage", strings.NewReader(`{"channel": "C0123456789", "text": "disk-full"}`))
	req.Header.Set("Authorization", "Bearer "+slacktest.Token)
	req.Header.Set("Content-Type", "application/json; charset=utf-8")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var answer struct {
		OK bool   `json:"ok"`
		TS string `json:"ts"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil || !answer.OK {
		t.Fatalf("posting to the test Slack: %+v, %v", answer, err)
	}
	return answer.TS
}

// startSMTP starts the SMTP server the email provider's tests use, as a
// plain relay on a free loopback port, and returns the port.
func startSMTP(t *testing.T) int {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "smtpd")
	build := exec.Command("go", "build", "-o", bin, "github.com/chaingate/gateway/providers/email/internal/smtpd")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the test SMTP server: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "-tls", "none", "-out", filepath.Join(t.TempDir(), "mail.jsonl"))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("reading the test SMTP server's address: %v", err)
	}
	_, port, err := net.SplitHostPort(strings.TrimSpace(strings.TrimPrefix(line, "listening ")))
	if err != nil {
		t.Fatalf("test SMTP server said %q: %v", line, err)
	}
	n, _ := strconv.Atoi(port)
	return n
}

// TestBuiltinsConform puts every built-in provider through the checklist.
func TestBuiltinsConform(t *testing.T) {
	var covered []string
	for _, row := range builtinRows {
		covered = append(covered, row.typ)
		t.Run(row.typ, func(t *testing.T) {
			t.Parallel()
			opts := row.setup(t)
			// The checks are of what a provider answers, not how fast: a
			// machine loaded by the whole suite, under the race detector,
			// gets a minute where a plugin author's gets 10 s.
			opts.Timeout = time.Minute
			r := conformance.Check(t.Context(), conformance.Target{Builtin: row.typ}, opts)
			var text strings.Builder
			_ = r.WriteText(&text)
			if !r.OK() {
				t.Errorf("the built-in %s provider does not conform:\n%s", row.typ, text.String())
			}
			for _, res := range r.Results {
				if res.Status == conformance.Skip && res.Check != "config" {
					t.Errorf("%s was skipped: %s\n%s", res.Check, res.Detail, text.String())
				}
			}
		})
	}
	for _, typ := range builtin.Types() {
		if !slices.Contains(covered, typ) {
			t.Errorf("built-in type %q has no row in builtinRows", typ)
		}
	}
}
