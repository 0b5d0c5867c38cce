package connguard

import (
	"math"
	"net/netip"
	"sync"
	"time"
)

// Failed credentials per remote address: authBurst may fail in a row, then
// one more every authRefill. Past that, every credential the address
// presents, right or wrong, is refused with 429 until its next one is due:
// were a right one let through, the refusals would not slow a guesser, who
// only looks for the answer that is not a refusal. A valid token never
// counts, so a client that has one is never slowed by its own requests;
// other addresses keep their own count.
const (
	authBurst  = 10
	authRefill = 6 * time.Second
	// authTable bounds the addresses remembered at once.
	authTable = 10_000
)

// AuthFailures is the table of addresses that presented wrong credentials.
// An address leaves it once its count has refilled; when it is full of
// addresses still counting, a random one is forgotten, so its size stays
// bounded whatever the number of addresses guessing.
type AuthFailures struct {
	now func() time.Time

	mu      sync.Mutex
	entries map[netip.Prefix]*failCount
	swept   time.Time
}

// failCount is a token bucket of failures allowed; it may go below zero
// when guesses race, and the address then waits longer.
type failCount struct {
	left float64
	at   time.Time
	// warned is set once the address has been logged as refused, until it
	// may try again.
	warned bool
}

func NewAuthFailures(now func() time.Time) *AuthFailures {
	return &AuthFailures{now: now, entries: map[netip.Prefix]*failCount{}}
}

// refill brings f up to t and reports whether it is full again.
func (f *failCount) refill(t time.Time) bool {
	f.left = min(authBurst, f.left+float64(t.Sub(f.at))/float64(authRefill))
	f.at = t
	return f.left >= authBurst
}

// Wait is how long addr must wait before a credential it presents is
// checked; 0 when it may present one now. first is true the first time a
// refusal is reported for this wait, so it is logged once.
func (a *AuthFailures) Wait(addr netip.Prefix) (d time.Duration, first bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f := a.entries[addr]
	if f == nil {
		return 0, false
	}
	t := a.now()
	if f.refill(t) {
		delete(a.entries, addr)
		return 0, false
	}
	if f.left >= 1 {
		f.warned = false
		return 0, false
	}
	first = !f.warned
	f.warned = true
	return time.Duration(math.Ceil((1 - f.left) * float64(authRefill))), first
}

// Fail counts a wrong credential from addr.
func (a *AuthFailures) Fail(addr netip.Prefix) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t := a.now()
	f := a.entries[addr]
	if f == nil {
		if len(a.entries) >= authTable {
			a.makeRoom(t)
		}
		f = &failCount{left: authBurst, at: t}
		a.entries[addr] = f
	}
	f.refill(t)
	f.left--
}

// makeRoom drops the addresses whose count has refilled, at most once a
// second, and one at random if that freed nothing.
func (a *AuthFailures) makeRoom(t time.Time) {
	if t.Sub(a.swept) >= time.Second {
		a.swept = t
		for k, f := range a.entries {
			if f.refill(t) {
				delete(a.entries, k)
			}
		}
	}
	if len(a.entries) < authTable {
		return
	}
	for k := range a.entries {
		delete(a.entries, k)
		return
	}
}
