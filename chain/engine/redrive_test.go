package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/loader"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/providers/builtin"
)

// redriveConfig is a split whose items fail where the item says so, a
// tolerance that lets the run go on, and a step after it; fixed, the items
// no longer pass on their failure.
const redriveConfig = `
[[chains]]
name = "c"
[[chains.steps]]
name = "fan"
[chains.steps.split]
items = "<<origin.payload.items>>"
max_concurrency = 4
tolerated_failures = "50%%"
[[chains.steps.split.steps]]
name = "call"
provider = "faulty"
on_failure = "dlq"
payload_template = { record = %q, n = "<<item.n>>", fail = %s }
[[chains.steps]]
name = "after"
provider = "faulty"
payload_template = { record = %q, ok = "<<steps.fan.body.succeeded>>", failed = "<<steps.fan.body.failed>>" }
`

// TestRedrive redrives a split that ended with tolerated failures in a
// run that succeeded: only the failed items are called again, every other
// item keeps its result, the step after the split runs again on the new
// results, and the failed items' dead-letter entries go.
func TestRedrive(t *testing.T) {
	dir := t.TempDir()
	items, after := filepath.Join(dir, "items"), filepath.Join(dir, "after")
	h := newHarness(t, fmt.Sprintf(redriveConfig, items, `"<<item.fail ?? \"\">>"`, after))
	var list []string
	failing := map[int]bool{3: true, 7: true, 11: true}
	for i := range 20 {
		if failing[i] {
			list = append(list, fmt.Sprintf(`{"n":%d,"fail":"boom %d"}`, i, i))
		} else {
			list = append(list, fmt.Sprintf(`{"n":%d}`, i))
		}
	}
	first := h.run("c", `{"items":[`+strings.Join(list, ",")+`]}`)
	if first.Status != store.RunSucceeded {
		t.Fatalf("first run: %s %+v", first.Status, first.Error)
	}
	before := splitResult(t, first, "fan")
	if before.Failed != 3 || before.Succeeded != 17 {
		t.Fatalf("first split: %+v", before)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if entries, _ := h.store.ListDLQ(ctx, store.DLQFilter{}); len(entries) != 3 {
		t.Fatalf("dead-letter entries before: %d, want 3", len(entries))
	}

	// Nothing to redrive in a split with no failure, nor in a step that is
	// not a split.
	if _, err := h.eng.Redrive(ctx, first.ID, "after", engine.RedriveOptions{}); !errors.Is(err, engine.ErrNotReplayable) {
		t.Errorf("redriving a provider step: %v", err)
	}

	fixed, err := loader.LoadBytes("test.toml", []byte(testProviders+fmt.Sprintf(redriveConfig, items, `""`, after)), loader.Options{ProviderTypes: builtin.Types()})
	if err != nil {
		t.Fatal(err)
	}
	h.eng.SetConfig(fixed)
	run, err := h.eng.Redrive(engine.WithActor(ctx, "alice"), first.ID, "fan", engine.RedriveOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if run.ID != first.ID {
		t.Fatalf("redrive carried on in run %s, not %s", run.ID, first.ID)
	}
	if _, err := h.eng.Wait(ctx, run.ID); err != nil {
		t.Fatal(err)
	}
	res, err := h.eng.Result(ctx, run.ID, true)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != store.RunSucceeded {
		t.Fatalf("after the redrive: %s %+v", res.Status, res.Error)
	}
	// 20 calls the first time, 3 more: the failed items only.
	calls := strings.Split(strings.TrimSpace(readFileString(t, items)), "\n")
	if len(calls) != 23 {
		t.Fatalf("%d item calls, want 20 + 3", len(calls))
	}
	for _, line := range calls[20:] {
		var c struct {
			Payload struct {
				N float64 `json:"n"`
			} `json:"payload"`
		}
		if err := json.Unmarshal([]byte(line), &c); err != nil || !failing[int(c.Payload.N)] {
			t.Errorf("redriven call %s is not a failed item's", line)
		}
	}
	now := splitResult(t, res, "fan")
	if now.Failed != 0 || now.Succeeded != 20 {
		t.Fatalf("split after the redrive: %+v", now)
	}
	for i := range 20 {
		if failing[i] {
			continue
		}
		if string(now.Results[i]) != string(before.Results[i]) {
			t.Errorf("item %d's result changed: %s, was %s", i, now.Results[i], before.Results[i])
		}
	}
	afterCalls := strings.Split(strings.TrimSpace(readFileString(t, after)), "\n")
	if len(afterCalls) != 2 || !strings.Contains(afterCalls[1], `"ok":20`) || !strings.Contains(afterCalls[1], `"failed":0`) {
		t.Errorf("the step after the split: %q", afterCalls)
	}
	if entries, _ := h.store.ListDLQ(ctx, store.DLQFilter{}); len(entries) != 0 {
		t.Errorf("dead-letter entries after: %d, want none", len(entries))
	}
	events, err := h.store.Events(ctx, run.ID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var msg string
	for _, ev := range events {
		if ev.Type == store.EventRunReplayed {
			msg = ev.Message
		}
	}
	if want := `redriving split "fan": 3 items run again, the others keep their results by alice`; !strings.Contains(msg, want) {
		t.Errorf("run_replayed says %q, want %q", msg, want)
	}
	if _, err := h.eng.Redrive(ctx, first.ID, "fan", engine.RedriveOptions{}); !errors.Is(err, engine.ErrNotReplayable) || !strings.Contains(err.Error(), "has no failed item") {
		t.Errorf("redriving a split with no failure left: %v", err)
	}
}
