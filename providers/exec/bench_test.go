package exec_test

import (
	"context"
	"testing"

	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/exec"
)

// BenchmarkExecute runs `true` through the provider: the supervisor's
// start, the command's, and the result.
func BenchmarkExecute(b *testing.B) {
	p := exec.New()
	req := providers.Request{Payload: []byte(`{"command": ["true"]}`), DedupKey: "run1/step1", RunID: "run1", Step: "step1", Attempt: 1}
	for b.Loop() {
		if _, err := p.Execute(context.Background(), req); err != nil {
			b.Fatal(err)
		}
	}
}
