package ssh_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/chaingate/gateway/internal/testutil/sshdtest"
	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/ssh"
)

// BenchmarkExecute runs `true` on a real sshd, one call at a time and
// several at once, over the provider's kept connection: what a step pays
// for its session, its command line and its result.
func BenchmarkExecute(b *testing.B) {
	srv := sshdtest.Start(b)
	cfg, _ := json.Marshal(config(srv, map[string]any{"max_sessions_per_host": 8}))
	payload := json.RawMessage(`{"host": "127.0.0.1", "command": ["true"]}`)
	p := ssh.New()
	call := func(b *testing.B) {
		if _, err := p.Execute(context.Background(), providers.Request{Payload: payload, Config: cfg, DedupKey: "run1/step1", RunID: "run1", Step: "step1", Attempt: 1}); err != nil {
			b.Fatal(err)
		}
	}
	call(b)
	b.Run("serial", func(b *testing.B) {
		for b.Loop() {
			call(b)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.SetParallelism(4)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				call(b)
			}
		})
	})
}
