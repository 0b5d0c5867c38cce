package http_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	nethttp "net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/providers"
	httpprovider "github.com/chaingate/gateway/providers/http"
)

type result struct {
	Status  int               `json:"status"`
	Headers map[string]string `json:"headers"`
	Body    json.RawMessage   `json:"body"`
}

// seen is what /inspect reports about the request it received.
type seen struct {
	Method         string `json:"method"`
	Path           string `json:"path"`
	Query          string `json:"query"`
	IdempotencyKey string `json:"idempotency_key"`
	Default        string `json:"x_default"`
	Override       string `json:"x_override"`
	ContentType    string `json:"content_type"`
	Body           string `json:"body"`
}

func newServer(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(nethttp.HandlerFunc(func(w nethttp.ResponseWriter, r *nethttp.Request) {
		path := strings.TrimPrefix(r.URL.Path, "/api")
		switch {
		case path == "/inspect":
			body, _ := io.ReadAll(r.Body)
			w.Header().Set("Content-Type", "application/json; charset=utf-8")
			w.Header().Add("X-Multi", "a")
			w.Header().Add("X-Multi", "b")
			_ = json.NewEncoder(w).Encode(seen{
				Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery,
				IdempotencyKey: r.Header.Get("Idempotency-Key"),
				Default:        r.Header.Get("X-Default"), Override: r.Header.Get("X-Override"),
				ContentType: r.Header.Get("Content-Type"), Body: string(body),
			})
		case path == "/redirect":
			nethttp.Redirect(w, r, "/inspect", nethttp.StatusFound)
		case path == "/text":
			w.Header().Set("Content-Type", "text/plain")
			fmt.Fprint(w, "hello there")
		case path == "/empty":
			w.WriteHeader(nethttp.StatusNoContent)
		case strings.HasPrefix(path, "/status/"):
			code, _ := strconv.Atoi(strings.TrimPrefix(path, "/status/"))
			w.WriteHeader(code)
			fmt.Fprintf(w, "  nope, status %d\n", code)
		case path == "/slow":
			select {
			case <-r.Context().Done():
			case <-time.After(2 * time.Minute):
			}
		case path == "/big-error":
			w.Header().Set("Content-Length", strconv.Itoa(2<<20))
			w.WriteHeader(nethttp.StatusServiceUnavailable)
			_, _ = w.Write([]byte("overloaded, try later "))
			_, _ = w.Write(make([]byte, 2<<20-22))
		case path == "/big":
			w.Header().Set("Content-Length", strconv.Itoa(2<<20))
			_, _ = w.Write(make([]byte, 2<<20))
		case path == "/chunked":
			for range 4 {
				_, _ = w.Write(make([]byte, 512))
				w.(nethttp.Flusher).Flush()
			}
		default:
			nethttp.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestExecute(t *testing.T) {
	srv := newServer(t)
	closed := httptest.NewServer(nethttp.NotFoundHandler())
	closed.Close()

	for _, tc := range []struct {
		name       string
		actionType string
		config     string
		payload    string
		wantCode   string // error code; "" for success
		retryable  bool
		wantInMsg  string
		check      func(t *testing.T, r result)
	}{
		{
			name: "json response", actionType: "get", payload: `{"url":"` + srv.URL + `/inspect?a=1"}`,
			check: func(t *testing.T, r result) {
				s := decodeSeen(t, r)
				if r.Status != 200 || s.Method != "GET" || s.Query != "a=1" || s.IdempotencyKey != "run-1/step-a" {
					t.Errorf("status %d, server saw %+v", r.Status, s)
				}
				if r.Headers["content-type"] != "application/json; charset=utf-8" || r.Headers["x-multi"] != "a, b" {
					t.Errorf("headers = %v", r.Headers)
				}
			},
		},
		{
			name: "text response", payload: `{"url":"` + srv.URL + `/text"}`,
			check: func(t *testing.T, r result) {
				if string(r.Body) != `"hello there"` {
					t.Errorf("body = %s", r.Body)
				}
			},
		},
		{
			name: "empty response", actionType: "delete", payload: `{"url":"` + srv.URL + `/empty"}`,
			check: func(t *testing.T, r result) {
				if r.Status != 204 || string(r.Body) != "null" {
					t.Errorf("status %d body %s", r.Status, r.Body)
				}
			},
		},
		{
			name: "relative to base_url, headers merged, json body", actionType: "post",
			config:  `{"base_url":"` + srv.URL + `/api","headers":{"X-Default":"cfg","X-Override":"cfg"}}`,
			payload: `{"url":"inspect","headers":{"x-override":"payload","Idempotency-Key":"forged"},"body":{"k":[1,2]}}`,
			check: func(t *testing.T, r result) {
				s := decodeSeen(t, r)
				want := seen{Method: "POST", Path: "/api/inspect", IdempotencyKey: "run-1/step-a", Default: "cfg", Override: "payload", ContentType: "application/json", Body: `{"k":[1,2]}`}
				if s != want {
					t.Errorf("server saw %+v, want %+v", s, want)
				}
			},
		},
		{
			name: "string body sent as-is, explicit method wins", actionType: "post",
			payload: `{"url":"` + srv.URL + `/inspect","method":"put","body":"raw <text>","headers":{"Content-Type":"text/plain"}}`,
			check: func(t *testing.T, r result) {
				if s := decodeSeen(t, r); s.Method != "PUT" || s.Body != "raw <text>" || s.ContentType != "text/plain" {
					t.Errorf("server saw %+v", s)
				}
			},
		},
		{
			name: "non-verb action type means GET", actionType: "check_health", payload: `{"url":"` + srv.URL + `/inspect"}`,
			check: func(t *testing.T, r result) {
				if s := decodeSeen(t, r); s.Method != "GET" {
					t.Errorf("method = %s", s.Method)
				}
			},
		},
		{name: "404 is permanent", payload: `{"url":"` + srv.URL + `/status/404"}`, wantCode: "http_404", wantInMsg: "HTTP 404 Not Found: nope, status 404"},
		{name: "400 is permanent", payload: `{"url":"` + srv.URL + `/status/400"}`, wantCode: "http_400"},
		{name: "503 is retryable", payload: `{"url":"` + srv.URL + `/status/503"}`, wantCode: "http_503", retryable: true, wantInMsg: "nope, status 503"},
		{name: "500 is retryable", payload: `{"url":"` + srv.URL + `/status/500"}`, wantCode: "http_500", retryable: true},
		{name: "429 is retryable", payload: `{"url":"` + srv.URL + `/status/429"}`, wantCode: "http_429", retryable: true},
		{name: "timeout_ms is retryable", payload: `{"url":"` + srv.URL + `/slow","timeout_ms":50}`, wantCode: "timeout", retryable: true, wantInMsg: "timeout_ms=50"},
		{name: "network error is retryable", payload: `{"url":"` + closed.URL + `/x"}`, wantCode: "network", retryable: true},
		{name: "oversized 503 is retryable", payload: `{"url":"` + srv.URL + `/big-error"}`, wantCode: "http_503", retryable: true, wantInMsg: "overloaded, try later"},
		{name: "oversized 503 without content-length", config: `{"allowed_hosts":["127.0.0.1"],"max_response_bytes":1024}`, payload: `{"url":"` + srv.URL + `/status/503"}`, wantCode: "http_503", retryable: true},
		{name: "header name with a space", payload: `{"url":"` + srv.URL + `/inspect","headers":{"X Bad":"v"}}`, wantCode: "bad_payload", wantInMsg: `header name "X Bad"`},
		{name: "header name with CRLF", payload: `{"url":"` + srv.URL + `/inspect","headers":{"X-A\r\nX-B":"v"}}`, wantCode: "bad_payload", wantInMsg: "not a valid HTTP token"},
		{name: "header value with CRLF", payload: `{"url":"` + srv.URL + `/inspect","headers":{"X-A":"v\r\nX-Injected: 1"}}`, wantCode: "bad_payload", wantInMsg: `header "X-A"`},
		{name: "config header value with LF", config: `{"allowed_hosts":["127.0.0.1"],"headers":{"Authorization":"Bearer t\nX: y"}}`, payload: `{"url":"` + srv.URL + `/inspect"}`, wantCode: "bad_config", wantInMsg: "config headers"},
		{name: "header value with tab", payload: `{"url":"` + srv.URL + `/inspect","headers":{"X-A":"a\tb"}}`},
		{name: "oversize by content-length", payload: `{"url":"` + srv.URL + `/big"}`, wantCode: "response_too_large", wantInMsg: "max_response_bytes=1048576"},
		{name: "oversize chunked", config: `{"allowed_hosts":["127.0.0.1"],"max_response_bytes":1024}`, payload: `{"url":"` + srv.URL + `/chunked"}`, wantCode: "response_too_large"},
		{name: "within max_response_bytes", config: `{"allowed_hosts":["127.0.0.1"],"max_response_bytes":2048}`, payload: `{"url":"` + srv.URL + `/chunked"}`},
		{name: "missing url", payload: `{"method":"get"}`, wantCode: "bad_payload", wantInMsg: "url is required"},
		{name: "relative url without base_url", payload: `{"url":"/x"}`, wantCode: "bad_payload", wantInMsg: "no base_url"},
		{name: "not http", payload: `{"url":"ftp://example.com/x"}`, wantCode: "bad_payload"},
		{name: "neither base_url nor allowed_hosts", config: `{"headers":{"X-Api-Key":"k"}}`, payload: `{"url":"` + srv.URL + `/inspect"}`, wantCode: "bad_config", wantInMsg: "give base_url, allowed_hosts or both"},
		{name: "absolute url elsewhere than base_url", config: `{"base_url":"https://api.example.com","headers":{"X-Api-Key":"k"}}`, payload: `{"url":"` + srv.URL + `/inspect"}`, wantCode: "host_not_allowed", wantInMsg: "is not base_url's origin (https://api.example.com:443)"},
		{name: "a redirect is not followed", payload: `{"url":"` + srv.URL + `/redirect"}`, wantCode: "http_302", wantInMsg: "follow_redirects = true"},
		{name: "bad method", payload: `{"url":"` + srv.URL + `","method":"FETCH"}`, wantCode: "bad_payload", wantInMsg: `method "FETCH"`},
		{name: "unknown payload field", payload: `{"url":"` + srv.URL + `","header":{}}`, wantCode: "bad_payload", wantInMsg: `"header"`},
		{name: "payload not an object", payload: `"http://x"`, wantCode: "bad_payload"},
		{name: "bad config", config: `{"base":"x"}`, payload: `{"url":"` + srv.URL + `"}`, wantCode: "bad_config"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			config := tc.config
			if config == "" {
				config = `{"allowed_hosts":["127.0.0.1"]}`
			}
			resp, err := httpprovider.New().Execute(ctx, providers.Request{
				ActionType: tc.actionType,
				Config:     json.RawMessage(config),
				Payload:    json.RawMessage(tc.payload),
				DedupKey:   "run-1/step-a",
				Attempt:    1,
			})
			if tc.wantCode != "" {
				var pe *providers.Error
				if !errors.As(err, &pe) {
					t.Fatalf("error %v is not a *providers.Error", err)
				}
				if pe.Code != tc.wantCode || pe.Retryable != tc.retryable || !strings.Contains(pe.Message, tc.wantInMsg) {
					t.Errorf("error %+v, want code %s retryable %v containing %q", pe, tc.wantCode, tc.retryable, tc.wantInMsg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var r result
			if err := json.Unmarshal(resp.Body, &r); err != nil {
				t.Fatalf("body %s: %v", resp.Body, err)
			}
			if tc.check != nil {
				tc.check(t, r)
			}
		})
	}
}

func TestCallerDeadline(t *testing.T) {
	srv := newServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := httpprovider.New().Execute(ctx, providers.Request{Config: json.RawMessage(`{"base_url":"` + srv.URL + `"}`), Payload: json.RawMessage(`{"url":"/slow"}`)})
	if !errors.Is(err, context.DeadlineExceeded) || !providers.IsRetryable(err) {
		t.Errorf("error %v is not a retryable context.DeadlineExceeded", err)
	}
	// The server holds the answer two minutes: only the deadline ends it.
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("returned after %v", d)
	}
}

// TestErrorsHideQuery checks every error path that names the URL: query
// strings and fragments often carry tokens.
func TestErrorsHideQuery(t *testing.T) {
	srv := newServer(t)
	closed := httptest.NewServer(nethttp.NotFoundHandler())
	closed.Close()
	for _, tc := range []struct {
		name, config, url, wantCode string
	}{
		{name: "error status", url: srv.URL + "/status/403?token=s3cret", wantCode: "http_403"},
		{name: "network error", url: closed.URL + "/x?token=s3cret", wantCode: "network"},
		{name: "timeout", url: srv.URL + "/slow?token=s3cret#s3cret", wantCode: "timeout"},
		{name: "too large", url: srv.URL + "/big?token=s3cret", wantCode: "response_too_large"},
		{name: "unparsable", url: srv.URL + "/x%zz?token=s3cret", wantCode: "bad_payload"},
		{name: "unparsable host", url: "http://[::1/x?token=s3cret", wantCode: "bad_payload"},
		{name: "relative without base", url: "x?token=s3cret", wantCode: "bad_payload"},
		{name: "not http", url: "ftp://host/x?token=s3cret", wantCode: "bad_payload"},
		{name: "bad base", config: `{"base_url":"http://[::1?token=s3cret"}`, url: "x?token=s3cret", wantCode: "bad_config"},
		{name: "host not allowed", config: `{"base_url":"https://api.example.com"}`, url: srv.URL + "/x?token=s3cret", wantCode: "host_not_allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			payload, _ := json.Marshal(map[string]any{"url": tc.url, "timeout_ms": 50})
			config := tc.config
			if config == "" {
				config = `{"allowed_hosts":["127.0.0.1","host"]}`
			}
			_, err := httpprovider.New().Execute(context.Background(), providers.Request{Config: json.RawMessage(config), Payload: payload})
			var pe *providers.Error
			if !errors.As(err, &pe) || pe.Code != tc.wantCode {
				t.Fatalf("error %v, want code %s", err, tc.wantCode)
			}
			texts := []string{err.Error(), fmt.Sprintf("%+v", err)}
			if pe.Err != nil {
				texts = append(texts, pe.Err.Error())
			}
			for _, text := range texts {
				if strings.Contains(text, "s3cret") {
					t.Errorf("error %q reveals the query string", text)
				}
			}
		})
	}
}

func decodeSeen(t *testing.T, r result) seen {
	t.Helper()
	var s seen
	if err := json.Unmarshal(r.Body, &s); err != nil {
		t.Fatalf("body %s is not the inspect JSON: %v", r.Body, err)
	}
	return s
}

// TestCredentialsStayWithBaseURL is an alert steering the url a template
// fills: the config's headers reach only base_url's origin, a request
// elsewhere needs allowed_hosts and goes without them, redirects are
// followed only when asked and never carry them off, and
// deny_private_networks refuses loopback addresses.
func TestCredentialsStayWithBaseURL(t *testing.T) {
	api := newServer(t)
	var hits []string
	attacker := httptest.NewServer(nethttp.HandlerFunc(func(w nethttp.ResponseWriter, r *nethttp.Request) {
		hits = append(hits, r.URL.Path+" key="+r.Header.Get("X-Api-Key"))
		if r.URL.Path == "/bounce" {
			nethttp.Redirect(w, r, api.URL+"/inspect", nethttp.StatusFound)
			return
		}
		w.Write([]byte(`{}`))
	}))
	defer attacker.Close()
	redirector := httptest.NewServer(nethttp.RedirectHandler(attacker.URL+"/collect", nethttp.StatusFound))
	defer redirector.Close()

	call := func(config, url string) error {
		_, err := httpprovider.New().Execute(context.Background(), providers.Request{
			ActionType: "get", Config: json.RawMessage(config), Payload: json.RawMessage(`{"url":"` + url + `"}`),
		})
		return err
	}
	codeOf := func(err error) string {
		var pe *providers.Error
		if errors.As(err, &pe) && !pe.Retryable {
			return pe.Code
		}
		return fmt.Sprint(err)
	}
	withBase := func(base, extra string) string {
		return `{"base_url":"` + base + `","headers":{"X-Api-Key":"k-9f8e"}` + extra + `}`
	}
	tests := []struct {
		name, config, url, code string
		hits                    []string
	}{
		{"absolute url to another host", withBase(api.URL, ""), attacker.URL + "/collect", "host_not_allowed", nil},
		{"allowed host, no credentials", withBase(api.URL, `,"allowed_hosts":["127.0.0.1"]`), attacker.URL + "/collect", "", []string{"/collect key="}},
		{"redirect not followed", withBase(redirector.URL, ""), "/x", "http_302", nil},
		{"redirect to a host not allowed", withBase(redirector.URL, `,"follow_redirects":true`), "/x", "host_not_allowed", nil},
		{"redirect to an allowed host drops credentials", withBase(redirector.URL, `,"follow_redirects":true,"allowed_hosts":["127.0.0.1"]`), "/x", "", []string{"/collect key="}},
		{"deny_private_networks", withBase(api.URL, `,"deny_private_networks":true`), "/inspect", "address_not_allowed", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			hits = nil
			err := call(tc.config, tc.url)
			if tc.code == "" && err != nil || tc.code != "" && codeOf(err) != tc.code {
				t.Errorf("error %v, want code %q", err, tc.code)
			}
			if fmt.Sprint(hits) != fmt.Sprint(tc.hits) {
				t.Errorf("the other host saw %q, want %q", hits, tc.hits)
			}
		})
	}
}
