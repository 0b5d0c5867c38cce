package chain

import (
	"math"
	"strconv"
)

// RateLimit is a provider's rate_limit table: a token bucket that refills
// PerSecond tokens a second and holds at most Burst.
type RateLimit struct {
	PerSecond float64
	Burst     int
}

// CircuitBreaker is a provider's circuit_breaker table: after Failures
// consecutive failed calls the provider is not called for OpenSeconds, then
// one trial call decides whether it is called again.
type CircuitBreaker struct {
	Failures    int
	OpenSeconds int
}

// Defaults for a provider's circuit_breaker table.
const (
	DefaultCircuitFailures    = 5
	DefaultCircuitOpenSeconds = 30
)

// maxPerSecond bounds rate_limit.per_second: a higher rate limits nothing
// and its default burst would not fit an int.
const maxPerSecond = 1_000_000

var (
	// providerLimitKeys are the keys of a [[providers]] entry that pace its
	// calls. They are left out of stored definitions, and so of chain
	// hashes: they change when calls go out, not what a run does, and
	// tuning one must not look like a new version of every chain using it.
	providerLimitKeys  = []string{"rate_limit", "max_concurrency", "circuit_breaker"}
	rateLimitKeys      = []string{"per_second", "burst"}
	circuitBreakerKeys = []string{"failures", "open_seconds"}
)

// decodeRateLimit decodes a provider's rate_limit; nil when per_second is
// missing or wrong, so nothing downstream sees half a limit.
func decodeRateLimit(t *table) *RateLimit {
	defer t.finish(rateLimitKeys)
	perSecond, ok := 0.0, false
	if t.has("per_second") {
		perSecond, ok = t.positive("per_second", "calls per second", maxPerSecond)
	} else {
		t.d.errorf(t.path, "missing required key %q: calls per second, e.g. per_second = 5.0", "per_second")
	}
	burst, _ := t.bounded("burst", "calls", 1, 0, max(1, int(math.Ceil(perSecond))))
	if !ok {
		return nil
	}
	return &RateLimit{PerSecond: perSecond, Burst: burst}
}

func decodeCircuitBreaker(t *table) *CircuitBreaker {
	b := &CircuitBreaker{}
	b.Failures, _ = t.bounded("failures", "failures", 1, 0, DefaultCircuitFailures)
	b.OpenSeconds, _ = t.bounded("open_seconds", "seconds", 1, 0, DefaultCircuitOpenSeconds)
	t.finish(circuitBreakerKeys)
	return b
}

// positive reads a number above 0 and at most most, written as an integer
// or a float.
func (t *table) positive(k, unit string, most float64) (float64, bool) {
	var f float64
	switch v := t.m[k].(type) {
	case int64:
		f = float64(v)
	case float64:
		f = v
	default:
		t.d.errorf(t.path.key(k), "must be a number of %s, got %s", unit, describe(v))
		return 0, false
	}
	switch {
	case math.IsNaN(f) || f <= 0:
		t.d.errorf(t.path.key(k), "must be greater than 0, got %s", formatFloat(f))
		return 0, false
	case f > most:
		t.d.errorf(t.path.key(k), "must be at most %s, got %s", formatFloat(most), formatFloat(f))
		return 0, false
	}
	return f, true
}

func formatFloat(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }
