package slack_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/slack"
	"github.com/chaingate/gateway/providers/slack/slacktest"
)

// sent is what a case expects the fake to have received.
type sent struct {
	path        string
	auth        string // Authorization header; "-" for none
	contentType string
	body        string // JSON, compared as values
}

func TestExecute(t *testing.T) {
	srv := slacktest.NewServer()
	defer srv.Close()
	apiConfig := `{"token":"` + slacktest.Token + `","base_url":"` + srv.BaseURL() + `"}`
	hookConfig := `{"webhook_url":"` + srv.WebhookURL() + `"}`
	bearer := "Bearer " + slacktest.Token
	const jsonUTF8 = "application/json; charset=utf-8"

	for _, tc := range []struct {
		name       string
		action     string
		config     string
		payload    string
		faults     []slacktest.Fault
		want       []sent // every request, in order; nil: none
		wantBody   string // JSON with "TS" standing for the ts the fake gave
		wantCode   string
		retryable  bool
		retryAfter time.Duration
		wantInMsg  string
	}{
		{
			name: "post_message", action: "post_message", config: apiConfig,
			payload: `{"channel":"#ops","text":"disk <full> & more","blocks":[{"type":"section","text":{"type":"mrkdwn","text":"*disk*"}}],"unfurl_links":false,"username":"gateway","icon_emoji":":rotating_light:"}`,
			want: []sent{{path: "/api/chat.postMessage", auth: bearer, contentType: jsonUTF8,
				body: `{"channel":"#ops","text":"disk <full> & more","blocks":[{"type":"section","text":{"type":"mrkdwn","text":"*disk*"}}],"unfurl_links":false,"username":"gateway","icon_emoji":":rotating_light:"}`}},
			wantBody: `{"ok":true,"channel":"` + slacktest.ChannelID("#ops") + `","ts":"TS"}`,
		},
		{
			name: "post_message in a thread", action: "post_message", config: apiConfig,
			payload: `{"channel":"C0123456789","text":"update","thread_ts":"1503435956.000247","reply_broadcast":true,"mrkdwn":true}`,
			want: []sent{{path: "/api/chat.postMessage", auth: bearer, contentType: jsonUTF8,
				body: `{"channel":"C0123456789","text":"update","thread_ts":"1503435956.000247","reply_broadcast":true,"mrkdwn":true}`}},
			wantBody: `{"ok":true,"channel":"C0123456789","ts":"TS","thread_ts":"1503435956.000247"}`,
		},
		{
			name: "post_message with attachments only, null blocks", action: "post_message", config: apiConfig,
			payload: `{"channel":"C0123456789","attachments":[{"color":"#ff0000","text":"down"}],"blocks":null}`,
			want: []sent{{path: "/api/chat.postMessage", auth: bearer, contentType: jsonUTF8,
				body: `{"channel":"C0123456789","attachments":[{"color":"#ff0000","text":"down"}]}`}},
			wantBody: `{"ok":true,"channel":"C0123456789","ts":"TS"}`,
		},
		{
			name: "webhook_message", action: "webhook_message", config: hookConfig,
			payload:  `{"text":"hello","unfurl_media":false}`,
			want:     []sent{{path: slacktest.WebhookPath, auth: "-", contentType: "application/json", body: `{"text":"hello","unfurl_media":false}`}},
			wantBody: `{"ok":true}`,
		},
		{
			name: "ok:false ratelimited", action: "post_message", config: apiConfig, payload: `{"channel":"C0123456789","text":"x"}`,
			faults:   []slacktest.Fault{{Status: 200, RetryAfter: "7", ContentType: "application/json", Body: `{"ok":false,"error":"ratelimited"}`}},
			want:     []sent{{path: "/api/chat.postMessage", auth: bearer, contentType: jsonUTF8, body: `{"channel":"C0123456789","text":"x"}`}},
			wantCode: "slack_ratelimited", retryable: true, retryAfter: 7 * time.Second,
		},
		{
			name: "HTTP 429", action: "post_message", config: apiConfig, payload: `{"channel":"C0123456789","text":"x"}`,
			faults:   []slacktest.Fault{slacktest.RateLimited(30)},
			want:     []sent{{path: "/api/chat.postMessage", auth: bearer, contentType: jsonUTF8, body: `{"channel":"C0123456789","text":"x"}`}},
			wantCode: "slack_ratelimited", retryable: true, retryAfter: 30 * time.Second, wantInMsg: "slack chat.postMessage: HTTP 429 Too Many Requests: ratelimited",
		},
		{
			name: "HTTP 429 with an HTTP date", action: "post_message", config: apiConfig, payload: `{"channel":"C0123456789","text":"x"}`,
			faults:   []slacktest.Fault{{Status: 429, RetryAfter: time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)}},
			want:     []sent{{path: "/api/chat.postMessage", auth: bearer, contentType: jsonUTF8, body: `{"channel":"C0123456789","text":"x"}`}},
			wantCode: "slack_http_429", retryable: true, retryAfter: time.Hour,
		},
		{name: "internal_error", action: "post_message", config: apiConfig, payload: `{"channel":"C1","text":"x"}`, faults: []slacktest.Fault{slacktest.APIError("internal_error")}, wantCode: "slack_internal_error", retryable: true},
		{name: "fatal_error", action: "post_message", config: apiConfig, payload: `{"channel":"C1","text":"x"}`, faults: []slacktest.Fault{slacktest.APIError("fatal_error")}, wantCode: "slack_fatal_error", retryable: true},
		{name: "service_unavailable", action: "update_message", config: apiConfig, payload: `{"channel":"C1","ts":"1.2","text":"x"}`, faults: []slacktest.Fault{slacktest.APIError("service_unavailable")}, wantCode: "slack_service_unavailable", retryable: true},
		{name: "request_timeout", action: "post_message", config: apiConfig, payload: `{"channel":"C1","text":"x"}`, faults: []slacktest.Fault{slacktest.APIError("request_timeout")}, wantCode: "slack_request_timeout", retryable: true},
		{name: "HTTP 503", action: "post_message", config: apiConfig, payload: `{"channel":"C1","text":"x"}`, faults: []slacktest.Fault{{Status: 503, Body: "upstream connect error"}}, wantCode: "slack_http_503", retryable: true, wantInMsg: "HTTP 503 Service Unavailable: upstream connect error"},
		{name: "channel_not_found", action: "post_message", config: apiConfig, payload: `{"channel":"C1","text":"x"}`, faults: []slacktest.Fault{slacktest.APIError("channel_not_found")}, wantCode: "slack_channel_not_found", wantInMsg: "slack chat.postMessage: channel_not_found"},
		{name: "not_in_channel", action: "post_message", config: apiConfig, payload: `{"channel":"C1","text":"x"}`, faults: []slacktest.Fault{slacktest.APIError("not_in_channel")}, wantCode: "slack_not_in_channel"},
		{name: "missing_scope", action: "post_message", config: apiConfig, payload: `{"channel":"C1","text":"x"}`, faults: []slacktest.Fault{slacktest.APIError("missing_scope")}, wantCode: "slack_missing_scope"},
		{name: "token_revoked", action: "post_message", config: apiConfig, payload: `{"channel":"C1","text":"x"}`, faults: []slacktest.Fault{slacktest.APIError("token_revoked")}, wantCode: "slack_token_revoked"},
		{name: "unknown error is permanent", action: "post_message", config: apiConfig, payload: `{"channel":"C1","text":"x"}`, faults: []slacktest.Fault{slacktest.APIError("something_new")}, wantCode: "slack_something_new"},
		{
			name: "wrong token", action: "post_message", config: `{"token":"xoxb-wrong","base_url":"` + srv.BaseURL() + `"}`, payload: `{"channel":"C1","text":"x"}`,
			want:     []sent{{path: "/api/chat.postMessage", auth: "Bearer xoxb-wrong", contentType: jsonUTF8, body: `{"channel":"C1","text":"x"}`}},
			wantCode: "slack_invalid_auth",
		},
		{
			name: "text over Slack's limit", action: "post_message", config: apiConfig, payload: `{"channel":"C1","text":"` + strings.Repeat("x", 40001) + `"}`,
			wantCode: "slack_msg_too_long",
		},
		{
			name: "blocks without type", action: "post_message", config: apiConfig, payload: `{"channel":"C1","blocks":[{"text":"x"}]}`,
			wantCode: "slack_invalid_blocks",
		},
		{
			name: "update of an unknown message", action: "update_message", config: apiConfig, payload: `{"channel":"C0123456789","ts":"1.000001","text":"x"}`,
			want:     []sent{{path: "/api/chat.update", auth: bearer, contentType: jsonUTF8, body: `{"channel":"C0123456789","ts":"1.000001","text":"x"}`}},
			wantCode: "slack_message_not_found",
		},
		{name: "wrong base_url answers 404", action: "post_message", config: `{"token":"t","base_url":"` + srv.URL + `/nope"}`, payload: `{"channel":"C1","text":"x"}`, wantCode: "slack_http_404"},
		{name: "webhook 404 no_service", action: "webhook_message", config: hookConfig, payload: `{"text":"x"}`, faults: []slacktest.Fault{slacktest.WebhookError(404, "no_service")}, wantCode: "slack_no_service", wantInMsg: "slack webhook: HTTP 404 Not Found: no_service"},
		{name: "webhook 410 channel_is_archived", action: "webhook_message", config: hookConfig, payload: `{"text":"x"}`, faults: []slacktest.Fault{slacktest.WebhookError(410, "channel_is_archived")}, wantCode: "slack_channel_is_archived"},
		{name: "webhook 400 invalid_payload", action: "webhook_message", config: hookConfig, payload: `{"text":"x"}`, faults: []slacktest.Fault{slacktest.WebhookError(400, "invalid_payload")}, wantCode: "slack_invalid_payload"},
		{name: "webhook 500 is retryable", action: "webhook_message", config: hookConfig, payload: `{"text":"x"}`, faults: []slacktest.Fault{slacktest.WebhookError(500, "rollup_error")}, wantCode: "slack_rollup_error", retryable: true},
		{name: "webhook 429", action: "webhook_message", config: hookConfig, payload: `{"text":"x"}`, faults: []slacktest.Fault{{Status: 429, RetryAfter: "2", Body: "rate_limited"}}, wantCode: "slack_rate_limited", retryable: true, retryAfter: 2 * time.Second},
		{name: "webhook answer that is no code", action: "webhook_message", config: hookConfig, payload: `{"text":"x"}`, faults: []slacktest.Fault{{Status: 403, Body: "<html>Forbidden</html>"}}, wantCode: "slack_http_403", wantInMsg: "<html>Forbidden</html>"},
		{name: "missing channel", action: "post_message", config: apiConfig, payload: `{"text":"x"}`, wantCode: "bad_payload", wantInMsg: "channel is required"},
		{name: "no text, blocks or attachments", action: "post_message", config: apiConfig, payload: `{"channel":"C1"}`, wantCode: "bad_payload", wantInMsg: "one of text, blocks and attachments"},
		{name: "blocks not an array", action: "post_message", config: apiConfig, payload: `{"channel":"C1","blocks":{"type":"divider"}}`, wantCode: "bad_payload", wantInMsg: "blocks must be an array"},
		{name: "unknown payload field", action: "post_message", config: apiConfig, payload: `{"channel":"C1","text":"x","chanel":"C2"}`, wantCode: "bad_payload", wantInMsg: `unknown field "chanel"`},
		{name: "thread_ts as a number", action: "post_message", config: apiConfig, payload: `{"channel":"C1","text":"x","thread_ts":1503435956.000247}`, wantCode: "bad_payload", wantInMsg: "thread_ts"},
		{name: "update without ts", action: "update_message", config: apiConfig, payload: `{"channel":"C1","text":"x"}`, wantCode: "bad_payload", wantInMsg: "channel and ts are required"},
		{name: "update takes no thread_ts", action: "update_message", config: apiConfig, payload: `{"channel":"C1","ts":"1.2","text":"x","thread_ts":"1.1"}`, wantCode: "bad_payload", wantInMsg: `unknown field "thread_ts"`},
		{name: "webhook takes no channel", action: "webhook_message", config: hookConfig, payload: `{"channel":"C1","text":"x"}`, wantCode: "bad_payload", wantInMsg: `unknown field "channel"`},
		{name: "unknown action", action: "post", config: apiConfig, payload: `{"channel":"C1","text":"x"}`, wantCode: "bad_action_type", wantInMsg: `"post"`},
		{name: "no token", action: "post_message", config: hookConfig, payload: `{"channel":"C1","text":"x"}`, wantCode: "bad_config", wantInMsg: "no token"},
		{name: "no webhook_url", action: "webhook_message", config: apiConfig, payload: `{"text":"x"}`, wantCode: "bad_config", wantInMsg: "no webhook_url"},
		{name: "unknown config key", action: "post_message", config: `{"token":"t","channel":"C1"}`, payload: `{"channel":"C1","text":"x"}`, wantCode: "bad_config", wantInMsg: `unknown field "channel"`},
		{name: "token with a newline", action: "post_message", config: `{"token":"t\nX-Evil: 1"}`, payload: `{"channel":"C1","text":"x"}`, wantCode: "bad_config", wantInMsg: "control character"},
		{name: "base_url not http", action: "post_message", config: `{"token":"t","base_url":"ftp://slack.com/api"}`, payload: `{"channel":"C1","text":"x"}`, wantCode: "bad_config"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv.Reset()
			for _, f := range tc.faults {
				srv.FailNext(1, f)
			}
			resp, err := slack.New().Execute(context.Background(), providers.Request{
				ActionType: tc.action, Config: json.RawMessage(tc.config), Payload: json.RawMessage(tc.payload),
				DedupKey: "run-1/alert", Attempt: 1,
			})
			reqs := srv.Requests()
			if tc.want != nil {
				checkSent(t, reqs, tc.want)
			}
			if tc.wantCode != "" {
				checkError(t, err, tc.wantCode, tc.retryable, tc.retryAfter, tc.wantInMsg)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			msgs := srv.Messages()
			if len(msgs) != 1 {
				t.Fatalf("the fake holds %d messages, want 1", len(msgs))
			}
			assertJSON(t, resp.Body, strings.ReplaceAll(tc.wantBody, `"TS"`, `"`+msgs[0].TS+`"`))
		})
	}
}

// TestThreadAndUpdate chains steps as a chain would: post, reply in the
// thread with the first step's ts, then update the first message.
func TestThreadAndUpdate(t *testing.T) {
	srv := slacktest.NewServer()
	defer srv.Close()
	p := slack.New()
	cfg := json.RawMessage(`{"token":"` + slacktest.Token + `","base_url":"` + srv.BaseURL() + `"}`)
	call := func(action, payload string) map[string]any {
		t.Helper()
		resp, err := p.Execute(context.Background(), providers.Request{ActionType: action, Config: cfg, Payload: json.RawMessage(payload)})
		if err != nil {
			t.Fatalf("%s: %v", action, err)
		}
		var body map[string]any
		if err := json.Unmarshal(resp.Body, &body); err != nil {
			t.Fatal(err)
		}
		return body
	}
	alert := call("post_message", `{"channel":"#incidents","text":"db down"}`)
	reply := call("post_message", fmt.Sprintf(`{"channel":%q,"thread_ts":%q,"text":"paging"}`, alert["channel"], alert["ts"]))
	updated := call("update_message", fmt.Sprintf(`{"channel":%q,"ts":%q,"text":"db down (resolved)"}`, alert["channel"], alert["ts"]))

	if reply["thread_ts"] != alert["ts"] || updated["ts"] != alert["ts"] || updated["channel"] != alert["channel"] {
		t.Errorf("alert %v, reply %v, update %v", alert, reply, updated)
	}
	msgs := srv.Messages()
	if len(msgs) != 2 || msgs[0].Text != "db down (resolved)" || !msgs[0].Edited || msgs[1].ThreadTS != msgs[0].TS {
		t.Errorf("messages = %+v", msgs)
	}
}

func TestCredentialsStayOutOfErrors(t *testing.T) {
	srv := slacktest.NewServer()
	defer srv.Close()
	// An answer that echoes the request, as a misbehaving proxy might.
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadGateway)
		fmt.Fprintf(w, "bad gateway for %s %s", r.Header.Get("Authorization"), r.URL.Path)
	}))
	defer echo.Close()
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	const secretPath = "/services/T1/B1/s3cretwebhookpath"

	const post, hook = `{"channel":"C1","text":"x"}`, `{"text":"x"}`
	for _, tc := range []struct {
		name, action, config, payload string
	}{
		{"echoed token", "post_message", `{"token":"xoxb-s3cret","base_url":"` + echo.URL + `"}`, post},
		{"echoed webhook path", "webhook_message", `{"webhook_url":"` + echo.URL + secretPath + `"}`, hook},
		{"webhook network error", "webhook_message", `{"webhook_url":"` + closed.URL + secretPath + `"}`, hook},
		{"webhook with a bad URL", "webhook_message", `{"webhook_url":"http://[::1` + secretPath + `"}`, hook},
		{"webhook 404", "webhook_message", `{"webhook_url":"` + srv.URL + secretPath + `"}`, hook},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := slack.New().Execute(context.Background(), providers.Request{
				ActionType: tc.action, Config: json.RawMessage(tc.config), Payload: json.RawMessage(tc.payload),
			})
			if err == nil {
				t.Fatal("no error")
			}
			texts := []string{err.Error()}
			if u := errors.Unwrap(err); u != nil {
				texts = append(texts, u.Error())
			}
			for _, text := range texts {
				if strings.Contains(text, "s3cret") {
					t.Errorf("error %q reveals a credential", text)
				}
			}
		})
	}
}

func TestCancelled(t *testing.T) {
	srv := slacktest.NewServer()
	defer srv.Close()
	srv.SetLatency(2 * time.Minute) // only the context can end the call
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := slack.New().Execute(ctx, providers.Request{
		ActionType: "post_message",
		Config:     json.RawMessage(`{"token":"` + slacktest.Token + `","base_url":"` + srv.BaseURL() + `"}`),
		Payload:    json.RawMessage(`{"channel":"C1","text":"x"}`),
	})
	if !errors.Is(err, context.DeadlineExceeded) || !providers.IsRetryable(err) {
		t.Errorf("error %v is not a retryable context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("returned after %v", d)
	}
}

func TestDescribe(t *testing.T) {
	info, err := slack.New().Describe(context.Background())
	if err != nil || info.Name != "slack" || !reflect.DeepEqual(info.ActionTypes, []string{"post_message", "update_message", "webhook_message"}) {
		t.Errorf("Describe = %+v, %v", info, err)
	}
	var schema struct {
		AdditionalProperties bool                      `json:"additionalProperties"`
		Properties           map[string]map[string]any `json:"properties"`
	}
	if err := json.Unmarshal(info.ConfigSchema, &schema); err != nil {
		t.Fatal(err)
	}
	for key, secret := range map[string]bool{"token": true, "webhook_url": true, "base_url": false} {
		if got := schema.Properties[key]["x-secret"] == true; got != secret {
			t.Errorf("%s: x-secret %v, want %v", key, got, secret)
		}
	}
}

func checkSent(t *testing.T, got []slacktest.Request, want []sent) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("the fake got %d requests, want %d", len(got), len(want))
	}
	for i, w := range want {
		g := got[i]
		auth := g.Header.Get("Authorization")
		if auth == "" {
			auth = "-"
		}
		if g.Method != "POST" || g.Path != w.path || g.Query != "" || auth != w.auth || g.Header.Get("Content-Type") != w.contentType {
			t.Errorf("request %d: %s %s?%s auth %q type %q; want POST %s auth %q type %q",
				i, g.Method, g.Path, g.Query, auth, g.Header.Get("Content-Type"), w.path, w.auth, w.contentType)
		}
		assertJSON(t, g.Body, w.body)
	}
}

func checkError(t *testing.T, err error, code string, retryable bool, retryAfter time.Duration, inMsg string) {
	t.Helper()
	var pe *providers.Error
	if !errors.As(err, &pe) {
		t.Fatalf("error %v is not a *providers.Error", err)
	}
	// An HTTP date has whole seconds and the clock moves on.
	if pe.Code != code || pe.Retryable != retryable || !strings.Contains(pe.Message, inMsg) ||
		pe.RetryAfter > retryAfter || pe.RetryAfter < retryAfter-2*time.Second {
		t.Errorf("error %+v, want code %s retryable %v retry after %v, containing %q", pe, code, retryable, retryAfter, inMsg)
	}
}

func assertJSON(t *testing.T, got []byte, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("%q is not JSON: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("want %q is not JSON: %v", want, err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}
