package exec_test

import (
	"context"
	"testing"

	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/exec"
)

// BenchmarkExecute runs a declared `true` with one checked argument
// through the provider: the config, the argument's rule, the supervisor's
// start, the command's, and the result.
func BenchmarkExecute(b *testing.B) {
	p := exec.New()
	req := providers.Request{
		ActionType: "noop",
		Config:     []byte(`{"commands": {"noop": {"argv": ["true"], "args": {"unit": {"type": "string", "pattern": "[a-z0-9@._-]+"}}}}}`),
		Payload:    []byte(`{"args": {"unit": "nginx.service"}}`),
		DedupKey:   "run1/step1", RunID: "run1", Step: "step1", Attempt: 1,
	}
	for b.Loop() {
		if _, err := p.Execute(context.Background(), req); err != nil {
			b.Fatal(err)
		}
	}
}
