package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/gateway/api"
)

// serveWithLimits runs env's server as `gateway serve` does, with the
// given [gateway.limits] keys added.
func serveWithLimits(t *testing.T, env *apiEnv, limits string) {
	t.Helper()
	serveWith(t, env, "", limits)
}

// serveWith runs env's server as `gateway serve` does, with extra
// [gateway] tables (say, [gateway.auth]) and [gateway.limits] keys added.
func serveWith(t *testing.T, env *apiEnv, extra, limits string) {
	t.Helper()
	env.write("[gateway]\nsecrets_file = \"secrets.env\"\n" + extra + strings.Replace(apiConfig, "max_request_bytes = 2048\n", "max_request_bytes = 2048\n"+limits, 1))
	if _, err := env.srv.Reload(); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	env.url = "http://" + l.Addr().String()
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- env.srv.Run(ctx, l, time.Second) }()
	t.Cleanup(func() {
		stop()
		<-served
	})
}

// TestSlowClientsCannotHoldTheServer: a client that never finishes its
// request is cut off at the request timeout; while max_connections are
// open the next client is answered at once: the health checks as usual,
// anything else 503 server_busy; once one closes it is served again.
func TestSlowClientsCannotHoldTheServer(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	serveWithLimits(t, env, "max_connections = 3\nrequest_timeout_seconds = 1\n")
	addr := strings.TrimPrefix(env.url, "http://")

	// A slow client: half a request, then nothing. It is cut off.
	slow := dialTest(t, addr)
	if _, err := io.WriteString(slow, "GET /v1/chains HTTP/1.1\r\nHost: 127.0.0.1\r\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(slow); err != nil {
		t.Fatalf("a slow client was not cut off by the server: %v", err)
	}

	// Three kept-alive connections, each answered once, so the server
	// holds all three; idle, they stay open for a minute.
	held := make([]net.Conn, 3)
	for i := range held {
		held[i] = dialTest(t, addr)
		if err := healthz(held[i], bufio.NewReader(held[i])); err != nil {
			t.Fatalf("healthz on a kept-alive connection: %v", err)
		}
	}
	client := clientFrom("127.0.0.1", "")
	for _, path := range []string{"/healthz", "/readyz"} {
		if got := get(t, client, env.url+path); got.status != 200 || !got.closed {
			t.Errorf("GET %s with every slot held: %d (closed %v), want 200 on a connection that closes", path, got.status, got.closed)
		}
	}
	if got := get(t, client, env.url+"/v1/chains"); got.status != 503 || got.code != "server_busy" || got.retryAfter == "" {
		t.Errorf("GET /v1/chains with every slot held: %d %q Retry-After %q, want 503 server_busy with Retry-After", got.status, got.code, got.retryAfter)
	}
	_ = held[0].Close()
	waitFor(t, "a freed slot to serve /v1/chains", func() bool { return get(t, client, env.url+"/v1/chains").status == 200 })
}

// TestIdleConnectionsClosed: a kept-alive connection with nothing more to
// ask is closed at the idle timeout.
func TestIdleConnectionsClosed(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	serveWithLimits(t, env, "idle_timeout_seconds = 1\n")
	c := dialTest(t, strings.TrimPrefix(env.url, "http://"))
	br := bufio.NewReader(c)
	if err := healthz(c, br); err != nil {
		t.Fatal(err)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("an idle kept-alive connection was not closed: %v", err)
	}
}

// dialTest opens a connection to addr that reads time out after a minute.
func dialTest(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetReadDeadline(time.Now().Add(60 * time.Second))
	return c
}

// healthz asks /healthz on a kept-alive connection and reads the answer.
func healthz(c net.Conn, br *bufio.Reader) error {
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	return err
}

// TestEventStreamOutlivesRequestTimeout: the request timeout bounds how a
// request is sent and answered, not how long an event stream follows a run.
func TestEventStreamOutlivesRequestTimeout(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	serveWithLimits(t, env, "request_timeout_seconds = 1\n")
	var run api.StartResponse
	if code, _, body := env.call("POST", "/v1/chains/hello/runs", `{"sleep_ms":2500}`, nil, &run); code != 202 {
		t.Fatalf("POST: %d %s", code, body)
	}
	resp, err := http.Get(env.url + "/v1/runs/" + run.ID + "/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("the event stream broke: %v\n%s", err, data)
	}
	if !strings.Contains(string(data), "event: run_succeeded") {
		t.Errorf("the stream ended before the run did:\n%s", data)
	}
	var waited api.StartResponse
	if code, _, body := env.call("POST", "/v1/chains/hello/runs?wait=30s", `{"sleep_ms":1500}`, nil, &waited); code != 200 || waited.Status != "succeeded" {
		t.Errorf("POST ?wait=30s past the request timeout: %d %s", code, body)
	}
}

// TestLoopbackModeRefusesForeignRequests: an API with no tokens answers
// only requests addressed to a loopback name and not sent by another
// origin's page, so neither DNS rebinding nor a cross-site form reaches it.
func TestLoopbackModeRefusesForeignRequests(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	tests := []struct {
		name, method, path string
		headers            map[string]string
		status             int
		code               string
	}{
		{"own host", "GET", "/v1/runs", nil, 200, ""},
		{"localhost", "GET", "/v1/runs", map[string]string{"Host": "localhost:8080"}, 200, ""},
		{"ipv6 loopback", "GET", "/v1/runs", map[string]string{"Host": "[::1]:8080"}, 200, ""},
		{"rebound name", "GET", "/v1/runs", map[string]string{"Host": "attacker.example:8080"}, 421, "host_not_loopback"},
		{"rebound name posting", "POST", "/v1/dlq/purge", map[string]string{"Host": "attacker.example"}, 421, "host_not_loopback"},
		{"foreign origin", "POST", "/v1/chains/hello/runs", map[string]string{"Origin": "https://attacker.example"}, 403, "foreign_origin"},
		{"null origin", "POST", "/v1/dlq/purge", map[string]string{"Origin": "null"}, 403, "foreign_origin"},
		{"cross-site fetch", "POST", "/v1/dlq/purge", map[string]string{"Sec-Fetch-Site": "cross-site"}, 403, "foreign_origin"},
		{"health checks stay open", "GET", "/healthz", map[string]string{"Host": "attacker.example"}, 200, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, env.url+tt.path, strings.NewReader(`{}`))
			for k, v := range tt.headers {
				if k == "Host" {
					req.Host = v
				} else {
					req.Header.Set(k, v)
				}
			}
			resp, err := env.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var e apiErr
			_ = json.NewDecoder(resp.Body).Decode(&e)
			if resp.StatusCode != tt.status || e.Error.Code != tt.code {
				t.Errorf("%s %s: %d %q, want %d %q (%s)", tt.method, tt.path, resp.StatusCode, e.Error.Code, tt.status, tt.code, e.Error.Message)
			}
		})
	}
	// The page's own origin is the API's: allowed.
	code, _, body := env.call("POST", "/v1/chains/hello/runs", `{}`, map[string]string{"Origin": env.url}, nil)
	if code != 202 {
		t.Errorf("same-origin POST: %d %s", code, body)
	}

	// With tokens, the token is the guard: any Host is answered.
	authed := newAPI(t, "[gateway.auth]\ntokens = [\"writer\"]\n")
	authed.token = "writer"
	req, _ := http.NewRequest("GET", authed.url+"/v1/runs", nil)
	req.Host = "gateway.internal.example:8080"
	req.Header.Set("Authorization", "Bearer writer")
	resp, err := authed.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("with tokens, a request by a non-loopback name: %d, want 200", resp.StatusCode)
	}
}

// TestItemsStream: ?items=true on a split of thousands of items answers
// the same JSON as the run without items, with every item's records.
func TestItemsStream(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	env.write("[gateway]\nsecrets_file = \"secrets.env\"\n" + strings.Replace(apiConfig, "max_request_bytes = 2048", "max_request_bytes = 1048576", 1))
	if _, err := env.srv.Reload(); err != nil {
		t.Fatal(err)
	}
	const n = 3000
	items := make([]string, n)
	for i := range items {
		items[i] = fmt.Sprintf(`{"host":"h%d"}`, i)
	}
	var run api.StartResponse
	code, _, body := env.call("POST", "/v1/chains/many/runs?wait=60s", `{"hosts":[`+strings.Join(items, ",")+`]}`, nil, &run)
	if code != 200 || run.Status != "succeeded" {
		t.Fatalf("POST: %d %s", code, body)
	}
	var without, with map[string]json.RawMessage
	env.call("GET", "/v1/runs/"+run.ID, "", nil, &without)
	code, hdr, _ := env.call("GET", "/v1/runs/"+run.ID+"?items=true", "", nil, &with)
	if code != 200 || hdr.Get("Content-Type") != "application/json" {
		t.Fatalf("GET ?items=true: %d %s", code, hdr.Get("Content-Type"))
	}
	for k, v := range without {
		if k != "steps" && string(with[k]) != string(v) {
			t.Errorf("%s: %s streamed, %s without items", k, with[k], v)
		}
	}
	var steps, own map[string]json.RawMessage
	_ = json.Unmarshal(with["steps"], &steps)
	_ = json.Unmarshal(without["steps"], &own)
	if len(steps) != len(own)+n {
		t.Fatalf("%d step records streamed, want the %d without items and %d items", len(steps), len(own), n)
	}
	if _, ok := steps[engine.ItemKey("check", n-1, n)]; !ok {
		t.Errorf("the last item's record is missing; some keys: %v", firstKeys(steps, 5))
	}
}

func firstKeys(m map[string]json.RawMessage, n int) []string {
	var keys []string
	for k := range m {
		if len(keys) == n {
			break
		}
		keys = append(keys, k)
	}
	return keys
}
