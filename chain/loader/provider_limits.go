package loader

import (
	"math"
	"strconv"

	"github.com/chaingate/gateway/chain"
)

// maxPerSecond bounds rate_limit.per_second: a higher rate limits nothing
// and its default burst would not fit an int.
const maxPerSecond = 1_000_000

var (
	rateLimitKeys      = []string{"per_second", "burst"}
	circuitBreakerKeys = []string{"failures", "open_seconds"}
)

// decodeRateLimit decodes a provider's rate_limit; nil when per_second is
// missing or wrong, so nothing downstream sees half a limit.
func decodeRateLimit(t *table) *chain.RateLimit {
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
	return &chain.RateLimit{PerSecond: perSecond, Burst: burst}
}

func decodeCircuitBreaker(t *table) *chain.CircuitBreaker {
	b := &chain.CircuitBreaker{}
	b.Failures, _ = t.bounded("failures", "failures", 1, 0, chain.DefaultCircuitFailures)
	b.OpenSeconds, _ = t.bounded("open_seconds", "seconds", 1, 0, chain.DefaultCircuitOpenSeconds)
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
		t.d.errorf(t.path.Key(k), "must be a number of %s, got %s", unit, describe(v))
		return 0, false
	}
	switch {
	case math.IsNaN(f) || f <= 0:
		t.d.errorf(t.path.Key(k), "must be greater than 0, got %s", formatFloat(f))
		return 0, false
	case f > most:
		t.d.errorf(t.path.Key(k), "must be at most %s, got %s", formatFloat(most), formatFloat(f))
		return 0, false
	}
	return f, true
}

func formatFloat(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }
