package server_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/gateway/server"
)

// slackHosts stands for every host a response_url may name: the gateway's
// replies go to it whatever the URL's host, over TLS, so the gateway's own
// rule decides which are posted. Each reply is handed over with its host.
type slackHosts struct {
	replies chan map[string]any
}

func newSlackHosts(t *testing.T, env *apiEnv) *slackHosts {
	t.Helper()
	h := &slackHosts{replies: make(chan map[string]any, 16)}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var m map[string]any
		body, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(body, &m); err != nil {
			t.Errorf("a reply that is not JSON: %s", body)
		}
		m["_host"] = r.Host
		h.replies <- m
	}))
	t.Cleanup(srv.Close)
	addr := srv.Listener.Addr().String()
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
		// The test server's certificate names none of Slack's hosts.
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
	}}
	server.RespondToSlackWith(env.srv, client)
	return h
}

// reply waits for the next reply posted, or reports none within wait.
func (h *slackHosts) reply(wait time.Duration) map[string]any {
	select {
	case m := <-h.replies:
		return m
	case <-time.After(wait):
		return nil
	}
}

// TestSlackResponseURLHosts answers from Slack with response URLs on
// several hosts: the reply goes to one that [gateway.slack]
// response_url_hosts names (Slack's own when it is unset), and to no
// other, which the log names.
func TestSlackResponseURLHosts(t *testing.T) {
	t.Setenv("CHAINGATE_SECRET_SLACK_SIGNING_SECRET", slackSigningSecret)
	for _, tc := range []struct {
		name, hosts, responseURL string
		posted                   bool
	}{
		{"Slack's own, by default", "", "https://hooks.slack.com/actions/T0/1/x", true},
		{"GovSlack, not configured", "", "https://hooks.slack-gov.com/actions/T0/1/x", false},
		{"GovSlack, configured", `["hooks.slack-gov.com"]`, "https://hooks.slack-gov.com/actions/T0/1/x", true},
		{"Slack's own, left out", `["hooks.slack-gov.com"]`, "https://hooks.slack.com/actions/T0/1/x", false},
		{"both", `["hooks.slack.com", "hooks.slack-gov.com"]`, "https://hooks.slack.com/actions/T0/1/x", true},
		{"a configured host, over http", `["hooks.slack-gov.com"]`, "http://hooks.slack-gov.com/actions/T0/1/x", false},
		{"a configured host, another port", `["hooks.slack-gov.com"]`, "https://hooks.slack-gov.com:8443/actions/T0/1/x", false},
		{"under a configured host", `["hooks.slack-gov.com"]`, "https://evil.hooks.slack-gov.com/actions/T0/1/x", false},
		{"an internal address", `["hooks.slack-gov.com"]`, "https://169.254.169.254/latest/meta-data", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			config := slackApprovalConfig
			if tc.hosts != "" {
				config = strings.Replace(config, `users = { U0ALICE1`, "response_url_hosts = "+tc.hosts+"\nusers = { U0ALICE1", 1)
			}
			env := newAPI(t, config)
			hosts := newSlackHosts(t, env)
			// An answer refused still gets its note.
			click := slackClick(t, tc.responseURL, "U0ALICE1", "chaingate:approve", "01nosuchrun/ask", nil)
			if code, raw := postSigned(t, env, click); code != http.StatusOK {
				t.Fatalf("the click: %d %s", code, raw)
			}
			if !tc.posted {
				for deadline := time.Now().Add(10 * time.Second); !strings.Contains(env.logs.String(), "not posting an answer's outcome to Slack"); time.Sleep(10 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatal("the refused response_url is not logged")
					}
				}
				if r := hosts.reply(50 * time.Millisecond); r != nil {
					t.Errorf("a reply was posted to %s: %v", tc.responseURL, r)
				}
				return
			}
			r := hosts.reply(10 * time.Second)
			if r == nil {
				t.Fatalf("no reply was posted to %s", tc.responseURL)
			}
			if want := strings.Split(strings.TrimPrefix(tc.responseURL, "https://"), "/")[0]; r["_host"] != want || !strings.Contains(r["text"].(string), "Your answer was not recorded") {
				t.Errorf("the reply: %v, want it on %s", r, want)
			}
		})
	}
}

// TestSlackCurlExample runs the curl example of docs/api.md, as written,
// against a gateway: its body is form-encoded and signed as Slack does,
// so the gateway takes it and answers the question it names.
func TestSlackCurlExample(t *testing.T) {
	for _, tool := range []string{"bash", "curl", "jq", "openssl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("the example needs %s: %v", tool, err)
		}
	}
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "api.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(doc), "### POST /v1/slack/interactions")
	_, example, _ := strings.Cut(section, "```sh\n")
	example, _, _ = strings.Cut(example, "```")
	const docRun, docUser = "01m8a6b3c9d2e7f4g5h8j1k0mn/approve-restart", "U0123ABCD"
	if !strings.Contains(example, docRun) || !strings.Contains(example, docUser) || !strings.Contains(example, "curl ") {
		t.Fatalf("no curl example of a click in the section:\n%s", example)
	}

	t.Setenv("CHAINGATE_SECRET_SLACK_SIGNING_SECRET", slackSigningSecret)
	env := newAPI(t, strings.Replace(slackApprovalConfig, `users = { U0ALICE1 = "alice"`, `users = { `+docUser+` = "alice"`, 1))
	env.token = "ops-tok"
	hosts := newSlackHosts(t, env)
	id := startRun(t, env, "restart-db", `{"host": "db-1"}`)
	waitAsking(t, env, id, "ask")

	cmd := exec.Command("bash", "-euo", "pipefail", "-c", strings.ReplaceAll(example, docRun, id+"/ask"))
	cmd.Env = append(os.Environ(), "GW="+env.url, "SLACK_SIGNING_SECRET="+slackSigningSecret)
	if out, err := cmd.CombinedOutput(); err != nil || len(out) != 0 {
		t.Fatalf("the example: %v, said %q (the gateway's answer to a click is an empty 200)", err, out)
	}
	v := waitRunEnd(t, env, id)
	if v.Status != "succeeded" || !strings.Contains(string(v.Steps["ask"].Body), `"by":"alice (Slack)"`) {
		t.Errorf("the run: %s %s", v.Status, v.Steps["ask"].Body)
	}
	r := hosts.reply(10 * time.Second)
	if r == nil || r["_host"] != "hooks.slack.com" || !strings.Contains(r["text"].(string), "Approved by alice (Slack)") {
		t.Errorf("the reply to the example's response_url: %v", r)
	}
}
