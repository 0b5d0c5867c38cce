package chaintest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// benchConfig is a chain of 10 steps, two retried, around a split of 100
// items, for BenchmarkCases.
const benchConfig = `
[[providers]]
name = "p"
type = "echo"

[[chains]]
name = "ten"
%s
[[chains.steps]]
name = "fan"
[chains.steps.split]
items = "<<origin.payload.items>>"
max_concurrency = 20
[[chains.steps.split.steps]]
name = "each"
provider = "p"
action_type = "x"
payload_template = { n = "<<item>>" }
`

const benchStep = `
[[chains.steps]]
name = "s%d"
provider = "p"
action_type = "x"
payload_template = { i = %d, prev = "<<prev.status ?? \"none\">>" }
retry = { max_retries = 3, backoff_ms = 1000, strategy = "exponential" }
`

// BenchmarkCases runs cases of a 10-step chain with retries and a split of
// 100 items; the figure that matters is cases/s.
func BenchmarkCases(b *testing.B) {
	dir := b.TempDir()
	var steps strings.Builder
	for i := range 9 {
		fmt.Fprintf(&steps, benchStep, i, i)
	}
	if err := os.WriteFile(filepath.Join(dir, "bench.toml"), []byte(fmt.Sprintf(benchConfig, steps.String())), 0o600); err != nil {
		b.Fatal(err)
	}
	items := make([]string, 100)
	for i := range items {
		items[i] = fmt.Sprint(i)
	}
	var tests strings.Builder
	for i := range 1000 {
		fmt.Fprintf(&tests, "[[tests]]\nname = \"case %d\"\nchain = \"ten\"\npayload = { items = [%s] }\n", i, strings.Join(items, ", "))
		tests.WriteString("mocks.s2.attempts = [{ error = \"busy\", retryable = true }, { body = { ok = true } }]\n")
		tests.WriteString("mocks.s5.attempts = [{ error = \"busy\", retryable = true }, { error = \"busy\", retryable = true }, { body = {} }]\n")
		tests.WriteString("mocks.each = { body = { ok = true }, items = [{ index = 7, error = \"bad item\" }] }\n")
		for j := range 9 {
			if j != 2 && j != 5 {
				fmt.Fprintf(&tests, "mocks.s%d.body = { ok = true }\n", j)
			}
		}
		tests.WriteString("[tests.expect]\nstatus = \"failed\"\nsteps.s5.attempts = 3\nsteps.fan.items = { failed = 1 }\n")
	}
	if err := os.WriteFile(filepath.Join(dir, "bench_test.toml"), []byte(tests.String()), 0o600); err != nil {
		b.Fatal(err)
	}
	s, err := Load([]string{dir})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		for _, r := range s.Run(context.Background(), Options{}) {
			if r.Failed() {
				b.Fatalf("%s: %v", r.Case, r.Failures[0].Message)
			}
		}
	}
	b.ReportMetric(float64(1000*b.N)/b.Elapsed().Seconds(), "cases/s")
}
