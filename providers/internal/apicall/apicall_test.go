package apicall_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/internal/apicall"
)

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		value string
		want  time.Duration
	}{
		{"", 0},
		{"0", 0},
		{"-3", 0},
		{"120", 2 * time.Minute},
		{" 5 ", 5 * time.Second},
		{"99999999999999999", 24 * time.Hour},
		{"Mon, 23 Nov 2026 12:01:30 GMT", 90 * time.Second},
		{"Monday, 23-Nov-26 12:00:10 GMT", 10 * time.Second},
		{"Mon, 23 Nov 2026 11:59:00 GMT", 0},
		{"soon", 0},
		{"1.5", 0},
	} {
		h := http.Header{}
		if tc.value != "" {
			h.Set("Retry-After", tc.value)
		}
		if got := apicall.RetryAfter(h, now); got != tc.want {
			t.Errorf("RetryAfter(%q) = %v, want %v", tc.value, got, tc.want)
		}
	}
}

func TestShortenKey(t *testing.T) {
	long := strings.Repeat("run-0123456789/", 40) // 600 bytes
	for _, tc := range []struct {
		name, key string
		max       int
	}{
		{"short stays", "run-1/page", 255},
		{"exactly max stays", strings.Repeat("k", 255), 255},
		{"long", long, 255},
		{"long, opsgenie", long, 512},
		{"multibyte at the cut", strings.Repeat("é", 300), 255},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := apicall.ShortenKey(tc.key, tc.max)
			if len(got) > tc.max || !utf8.ValidString(got) {
				t.Errorf("ShortenKey gave %d bytes (valid UTF-8: %v), max %d", len(got), utf8.ValidString(got), tc.max)
			}
			if again := apicall.ShortenKey(tc.key, tc.max); again != got {
				t.Error("not deterministic")
			}
			if len(tc.key) <= tc.max && got != tc.key {
				t.Errorf("a key within the limit changed: %q", got)
			}
			if len(tc.key) > tc.max {
				if apicall.ShortenKey(got, tc.max) != got {
					t.Error("shortening a shortened key changed it")
				}
				if other := apicall.ShortenKey(tc.key+"x", tc.max); other == got {
					t.Error("two long keys gave the same short one")
				}
			}
		})
	}
}

func TestTruncate(t *testing.T) {
	for _, tc := range []struct {
		s    string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly", 7, "exactly"},
		{"one too long", 11, "one too lo…"},
		{"ééééé", 3, "éé…"},
	} {
		if got := apicall.Truncate(tc.s, tc.n); got != tc.want || utf8.RuneCountInString(got) > tc.n {
			t.Errorf("Truncate(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.want)
		}
	}
}

func TestSnippet(t *testing.T) {
	body := []byte("  token xoxb-s3cret rejected \xff" + strings.Repeat("x", 1000))
	got := apicall.Snippet(body, "xoxb-s3cret", "")
	if strings.Contains(got, "s3cret") || !strings.HasPrefix(got, "token [REDACTED] rejected \uFFFD") || len(got) > apicall.SnippetBytes || !utf8.ValidString(got) {
		t.Errorf("Snippet = %q", got)
	}
	// A credential across the cut is still blanked, not left half shown.
	secret := strings.Repeat("s", 20)
	got = apicall.Snippet([]byte(strings.Repeat("x", apicall.SnippetBytes-10)+secret), secret)
	if strings.Contains(got, "ssss") {
		t.Errorf("Snippet left part of a credential: %q", got[len(got)-20:])
	}
}

func TestDecodeStrict(t *testing.T) {
	type v struct {
		A string `json:"a"`
	}
	for _, tc := range []struct {
		raw     string
		wantErr string
	}{
		{"", ""},
		{"null", ""},
		{`{"a":"x"}`, ""},
		{`{"a":"x","b":1}`, `unknown field "b"`},
		{`{"a":1}`, "cannot unmarshal"},
		{`{"a":"x"} {}`, "after the JSON value"},
		{`[1]`, "cannot unmarshal"},
	} {
		var got v
		err := apicall.DecodeStrict([]byte(tc.raw), &got)
		if (err == nil) != (tc.wantErr == "") || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("DecodeStrict(%s) = %v, want error containing %q", tc.raw, err, tc.wantErr)
		}
	}
}

func TestPost(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/redirect":
			http.Redirect(w, r, "/elsewhere?token=s3cret", http.StatusFound)
		case "/big":
			w.Write(make([]byte, apicall.MaxResponseBytes+1))
		case "/big-error":
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte("busy "))
			w.Write(make([]byte, apicall.MaxResponseBytes+1))
		default:
			w.Header().Set("X-Seen-Type", r.Header.Get("Content-Type"))
			w.Header().Set("X-Seen-Agent", r.Header.Get("User-Agent"))
			w.Write([]byte(`{"ok":true}`))
		}
	}))
	defer srv.Close()
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	c := apicall.NewNet().Client(apicall.Policy{})
	ctx := context.Background()

	a, err := apicall.Post(ctx, c, apicall.Request{URL: srv.URL + "/ok", Where: "test", Body: []byte(`{}`)})
	if err != nil || a.Status != 200 || a.Header.Get("X-Seen-Type") != "application/json" || a.Header.Get("X-Seen-Agent") != apicall.UserAgent || string(a.Body) != `{"ok":true}` {
		t.Errorf("Post = %+v, %v", a, err)
	}

	a, err = apicall.Post(ctx, c, apicall.Request{URL: srv.URL + "/redirect", Where: "test"})
	if err != nil || a.Status != http.StatusFound {
		t.Fatalf("redirect: %+v, %v", a, err)
	}
	if pe := apicall.StatusError("x_302", "test", a, ""); pe.Retryable || !strings.Contains(pe.Message, "redirects are not followed") || strings.Contains(pe.Message, "s3cret") {
		t.Errorf("redirect error %+v", pe)
	}

	_, err = apicall.Post(ctx, c, apicall.Request{URL: srv.URL + "/big", Where: "test"})
	var pe *providers.Error
	if !errors.As(err, &pe) || pe.Code != "response_too_large" || pe.Retryable {
		t.Errorf("big answer: %v", err)
	}
	a, err = apicall.Post(ctx, c, apicall.Request{URL: srv.URL + "/big-error", Where: "test"})
	if err != nil || a.Status != 503 || len(a.Body) != apicall.MaxResponseBytes {
		t.Errorf("big error answer: status %d, %d bytes, %v", a.Status, len(a.Body), err)
	}

	_, err = apicall.Post(ctx, c, apicall.Request{URL: closed.URL + "/x?token=s3cret", Where: "test"})
	if !errors.As(err, &pe) || pe.Code != "network" || !pe.Retryable || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("network error: %v", err)
	}

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = apicall.Post(cancelled, c, apicall.Request{URL: srv.URL, Where: "test"})
	if !errors.Is(err, context.Canceled) || errors.As(err, &pe) {
		t.Errorf("cancelled: %v", err)
	}
}

func TestStatusError(t *testing.T) {
	for _, tc := range []struct {
		status     int
		retryAfter string
		retryable  bool
		wantAfter  time.Duration
	}{
		{400, "", false, 0},
		{404, "5", false, 0},
		{429, "5", true, 5 * time.Second},
		{429, "", true, 0},
		{500, "", true, 0},
		{503, "60", true, time.Minute},
	} {
		h := http.Header{}
		if tc.retryAfter != "" {
			h.Set("Retry-After", tc.retryAfter)
		}
		pe := apicall.StatusError("c", "svc", &apicall.Answer{Status: tc.status, Header: h, Body: []byte("why: key-s3cret")}, "", "key-s3cret")
		if pe.Retryable != tc.retryable || pe.RetryAfter != tc.wantAfter || strings.Contains(pe.Message, "s3cret") || !strings.Contains(pe.Message, "why: [REDACTED]") {
			t.Errorf("status %d: %+v", tc.status, pe)
		}
	}
}
