// Package connguard is what the HTTP server guards its connections with:
// connections per address and in all, bodies left unread, wrong credentials
// counted per address, and loopback-only answers.
package connguard

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/gateway/api"
)

// HoldOpen lets a request that waits for the engine (an event stream, a
// ?wait= start) outlive the request timeout: its body has been read, so the
// read deadline goes, and the write deadline moves to d from now. Streams
// call it again before each write.
func HoldOpen(w http.ResponseWriter, d time.Duration) {
	rc := http.NewResponseController(w)
	// Test recorders have no deadlines; the server's connections do.
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Now().Add(d))
}

// The reserve: connections taken past max_connections, or past an
// address's max_connections_per_address, so that a load balancer's probe
// still reaches /healthz and /readyz while a flood holds every slot. A
// connection in it must send its request within reserveTime; it is
// answered once, the health checks as usual, anything else with 429 or 503,
// and closed. One address holds at most reservePerAddress of it, so a flood
// from a few addresses cannot fill it either.
const (
	reserveConns      = 64
	reservePerAddress = 4
	reserveTime       = 2 * time.Second
)

// refusedBodyGrace is how long a refused request's body is still read, so
// its client sees the answer rather than a reset: net/http would read up
// to 256 KB of it for as long as the request timeout to keep the
// connection, and a client sending a byte at a time would hold it that long.
// An address that holds half its connections or more gets no grace: a
// flood's refused connections then free their slots at once.
const refusedBodyGrace = time.Second

// connLimiter admits the API's connections: each remote address holds at
// most perAddr of the max regular connections; past either bound a
// connection goes to the reserve, and past the reserve it is closed at
// once. Nothing waits in the kernel's backlog, where a probe would wait
// behind the flood.
type connLimiter struct {
	net.Listener
	max, perAddr int
	// refused counts connections closed or answered without being served.
	refused func(reason string)

	mu     sync.Mutex
	open   int // regular connections
	spare  int // connections in the reserve
	byAddr map[netip.Prefix]*addrConns
}

type addrConns struct{ open, spare int }

func LimitConns(l net.Listener, lim chain.Limits, refused func(reason string)) *connLimiter {
	perAddr := lim.MaxConnectionsPerAddress
	if perAddr <= 0 {
		perAddr = chain.DefaultMaxConnsPerAddr
	}
	return &connLimiter{Listener: l, max: lim.MaxConnections, perAddr: perAddr, refused: refused, byAddr: map[netip.Prefix]*addrConns{}}
}

func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if ac := l.admit(c); ac != nil {
			return ac, nil
		}
		l.refused("connection_closed")
		_ = c.Close()
	}
}

func (l *connLimiter) admit(c net.Conn) *admittedConn {
	key := addressKey(c.RemoteAddr())
	l.mu.Lock()
	defer l.mu.Unlock()
	a := l.byAddr[key]
	if a == nil {
		a = &addrConns{}
		l.byAddr[key] = a
	}
	switch {
	case a.open < l.perAddr && l.open < l.max:
		a.open++
		l.open++
		return &admittedConn{Conn: c, l: l, key: key}
	case a.spare < reservePerAddress && l.spare < reserveConns:
		a.spare++
		l.spare++
		over := &api.APIError{Status: http.StatusServiceUnavailable, Code: "server_busy", Message: fmt.Sprintf("the gateway holds as many connections as it takes (%d); only /healthz and /readyz are answered until some close", l.max)}
		if a.open >= l.perAddr {
			over = &api.APIError{Status: http.StatusTooManyRequests, Code: "too_many_connections", Message: fmt.Sprintf("this address holds as many connections as one address may (%d); send requests on those, or close some", l.perAddr)}
		}
		return &admittedConn{Conn: c, l: l, key: key, Over: over, cutAt: time.Now().Add(reserveTime)}
	}
	if a.open+a.spare == 0 {
		delete(l.byAddr, key)
	}
	return nil
}

func (l *connLimiter) release(c *admittedConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	a := l.byAddr[c.key]
	if c.Over != nil {
		a.spare--
		l.spare--
	} else {
		a.open--
		l.open--
	}
	if a.open+a.spare == 0 {
		delete(l.byAddr, c.key)
	}
}

// crowded reports whether c is in the reserve, or its address holds half
// the connections it may or more.
func (l *connLimiter) crowded(c *admittedConn) bool {
	if c.Over != nil {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	// Gone when the server closed c meanwhile, shutting down.
	a := l.byAddr[c.key]
	return a == nil || 2*a.open >= l.perAddr
}

// admittedConn is a connection the limiter took, released when closed.
type admittedConn struct {
	net.Conn
	l    *connLimiter
	key  netip.Prefix
	once sync.Once
	// Over is what a connection in the reserve answers to anything but
	// the health checks; nil for a regular connection.
	Over *api.APIError
	// cutAt is when a connection in the reserve stops being read.
	cutAt time.Time
}

// SetReadDeadline keeps a reserve connection's reads within its time,
// whatever net/http asks for.
func (c *admittedConn) SetReadDeadline(t time.Time) error {
	if c.Over != nil && (t.IsZero() || t.After(c.cutAt)) {
		t = c.cutAt
	}
	return c.Conn.SetReadDeadline(t)
}

func (c *admittedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c) })
	return err
}

type ConnKey struct{}

// ReserveConn is the reserve connection r came on; nil when it came on a
// regular one.
func ReserveConn(r *http.Request) *admittedConn {
	c, ok := r.Context().Value(ConnKey{}).(*admittedConn)
	if !ok || c.Over == nil {
		return nil
	}
	return c
}

// addressKey is what the per-address limits count by: the remote IP, or
// for IPv6 its /64, which one client usually has whole.
func addressKey(a net.Addr) netip.Prefix {
	var ip netip.Addr
	if ta, ok := a.(*net.TCPAddr); ok {
		ip = ta.AddrPort().Addr()
	} else if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		ip = ap.Addr()
	}
	return prefixOf(ip)
}

func prefixOf(ip netip.Addr) netip.Prefix {
	ip = ip.Unmap()
	bits := 32
	if ip.Is6() {
		bits = 64
	}
	p, _ := ip.Prefix(bits)
	return p
}

// RequestAddress is the key of the address r came from.
func RequestAddress(r *http.Request) netip.Prefix {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Prefix{}
	}
	return prefixOf(ap.Addr())
}

// BodyWatch records whether a request's body was read to its end.
type BodyWatch struct {
	io.ReadCloser
	done atomic.Bool
}

func (b *BodyWatch) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.done.Store(true)
	}
	return n, err
}

// BodyUnread reports whether r has a body its handler has not read to its
// end.
func BodyUnread(r *http.Request) bool {
	b, ok := r.Body.(*BodyWatch)
	return ok && r.ContentLength != 0 && !b.done.Load()
}

// CloseUnread ends a request whose body was left unread: the connection
// closes after the answer, and what the client still sends is read for
// refusedBodyGrace at most.
func CloseUnread(w http.ResponseWriter, r *http.Request) {
	grace := refusedBodyGrace
	if c, ok := r.Context().Value(ConnKey{}).(*admittedConn); ok && c.l.crowded(c) {
		grace = 0
	}
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(grace))
}

// LoopbackOnly guards an API, or a console, served without tokens. Such an API listens
// only on loopback, but a web page the operator opens can still reach it:
// by a DNS name rebound to 127.0.0.1 (its Host is then that name) or by a
// form posted from another origin. Both are refused.
func LoopbackOnly(r *http.Request) *api.APIError {
	if !loopbackHost(r.Host) {
		return &api.APIError{Status: http.StatusMisdirectedRequest, Code: "host_not_loopback", Message: "this gateway serves without API tokens, so only requests to a loopback name (localhost, 127.0.0.1, [::1]) are answered; got Host " + quoteHost(r.Host)}
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		if r.Header.Get("Sec-Fetch-Site") == "cross-site" {
			return &api.APIError{Status: http.StatusForbidden, Code: "foreign_origin", Message: "this gateway serves without API tokens and answers no cross-site request"}
		}
		return nil
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" || !strings.EqualFold(u.Host, r.Host) {
		return &api.APIError{Status: http.StatusForbidden, Code: "foreign_origin", Message: "this gateway serves without API tokens and answers no request from another origin; got Origin " + quoteHost(origin)}
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
