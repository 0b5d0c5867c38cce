package ssh_test

import (
	"context"
	"encoding/json"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/chaingate/gateway/internal/testutil/sshdtest"
	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/ssh"
)

// BenchmarkExecute runs a declared `true` with one checked argument on a
// real sshd, one call at a time and
// several at once, over the provider's kept connection: what a step pays
// for its session, its command line and its result.
func BenchmarkExecute(b *testing.B) {
	srv := sshdtest.Start(b)
	// Half of sshd's MaxSessions, as the docs advise: sshd frees a closed
	// session's slot only after it has read the packets that came with the
	// close, so a burst of closes and opens can find every slot taken.
	cfg, _ := json.Marshal(config(srv, map[string]any{"max_sessions_per_host": 5,
		"commands": map[string]any{"noop": map[string]any{"argv": []string{"true"}, "args": map[string]any{"unit": map[string]any{"type": "string", "pattern": "[a-z0-9@._-]+"}}}}}))
	payload := json.RawMessage(`{"host": "127.0.0.1", "args": {"unit": "nginx.service"}}`)
	p := ssh.New()
	// A step of its own for each call: calls of one step run one at a time.
	var steps atomic.Int64
	call := func(b *testing.B) {
		step := "step" + strconv.FormatInt(steps.Add(1), 10)
		if _, err := p.Execute(context.Background(), providers.Request{ActionType: "noop", Payload: payload, Config: cfg, DedupKey: "run1/" + step, RunID: "run1", Step: step, Attempt: 1}); err != nil {
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
