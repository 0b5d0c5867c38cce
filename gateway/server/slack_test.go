package server_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/gateway/server"
)

const slackSigningSecret = "8f742231b10e8888abcd99yyyzzz85a5"

// slackApprovalConfig posts the question with answer buttons and a link
// to the step's console panel (an echo step stands in for Slack, so its
// body is the message as Slack would get it), then waits for the answer.
const slackApprovalConfig = `external_url = "https://gw.example.com/"

[gateway.auth]
tokens = [{ name = "ops", token = "ops-tok" }]

[gateway.slack]
signing_secret = "<<secrets.SLACK_SIGNING_SECRET>>"
users = { U0ALICE1 = "alice", U0BOB2 = "bob" }

[[chains]]
name = "restart-db"
[[chains.steps]]
name = "post"
provider = "echo"
[chains.steps.payload_template]
channel = "#db"
text = "Restart <<origin.payload.host>>?"
[[chains.steps.payload_template.blocks]]
type = "section"
text = { type = "mrkdwn", text = "Restart <<origin.payload.host>>?" }
[[chains.steps.payload_template.blocks]]
type = "actions"
elements = [
  { type = "button", action_id = "chaingate:approve", value = "<<run.id>>/ask", text = { type = "plain_text", text = "Approve" } },
  { type = "button", action_id = "chaingate:reject", value = "<<run.id>>/ask", text = { type = "plain_text", text = "Reject" } },
  { type = "button", action_id = "open", url = "<<run.url>>/steps/ask", text = { type = "plain_text", text = "Open" } },
]
[[chains.steps]]
name = "ask"
approval = { message = "Restart <<origin.payload.host>>?" }
[[chains.steps]]
name = "restart"
provider = "echo"
payload_template = { host = "<<origin.payload.host>>", by = "<<steps.ask.body.by>>" }

`

// fakeSlack stands for Slack's response URLs: it hands over each reply
// posted to one.
type fakeSlack struct {
	srv     *httptest.Server
	replies chan map[string]any
}

func newFakeSlack(t *testing.T, env *apiEnv) *fakeSlack {
	t.Helper()
	f := &fakeSlack{replies: make(chan map[string]any, 16)}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var m map[string]any
		body, _ := io.ReadAll(r.Body)
		if r.Method != http.MethodPost || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") || json.Unmarshal(body, &m) != nil {
			t.Errorf("a reply Slack would refuse: %s %s %s", r.Method, r.Header.Get("Content-Type"), body)
		}
		m["_path"] = r.URL.Path
		f.replies <- m
	}))
	t.Cleanup(f.srv.Close)
	u, _ := url.Parse(f.srv.URL)
	server.RespondToSlackAt(env.srv, f.srv.Client(), u.Host)
	return f
}

// reply waits for the next reply the gateway posts.
func (f *fakeSlack) reply(t *testing.T) map[string]any {
	t.Helper()
	select {
	case m := <-f.replies:
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("the gateway posted no reply to the response URL")
		return nil
	}
}

// slackClick is the form body Slack posts when user clicks the button of
// message whose action_id and value are given.
func slackClick(t *testing.T, responseURL, user, actionID, value string, message json.RawMessage) string {
	t.Helper()
	payload, err := json.Marshal(map[string]any{
		"type":         "block_actions",
		"user":         map[string]any{"id": user, "username": strings.ToLower(user)},
		"actions":      []any{map[string]any{"type": "button", "action_id": actionID, "value": value}},
		"response_url": responseURL,
		"message":      message,
	})
	if err != nil {
		t.Fatal(err)
	}
	return url.Values{"payload": {string(payload)}}.Encode()
}

// slackSign signs body at ts as Slack does: v0= and the hex HMAC-SHA256
// of "v0:TIMESTAMP:BODY", keyed with the signing secret.
func slackSign(secret string, ts time.Time, body string) (timestamp, signature string) {
	timestamp = strconv.FormatInt(ts.Unix(), 10)
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte("v0:" + timestamp + ":" + body))
	return timestamp, "v0=" + hex.EncodeToString(m.Sum(nil))
}

// postSlack posts body to the interaction endpoint with Slack's headers,
// and no API token.
func postSlack(t *testing.T, env *apiEnv, body, timestamp, signature string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, env.url+"/v1/slack/interactions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if timestamp != "" {
		req.Header.Set("X-Slack-Request-Timestamp", timestamp)
	}
	if signature != "" {
		req.Header.Set("X-Slack-Signature", signature)
	}
	resp, err := env.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw)
}

// TestSlackApproval answers an approval step from a Slack message's
// buttons, with requests signed as Slack signs them: forged, stale and
// future-dated requests are refused, a Slack user the config does not
// map is told so, alice's approve lands in the run as "alice (Slack)" and
// takes the buttons off the message, a replay of her request is refused,
// and bob's later reject is told who answered first.
func TestSlackApproval(t *testing.T) {
	t.Setenv("CHAINGATE_SECRET_SLACK_SIGNING_SECRET", slackSigningSecret)
	env := newAPI(t, slackApprovalConfig)
	env.token = "ops-tok"
	slack := newFakeSlack(t, env)
	responseURL := slack.srv.URL + "/actions/T0TEAM/1234/abcd"

	var started api.StartResponse
	if code, _, raw := env.call("POST", "/v1/chains/restart-db/runs", `{"host": "db-1"}`, nil, &started); code != http.StatusAccepted {
		t.Fatalf("starting the run: %d %s", code, raw)
	}
	id := started.ID
	waitAsking(t, env, id, "ask")
	var v api.RunView
	env.call("GET", "/v1/runs/"+id, "", nil, &v)
	message := v.Steps["post"].Body
	var posted struct {
		Blocks []struct {
			Elements []struct {
				ActionID string `json:"action_id"`
				Value    string `json:"value"`
				URL      string `json:"url"`
			} `json:"elements"`
		} `json:"blocks"`
	}
	if err := json.Unmarshal(message, &posted); err != nil || len(posted.Blocks) != 2 || len(posted.Blocks[1].Elements) != 3 {
		t.Fatalf("the posted message: %v %s", err, message)
	}
	buttons := posted.Blocks[1].Elements
	if buttons[0].Value != id+"/ask" || buttons[2].URL != "https://gw.example.com/ui/runs/"+id+"/steps/ask" {
		t.Errorf("the buttons' value and link: %+v", buttons)
	}
	value := buttons[0].Value

	now := time.Now()
	approve := slackClick(t, responseURL, "U0ALICE1", "chaingate:approve", value, message)
	for _, tc := range []struct {
		name      string
		secret    string
		at        time.Time
		body      string
		signature string
	}{
		{name: "another secret", secret: "not-the-signing-secret", at: now, body: approve},
		{name: "signed before five minutes", secret: slackSigningSecret, at: now.Add(-5*time.Minute - 10*time.Second), body: approve},
		{name: "signed five minutes ahead", secret: slackSigningSecret, at: now.Add(5*time.Minute + 10*time.Second), body: approve},
		{name: "a body changed after signing", secret: slackSigningSecret, at: now, body: strings.Replace(approve, "U0ALICE1", "U0BOB2", 1)},
		{name: "no signature", at: now, body: approve},
		{name: "a signature that is not hex", at: now, body: approve, signature: "v0=zz"},
		{name: "another scheme", at: now, body: approve, signature: "v1=" + strings.Repeat("ab", 32)},
	} {
		ts, sig := slackSign(tc.secret, tc.at, approve)
		if tc.secret == "" {
			sig = tc.signature
		}
		if code, raw := postSlack(t, env, tc.body, ts, sig); code != http.StatusUnauthorized || !strings.Contains(raw, `"code":"unauthorized"`) {
			t.Errorf("%s: %d %s, want 401", tc.name, code, raw)
		}
	}
	if code, raw := postSlack(t, env, approve, "", ""); code != http.StatusUnauthorized {
		t.Errorf("no Slack headers at all: %d %s, want 401", code, raw)
	}
	logsSay(t, env, `"msg":"Slack request refused"`, "does not match the body", "more than 5m0s from this gateway's clock", "is not v0= and a hex HMAC-SHA256")

	// A click on the link button is Slack's to acknowledge, and answers
	// nothing.
	link := slackClick(t, responseURL, "U0ALICE1", "open", "", message)
	if code, raw := postSigned(t, env, link); code != http.StatusOK {
		t.Errorf("the link button's click: %d %s", code, raw)
	}

	eve := slackClick(t, responseURL, "U0EVE99", "chaingate:approve", value, message)
	if code, raw := postSigned(t, env, eve); code != http.StatusOK {
		t.Fatalf("an unmapped user's click: %d %s", code, raw)
	}
	r := slack.reply(t)
	if r["response_type"] != "ephemeral" || r["replace_original"] != false || !strings.Contains(r["text"].(string), "your Slack user ID, U0EVE99, is not one of them") || r["_path"] != "/actions/T0TEAM/1234/abcd" {
		t.Errorf("the reply to an unmapped user: %v", r)
	}

	ts, sig := slackSign(slackSigningSecret, time.Now(), approve)
	if code, raw := postSlack(t, env, approve, ts, sig); code != http.StatusOK {
		t.Fatalf("alice's approve: %d %s", code, raw)
	}
	r = slack.reply(t)
	blocks, _ := json.Marshal(r["blocks"])
	if r["replace_original"] != true || r["response_type"] != nil || r["text"] != "Restart db-1?" {
		t.Errorf("the reply to alice's approve does not replace the message: %v", r)
	}
	if s := string(blocks); !strings.Contains(s, `"text":"Restart db-1?"`) || strings.Contains(s, "chaingate:") || !strings.Contains(s, `"action_id":"open"`) ||
		!strings.Contains(s, `{"elements":[{"emoji":true,"text":":white_check_mark: Approved by alice (Slack) at `) {
		t.Errorf("the answered message's blocks: %s", s)
	}

	if code, raw := postSlack(t, env, approve, ts, sig); code != http.StatusUnauthorized {
		t.Errorf("alice's approve sent again: %d %s, want 401", code, raw)
	}
	logsSay(t, env, "the same signed request was taken before")

	bob := slackClick(t, responseURL, "U0BOB2", "chaingate:reject", value, message)
	if code, raw := postSigned(t, env, bob); code != http.StatusOK {
		t.Fatalf("bob's reject: %d %s", code, raw)
	}
	if r = slack.reply(t); r["response_type"] != "ephemeral" || !strings.Contains(r["text"].(string), "Your answer was not recorded: answering step \"ask\" of run "+id+": already answered: approve by alice (Slack)") {
		t.Errorf("the reply to bob's later reject: %v", r)
	}

	end := waitRunEnd(t, env, id)
	if end.Status != "succeeded" || !strings.Contains(string(end.Body), `"by":"alice (Slack)"`) {
		t.Errorf("the run: %s %s", end.Status, end.Body)
	}
	var answered []string
	for _, ev := range readSSE(t, env, id, "") {
		if ev.Step == "ask" && ev.Type == "step_succeeded" {
			answered = append(answered, ev.Message)
		}
	}
	if len(answered) != 1 || answered[0] != "approved by alice (Slack)" {
		t.Errorf("the approval's events: %q", answered)
	}
	logsSay(t, env, `"msg":"Slack answer refused: [gateway.slack] users does not name the Slack user"`, `"slack_user":"U0EVE99"`)
}

// postSigned posts body to the interaction endpoint signed now with the
// signing secret, as Slack would.
func postSigned(t *testing.T, env *apiEnv, body string) (int, string) {
	t.Helper()
	ts, sig := slackSign(slackSigningSecret, time.Now(), body)
	return postSlack(t, env, body, ts, sig)
}

// TestSlackApprovalErrors checks what a click is told when its answer
// cannot be recorded: a run that does not exist, a button that is not
// an answer button, and a run that has ended.
func TestSlackApprovalErrors(t *testing.T) {
	t.Setenv("CHAINGATE_SECRET_SLACK_SIGNING_SECRET", slackSigningSecret)
	env := newAPI(t, slackApprovalConfig)
	env.token = "ops-tok"
	slack := newFakeSlack(t, env)
	responseURL := slack.srv.URL + "/actions/T0TEAM/1/x"

	for _, tc := range []struct {
		name, actionID, value, says string
	}{
		{"no such run", "chaingate:approve", "01nosuchrun/ask", `Your answer was not recorded: answering step "ask" of run 01nosuchrun:`},
		{"no step in the value", "chaingate:approve", "01nosuchrun", `This button answers nothing: an answer button's action_id is "chaingate:approve" or "chaingate:reject", and its value is the run and the step, "&lt;&lt;run.id&gt;&gt;/STEP"; this one has "chaingate:approve" and "01nosuchrun".`},
		{"another decision", "chaingate:maybe", "01nosuchrun/ask", `this one has "chaingate:maybe"`},
	} {
		click := slackClick(t, responseURL, "U0ALICE1", tc.actionID, tc.value, nil)
		if code, raw := postSigned(t, env, click); code != http.StatusOK {
			t.Fatalf("%s: %d %s", tc.name, code, raw)
		}
		if r := slack.reply(t); r["response_type"] != "ephemeral" || !strings.Contains(r["text"].(string), tc.says) {
			t.Errorf("%s: the reply %v, want it to say %s", tc.name, r, tc.says)
		}
	}

	var started api.StartResponse
	env.call("POST", "/v1/chains/restart-db/runs", `{"host": "db-2"}`, nil, &started)
	waitAsking(t, env, started.ID, "ask")
	if code, _, raw := env.call("POST", "/v1/runs/"+started.ID+"/cancel", "", nil, nil); code != http.StatusAccepted {
		t.Fatalf("cancelling: %d %s", code, raw)
	}
	waitRunEnd(t, env, started.ID)
	click := slackClick(t, responseURL, "U0ALICE1", "chaingate:approve", started.ID+"/ask", nil)
	if code, raw := postSigned(t, env, click); code != http.StatusOK {
		t.Fatalf("a click on an ended run's button: %d %s", code, raw)
	}
	if r := slack.reply(t); r["text"] != `Your answer was not recorded: answering step "ask" of run `+started.ID+`: run already finished (cancelled)` {
		t.Errorf("the reply to a click on an ended run: %v", r)
	}

	if code, raw := postSigned(t, env, "payload=%7Bnot+json"); code != http.StatusBadRequest || !strings.Contains(raw, "invalid_payload") {
		t.Errorf("a signed body that is not an interaction: %d %s", code, raw)
	}
}

// TestSlackInteractionsNotConfigured checks the endpoint of a gateway
// without [gateway.slack].
func TestSlackInteractionsNotConfigured(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	if code, raw := postSlack(t, env, "payload=%7B%7D", "1", "v0=00"); code != http.StatusNotFound || !strings.Contains(raw, "no [gateway.slack]") {
		t.Errorf("%d %s, want 404", code, raw)
	}
}

// TestSlackResponseURLs checks that a gateway posts replies only to the
// response URLs of the hosts [gateway.slack] response_url_hosts allows,
// Slack's own when it is unset: https, that host exactly, no port, no
// user info.
func TestSlackResponseURLs(t *testing.T) {
	t.Parallel()
	gov := []string{"hooks.slack-gov.com"}
	for _, tc := range []struct {
		raw   string
		hosts []string
		want  bool
	}{
		{"https://hooks.slack.com/actions/T0TEAM/1234/abcd", nil, true},
		{"https://HOOKS.slack.com/actions/T0TEAM/1234/abcd", nil, true},
		{"http://hooks.slack.com/actions/T0TEAM/1234/abcd", nil, false},
		{"https://hooks.slack.com:8443/actions/T/1/x", nil, false},
		{"https://hooks.slack.com.example.com/actions/T/1/x", nil, false},
		{"https://user@hooks.slack.com/actions/T/1/x", nil, false},
		{"https://example.com/hooks.slack.com", nil, false},
		{"https://127.0.0.1/actions", nil, false},
		{"https://hooks.slack-gov.com/actions/T0/1/x", nil, false},
		{"https://hooks.slack-gov.com/actions/T0/1/x", gov, true},
		{"https://hooks.slack.com/actions/T0/1/x", gov, false},
		{"https://evil.hooks.slack-gov.com/actions/T0/1/x", gov, false},
		{"https://hooks.slack-gov.com.evil.com/actions/T0/1/x", gov, false},
		{"https://hooks.slack-gov.com:444/actions/T0/1/x", gov, false},
		{"http://hooks.slack-gov.com/actions/T0/1/x", gov, false},
		{"https://hooks.slack.com/actions/T0/1/x", []string{"hooks.slack-gov.com", "hooks.slack.com"}, true},
	} {
		if got := server.SlackResponseURLAllowed(tc.raw, tc.hosts); got != tc.want {
			t.Errorf("%s with hosts %q: allowed %v, want %v", tc.raw, tc.hosts, got, tc.want)
		}
	}
}

// TestSlackSigningSecretMissing checks that a gateway without the secret
// that holds the signing secret is a config error at its key.
func TestSlackSigningSecretMissing(t *testing.T) {
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "gw.toml")
	if err := os.WriteFile(cfgFile, []byte("[gateway.slack]\nsigning_secret = \"<<secrets.SLACK_SIGNING_SECRET_NOT_SET>>\"\nusers = { U0ALICE1 = \"alice\" }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := gateway.LoadConfig([]string{cfgFile})
	if err != nil {
		t.Fatal(err)
	}
	var ce *chain.ConfigError
	err = gateway.CheckSecrets(context.Background(), cfg)
	if !errors.As(err, &ce) || len(ce.Diagnostics) != 1 ||
		ce.Diagnostics[0].String() != cfgFile+":2:1: gateway.slack.signing_secret: <<secrets.SLACK_SIGNING_SECRET_NOT_SET>>: no secret SLACK_SIGNING_SECRET_NOT_SET for the Slack app's signing secret: set CHAINGATE_SECRET_SLACK_SIGNING_SECRET_NOT_SET" {
		t.Errorf("got %v", err)
	}
	t.Setenv("CHAINGATE_SECRET_SLACK_SIGNING_SECRET_NOT_SET", " ")
	if err := gateway.CheckSecrets(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "the secret SLACK_SIGNING_SECRET_NOT_SET is empty") {
		t.Errorf("an empty secret: %v", err)
	}
}
