package opsgenie_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/internal/apicall"
	"github.com/chaingate/gateway/providers/opsgenie"
	"github.com/chaingate/gateway/providers/opsgenie/opsgenietest"
)

const genieKey = "GenieKey " + opsgenietest.APIKey

func TestExecute(t *testing.T) {
	srv := opsgenietest.NewServer()
	defer srv.Close()
	cfg := `{"api_key":"` + opsgenietest.APIKey + `","base_url":"` + srv.URL + `"}`
	longAlias := strings.Repeat("run-0123456789/", 40) // 600 bytes
	shortAlias := apicall.ShortenKey(longAlias, 512)
	longMessage := strings.Repeat("m", 200)

	for _, tc := range []struct {
		name       string
		action     string
		config     string
		payload    string
		faults     []opsgenietest.Fault
		wantPath   string // escaped, "" when no request is expected
		wantQuery  string
		wantSent   string
		wantAlias  string // in the body
		wantCode   string
		retryable  bool
		retryAfter time.Duration
		wantInMsg  string
	}{
		{
			name: "create_alert with every field", action: "create_alert", config: cfg,
			payload: `{"message":"db <primary> down","alias":"db-1","description":"disk full","responders":[{"type":"team","name":"dba"},{"type":"user","username":"ann@example.com"}],
				"visibleTo":[{"type":"team","id":"4513b7ea"}],"actions":["Restart"],"tags":["prod","db"],"details":{"host":"db-1"},"entity":"db-1","source":"chaingate","priority":"P1","user":"gateway","note":"auto"}`,
			wantPath: "/v2/alerts",
			wantSent: `{"message":"db <primary> down","alias":"db-1","description":"disk full","responders":[{"type":"team","name":"dba"},{"type":"user","username":"ann@example.com"}],
				"visibleTo":[{"type":"team","id":"4513b7ea"}],"actions":["Restart"],"tags":["prod","db"],"details":{"host":"db-1"},"entity":"db-1","source":"chaingate","priority":"P1","user":"gateway","note":"auto"}`,
			wantAlias: "db-1",
		},
		{
			name: "create_alert takes the step's dedup key as alias", action: "create_alert", config: cfg, payload: `{"message":"m"}`,
			wantPath: "/v2/alerts", wantSent: `{"message":"m","alias":"run-1/alert"}`, wantAlias: "run-1/alert",
		},
		{
			name: "create_alert shortens a long alias and message", action: "create_alert", config: cfg, payload: `{"message":"` + longMessage + `","alias":"` + longAlias + `"}`,
			wantPath: "/v2/alerts", wantSent: `{"message":"` + longMessage[:129] + `…","alias":"` + shortAlias + `"}`, wantAlias: shortAlias,
		},
		{
			name: "acknowledge_alert", action: "acknowledge_alert", config: cfg, payload: `{"alias":"db 1/disk","user":"gateway","note":"on it"}`,
			wantPath: "/v2/alerts/db%201%2Fdisk/acknowledge", wantQuery: "identifierType=alias", wantSent: `{"user":"gateway","note":"on it"}`, wantAlias: "db 1/disk",
		},
		{
			name: "close_alert", action: "close_alert", config: cfg, payload: `{"alias":"` + longAlias + `","source":"chaingate"}`,
			wantPath: "/v2/alerts/" + strings.ReplaceAll(shortAlias, "/", "%2F") + "/close", wantQuery: "identifierType=alias", wantSent: `{"source":"chaingate"}`, wantAlias: shortAlias,
		},
		{
			name: "close_alert with only the alias", action: "close_alert", config: cfg, payload: `{"alias":"a"}`,
			wantPath: "/v2/alerts/a/close", wantQuery: "identifierType=alias", wantSent: `{}`, wantAlias: "a",
		},
		{
			name: "429", action: "create_alert", config: cfg, payload: `{"message":"m"}`, faults: []opsgenietest.Fault{opsgenietest.RateLimited(4)},
			wantPath: "/v2/alerts", wantCode: "opsgenie_http_429", retryable: true, retryAfter: 4 * time.Second, wantInMsg: "opsgenie create_alert: HTTP 429 Too Many Requests: You are making too many requests",
		},
		{name: "500", action: "close_alert", config: cfg, payload: `{"alias":"a"}`, faults: []opsgenietest.Fault{opsgenietest.Error(500, "Internal Server Error")}, wantPath: "/v2/alerts/a/close", wantQuery: "identifierType=alias", wantCode: "opsgenie_http_500", retryable: true},
		{name: "503 without a body", action: "create_alert", config: cfg, payload: `{"message":"m"}`, faults: []opsgenietest.Fault{{Status: 503}}, wantPath: "/v2/alerts", wantCode: "opsgenie_http_503", retryable: true},
		{name: "400", action: "create_alert", config: cfg, payload: `{"message":"m"}`, faults: []opsgenietest.Fault{opsgenietest.Error(400, "Invalid request")}, wantPath: "/v2/alerts", wantCode: "opsgenie_http_400", wantInMsg: "Invalid request (request id"},
		{name: "403", action: "create_alert", config: cfg, payload: `{"message":"m"}`, faults: []opsgenietest.Fault{opsgenietest.Error(403, "Not authorized")}, wantPath: "/v2/alerts", wantCode: "opsgenie_http_403"},
		{name: "404", action: "acknowledge_alert", config: cfg, payload: `{"alias":"a"}`, faults: []opsgenietest.Fault{opsgenietest.Error(404, "Alert not found")}, wantPath: "/v2/alerts/a/acknowledge", wantQuery: "identifierType=alias", wantCode: "opsgenie_http_404"},
		{
			name: "wrong key", action: "create_alert", config: `{"api_key":"nope","base_url":"` + srv.URL + `"}`, payload: `{"message":"m"}`,
			wantPath: "/v2/alerts", wantCode: "opsgenie_http_401", wantInMsg: "Could not authenticate",
		},
		{
			name: "422 names the field", action: "create_alert", config: cfg, payload: `{"message":"m","responders":[{"type":"team","name":"x"}]}`,
			faults:   []opsgenietest.Fault{{Status: 422, Body: `{"message":"Request has validation errors","errors":{"responders":"Invalid","tags":"Too many"},"took":0.1,"requestId":"r-1"}`}},
			wantPath: "/v2/alerts", wantCode: "opsgenie_http_422", wantInMsg: "Request has validation errors; responders: Invalid; tags: Too many (request id r-1)",
		},
		{name: "2xx that is not Opsgenie's", action: "create_alert", config: cfg, payload: `{"message":"m"}`, faults: []opsgenietest.Fault{{Status: 202, Body: "ok"}}, wantPath: "/v2/alerts", wantCode: "opsgenie_bad_response"},
		{name: "missing message", action: "create_alert", config: cfg, payload: `{"alias":"a"}`, wantCode: "bad_payload", wantInMsg: "message is required"},
		{name: "bad priority", action: "create_alert", config: cfg, payload: `{"message":"m","priority":"high"}`, wantCode: "bad_payload", wantInMsg: `priority "high"`},
		{name: "bad responder type", action: "create_alert", config: cfg, payload: `{"message":"m","responders":[{"type":"group","name":"x"}]}`, wantCode: "bad_payload", wantInMsg: `responders[0].type "group"`},
		{name: "responder without identity", action: "create_alert", config: cfg, payload: `{"message":"m","responders":[{"type":"team"}]}`, wantCode: "bad_payload", wantInMsg: "needs an id, a name or a username"},
		{name: "visibleTo takes no schedule", action: "create_alert", config: cfg, payload: `{"message":"m","visibleTo":[{"type":"schedule","name":"x"}]}`, wantCode: "bad_payload", wantInMsg: "visibleTo[0]"},
		{name: "details must be strings", action: "create_alert", config: cfg, payload: `{"message":"m","details":{"n":1}}`, wantCode: "bad_payload", wantInMsg: "details"},
		{name: "unknown payload field", action: "create_alert", config: cfg, payload: `{"message":"m","visible_to":[]}`, wantCode: "bad_payload", wantInMsg: `unknown field "visible_to"`},
		{name: "acknowledge without alias", action: "acknowledge_alert", config: cfg, payload: `{"user":"u"}`, wantCode: "bad_payload", wantInMsg: "alias is required"},
		{name: "close takes no message", action: "close_alert", config: cfg, payload: `{"alias":"a","message":"m"}`, wantCode: "bad_payload", wantInMsg: `unknown field "message"`},
		{name: "unknown action", action: "create", config: cfg, payload: `{}`, wantCode: "bad_action_type"},
		{name: "no api_key", action: "create_alert", config: `{}`, payload: `{"message":"m"}`, wantCode: "bad_config", wantInMsg: "no api_key"},
		{name: "api_key with a newline", action: "create_alert", config: `{"api_key":"k\r\nX: y"}`, payload: `{"message":"m"}`, wantCode: "bad_config", wantInMsg: "control character"},
		{name: "unknown config key", action: "create_alert", config: `{"api_key":"k","region":"eu"}`, payload: `{"message":"m"}`, wantCode: "bad_config", wantInMsg: `unknown field "region"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv.Reset()
			for _, f := range tc.faults {
				srv.FailNext(1, f)
			}
			resp, err := opsgenie.New().Execute(context.Background(), providers.Request{
				ActionType: tc.action, Config: json.RawMessage(tc.config), Payload: json.RawMessage(tc.payload), DedupKey: "run-1/alert", Attempt: 1,
			})
			reqs := srv.Requests()
			switch {
			case tc.wantPath == "" && len(reqs) != 0:
				t.Errorf("sent %d requests, want none", len(reqs))
			case tc.wantPath != "":
				if len(reqs) != 1 {
					t.Fatalf("sent %d requests, want 1", len(reqs))
				}
				r := reqs[0]
				if r.Method != "POST" || r.Path != tc.wantPath || r.Query != tc.wantQuery || r.Header.Get("Content-Type") != "application/json" ||
					(tc.wantCode != "opsgenie_http_401" && r.Header.Get("Authorization") != genieKey) {
					t.Errorf("sent %s %s?%s type %q auth %q", r.Method, r.Path, r.Query, r.Header.Get("Content-Type"), r.Header.Get("Authorization"))
				}
				if tc.wantSent != "" {
					assertJSON(t, r.Body, tc.wantSent)
				}
			}
			if tc.wantCode != "" {
				var pe *providers.Error
				if !errors.As(err, &pe) {
					t.Fatalf("error %v is not a *providers.Error", err)
				}
				if pe.Code != tc.wantCode || pe.Retryable != tc.retryable || pe.RetryAfter != tc.retryAfter || !strings.Contains(pe.Message, tc.wantInMsg) {
					t.Errorf("error %+v, want code %s retryable %v retry after %v containing %q", pe, tc.wantCode, tc.retryable, tc.retryAfter, tc.wantInMsg)
				}
				if strings.Contains(pe.Message, opsgenietest.APIKey) {
					t.Errorf("message %q reveals the key", pe.Message)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var body struct {
				Alias     string `json:"alias"`
				RequestID string `json:"request_id"`
				Result    string `json:"result"`
			}
			if err := json.Unmarshal(resp.Body, &body); err != nil {
				t.Fatal(err)
			}
			if body.Alias != tc.wantAlias || body.RequestID == "" || body.Result != "Request will be processed" {
				t.Errorf("body = %s, want alias %q", resp.Body, tc.wantAlias)
			}
		})
	}
}

// TestCreateAckClose chains steps as a chain would, the create retried.
func TestCreateAckClose(t *testing.T) {
	srv := opsgenietest.NewServer()
	defer srv.Close()
	p := opsgenie.New()
	cfg := json.RawMessage(`{"api_key":"` + opsgenietest.APIKey + `","base_url":"` + srv.URL + `"}`)
	call := func(action, payload string) string {
		t.Helper()
		resp, err := p.Execute(context.Background(), providers.Request{ActionType: action, Config: cfg, Payload: json.RawMessage(payload), DedupKey: "run-9/alert"})
		if err != nil {
			t.Fatalf("%s: %v", action, err)
		}
		var body struct {
			Alias string `json:"alias"`
		}
		if err := json.Unmarshal(resp.Body, &body); err != nil {
			t.Fatal(err)
		}
		return body.Alias
	}
	alias := call("create_alert", `{"message":"queue backlog","priority":"P2"}`)
	call("create_alert", `{"message":"queue backlog","priority":"P2"}`)
	call("acknowledge_alert", `{"alias":"`+alias+`"}`)
	acked := srv.Alerts()
	call("close_alert", `{"alias":"`+alias+`","note":"drained"}`)

	if len(acked) != 1 || !acked[0].Acknowledged || acked[0].Status != "open" {
		t.Errorf("after acknowledge: %+v", acked)
	}
	want := []opsgenietest.Alert{{Alias: "run-9/alert", Message: "queue backlog", Priority: "P2", Status: "closed", Acknowledged: true, Count: 2}}
	if got := srv.Alerts(); !reflect.DeepEqual(got, want) {
		t.Errorf("alerts = %+v, want %+v", got, want)
	}
}

func TestCancelled(t *testing.T) {
	srv := opsgenietest.NewServer()
	defer srv.Close()
	srv.SetLatency(2 * time.Minute) // only the context can end the call
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := opsgenie.New().Execute(ctx, providers.Request{
		ActionType: "create_alert", Config: json.RawMessage(`{"api_key":"` + opsgenietest.APIKey + `","base_url":"` + srv.URL + `"}`),
		Payload: json.RawMessage(`{"message":"m"}`),
	})
	if !errors.Is(err, context.DeadlineExceeded) || !providers.IsRetryable(err) {
		t.Errorf("error %v is not a retryable context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("returned after %v", d)
	}
}

func TestDescribe(t *testing.T) {
	info, err := opsgenie.New().Describe(context.Background())
	if err != nil || info.Name != "opsgenie" || !reflect.DeepEqual(info.ActionTypes, []string{"create_alert", "acknowledge_alert", "close_alert"}) {
		t.Errorf("Describe = %+v, %v", info, err)
	}
	var schema struct {
		Properties map[string]map[string]any `json:"properties"`
	}
	if err := json.Unmarshal(info.ConfigSchema, &schema); err != nil {
		t.Fatal(err)
	}
	if schema.Properties["api_key"]["x-secret"] != true || schema.Properties["base_url"]["x-secret"] != nil {
		t.Errorf("schema properties = %v", schema.Properties)
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
