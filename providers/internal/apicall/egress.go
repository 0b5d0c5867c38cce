package apicall

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/chaingate/gateway/providers"
)

// A payload is filled from the alert that started the run, so anything a
// template puts in a URL is the sender's to choose. Where a provider's
// requests may go is therefore decided here, once, for every provider that
// takes a URL:
//
//   - the config's credentials (its headers, its token) go only to base_url's
//     origin: scheme, host and port;
//   - any other origin must match allowed_hosts, and gets no credentials;
//   - redirects are not followed unless the config asks, and then only to
//     where a request could go, without credentials off base_url's origin;
//   - with deny_private_networks, no connection is made to a loopback,
//     private or link-local address, checked on the address dialed, so a
//     name that resolves there (DNS rebinding included) is refused too.

// Egress says where a provider's requests may go.
type Egress struct {
	// origin is base_url's, "" when there is none.
	origin  string
	allowed []string
}

// NewEgress checks a config's base_url (may be empty) and allowed_hosts.
// A pattern is a host name ("status.example.com"), a wildcard for every
// name below a domain ("*.internal.example.com", not the domain itself),
// an IP address, or "*" for any host.
func NewEgress(baseURL string, allowedHosts []string) (*Egress, error) {
	e := &Egress{}
	if baseURL != "" {
		u, err := url.Parse(baseURL)
		if err != nil {
			return nil, fmt.Errorf("parsing base_url: %w", InnerURLError(err))
		}
		if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("base_url %q is not an http or https URL with a host", WithoutQuery(u.Redacted()))
		}
		e.origin = Origin(u)
	}
	for i, p := range allowedHosts {
		p = strings.ToLower(strings.TrimSpace(p))
		name := strings.TrimPrefix(p, "*.")
		switch {
		case p == "*":
		case name == "" || strings.ContainsAny(name, "*/:@?# ") && net.ParseIP(strings.Trim(name, "[]")) == nil:
			return nil, fmt.Errorf("allowed_hosts[%d] %q is not a host name, *.domain, an IP address or *", i, allowedHosts[i])
		}
		e.allowed = append(e.allowed, strings.Trim(p, "[]"))
	}
	return e, nil
}

// Origin is a URL's scheme, host and port, the port written even when it
// is the scheme's default, so that two spellings of one origin compare
// equal.
func Origin(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	return u.Scheme + "://" + net.JoinHostPort(strings.ToLower(u.Hostname()), port)
}

// Check says whether a request may go to u, and whether the config's
// credentials go with it. A request elsewhere is a permanent error naming
// the host: no retry can make it allowed.
func (e *Egress) Check(where string, u *url.URL) (credentials bool, err error) {
	if e.origin != "" && Origin(u) == e.origin {
		return true, nil
	}
	host := strings.ToLower(u.Hostname())
	for _, p := range e.allowed {
		if p == "*" || p == host || strings.HasPrefix(p, "*.") && strings.HasSuffix(host, p[1:]) {
			return false, nil
		}
	}
	switch {
	case e.origin == "" && len(e.allowed) == 0:
		return false, providers.Permanent("host_not_allowed", "%s: host %q is not allowed: the provider has neither base_url nor allowed_hosts", where, host)
	case e.origin == "":
		return false, providers.Permanent("host_not_allowed", "%s: host %q matches no allowed_hosts pattern (%s)", where, host, strings.Join(e.allowed, ", "))
	default:
		return false, providers.Permanent("host_not_allowed", "%s: %s is not base_url's origin (%s) and matches no allowed_hosts pattern; add it to allowed_hosts to allow requests there, which never carry the config's headers", where, Origin(u), e.origin)
	}
}

// Policy is how one call's requests are made.
type Policy struct {
	// Egress decides where redirects may go; nil with FollowRedirects unset.
	Egress *Egress
	// FollowRedirects follows up to ten redirects that Egress allows.
	FollowRedirects bool
	// Credentials are the header names the config sets, dropped from a
	// redirect off base_url's origin.
	Credentials []string
	// DenyPrivate refuses connections to loopback, private and link-local
	// addresses.
	DenyPrivate bool
}

// Net holds a provider's connection pools: one that may dial anywhere, one
// that refuses private addresses. Clients made from it share them.
type Net struct {
	open, public *http.Transport
}

// NewNet returns the pools of a provider.
func NewNet() *Net {
	open := http.DefaultTransport.(*http.Transport).Clone()
	public := http.DefaultTransport.(*http.Transport).Clone()
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: refusePrivate}
	public.DialContext = dialer.DialContext
	// Through a proxy, the address dialed is the proxy's, not the target's,
	// which then cannot be checked: the proxy is not used.
	public.Proxy = nil
	return &Net{open: open, public: public}
}

// Client returns a client for one call made under p.
func (n *Net) Client(p Policy) *http.Client {
	t := n.open
	if p.DenyPrivate {
		t = n.public
	}
	return &http.Client{Transport: t, CheckRedirect: func(req *http.Request, via []*http.Request) error {
		if !p.FollowRedirects {
			return http.ErrUseLastResponse
		}
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		creds, err := p.Egress.Check("following a redirect", req.URL)
		if err != nil {
			return err
		}
		if !creds {
			for _, h := range p.Credentials {
				req.Header.Del(h)
			}
		}
		return nil
	}}
}

// PrivateAddressError is a connection refused because the address is
// loopback, private or link-local.
type PrivateAddressError struct {
	Addr netip.Addr
}

func (e *PrivateAddressError) Error() string {
	return fmt.Sprintf("refusing to connect to %s, a loopback, private or link-local address (deny_private_networks)", e.Addr)
}

func refusePrivate(_, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return err
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return err
	}
	if ip = ip.Unmap(); !IsPublic(ip) {
		return &PrivateAddressError{Addr: ip}
	}
	return nil
}

// notPublic are ranges no service on the internet answers from.
var notPublic = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"), // shared address space (carrier-grade NAT)
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("64:ff9b::/96"), // NAT64, which may embed any of the above
}

// IsPublic reports whether ip is an address on the internet: not loopback,
// private, link-local, unspecified, multicast or reserved.
func IsPublic(ip netip.Addr) bool {
	ip = ip.Unmap()
	if ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() ||
		ip.IsInterfaceLocalMulticast() || ip.IsMulticast() || ip.IsUnspecified() || !ip.IsValid() {
		return false
	}
	return !slices.ContainsFunc(notPublic, func(p netip.Prefix) bool { return p.Contains(ip) })
}

// Refused reports a request the policy refused — a connection to a private
// address, a redirect to a host not allowed — as the permanent error it
// is; nil for any other error.
func Refused(where string, err error) error {
	var pe *PrivateAddressError
	if errors.As(err, &pe) {
		return &providers.Error{Code: "address_not_allowed", Message: fmt.Sprintf("%s: %v", where, pe), Err: err}
	}
	var he *providers.Error
	if errors.As(err, &he) && he.Code == "host_not_allowed" {
		return he
	}
	return nil
}
