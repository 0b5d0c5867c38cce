package engine

import (
	"fmt"
	"testing"

	"github.com/chaingate/gateway/chain/loader"
	"github.com/chaingate/gateway/providers/builtin"
)

// TestReadsOrigin tells the splits whose items may read the run's origin,
// whose workers are sent the payload, from those whose items never do.
func TestReadsOrigin(t *testing.T) {
	for _, tc := range []struct {
		name, steps string
		want        bool
	}{
		{"item only", `
[[chains.steps.split.steps]]
name = "a"
provider = "echo"
payload_template = { i = "<<item>>", run = "<<run.id>>" }`, false},
		{"a payload path", `
[[chains.steps.split.steps]]
name = "a"
provider = "echo"
payload_template = { host = "<<origin.payload.host>>" }`, true},
		{"metadata", `
[[chains.steps.split.steps]]
name = "a"
provider = "echo"
payload_template = "<<origin.metadata>>"`, true},
		{"a when condition", `
[[chains.steps.split.steps]]
name = "a"
provider = "echo"
when = 'origin.payload.mode == "x"'`, true},
		{"a branch", `
[[chains.steps.split.steps]]
name = "a"
provider = "echo"
[[chains.steps.split.steps.branches]]
when = 'origin.payload.mode == "x"'
target = "b"
[[chains.steps.split.steps]]
name = "b"
provider = "echo"`, true},
		{"a nested split's items", `
[[chains.steps.split.steps]]
name = "inner"
[chains.steps.split.steps.split]
items = "<<origin.payload.ports>>"
[[chains.steps.split.steps.split.steps]]
name = "a"
provider = "echo"`, true},
		{"a parallel sub-step", `
[[chains.steps.split.steps]]
name = "both"
[chains.steps.split.steps.parallel]
[[chains.steps.split.steps.parallel.steps]]
name = "a"
provider = "echo"
payload_template = { n = "<<item>>" }
[[chains.steps.split.steps.parallel.steps]]
name = "b"
provider = "echo"
payload_template = { who = "<<origin.payload.who>>" }`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := fmt.Sprintf(`
[[providers]]
name = "echo"
type = "echo"
[[chains]]
name = "c"
[[chains.steps]]
name = "loop"
[chains.steps.split]
items = "<<origin.payload.items>>"
%s
`, tc.steps)
			cfg, err := loader.LoadBytes("test.toml", []byte(src), loader.Options{ProviderTypes: builtin.Types()})
			if err != nil {
				t.Fatalf("loading:\n%v", err)
			}
			if got := readsOrigin(cfg.Chains["c"].Step("loop").Split.Steps); got != tc.want {
				t.Errorf("readsOrigin = %v, want %v", got, tc.want)
			}
		})
	}
}
