package loader_test

import (
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/loader"
)

const retentionChains = `
[[providers]]
name = "echo"
type = "echo"

[[chains]]
name = "health"
RETENTION
[[chains.steps]]
name = "ping"
provider = "echo"

[[schedules]]
name = "hc"
chain = "health"
every = "30s"
retention = { succeeded = "10m" }
`

// TestRetentionKeep checks which table decides how long a run is kept,
// and that a chain's retention is not part of its definition.
func TestRetentionKeep(t *testing.T) {
	load := func(retention string) *chain.Config {
		t.Helper()
		src := "[gateway.retention]\nsucceeded = \"2d\"\nfailed = \"0\"\n" + strings.Replace(retentionChains, "RETENTION", retention, 1)
		cfg, err := loader.LoadBytes("r.toml", []byte(src), loadOpts)
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	cfg := load(`retention = { succeeded = "1h", timed_out = "3d", dead_letters = "12h" }`)
	r, c, s := cfg.Gateway.Retention, cfg.Chains["health"].Retention, cfg.Schedules["hc"].Retention
	for _, tc := range []struct {
		status    string
		overrides []*chain.RetentionOverride
		want      time.Duration
	}{
		{"succeeded", nil, 2 * 24 * time.Hour},
		{"failed", nil, 0},
		{"cancelled", nil, chain.DefaultKeepCancelled},
		{"timed_out", nil, chain.DefaultKeepTimedOut},
		{"dead_letters", nil, chain.DefaultKeepDeadLetters},
		{"succeeded", []*chain.RetentionOverride{c}, time.Hour},
		{"succeeded", []*chain.RetentionOverride{s, c}, 10 * time.Minute},
		{"timed_out", []*chain.RetentionOverride{s, c}, 3 * 24 * time.Hour},
		{"failed", []*chain.RetentionOverride{s, c}, 0},
		{"dead_letters", []*chain.RetentionOverride{nil, c}, 12 * time.Hour},
	} {
		if got := r.Keep(tc.status, tc.overrides...); got != tc.want {
			t.Errorf("%s with %d overrides: %s, want %s", tc.status, len(tc.overrides), got, tc.want)
		}
	}
	if r.Interval != chain.DefaultPruneInterval {
		t.Errorf("interval %s", r.Interval)
	}
	if other := load(""); other.Chains["health"].Hash != cfg.Chains["health"].Hash {
		t.Error("a chain's retention changed its definition's hash")
	}
}
