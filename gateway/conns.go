package gateway

import (
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/chaingate/gateway/chain"
)

// httpServer is the API's HTTP server, with the timeouts of lim: a client
// that sends its request slowly, reads its answer slowly or keeps an idle
// connection is cut off instead of holding it.
func (s *Server) httpServer(lim chain.Limits) *http.Server {
	request := time.Duration(lim.RequestTimeoutSeconds) * time.Second
	return &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: min(request, 10*time.Second),
		ReadTimeout:       request,
		WriteTimeout:      request,
		IdleTimeout:       time.Duration(lim.IdleTimeoutSeconds) * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
}

// holdOpen lets a request that waits for the engine (an event stream, a
// ?wait= start) outlive the request timeout: its body has been read, so the
// read deadline goes, and the write deadline moves to d from now. Streams
// call it again before each write.
func holdOpen(w http.ResponseWriter, d time.Duration) {
	rc := http.NewResponseController(w)
	// Test recorders have no deadlines; the server's connections do.
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Now().Add(d))
}

// limitListener accepts at most n connections at once; the next waits in
// the kernel's backlog until one closes.
type limitListener struct {
	net.Listener
	slots chan struct{}
}

func limitConns(l net.Listener, n int) net.Listener {
	return &limitListener{Listener: l, slots: make(chan struct{}, n)}
}

func (l *limitListener) Accept() (net.Conn, error) {
	l.slots <- struct{}{}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &limitedConn{Conn: c, release: func() { <-l.slots }}, nil
}

type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// loopbackOnly guards an API served without tokens. Such an API listens
// only on loopback, but a web page the operator opens can still reach it:
// by a DNS name rebound to 127.0.0.1 (its Host is then that name) or by a
// form posted from another origin. Both are refused.
func loopbackOnly(r *http.Request) *APIError {
	if !loopbackHost(r.Host) {
		return &APIError{Status: http.StatusMisdirectedRequest, Code: "host_not_loopback", Message: "this gateway serves without API tokens, so only requests to a loopback name (localhost, 127.0.0.1, [::1]) are answered; got Host " + quoteHost(r.Host)}
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		if r.Header.Get("Sec-Fetch-Site") == "cross-site" {
			return &APIError{Status: http.StatusForbidden, Code: "foreign_origin", Message: "this gateway serves without API tokens and answers no cross-site request"}
		}
		return nil
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" || !strings.EqualFold(u.Host, r.Host) {
		return &APIError{Status: http.StatusForbidden, Code: "foreign_origin", Message: "this gateway serves without API tokens and answers no request from another origin; got Origin " + quoteHost(origin)}
	}
	return nil
}

func quoteHost(h string) string {
	if h == "" {
		return "(none)"
	}
	if len(h) > 100 {
		h = h[:100] + "…"
	}
	return `"` + h + `"`
}

// loopbackHost reports whether a Host header names this machine: localhost,
// a name under .localhost, or a loopback address, with any port.
func loopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
