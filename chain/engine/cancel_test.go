package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
)

const cancelChains = `
[[chains]]
name = "ask"
[[chains.steps]]
name = "ask"
approval = {}

[[chains]]
name = "quick"
[[chains.steps]]
name = "call"
provider = "echo"
`

// TestCancelThroughAnotherEngine: an engine cancels a run another engine
// sharing the store advances by asking it to, and the owner ends the run
// with the cancel's author; a replay of the run is not cancelled again by
// that request. A run that has ended is refused as finished.
func TestCancelThroughAnotherEngine(t *testing.T) {
	t.Parallel()
	owner := newHarness(t, cancelChains, withLeaseTTL(600*time.Millisecond))
	other := newHarness(t, cancelChains, sharing(owner.store), withLeaseTTL(600*time.Millisecond))
	ctx := engine.WithActor(context.Background(), "bob")
	for _, tc := range []struct {
		name, chain string
		want        error
	}{
		{"a waiting run", "ask", nil},
		{"an ended run", "quick", engine.ErrFinished},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run, err := owner.eng.Start(ctx, tc.chain, engine.Input{Payload: json.RawMessage(`{}`)})
			if err != nil {
				t.Fatal(err)
			}
			if tc.want != nil {
				if _, err := owner.eng.Wait(ctx, run.ID); err != nil {
					t.Fatal(err)
				}
			} else {
				waitWaiting(t, owner, run.ID)
			}
			if err := other.eng.Cancel(ctx, run.ID); !errors.Is(err, tc.want) {
				t.Fatalf("cancel through the other engine: %v, want %v", err, tc.want)
			}
			if tc.want != nil {
				return
			}
			ended, err := owner.eng.Wait(ctx, run.ID)
			if err != nil || ended.Status != store.RunCancelled || !strings.Contains(ended.Error.Message, "run cancelled by bob") {
				t.Fatalf("after the cancel: %v %+v", err, ended)
			}
			if _, err := other.eng.ReplayRun(ctx, run.ID, engine.ReplayOptions{Mode: engine.ReplayResume}); err != nil {
				t.Fatalf("replay: %v", err)
			}
			waitWaiting(t, other, run.ID)
			// Each renewal of the lease, every 200 ms, reads the requests.
			time.Sleep(time.Second)
			if got, _ := other.store.RunHeader(ctx, run.ID); got.Status != store.RunWaiting {
				t.Fatalf("the replayed run is %s: the cancel asked of its last advance was taken again", got.Status)
			}
			if err := owner.eng.Cancel(ctx, run.ID); err != nil {
				t.Fatal(err)
			}
			if ended, err := other.eng.Wait(ctx, run.ID); err != nil || ended.Status != store.RunCancelled {
				t.Fatalf("after the second cancel: %v %+v", err, ended)
			}
		})
	}
}
