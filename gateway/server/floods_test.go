package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// These tests drive a real listener from several loopback addresses
// (127.0.0.2, 127.0.0.3, ...), which Linux routes to lo: the per-address
// limits count by remote address.

const floodAuth = "[gateway.auth]\ntokens = [\"writer\"]\nread_tokens = [\"reader\"]\n"

// answer is what one request got.
type answer struct {
	status     int
	code       string
	retryAfter string
	// closed is whether the server said it closes the connection.
	closed bool
	err    error
}

// clientFrom makes requests from the loopback address from, each on a
// connection of its own, with token as its bearer token if not empty.
func clientFrom(from, token string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	return &http.Client{Timeout: 30 * time.Second, Transport: &tokenTransport{token: token, rt: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}}
}

type tokenTransport struct {
	token string
	rt    http.RoundTripper
}

func (t *tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if t.token != "" {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+t.token)
	}
	return t.rt.RoundTrip(r)
}

func get(t *testing.T, c *http.Client, url string) answer {
	t.Helper()
	return request(c, "GET", url, "")
}

func request(c *http.Client, method, url, body string) answer {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	resp, err := c.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	var e apiErr
	_ = json.NewDecoder(resp.Body).Decode(&e)
	return answer{status: resp.StatusCode, code: e.Error.Code, retryAfter: resp.Header.Get("Retry-After"), closed: resp.Close}
}

// waitFor polls cond for up to a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("still waiting for %s after a minute", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// dialFrom opens a connection to addr from the loopback address from,
// whose reads time out after a minute.
func dialFrom(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dialing from %s: %v", from, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetReadDeadline(time.Now().Add(time.Minute))
	return c
}

// slowPost sends the head of a POST announcing a body of size bytes,
// then its body a byte every gap until the server closes or stop closes.
func slowPost(c net.Conn, path, token string, size int, gap time.Duration, stop <-chan struct{}) {
	head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n", path, size)
	if token != "" {
		head += "Authorization: Bearer " + token + "\r\n"
	}
	if _, err := io.WriteString(c, head+"\r\n"); err != nil {
		return
	}
	t := time.NewTicker(gap)
	defer t.Stop()
	for range size {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if _, err := c.Write([]byte{' '}); err != nil {
			return
		}
	}
}

// TestRefusalsCloseAtOnce: a request refused before its body is read is
// answered at once, and its connection closes soon after, however slowly
// the client sends the body it announced; it is not held for the request
// timeout (30 s here) reading it.
func TestRefusalsCloseAtOnce(t *testing.T) {
	t.Parallel()
	env := newAPI(t, floodAuth)
	serveWith(t, env, floodAuth, "")
	addr := strings.TrimPrefix(env.url, "http://")
	tests := []struct {
		name, path, token string
		size              int
		status            int
		code              string
	}{
		{"no token", "/v1/chains/hello/runs", "", 100_000, 401, "unauthorized"},
		{"wrong token", "/v1/chains/hello/runs", "guess", 100_000, 401, "unauthorized"},
		{"read-only token", "/v1/chains/hello/runs", "reader", 100_000, 403, "forbidden"},
		{"announced too large", "/v1/chains/hello/runs", "writer", 100_000, 413, "payload_too_large"},
		{"larger than net/http reads after a handler", "/v1/chains/hello/runs", "", 1 << 20, 401, "unauthorized"},
		{"no such path", "/v1/nothing", "writer", 1000, 404, "not_found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := dialTest(t, addr)
			stop := make(chan struct{})
			defer close(stop)
			go slowPost(c, tt.path, tt.token, tt.size, 100*time.Millisecond, stop)
			// Half the request timeout: a connection held to read the
			// body would still be open then.
			_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			var e apiErr
			_ = json.NewDecoder(resp.Body).Decode(&e)
			resp.Body.Close()
			if resp.StatusCode != tt.status || e.Error.Code != tt.code || !resp.Close {
				t.Errorf("%d %q (Connection: close %v), want %d %q with Connection: close", resp.StatusCode, e.Error.Code, resp.Close, tt.status, tt.code)
			}
			if _, err := io.Copy(io.Discard, br); errors.Is(err, os.ErrDeadlineExceeded) {
				t.Errorf("the connection was still open 15 s after its request was refused")
			}
		})
	}

	// A client that sends its whole body at once gets the answer, not a
	// reset, though the body was never read.
	got := request(clientFrom("127.0.0.1", ""), "POST", env.url+"/v1/chains/hello/runs", strings.Repeat(" ", 100_000))
	if got.err != nil || got.status != 401 || !got.closed {
		t.Errorf("a whole unread body: %d %v (closed %v), want 401 and a closed connection", got.status, got.err, got.closed)
	}
}

// TestOneAddressCannotHoldEveryConnection: an address holds at most
// max_connections_per_address connections; past that it is answered 429
// at once, but its health checks still are; other addresses are served.
// Once every slot is held, the health checks are still answered, from the
// reserve, which one address cannot fill either.
func TestOneAddressCannotHoldEveryConnection(t *testing.T) {
	t.Parallel()
	env := newAPI(t, floodAuth)
	serveWith(t, env, floodAuth, "max_connections = 6\nmax_connections_per_address = 2\n")
	addr := strings.TrimPrefix(env.url, "http://")
	// hold keeps a regular connection from an address open: one its
	// answer does not close, as those in the reserve do.
	hold := func(from string) {
		t.Helper()
		waitFor(t, "a regular connection from "+from, func() bool {
			c := dialFrom(t, from, addr)
			if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("healthz from %s: %v", from, err)
			}
			resp.Body.Close()
			if resp.Close {
				_ = c.Close()
			}
			return !resp.Close
		})
	}
	hold("127.0.0.2")
	hold("127.0.0.2")

	flooder := clientFrom("127.0.0.2", "writer")
	if got := get(t, flooder, env.url+"/v1/chains"); got.status != 429 || got.code != "too_many_connections" || got.retryAfter == "" || !got.closed {
		t.Errorf("a third connection from one address: %+v, want 429 too_many_connections with Retry-After, closed", got)
	}
	if got := get(t, flooder, env.url+"/healthz"); got.status != 200 {
		t.Errorf("healthz on a third connection from one address: %+v, want 200", got)
	}
	other := clientFrom("127.0.0.7", "writer")
	if got := get(t, other, env.url+"/v1/chains"); got.status != 200 {
		t.Errorf("another address while the first holds its share: %+v, want 200", got)
	}

	for _, from := range []string{"127.0.0.3", "127.0.0.3", "127.0.0.4", "127.0.0.4"} {
		hold(from)
	}
	late := clientFrom("127.0.0.5", "writer")
	if got := get(t, late, env.url+"/v1/chains"); got.status != 503 || got.code != "server_busy" {
		t.Errorf("a new address with every slot held: %+v, want 503 server_busy", got)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if got := get(t, late, env.url+path); got.status != 200 {
			t.Errorf("GET %s with every slot held: %+v, want 200", path, got)
		}
	}

	// One address sits on its share of the reserve, sending nothing; its
	// next connection is closed unanswered, and another address's probe
	// is still answered.
	for range 4 {
		dialFrom(t, "127.0.0.8", addr)
	}
	c := dialFrom(t, "127.0.0.8", addr)
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); err == nil {
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
			resp.Body.Close()
			t.Errorf("an address past its share of the reserve was answered %d, want its connection closed", resp.StatusCode)
		}
	}
	if got := get(t, clientFrom("127.0.0.6", ""), env.url+"/healthz"); got.status != 200 {
		t.Errorf("a probe while one address sits on its share of the reserve: %+v, want 200", got)
	}
}

// TestHealthAnswersDuringSlowPostFlood: one address floods with slow
// POSTs, some with a valid token (which hold their connections while the
// body trickles in), most without (refused, and reconnecting); health
// probes from another address are answered all along, and the flooding
// address is refused more connections.
func TestHealthAnswersDuringSlowPostFlood(t *testing.T) {
	t.Parallel()
	env := newAPI(t, floodAuth)
	serveWith(t, env, floodAuth, "max_connections_per_address = 8\n")
	addr := strings.TrimPrefix(env.url, "http://")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() {
		close(stop)
		wg.Wait()
	}()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	for i := range 40 {
		token := ""
		if i < 8 {
			token = "writer"
		}
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := d.DialContext(context.Background(), "tcp", addr)
				if err != nil {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				go func() {
					_, _ = io.Copy(io.Discard, c)
					_ = c.Close()
				}()
				slowPost(c, "/v1/chains/hello/runs", token, 2000, 200*time.Millisecond, stop)
				_ = c.Close()
			}
		})
	}
	flooder := clientFrom("127.0.0.2", "writer")
	waitFor(t, "the flood to hold its address's share", func() bool { return get(t, flooder, env.url+"/v1/chains").status == 429 })
	probe := clientFrom("127.0.0.1", "")
	for range 10 {
		if got := get(t, probe, env.url+"/healthz"); got.status != 200 {
			t.Fatalf("a health probe during the flood: %+v, want 200", got)
		}
		if got := get(t, probe, env.url+"/readyz"); got.status != 200 {
			t.Fatalf("a readiness probe during the flood: %+v, want 200", got)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := get(t, clientFrom("127.0.0.3", "writer"), env.url+"/v1/chains"); got.status != 200 {
		t.Errorf("a client from another address during the flood: %+v, want 200", got)
	}
}

// TestWrongTokensAreSlowed: after ten wrong tokens from one address, its
// credentials are refused with 429 and Retry-After, a valid one too, while
// other addresses, with right or wrong tokens, are answered as usual.
func TestWrongTokensAreSlowed(t *testing.T) {
	t.Parallel()
	env := newAPI(t, floodAuth)
	serveWith(t, env, floodAuth, "")
	guesser := "127.0.0.2"
	for i := range 10 {
		if got := get(t, clientFrom(guesser, fmt.Sprintf("guess-%d", i)), env.url+"/v1/runs"); got.status != 401 {
			t.Fatalf("wrong token %d: %+v, want 401", i+1, got)
		}
	}
	got := get(t, clientFrom(guesser, "guess-10"), env.url+"/v1/runs")
	if got.status != 429 || got.code != "too_many_auth_failures" || got.retryAfter == "" || got.retryAfter == "0" {
		t.Errorf("the eleventh wrong token: %+v, want 429 too_many_auth_failures with Retry-After", got)
	}
	if got := get(t, clientFrom(guesser, "writer"), env.url+"/v1/runs"); got.status != 429 {
		t.Errorf("a valid token from the guessing address: %+v, want 429 (a guess that found the token must not be told)", got)
	}
	if got := get(t, clientFrom(guesser, ""), env.url+"/healthz"); got.status != 200 {
		t.Errorf("healthz from the guessing address: %+v, want 200", got)
	}
	form := "token=guess-11&next=%2Fui%2F"
	req, _ := http.NewRequest("POST", env.url+"/ui/login", strings.NewReader(form))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := clientFrom(guesser, "").Do(req)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 429 || !bytes.Contains(page, []byte("too many wrong tokens")) {
		t.Errorf("console sign-in from the guessing address: %d, want 429 saying why", resp.StatusCode)
	}

	if got := get(t, clientFrom("127.0.0.1", "writer"), env.url+"/v1/runs"); got.status != 200 {
		t.Errorf("a valid token from another address: %+v, want 200", got)
	}
	if got := get(t, clientFrom("127.0.0.3", "guess"), env.url+"/v1/runs"); got.status != 401 {
		t.Errorf("a wrong token from another address: %+v, want 401", got)
	}
	for range 50 {
		if got := get(t, clientFrom("127.0.0.4", "reader"), env.url+"/v1/runs"); got.status != 200 {
			t.Fatalf("a valid token, many times over: %+v, want 200", got)
		}
	}
}
