package pagerduty_test

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
	"github.com/chaingate/gateway/providers/pagerduty"
	"github.com/chaingate/gateway/providers/pagerduty/pagerdutytest"
)

const rk = pagerdutytest.RoutingKey

func TestExecute(t *testing.T) {
	srv := pagerdutytest.NewServer()
	defer srv.Close()
	cfg := `{"routing_key":"` + rk + `","base_url":"` + srv.URL + `"}`
	longKey := strings.Repeat("run-0123456789/", 20) // 300 bytes
	shortKey := apicall.ShortenKey(longKey, 255)
	longSummary := strings.Repeat("é", 1100)

	for _, tc := range []struct {
		name       string
		action     string
		config     string
		payload    string
		dedupKey   string // the step's; default run-1/page
		faults     []pagerdutytest.Fault
		wantPath   string // "" when no request is expected
		wantSent   string // the event, JSON
		wantBody   string
		wantCode   string
		retryable  bool
		retryAfter time.Duration
		wantInMsg  string
	}{
		{
			name: "trigger with every field", action: "trigger", config: cfg,
			payload: `{"summary":"db <primary> down","source":"db-1","severity":"critical","timestamp":"2026-11-23T12:00:00Z","component":"postgres","group":"prod","class":"availability",
				"custom_details":{"free":"0%"},"images":[{"src":"https://graphs/x.png","href":"https://graphs/x","alt":"graph"}],"links":[{"href":"https://runbook","text":"runbook"}],"client":"chaingate","client_url":"https://gateway/runs/1"}`,
			wantPath: "/v2/enqueue",
			wantSent: `{"routing_key":"` + rk + `","event_action":"trigger","dedup_key":"run-1/page","payload":{"summary":"db <primary> down","source":"db-1","severity":"critical","timestamp":"2026-11-23T12:00:00Z","component":"postgres","group":"prod","class":"availability","custom_details":{"free":"0%"}},
				"images":[{"src":"https://graphs/x.png","href":"https://graphs/x","alt":"graph"}],"links":[{"href":"https://runbook","text":"runbook"}],"client":"chaingate","client_url":"https://gateway/runs/1"}`,
			wantBody: `{"status":"success","message":"Event processed","dedup_key":"run-1/page"}`,
		},
		{
			name: "trigger with the payload's dedup_key", action: "trigger", config: cfg,
			payload:  `{"summary":"s","source":"x","severity":"info","dedup_key":"db-1/disk"}`,
			wantPath: "/v2/enqueue",
			wantSent: `{"routing_key":"` + rk + `","event_action":"trigger","dedup_key":"db-1/disk","payload":{"summary":"s","source":"x","severity":"info"}}`,
			wantBody: `{"status":"success","message":"Event processed","dedup_key":"db-1/disk"}`,
		},
		{
			name: "trigger with a long step dedup key and summary", action: "trigger", config: cfg, dedupKey: longKey,
			payload:  `{"summary":"` + longSummary + `","source":"x","severity":"warning","custom_details":null}`,
			wantPath: "/v2/enqueue",
			wantSent: `{"routing_key":"` + rk + `","event_action":"trigger","dedup_key":"` + shortKey + `","payload":{"summary":"` + longSummary[:2*1023] + `…","source":"x","severity":"warning"}}`,
			wantBody: `{"status":"success","message":"Event processed","dedup_key":"` + shortKey + `"}`,
		},
		{
			name: "acknowledge", action: "acknowledge", config: cfg, payload: `{"dedup_key":"db-1/disk"}`,
			wantPath: "/v2/enqueue",
			wantSent: `{"routing_key":"` + rk + `","event_action":"acknowledge","dedup_key":"db-1/disk"}`,
			wantBody: `{"status":"success","message":"Event processed","dedup_key":"db-1/disk"}`,
		},
		{
			name: "resolve with a long key shortens it as the trigger did", action: "resolve", config: cfg, payload: `{"dedup_key":"` + longKey + `"}`,
			wantPath: "/v2/enqueue",
			wantSent: `{"routing_key":"` + rk + `","event_action":"resolve","dedup_key":"` + shortKey + `"}`,
			wantBody: `{"status":"success","message":"Event processed","dedup_key":"` + shortKey + `"}`,
		},
		{
			name: "change", action: "change", config: cfg,
			payload:  `{"summary":"deployed v1.2","source":"ci","timestamp":"2026-11-23T12:00:00.000+0000","custom_details":{"sha":"abc"},"links":[{"href":"https://ci/1"}]}`,
			wantPath: "/v2/change/enqueue",
			wantSent: `{"routing_key":"` + rk + `","payload":{"summary":"deployed v1.2","source":"ci","timestamp":"2026-11-23T12:00:00.000+0000","custom_details":{"sha":"abc"}},"links":[{"href":"https://ci/1"}]}`,
			wantBody: `{"status":"success","message":"Change event processed"}`,
		},
		{
			name: "429 with Retry-After", action: "trigger", config: cfg, payload: `{"summary":"s","source":"x","severity":"info"}`,
			faults: []pagerdutytest.Fault{pagerdutytest.RateLimited(12)}, wantPath: "/v2/enqueue",
			wantCode: "pagerduty_http_429", retryable: true, retryAfter: 12 * time.Second, wantInMsg: "pagerduty trigger: HTTP 429 Too Many Requests: Requests for this service are arriving too quickly",
		},
		{
			name: "429 without Retry-After", action: "resolve", config: cfg, payload: `{"dedup_key":"k"}`,
			faults: []pagerdutytest.Fault{{Status: 429}}, wantPath: "/v2/enqueue",
			wantCode: "pagerduty_http_429", retryable: true,
		},
		{
			name: "500", action: "trigger", config: cfg, payload: `{"summary":"s","source":"x","severity":"info"}`,
			faults: []pagerdutytest.Fault{pagerdutytest.ServerError(500)}, wantPath: "/v2/enqueue",
			wantCode: "pagerduty_http_500", retryable: true,
		},
		{
			name: "503 with Retry-After", action: "change", config: cfg, payload: `{"summary":"s"}`,
			faults: []pagerdutytest.Fault{{Status: 503, RetryAfter: "3"}}, wantPath: "/v2/change/enqueue",
			wantCode: "pagerduty_http_503", retryable: true, retryAfter: 3 * time.Second,
		},
		{
			name: "400 names PagerDuty's errors", action: "trigger", config: cfg, payload: `{"summary":"s","source":"x","severity":"info"}`,
			faults: []pagerdutytest.Fault{pagerdutytest.InvalidEvent("'payload.summary' is invalid", "'links' is invalid")}, wantPath: "/v2/enqueue",
			wantCode: "pagerduty_invalid_event", wantInMsg: "pagerduty trigger: HTTP 400 Bad Request: Event object is invalid: 'payload.summary' is invalid: 'links' is invalid",
		},
		{
			name: "wrong routing key", action: "trigger", config: `{"routing_key":"short","base_url":"` + srv.URL + `"}`, payload: `{"summary":"s","source":"x","severity":"info"}`,
			wantPath: "/v2/enqueue",
			wantSent: `{"routing_key":"short","event_action":"trigger","dedup_key":"run-1/page","payload":{"summary":"s","source":"x","severity":"info"}}`,
			wantCode: "pagerduty_invalid_event", wantInMsg: "Length of 'routing_key' is incorrect",
		},
		{name: "bad timestamp refused by PagerDuty", action: "trigger", config: cfg, payload: `{"summary":"s","source":"x","severity":"info","timestamp":"yesterday"}`, wantPath: "/v2/enqueue", wantCode: "pagerduty_invalid_event", wantInMsg: "timestamp"},
		{name: "404 from a wrong base_url", action: "trigger", config: `{"routing_key":"k","base_url":"` + srv.URL + `/api"}`, payload: `{"summary":"s","source":"x","severity":"info"}`, wantPath: "/api/v2/enqueue", wantCode: "pagerduty_http_404"},
		{name: "403", action: "trigger", config: cfg, payload: `{"summary":"s","source":"x","severity":"info"}`, faults: []pagerdutytest.Fault{{Status: 403, Body: "forbidden"}}, wantPath: "/v2/enqueue", wantCode: "pagerduty_http_403"},
		{name: "2xx that is not PagerDuty's", action: "trigger", config: cfg, payload: `{"summary":"s","source":"x","severity":"info"}`, faults: []pagerdutytest.Fault{{Status: 200, Body: "<html>hi</html>"}}, wantPath: "/v2/enqueue", wantCode: "pagerduty_bad_response"},
		{name: "missing summary and source", action: "trigger", config: cfg, payload: `{"severity":"info"}`, wantCode: "bad_payload", wantInMsg: "missing required fields: summary, source"},
		{name: "bad severity", action: "trigger", config: cfg, payload: `{"summary":"s","source":"x","severity":"high"}`, wantCode: "bad_payload", wantInMsg: `severity "high"`},
		{name: "image without src", action: "trigger", config: cfg, payload: `{"summary":"s","source":"x","severity":"info","images":[{"href":"h"}]}`, wantCode: "bad_payload", wantInMsg: "images[0].src"},
		{name: "link without href", action: "change", config: cfg, payload: `{"summary":"s","links":[{"text":"t"}]}`, wantCode: "bad_payload", wantInMsg: "links[0].href"},
		{name: "unknown payload field", action: "trigger", config: cfg, payload: `{"summary":"s","source":"x","severity":"info","severtiy":"info"}`, wantCode: "bad_payload", wantInMsg: `unknown field "severtiy"`},
		{name: "nested payload is not the step's shape", action: "trigger", config: cfg, payload: `{"payload":{"summary":"s"}}`, wantCode: "bad_payload", wantInMsg: `unknown field "payload"`},
		{name: "resolve without dedup_key", action: "resolve", config: cfg, payload: `{}`, wantCode: "bad_payload", wantInMsg: "dedup_key is required"},
		{name: "resolve takes no summary", action: "resolve", config: cfg, payload: `{"dedup_key":"k","summary":"s"}`, wantCode: "bad_payload", wantInMsg: `unknown field "summary"`},
		{name: "change without summary", action: "change", config: cfg, payload: `{"source":"ci"}`, wantCode: "bad_payload", wantInMsg: "summary is required"},
		{name: "unknown action", action: "page", config: cfg, payload: `{}`, wantCode: "bad_action_type"},
		{name: "no routing_key", action: "trigger", config: `{}`, payload: `{}`, wantCode: "bad_config", wantInMsg: "no routing_key"},
		{name: "unknown config key", action: "trigger", config: `{"routing_key":"k","service":"x"}`, payload: `{}`, wantCode: "bad_config", wantInMsg: `unknown field "service"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv.Reset()
			for _, f := range tc.faults {
				srv.FailNext(1, f)
			}
			if tc.dedupKey == "" {
				tc.dedupKey = "run-1/page"
			}
			resp, err := pagerduty.New().Execute(context.Background(), providers.Request{
				ActionType: tc.action, Config: json.RawMessage(tc.config), Payload: json.RawMessage(tc.payload), DedupKey: tc.dedupKey, Attempt: 1,
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
				if r.Method != "POST" || r.Path != tc.wantPath || r.Query != "" || r.Header.Get("Content-Type") != "application/json" || r.Header.Get("Authorization") != "" {
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
				if strings.Contains(pe.Message, rk) {
					t.Errorf("message %q reveals the routing key", pe.Message)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			assertJSON(t, resp.Body, tc.wantBody)
		})
	}
}

// TestRetriedTriggerOpensOneAlert replays a trigger, as a retry after a
// lost answer or a DLQ replay would, then resolves with the body's key.
func TestRetriedTriggerOpensOneAlert(t *testing.T) {
	srv := pagerdutytest.NewServer()
	defer srv.Close()
	p := pagerduty.New()
	cfg := json.RawMessage(`{"routing_key":"` + rk + `","base_url":"` + srv.URL + `"}`)
	srv.FailNext(1, pagerdutytest.ServerError(502))

	var body struct {
		DedupKey string `json:"dedup_key"`
	}
	for attempt := 1; attempt <= 3; attempt++ {
		resp, err := p.Execute(context.Background(), providers.Request{
			ActionType: "trigger", Config: cfg, DedupKey: "run-7/page", Attempt: attempt,
			Payload: json.RawMessage(`{"summary":"api 5xx","source":"lb","severity":"error"}`),
		})
		if attempt == 1 {
			if !providers.IsRetryable(err) {
				t.Fatalf("attempt 1: %v, want a retryable error", err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("attempt %d: %v", attempt, err)
		}
		if err := json.Unmarshal(resp.Body, &body); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.Execute(context.Background(), providers.Request{
		ActionType: "resolve", Config: cfg, DedupKey: "run-7/resolve", Payload: json.RawMessage(`{"dedup_key":"` + body.DedupKey + `"}`),
	}); err != nil {
		t.Fatal(err)
	}
	want := []pagerdutytest.Alert{{DedupKey: "run-7/page", Status: "resolved", Summary: "api 5xx", Severity: "error", Events: 3}}
	if got := srv.Alerts(); !reflect.DeepEqual(got, want) {
		t.Errorf("alerts = %+v, want %+v", got, want)
	}
}

func TestCancelled(t *testing.T) {
	srv := pagerdutytest.NewServer()
	defer srv.Close()
	srv.SetLatency(2 * time.Minute) // only the context can end the call
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := pagerduty.New().Execute(ctx, providers.Request{
		ActionType: "resolve", Config: json.RawMessage(`{"routing_key":"` + rk + `","base_url":"` + srv.URL + `"}`),
		Payload: json.RawMessage(`{"dedup_key":"k"}`),
	})
	if !errors.Is(err, context.DeadlineExceeded) || !providers.IsRetryable(err) {
		t.Errorf("error %v is not a retryable context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("returned after %v", d)
	}
}

func TestDescribe(t *testing.T) {
	info, err := pagerduty.New().Describe(context.Background())
	if err != nil || info.Name != "pagerduty" || !reflect.DeepEqual(info.ActionTypes, []string{"trigger", "acknowledge", "resolve", "change"}) {
		t.Errorf("Describe = %+v, %v", info, err)
	}
	var schema struct {
		Properties map[string]map[string]any `json:"properties"`
	}
	if err := json.Unmarshal(info.ConfigSchema, &schema); err != nil {
		t.Fatal(err)
	}
	if schema.Properties["routing_key"]["x-secret"] != true || schema.Properties["base_url"]["x-secret"] != nil {
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
