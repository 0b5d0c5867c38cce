package engine_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
)

// createWatch keeps what each commit held, counts the concurrency slots
// asked for, and, with refuse, refuses every create as a store does when
// another start of the run was first.
type createWatch struct {
	store.Store
	slots  store.Slots
	refuse bool
	asked  atomic.Int32

	mu      sync.Mutex
	batches []string // per commit: "create" or "", then each step record as key=status
}

func watchCreates(refuse bool) (harnessOption, *createWatch) {
	w := &createWatch{refuse: refuse}
	return wrapStore(func(st store.Store) store.Store {
		w.Store, w.slots = st, st.(store.Slots)
		return w
	}), w
}

func (w *createWatch) Commit(ctx context.Context, b *store.Batch) error {
	if b.Create && w.refuse {
		return fmt.Errorf("creating run %s: %w", b.Run.ID, store.ErrExists)
	}
	line := ""
	if b.Create {
		line = "create"
	}
	for _, rec := range b.Steps {
		line += fmt.Sprintf(" %s=%s", rec.Key, rec.Status)
	}
	w.mu.Lock()
	w.batches = append(w.batches, line)
	w.mu.Unlock()
	return w.Store.Commit(ctx, b)
}

func (w *createWatch) AcquireSlot(ctx context.Context, req store.SlotRequest) (store.SlotGrant, error) {
	w.asked.Add(1)
	return w.slots.AcquireSlot(ctx, req)
}

func (w *createWatch) ReleaseSlot(ctx context.Context, key, holder string) error {
	return w.slots.ReleaseSlot(ctx, key, holder)
}

func (w *createWatch) ListSlots(ctx context.Context) ([]store.SlotState, error) {
	return w.slots.ListSlots(ctx)
}

func (w *createWatch) commits() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.batches)
}

const createChains = `
[[chains]]
name = "two"
[[chains.steps]]
name = "first"
provider = "faulty"
payload_template = { record = "REC" }
[[chains.steps]]
name = "second"
provider = "faulty"
payload_template = { record = "REC" }

[[chains]]
name = "keyed"
[[chains.steps]]
name = "first"
provider = "faulty"
concurrency = { key = "fleet" }
payload_template = { record = "REC" }

[[chains]]
name = "skipped"
[[chains.steps]]
name = "never"
provider = "faulty"
when = "false"
payload_template = { record = "REC" }
[[chains.steps]]
name = "first"
provider = "faulty"
payload_template = { record = "REC" }

[[chains]]
name = "split"
[[chains.steps]]
name = "loop"
[chains.steps.split]
items = "<<origin.payload.hosts>>"
[[chains.steps.split.steps]]
name = "first"
provider = "faulty"
concurrency = { key = "host-<<item>>" }
payload_template = { record = "REC" }
`

// TestCreateCarriesFirstIntents checks that a run's create commit holds the
// intents of its first calls, so that they go out one commit sooner, and
// that a step whose concurrency key is held under the run's id asks for
// it only once the run exists.
func TestCreateCarriesFirstIntents(t *testing.T) {
	tests := []struct {
		chain   string
		payload string
		commits []string
	}{
		{"two", `{}`, []string{
			"create first=running",
			" first=succeeded second=running",
			" second=succeeded",
		}},
		{"skipped", `{}`, []string{
			"create never=skipped first=running",
			" first=succeeded",
		}},
		// The step waits for its slot in the create commit, and takes it
		// in the run's first pass.
		{"keyed", `{}`, []string{
			"create first=pending",
			" first=running",
			" first=succeeded",
		}},
		// A split opens in the run's first pass.
		{"split", `{"hosts":["a"]}`, []string{
			"create loop=pending",
			" loop=running",
			" loop[0]=succeeded loop=running",
			" loop=succeeded",
		}},
	}
	for _, tc := range tests {
		t.Run(tc.chain, func(t *testing.T) {
			rec := filepath.Join(t.TempDir(), "calls.jsonl")
			watch, w := watchCreates(false)
			h := newHarness(t, replaceRec(createChains, rec), watch)
			if res := h.run(tc.chain, tc.payload); res.Status != store.RunSucceeded {
				t.Fatalf("run: %s %+v", res.Status, res.Error)
			}
			if got := w.commits(); !slices.Equal(got, tc.commits) {
				t.Errorf("commits:\n%q\nwant\n%q", got, tc.commits)
			}
		})
	}
}

// TestRefusedCreateLeavesNothing refuses a run's create commit, as the
// store does when another start of the same run was first: the start
// fails with the store's answer, no call goes out, and no concurrency slot
// is asked for in the run's name, which the other start's run may hold.
func TestRefusedCreateLeavesNothing(t *testing.T) {
	for _, name := range []string{"two", "keyed", "skipped", "split"} {
		t.Run(name, func(t *testing.T) {
			rec := filepath.Join(t.TempDir(), "calls.jsonl")
			watch, w := watchCreates(true)
			h := newHarness(t, replaceRec(createChains, rec), watch)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, err := h.eng.StartWithID(ctx, name, engine.Input{Payload: []byte(`{"hosts":["a","b"]}`)}, "run-1")
			if !errors.Is(err, store.ErrExists) {
				t.Fatalf("start under a refused create: %v", err)
			}
			if _, err := h.eng.Wait(ctx, "run-1"); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("waiting for the refused run: %v", err)
			}
			// Closing waits for whatever the engine has under way.
			h.close()
			if n := countLines(t, rec); n != 0 {
				t.Errorf("%d calls went out for a run that was never created", n)
			}
			if n := w.asked.Load(); n != 0 {
				t.Errorf("%d concurrency slots asked for in the name of a run that was never created", n)
			}
			if got := w.commits(); len(got) != 0 {
				t.Errorf("commits after the refused create: %q", got)
			}
		})
	}
}

func replaceRec(config, rec string) string {
	return strings.ReplaceAll(config, `"REC"`, fmt.Sprintf("%q", rec))
}
