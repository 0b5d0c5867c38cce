package webhook_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/internal/apicall"
	"github.com/chaingate/gateway/providers/webhook"
	"github.com/chaingate/gateway/providers/webhook/webhooktest"
)

// fixed is the clock of the provider under test.
var fixed = time.Unix(1795000000, 0)

func newProvider() *webhook.Provider {
	return &webhook.Provider{Net: apicall.NewNet(), Now: func() time.Time { return fixed }}
}

func TestExecute(t *testing.T) {
	srv := webhooktest.NewServer()
	defer srv.Close()
	// The receiver checks timestamps against the real clock.
	srv.SetSecret(nil)
	cfg := func(extra string) string {
		return `{"url":"` + srv.URL + `/hooks/incident?tenant=t1","secret":"` + webhooktest.Secret + `"` + extra + `}`
	}

	for _, tc := range []struct {
		name       string
		action     string
		config     string
		payload    string
		faults     []webhooktest.Fault
		wantSent   bool
		wantHeader map[string]string // "" means absent
		wantBody   string
		wantCode   string
		retryable  bool
		retryAfter time.Duration
		wantInMsg  string
	}{
		{
			name: "signed post", action: "post", config: cfg(`,"headers":{"Authorization":"Bearer abc123","X-Team":"ops"}`),
			payload:  `{"alert":"db <down> & out","n":1}`,
			wantSent: true,
			wantHeader: map[string]string{
				"Content-Type": "application/json", "Idempotency-Key": "run-1/notify", "Authorization": "Bearer abc123", "X-Team": "ops",
				"User-Agent": "chaingate-gateway", webhook.TimestampHeader: "1795000000",
				webhook.SignatureHeader: webhook.Sign([]byte(webhooktest.Secret), fixed.Unix(), []byte(`{"alert":"db <down> & out","n":1}`)),
			},
			wantBody: `{"status":200,"body":{"received":true,"delivery":1}}`,
		},
		{
			name: "unsigned without a secret", action: "post", config: `{"url":"` + srv.URL + `/x"}`, payload: `[1,2]`, wantSent: true,
			wantHeader: map[string]string{"Content-Type": "application/json", "Idempotency-Key": "run-1/notify", webhook.TimestampHeader: "", webhook.SignatureHeader: ""},
			wantBody:   `{"status":200,"body":{"received":true,"delivery":1}}`,
		},
		{
			name: "429 with Retry-After", action: "post", config: cfg(""), payload: `{}`, faults: []webhooktest.Fault{webhooktest.RateLimited(9)}, wantSent: true,
			wantCode: "webhook_http_429", retryable: true, retryAfter: 9 * time.Second, wantInMsg: "webhook POST " + srv.URL + "/hooks/incident: HTTP 429 Too Many Requests",
		},
		{name: "500", action: "post", config: cfg(""), payload: `{}`, faults: []webhooktest.Fault{webhooktest.ServerError(500)}, wantSent: true, wantCode: "webhook_http_500", retryable: true},
		{name: "503 with Retry-After", action: "post", config: cfg(""), payload: `{}`, faults: []webhooktest.Fault{{Status: 503, RetryAfter: "1"}}, wantSent: true, wantCode: "webhook_http_503", retryable: true, retryAfter: time.Second},
		{name: "400", action: "post", config: cfg(""), payload: `{}`, faults: []webhooktest.Fault{{Status: 400, Body: "bad"}}, wantSent: true, wantCode: "webhook_http_400", wantInMsg: "HTTP 400 Bad Request: bad"},
		{name: "410", action: "post", config: cfg(""), payload: `{}`, faults: []webhooktest.Fault{{Status: 410}}, wantSent: true, wantCode: "webhook_http_410"},
		{name: "redirect is not followed", action: "post", config: cfg(""), payload: `{}`, faults: []webhooktest.Fault{{Status: 308}}, wantSent: true, wantCode: "webhook_http_308", wantInMsg: "redirects are not followed"},
		{name: "text answer", action: "post", config: cfg(""), payload: `{}`, faults: []webhooktest.Fault{{Status: 202, ContentType: "text/plain", Body: "queued"}}, wantSent: true, wantBody: `{"status":202,"body":"queued"}`},
		{name: "empty answer", action: "post", config: cfg(""), payload: `{}`, faults: []webhooktest.Fault{{Status: 204}}, wantSent: true, wantBody: `{"status":204,"body":null}`},
		{name: "payload not JSON", action: "post", config: cfg(""), payload: `{"a":`, wantCode: "bad_payload"},
		{name: "unknown action", action: "get", config: cfg(""), payload: `{}`, wantCode: "bad_action_type"},
		{name: "no url", action: "post", config: `{"secret":"s"}`, payload: `{}`, wantCode: "bad_config", wantInMsg: "no url"},
		{name: "url not http", action: "post", config: `{"url":"ftp://x/y?token=s3cret"}`, payload: `{}`, wantCode: "bad_config", wantInMsg: `"ftp://x/y"`},
		{name: "reserved header", action: "post", config: cfg(`,"headers":{"idempotency-key":"x"}`), payload: `{}`, wantCode: "bad_config", wantInMsg: "Idempotency-Key is set by the provider"},
		{name: "header with CRLF", action: "post", config: cfg(`,"headers":{"X-A":"v\r\nX-B: 1"}`), payload: `{}`, wantCode: "bad_config", wantInMsg: `header "X-A"`},
		{name: "unknown config key", action: "post", config: `{"url":"http://x","hmac":"s"}`, payload: `{}`, wantCode: "bad_config", wantInMsg: `unknown field "hmac"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv.Reset()
			for _, f := range tc.faults {
				srv.FailNext(1, f)
			}
			resp, err := newProvider().Execute(context.Background(), providers.Request{
				ActionType: tc.action, Config: json.RawMessage(tc.config), Payload: json.RawMessage(tc.payload), DedupKey: "run-1/notify", Attempt: 1,
			})
			reqs := srv.Requests()
			if !tc.wantSent && len(reqs) != 0 || tc.wantSent && len(reqs) != 1 {
				t.Fatalf("sent %d requests, want sent: %v", len(reqs), tc.wantSent)
			}
			if tc.wantSent {
				r := reqs[0]
				var c struct{ URL string }
				_ = json.Unmarshal([]byte(tc.config), &c)
				u, _ := url.Parse(c.URL)
				if r.Method != "POST" || r.Path != u.EscapedPath() || r.Query != u.RawQuery || string(r.Body) != tc.payload {
					t.Errorf("sent %s %s?%s %s", r.Method, r.Path, r.Query, r.Body)
				}
				for k, v := range tc.wantHeader {
					if got := r.Header.Get(k); got != v {
						t.Errorf("header %s = %q, want %q", k, got, v)
					}
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
				for _, secret := range []string{webhooktest.Secret, "tenant=t1", "s3cret"} {
					if strings.Contains(pe.Message, secret) {
						t.Errorf("message %q reveals %q", pe.Message, secret)
					}
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

// TestRetryIsDeliveredOnce sends through a receiver that checks signatures
// with the real clock, fails once, and is retried twice.
func TestRetryIsDeliveredOnce(t *testing.T) {
	srv := webhooktest.NewServer()
	defer srv.Close()
	srv.FailNext(1, webhooktest.ServerError(502))
	p := webhook.New()
	cfg := json.RawMessage(`{"url":"` + srv.URL + `/in","secret":"` + webhooktest.Secret + `"}`)
	var bodies []string
	for attempt := 1; attempt <= 3; attempt++ {
		resp, err := p.Execute(context.Background(), providers.Request{ActionType: "post", Config: cfg, Payload: json.RawMessage(`{"k":"v"}`), DedupKey: "run-2/hook", Attempt: attempt})
		if attempt == 1 {
			if !providers.IsRetryable(err) {
				t.Fatalf("attempt 1: %v, want a retryable error", err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("attempt %d: %v", attempt, err)
		}
		bodies = append(bodies, string(resp.Body))
	}
	want := []webhooktest.Delivery{{Number: 1, IdempotencyKey: "run-2/hook", Path: "/in", Body: json.RawMessage(`{"k":"v"}`), Attempts: 2}}
	if got := srv.Deliveries(); !reflect.DeepEqual(got, want) {
		t.Errorf("deliveries = %+v, want %+v", got, want)
	}
	if len(bodies) != 2 || bodies[0] != bodies[1] {
		t.Errorf("bodies = %v, want the same answer twice", bodies)
	}

	// A sender with another secret is turned away, permanently.
	_, err := p.Execute(context.Background(), providers.Request{ActionType: "post", DedupKey: "run-3/hook",
		Config: json.RawMessage(`{"url":"` + srv.URL + `/in","secret":"not-the-secret"}`), Payload: json.RawMessage(`{}`)})
	var pe *providers.Error
	if !errors.As(err, &pe) || pe.Code != "webhook_http_401" || pe.Retryable || !strings.Contains(pe.Message, "does not match") {
		t.Errorf("wrong secret: %v", err)
	}
}

func TestVerify(t *testing.T) {
	secret := []byte("topsecret")
	body := []byte(`{"alert":"db down"}`)
	now := time.Unix(1795000000, 0)
	ts := "1795000000"
	sig := webhook.Sign(secret, now.Unix(), body)

	// The documented scheme, computed independently of Sign.
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ts + "." + string(body)))
	if want := "v1=" + hex.EncodeToString(m.Sum(nil)); sig != want {
		t.Fatalf("Sign = %s, want %s", sig, want)
	}

	for _, tc := range []struct {
		name      string
		secret    []byte
		ts, sig   string
		body      []byte
		tolerance time.Duration
		now       time.Time
		want      error
	}{
		{name: "valid", secret: secret, ts: ts, sig: sig, body: body, now: now},
		{name: "valid within tolerance", secret: secret, ts: ts, sig: sig, body: body, tolerance: time.Minute, now: now.Add(59 * time.Second)},
		{name: "valid, receiver's clock behind", secret: secret, ts: ts, sig: sig, body: body, now: now.Add(-4 * time.Minute)},
		{name: "wrong secret", secret: []byte("other"), ts: ts, sig: sig, body: body, now: now, want: webhook.ErrSignatureMismatch},
		{name: "tampered body", secret: secret, ts: ts, sig: sig, body: []byte(`{"alert":"all fine"}`), now: now, want: webhook.ErrSignatureMismatch},
		{name: "tampered timestamp", secret: secret, ts: "1795000600", sig: sig, body: body, now: now.Add(10 * time.Minute), want: webhook.ErrSignatureMismatch},
		{name: "stale", secret: secret, ts: ts, sig: sig, body: body, now: now.Add(6 * time.Minute), want: webhook.ErrStale},
		{name: "stale with a tolerance", secret: secret, ts: ts, sig: sig, body: body, tolerance: 30 * time.Second, now: now.Add(31 * time.Second), want: webhook.ErrStale},
		{name: "from the future", secret: secret, ts: ts, sig: sig, body: body, now: now.Add(-6 * time.Minute), want: webhook.ErrStale},
		{name: "no timestamp", secret: secret, ts: "", sig: sig, body: body, now: now, want: webhook.ErrMalformed},
		{name: "no signature", secret: secret, ts: ts, sig: "", body: body, now: now, want: webhook.ErrMalformed},
		{name: "other scheme", secret: secret, ts: ts, sig: "v0=" + strings.TrimPrefix(sig, "v1="), body: body, now: now, want: webhook.ErrMalformed},
		{name: "not hex", secret: secret, ts: ts, sig: "v1=zz", body: body, now: now, want: webhook.ErrMalformed},
		{name: "truncated", secret: secret, ts: ts, sig: sig[:20], body: body, now: now, want: webhook.ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := webhook.Verify(tc.secret, tc.ts, tc.sig, tc.body, tc.tolerance, tc.now)
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("Verify = %v, want %v", err, tc.want)
			}
		})
	}
	if err := webhook.Verify(nil, ts, sig, body, 0, now); err == nil {
		t.Error("Verify accepted an empty secret")
	}
}

// ExampleVerify is a receiver's handler.
func ExampleVerify() {
	secret := []byte("topsecret") // the provider's secret, from the receiver's own secret store
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, "bad body", http.StatusBadRequest)
			return
		}
		err = webhook.Verify(secret, r.Header.Get(webhook.TimestampHeader), r.Header.Get(webhook.SignatureHeader), body, 5*time.Minute, time.Now())
		if err != nil {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		// Handle the request once per Idempotency-Key.
		fmt.Fprintln(w, "ok")
	})
	srv := httptest.NewServer(handler)
	defer srv.Close()

	_, err := webhook.New().Execute(context.Background(), providers.Request{
		ActionType: "post", DedupKey: "run-1/notify", Payload: json.RawMessage(`{"alert":"db down"}`),
		Config: json.RawMessage(`{"url":"` + srv.URL + `","secret":"topsecret"}`),
	})
	fmt.Println(err)
	// Output: <nil>
}

func TestCancelled(t *testing.T) {
	srv := webhooktest.NewServer()
	defer srv.Close()
	srv.SetLatency(2 * time.Minute) // only the context can end the call
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := webhook.New().Execute(ctx, providers.Request{ActionType: "post", Config: json.RawMessage(`{"url":"` + srv.URL + `"}`), Payload: json.RawMessage(`{}`)})
	if !errors.Is(err, context.DeadlineExceeded) || !providers.IsRetryable(err) {
		t.Errorf("error %v is not a retryable context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("returned after %v", d)
	}
}

func TestDescribe(t *testing.T) {
	info, err := webhook.New().Describe(context.Background())
	if err != nil || info.Name != "webhook" || !reflect.DeepEqual(info.ActionTypes, []string{"post"}) {
		t.Errorf("Describe = %+v, %v", info, err)
	}
	var schema struct {
		Properties map[string]map[string]any `json:"properties"`
	}
	if err := json.Unmarshal(info.ConfigSchema, &schema); err != nil {
		t.Fatal(err)
	}
	if schema.Properties["secret"]["x-secret"] != true || schema.Properties["url"]["x-secret"] != nil {
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
