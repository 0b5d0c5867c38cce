package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestFlagChecks(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{}, "give --chain or --trigger"},
		{[]string{"--chain", "c", "--trigger", "t"}, "give --chain or --trigger"},
		{[]string{"--chain", "c", "--concurrency", "0"}, "--concurrency must be at least 1"},
		{[]string{"--chain", "c", "--duration", "0s"}, "--duration must be positive"},
		{[]string{"--chain", "c", "--warmup", "-1s"}, "--warmup must not be negative"},
		{[]string{"--chain", "c", "--payload", "{"}, "--payload must be JSON"},
		{[]string{"--chain", "c", "--server", "127.0.0.1:8080"}, "is not an http:// or https:// URL"},
	}
	for _, tc := range tests {
		var out, errOut bytes.Buffer
		if code := run(context.Background(), tc.args, &out, &errOut); code != exitUsage || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%v: exit %d\n%s%s", tc.args, code, out.String(), errOut.String())
		}
	}
}

// TestReportsFailures drives servers that refuse, fail or are gone: the
// tool says what went wrong, backs off, and exits non-zero when no run
// succeeded.
func TestReportsFailures(t *testing.T) {
	var metricsReads atomic.Int64
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	goneURL := "http://" + gone.Addr().String()
	_ = gone.Close()
	tests := []struct {
		name    string
		handler http.HandlerFunc // nil: no server listens
		code    int
		want    []string
		// maxRequests bounds what a backing-off tool sends; 0: no bound.
		maxRequests int64
	}{
		{"unauthorized", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":{"code":"unauthorized","message":"a valid bearer token is required"}}`))
		}, exitFailed, []string{"outcomes: http_401 ", "first error: POST answered 401 Unauthorized", "a valid bearer token is required", "no run succeeded"}, 200},
		{"server down", nil, exitFailed, []string{"outcomes: error ", "first error:", "connection refused"}, 0},
		{"runs fail", func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte(`{"id":"x","status":"failed"}`))
		}, exitFailed, []string{"outcomes: failed ", "no run succeeded"}, 0},
		{"runs succeed", func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/v1/chains/c/runs" || r.URL.Query().Get("wait") == "" {
				w.WriteHeader(http.StatusNotFound)
			}
			_, _ = w.Write([]byte(`{"id":"x","status":"succeeded"}`))
		}, exitOK, []string{"outcomes: succeeded ", "runs succeeded: ", "CPU per run: the gateway unknown (reading /metrics: 404 Not Found)"}, 0},
		{"the gateway's CPU", func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/metrics" {
				// Read before and after the measured runs: a second of
				// the gateway's CPU between the two.
				_, _ = fmt.Fprintf(w, "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total %d\n", 41+metricsReads.Add(1))
				return
			}
			_, _ = w.Write([]byte(`{"id":"x","status":"succeeded"}`))
		}, exitOK, []string{"runs succeeded: ", "CPU per run: the gateway ", " µs (its plugins not counted), this load tool "}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var requests atomic.Int64
			server := goneURL
			if tc.handler != nil {
				ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					requests.Add(1)
					tc.handler(w, r)
				}))
				defer ts.Close()
				server = ts.URL
			}
			var out, errOut bytes.Buffer
			code := run(context.Background(), []string{"--server", server, "--chain", "c", "--concurrency", "4", "--warmup", "0s", "--duration", "400ms"}, &out, &errOut)
			all := out.String() + errOut.String()
			if code != tc.code {
				t.Errorf("exit %d, want %d\n%s", code, tc.code, all)
			}
			for _, want := range tc.want {
				if !strings.Contains(all, want) {
					t.Errorf("output lacks %q:\n%s", want, all)
				}
			}
			// Backing off, four workers make a few dozen requests in 400 ms
			// to a server that refuses them, not thousands.
			if n := requests.Load(); tc.maxRequests > 0 && n > tc.maxRequests {
				t.Errorf("%d requests in 400 ms: no backoff", n)
			}
		})
	}
}

func TestSplitFlagChecks(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"split"}, "--gateway is required"},
		{[]string{"split", "--gateway", "/bin/true", "--repeat", "-1"}, "--repeat is 0 or more, and needs --local"},
		{[]string{"split", "--gateway", "/bin/true", "--repeat", "3", "--local=false"}, "--repeat is 0 or more, and needs --local"},
	} {
		var out, errOut bytes.Buffer
		if code := runSplit(context.Background(), tc.args[1:], &out, &errOut); code != exitUsage || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%v: exit %d\n%s%s", tc.args, code, out.String(), errOut.String())
		}
	}
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []time.Duration
		want time.Duration
	}{
		{[]time.Duration{3, 1, 2}, 2},
		{[]time.Duration{4, 1, 3, 2}, 2},
		{[]time.Duration{5}, 5},
	} {
		if got := median(tc.in); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}
