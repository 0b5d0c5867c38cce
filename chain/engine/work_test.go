package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/loader"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/providers/builtin"
)

// batchSink keeps what a worker's runner commits.
type batchSink struct {
	mu      sync.Mutex
	batches [][]string
}

func (s *batchSink) Commit(_ context.Context, b *store.Batch) error {
	var keys []string
	for _, rec := range b.Steps {
		keys = append(keys, rec.Key)
	}
	s.mu.Lock()
	s.batches = append(s.batches, keys)
	s.mu.Unlock()
	return nil
}

func (s *batchSink) ForEachStep(context.Context, string, func(*store.StepRecord) error) error {
	return nil
}

// splitToWork starts a harness with chain "c", whose split "loop" has the
// item steps given, and returns it with the split as a worker is handed it.
func splitToWork(t *testing.T, steps string, total int) (*harness, *engine.WorkSplit) {
	t.Helper()
	config := `
[[chains]]
name = "c"
[[chains.steps]]
name = "loop"
[chains.steps.split]
items = "<<origin.payload.items>>"` + steps
	h := newHarness(t, config)
	cfg, err := loader.LoadBytes("test.toml", []byte(testProviders+config), loader.Options{ProviderTypes: builtin.Types()})
	if err != nil {
		t.Fatal(err)
	}
	ws := &engine.WorkSplit{Run: &store.Run{ID: t.Name(), Chain: "c", ChainHash: cfg.Chains["c"].Hash}, Key: "loop", Step: "loop", Total: total}
	if ws.Definition, err = cfg.Definition("c"); err != nil {
		t.Fatal(err)
	}
	return h, ws
}

// slot matches the key of an item's slot record.
var slot = regexp.MustCompile(`^loop\[\d+\]$`)

// TestWorkerCommitsResultsTogether runs split items as a worker does, with
// a linger longer than the test: the results of items whose calls went out
// together are committed together, while a result the item's next step
// waits on goes at once.
func TestWorkerCommitsResultsTogether(t *testing.T) {
	for _, tc := range []struct {
		name    string
		steps   string
		commits func(n int) bool
	}{
		{"one step", `
[[chains.steps.split.steps]]
name = "a"
provider = "echo"
payload_template = { i = "<<item>>" }`, func(n int) bool { return n == 1 }},
		{"two steps", `
[[chains.steps.split.steps]]
name = "a"
provider = "echo"
payload_template = { i = "<<item>>" }
[[chains.steps.split.steps]]
name = "b"
provider = "echo"
payload_template = { i = "<<prev.body.i>>" }`, func(n int) bool { return n >= 2 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 10
			h, ws := splitToWork(t, tc.steps, n)
			sink := &batchSink{}
			finished := make(chan int, n)
			r, err := h.eng.Work(ws, sink, engine.WorkOptions{Linger: time.Hour, Finished: func(i int, dropped bool) {
				if dropped {
					t.Errorf("item %d dropped", i)
				}
				finished <- i
			}})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			var items []engine.WorkItem
			for i := range n {
				items = append(items, engine.WorkItem{Index: i, Value: json.RawMessage(fmt.Sprint(i))})
			}
			if err := r.Add(items); err != nil {
				t.Fatal(err)
			}
			// Far less than the linger: a result held for it fails here.
			timeout := time.After(time.Minute)
			for range n {
				select {
				case <-finished:
				case <-timeout:
					t.Fatalf("items still not finished; commits so far %v", sink.batches)
				}
			}
			sink.mu.Lock()
			defer sink.mu.Unlock()
			slots := 0
			for _, keys := range sink.batches {
				for _, k := range keys {
					if slot.MatchString(k) {
						slots++
					}
				}
			}
			if !tc.commits(len(sink.batches)) || slots != n {
				t.Errorf("%d commits holding %d item slots: %v", len(sink.batches), slots, sink.batches)
			}
		})
	}
}

// TestWorkerStopKeepsHeldResults stops a worker's runner while it holds a
// result for the call still out to join: the result is written as it
// stops, not called again wherever its item goes next.
func TestWorkerStopKeepsHeldResults(t *testing.T) {
	h, ws := splitToWork(t, `
[[chains.steps.split.steps]]
name = "a"
provider = "faulty"
payload_template = { hang = "<<item.hang>>" }`, 2)
	sink := &batchSink{}
	r, err := h.eng.Work(ws, sink, engine.WorkOptions{Linger: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Add([]engine.WorkItem{{Index: 0, Value: json.RawMessage(`{"hang":false}`)}, {Index: 1, Value: json.RawMessage(`{"hang":true}`)}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for r.Pending() < 1 {
		if time.Now().After(deadline) {
			t.Fatal("item 0's result never came back")
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.Close()
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if len(sink.batches) != 1 || !slices.Equal(sink.batches[0], []string{"loop[0]"}) {
		t.Errorf("written as the runner stopped: %v, want item 0's slot", sink.batches)
	}
}
