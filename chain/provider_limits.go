package chain

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

// ProviderLimitKeys are the keys of a [[providers]] entry that pace its
// calls. They are left out of stored definitions, and so of chain hashes:
// they change when calls go out, not what a run does, and tuning one must
// not look like a new version of every chain using it.
var ProviderLimitKeys = []string{"rate_limit", "max_concurrency", "circuit_breaker"}
