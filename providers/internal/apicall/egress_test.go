package apicall_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"

	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/internal/apicall"
)

func TestEgressCheck(t *testing.T) {
	tests := []struct {
		base    string
		allowed []string
		url     string
		creds   bool
		err     string
	}{
		{"https://api.example.com/v1", nil, "https://api.example.com/v2/x", true, ""},
		{"https://api.example.com/v1", nil, "https://API.example.com:443/x", true, ""},
		{"https://api.example.com", nil, "http://api.example.com/x", false, "http://api.example.com:80 is not base_url's origin (https://api.example.com:443)"},
		{"https://api.example.com", nil, "https://api.example.com:8443/x", false, "is not base_url's origin"},
		{"https://api.example.com", nil, "https://evil.example.net/steal", false, `https://evil.example.net:443 is not base_url's origin`},
		{"https://api.example.com", []string{"*.internal.example.com"}, "https://db-1.internal.example.com/healthz", false, ""},
		{"https://api.example.com", []string{"*.internal.example.com"}, "https://a.b.internal.example.com/x", false, ""},
		{"https://api.example.com", []string{"*.internal.example.com"}, "https://internal.example.com/x", false, "matches no allowed_hosts pattern"},
		{"https://api.example.com", []string{"*.internal.example.com"}, "https://evilinternal.example.com/x", false, "matches no allowed_hosts pattern"},
		{"", []string{"status.example.com", "10.0.0.7"}, "http://10.0.0.7:8080/x", false, ""},
		{"", []string{"status.example.com"}, "https://other.example.com/x", false, `host "other.example.com" matches no allowed_hosts pattern (status.example.com)`},
		{"", []string{"*"}, "https://anything.example.org/x", false, ""},
		{"", nil, "https://anything.example.org/x", false, "neither base_url nor allowed_hosts"},
	}
	for _, tc := range tests {
		e, err := apicall.NewEgress(tc.base, tc.allowed)
		if err != nil {
			t.Fatal(err)
		}
		u, _ := url.Parse(tc.url)
		creds, err := e.Check("test", u)
		if tc.err == "" {
			if err != nil || creds != tc.creds {
				t.Errorf("%s with base %q, allowed %v: %v %v, want credentials %v", tc.url, tc.base, tc.allowed, creds, err, tc.creds)
			}
			continue
		}
		var pe *providers.Error
		if !errors.As(err, &pe) || pe.Retryable || pe.Code != "host_not_allowed" || !strings.Contains(pe.Message, tc.err) || creds {
			t.Errorf("%s with base %q, allowed %v: %v, want a permanent host_not_allowed error saying %q", tc.url, tc.base, tc.allowed, err, tc.err)
		}
	}
	for _, bad := range [][]string{{"https://x.example.com"}, {"*example.com"}, {""}, {"a b"}, {"user@host"}} {
		if _, err := apicall.NewEgress("", bad); err == nil {
			t.Errorf("allowed_hosts %q was accepted", bad)
		}
	}
}

func TestIsPublic(t *testing.T) {
	for addr, want := range map[string]bool{
		"8.8.8.8": true, "2606:4700::1111": true, "93.184.216.34": true,
		"127.0.0.1": false, "::1": false, "10.1.2.3": false, "172.16.0.1": false, "192.168.1.1": false,
		"169.254.169.254": false, "fe80::1": false, "fd00::1": false, "0.0.0.0": false, "::": false,
		"100.64.0.1": false, "::ffff:127.0.0.1": false, "::ffff:10.0.0.1": false, "224.0.0.1": false,
		"64:ff9b::a00:1": false,
	} {
		if got := apicall.IsPublic(netip.MustParseAddr(addr)); got != want {
			t.Errorf("IsPublic(%s) = %v, want %v", addr, got, want)
		}
	}
}

// TestDenyPrivate connects to a server on loopback: refused, permanently,
// under deny_private_networks, whatever name the URL uses; reached without.
func TestDenyPrivate(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{}`)) }))
	defer srv.Close()
	n := apicall.NewNet()
	ctx := context.Background()
	u, _ := url.Parse(srv.URL)
	for _, target := range []string{srv.URL, "http://localhost:" + u.Port()} {
		_, err := apicall.Post(ctx, n.Client(apicall.Policy{DenyPrivate: true}), apicall.Request{URL: target, Where: "test"})
		var pe *providers.Error
		if !errors.As(err, &pe) || pe.Retryable || pe.Code != "address_not_allowed" || !strings.Contains(pe.Message, "loopback, private or link-local") {
			t.Errorf("%s: %v, want a permanent address_not_allowed error", target, err)
		}
	}
	if a, err := apicall.Post(ctx, n.Client(apicall.Policy{}), apicall.Request{URL: srv.URL, Where: "test"}); err != nil || !a.OK() {
		t.Errorf("without deny_private_networks: %+v %v", a, err)
	}
}

// TestRedirects follows redirects only when asked, only where requests may
// go, and never with the config's credentials off base_url's origin.
func TestRedirects(t *testing.T) {
	var gotKey string
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotKey = r.Header.Get("X-Api-Key")
		w.Write([]byte(`{"at":"other"}`))
	}))
	defer other.Close()
	base := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+"/landed", http.StatusFound)
	}))
	defer base.Close()
	otherURL, _ := url.Parse(other.URL)
	ctx := context.Background()
	post := func(p apicall.Policy) (*apicall.Answer, error) {
		return apicall.Post(ctx, apicall.NewNet().Client(p), apicall.Request{URL: base.URL + "/x", Where: "test", Header: http.Header{"X-Api-Key": {"k-123"}}})
	}

	a, err := post(apicall.Policy{})
	if err != nil || a.Status != http.StatusFound {
		t.Errorf("not following: %+v %v", a, err)
	}
	strict, _ := apicall.NewEgress(base.URL, nil)
	_, err = post(apicall.Policy{Egress: strict, FollowRedirects: true, Credentials: []string{"X-Api-Key"}})
	var pe *providers.Error
	if !errors.As(err, &pe) || pe.Code != "host_not_allowed" || pe.Retryable {
		t.Errorf("redirect to a host not allowed: %v", err)
	}
	open, _ := apicall.NewEgress(base.URL, []string{otherURL.Hostname()})
	gotKey = "unset"
	a, err = post(apicall.Policy{Egress: open, FollowRedirects: true, Credentials: []string{"X-Api-Key"}})
	if err != nil || !a.OK() || string(a.Body) != `{"at":"other"}` {
		t.Fatalf("redirect to an allowed host: %+v %v", a, err)
	}
	// The two servers share 127.0.0.1 but not a port: another origin.
	if gotKey != "" {
		t.Errorf("the credential went along to another origin: %q", gotKey)
	}
}
