package connguard

import (
	"net/netip"
	"testing"
	"time"
)

// TestAuthFailuresRefill: an address may fail authBurst times, then once
// per authRefill; racing failures past the burst make it wait longer; an
// address that stops failing is forgotten once its count is whole again.
func TestAuthFailuresRefill(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a := NewAuthFailures(func() time.Time { return now })
	guesser := netip.MustParsePrefix("192.0.2.7/32")
	other := netip.MustParsePrefix("2001:db8:1:2::/64")
	tests := []struct {
		name     string
		advance  time.Duration
		failures int
		wait     time.Duration
	}{
		{"a first wrong credential", 0, 1, 0},
		{"the burst used up", 0, authBurst - 1, authRefill},
		{"half the refill later", authRefill / 2, 0, authRefill / 2},
		{"one refilled", authRefill / 2, 0, 0},
		{"one more spent", 0, 1, authRefill},
		{"three that raced past the check", 0, 3, 4 * authRefill},
		{"refilled whole", (authBurst + 4) * authRefill, 0, 0},
	}
	for _, tt := range tests {
		now = now.Add(tt.advance)
		for range tt.failures {
			a.Fail(guesser)
		}
		if got, _ := a.Wait(guesser); got != tt.wait {
			t.Errorf("%s: wait %v, want %v", tt.name, got, tt.wait)
		}
		if got, _ := a.Wait(other); got != 0 {
			t.Errorf("%s: another address waits %v", tt.name, got)
		}
	}
	if len(a.entries) != 0 {
		t.Errorf("%d addresses remembered after their counts refilled", len(a.entries))
	}
}

// TestAuthFailuresFirstRefusalLogged: a wait is reported as new once, and
// again after the address may try, and fails, once more.
func TestAuthFailuresFirstRefusalLogged(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a := NewAuthFailures(func() time.Time { return now })
	addr := netip.MustParsePrefix("192.0.2.7/32")
	for range authBurst {
		a.Fail(addr)
	}
	var firsts []bool
	for range 2 {
		_, first := a.Wait(addr)
		firsts = append(firsts, first)
	}
	now = now.Add(authRefill)
	if d, _ := a.Wait(addr); d != 0 {
		t.Fatalf("wait %v after a refill", d)
	}
	a.Fail(addr)
	_, first := a.Wait(addr)
	firsts = append(firsts, first)
	if firsts[0] != true || firsts[1] != false || firsts[2] != true {
		t.Errorf("first refusals %v, want [true false true]", firsts)
	}
}

// TestAuthFailuresTableBounded: however many addresses guess, the table
// holds at most authTable of them.
func TestAuthFailuresTableBounded(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a := NewAuthFailures(func() time.Time { return now })
	base := netip.MustParseAddr("10.0.0.0").As4()
	for i := range authTable + 500 {
		ip := base
		ip[1], ip[2], ip[3] = byte(i>>16), byte(i>>8), byte(i)
		a.Fail(prefixOf(netip.AddrFrom4(ip)))
		now = now.Add(time.Millisecond)
	}
	if len(a.entries) > authTable {
		t.Errorf("%d addresses remembered, want at most %d", len(a.entries), authTable)
	}
}

// TestAddressKey: IPv4 addresses count alone, IPv4-mapped ones as IPv4,
// and IPv6 by their /64.
func TestAddressKey(t *testing.T) {
	t.Parallel()
	tests := []struct{ remote, want string }{
		{"192.0.2.7:5000", "192.0.2.7/32"},
		{"[::ffff:192.0.2.7]:5000", "192.0.2.7/32"},
		{"[2001:db8:1:2:aaaa::1]:5000", "2001:db8:1:2::/64"},
		{"[2001:db8:1:2:bbbb::9]:80", "2001:db8:1:2::/64"},
		{"[::1]:80", "::/64"},
	}
	for _, tt := range tests {
		ap := netip.MustParseAddrPort(tt.remote)
		if got := prefixOf(ap.Addr()); got.String() != tt.want {
			t.Errorf("%s: %s, want %s", tt.remote, got, tt.want)
		}
	}
}
