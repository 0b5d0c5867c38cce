package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
)

type splitBody struct {
	Results   []json.RawMessage `json:"results"`
	Succeeded int               `json:"succeeded"`
	Failed    int               `json:"failed"`
	Skipped   int               `json:"skipped"`
	Total     int               `json:"total"`
}

func splitResult(t *testing.T, res *engine.Result, step string) splitBody {
	t.Helper()
	var b splitBody
	if err := json.Unmarshal(res.Steps[step].Body, &b); err != nil {
		t.Fatalf("%s body %s: %v", step, res.Steps[step].Body, err)
	}
	return b
}

func TestSplitBasics(t *testing.T) {
	h := newHarness(t, `
[[chains]]
name = "c"
[[chains.steps]]
name = "inventory"
provider = "echo"
payload_template = { region = "eu", hosts = "<<origin.payload.hosts>>" }
[[chains.steps]]
name = "check-hosts"
[chains.steps.split]
items = "<<steps.inventory.body.hosts>>"
max_concurrency = 2
[[chains.steps.split.steps]]
name = "ping"
provider = "echo"
payload_template = { host = "<<item.name>>", i = "<<item_index>>", region = "<<steps.inventory.body.region>>" }
[[chains.steps.split.steps]]
name = "report"
provider = "echo"
payload_template = { host = "<<steps.ping.body.host>>", n = "<<prev.body.i>>" }
[[chains.steps]]
name = "summary"
provider = "echo"
payload_template = { text = "<<steps.check-hosts.body.succeeded>> of <<steps.check-hosts.body.total>> ok", first = "<<steps.check-hosts.body.results[0].host>>", prev = "<<prev.body.total>>" }
`)
	res := h.run("c", `{"hosts":[{"name":"db-1"},{"name":"db-2"},{"name":"db-3"}]}`)
	if res.Status != store.RunSucceeded {
		t.Fatalf("got %s %+v", res.Status, res.Error)
	}
	b := splitResult(t, res, "check-hosts")
	if b.Total != 3 || b.Succeeded != 3 || len(b.Results) != 3 {
		t.Fatalf("split body %+v", b)
	}
	for i, r := range b.Results {
		want := fmt.Sprintf(`{"host":"db-%d","n":%d}`, i+1, i)
		if string(r) != want {
			t.Errorf("result %d = %s, want %s", i, r, want)
		}
	}
	s := body(t, res, "summary")
	if s["text"] != "3 of 3 ok" || s["first"] != "db-1" || s["prev"] != float64(3) {
		t.Errorf("summary: %v", s)
	}
	// Each item's steps are recorded under the item's key.
	if st := res.Steps["check-hosts[1]/ping"]; st.Status != store.StepSucceeded || !strings.Contains(string(st.Body), `"region":"eu"`) {
		t.Errorf("check-hosts[1]/ping: %+v", st)
	}
	if _, leaked := res.Steps["ping"]; leaked {
		t.Error("a per-item step was recorded at the top level")
	}
	// Progress events count items.
	evs, _ := h.store.Events(context.Background(), res.ID, 0, 0)
	var last store.Event
	for _, ev := range evs {
		if ev.Type == store.EventStepProgress {
			last = ev
		}
	}
	if !strings.Contains(string(last.Data), `"processed":3`) || !strings.Contains(string(last.Data), `"total":3`) {
		t.Errorf("last progress event: %+v", last)
	}
}

func TestSplitItemsMustBeAnArray(t *testing.T) {
	h := newHarness(t, `
[[chains]]
name = "c"
[[chains.steps]]
name = "loop"
[chains.steps.split]
items = "<<origin.payload.hosts>>"
[[chains.steps.split.steps]]
name = "ping"
provider = "echo"
`)
	for payload, want := range map[string]string{
		`{"hosts":"db-1"}`:        `items of split "loop" rendered to a string, not an array`,
		`{"hosts":{"a":1}}`:       "rendered to an object",
		`{"hosts":null}`:          "rendered to null",
		`{"nohosts":[]}`:          "missing value for <<origin.payload.hosts>>",
		`{"hosts":[1,2,3,4,5,6]}`: "", // fine
	} {
		res := h.run("c", payload)
		if want == "" {
			if res.Status != store.RunSucceeded {
				t.Errorf("%s: %s %+v", payload, res.Status, res.Error)
			}
			continue
		}
		if res.Status != store.RunFailed || !strings.Contains(res.Steps["loop"].Error.Message, want) {
			t.Errorf("%s: got %s %+v, want %q", payload, res.Status, res.Steps["loop"].Error, want)
		}
	}
}

func TestSplitEmptyArray(t *testing.T) {
	h := newHarness(t, `
[[chains]]
name = "c"
[[chains.steps]]
name = "loop"
[chains.steps.split]
items = "<<origin.payload.hosts>>"
[[chains.steps.split.steps]]
name = "ping"
provider = "echo"
[[chains.steps]]
name = "after"
provider = "echo"
payload_template = { total = "<<steps.loop.body.total>>" }
`)
	res := h.run("c", `{"hosts":[]}`)
	if res.Status != store.RunSucceeded {
		t.Fatalf("got %s %+v", res.Status, res.Error)
	}
	if b := splitResult(t, res, "loop"); b.Total != 0 || len(b.Results) != 0 {
		t.Errorf("body %+v", b)
	}
	if b := body(t, res, "after"); b["total"] != float64(0) {
		t.Errorf("after: %v", b)
	}
}

const toleranceChain = `
[[chains]]
name = "count"
[[chains.steps]]
name = "loop"
on_failure = "skip"
[chains.steps.split]
items = "<<origin.payload.items>>"
tolerated_failures = 2
max_concurrency = 1
[[chains.steps.split.steps]]
name = "work"
provider = "faulty"
payload_template = "<<item>>"

[[chains]]
name = "percent"
[[chains.steps]]
name = "loop"
[chains.steps.split]
items = "<<origin.payload.items>>"
tolerated_failures = "25%"
[[chains.steps.split.steps]]
name = "work"
provider = "faulty"
payload_template = "<<item>>"
`

func TestSplitToleratedFailures(t *testing.T) {
	h := newHarness(t, toleranceChain)
	ok, bad := `{"v":1}`, `{"fail":"nope"}`
	items := func(xs ...string) string { return `{"items":[` + strings.Join(xs, ",") + `]}` }

	res := h.run("count", items(ok, bad, ok, bad, ok))
	b := splitResult(t, res, "loop")
	if res.Status != store.RunSucceeded || res.Steps["loop"].Status != store.StepSucceeded || b.Failed != 2 || b.Succeeded != 3 {
		t.Fatalf("at the tolerance: %s %+v", res.Status, b)
	}
	if !strings.Contains(string(b.Results[1]), `"error"`) || !strings.Contains(string(b.Results[1]), "nope") {
		t.Errorf("failed slot: %s", b.Results[1])
	}

	res = h.run("count", items(bad, bad, bad, ok, ok, ok))
	st := res.Steps["loop"]
	if st.Status != store.StepSkipped || !strings.Contains(st.Error.Message, "3 items failed, more than the 2 tolerated") {
		t.Fatalf("above the tolerance: %+v", st)
	}
	// One at a time: the three items after the third failure never ran.
	for i := 3; i < 6; i++ {
		if _, ran := res.Steps[fmt.Sprintf("loop[%d]", i)]; ran {
			t.Errorf("item %d ran after the split had failed", i)
		}
	}

	res = h.run("percent", items(ok, ok, ok, bad, ok, ok, ok, bad)) // 2 of 8 = 25 %
	if res.Status != store.RunSucceeded {
		t.Errorf("25%% of 8: %s %+v", res.Status, res.Error)
	}
	res = h.run("percent", items(ok, bad, ok, bad, ok, ok, ok, bad))
	if res.Status != store.RunFailed {
		t.Errorf("3 of 8 above 25%%: %s", res.Status)
	}
}

func TestSplitGhostSignal(t *testing.T) {
	h := newHarness(t, `
[[chains]]
name = "c"
[[chains.steps]]
name = "loop"
[chains.steps.split]
items = "<<origin.payload.items>>"
[[chains.steps.split.steps]]
name = "filter"
provider = "echo"
when = 'item.keep'
payload_template = "<<item>>"
[[chains.steps.split.steps]]
name = "work"
provider = "faulty"
payload_template = "<<item>>"
on_failure = "skip"
`)
	res := h.run("c", `{"items":[{"keep":true},{"keep":false},{"keep":true,"fail":"x"},{"keep":false}]}`)
	if res.Status != store.RunSucceeded {
		t.Fatalf("got %s %+v", res.Status, res.Error)
	}
	b := splitResult(t, res, "loop")
	if b.Succeeded != 1 || b.Skipped != 3 || b.Failed != 0 || string(b.Results[1]) != "null" || string(b.Results[2]) != "null" {
		t.Errorf("body %+v %s", b, b.Results)
	}
	// A filtered item stops at the filter.
	if _, ran := res.Steps["loop[1]/work"]; ran {
		t.Error("a filtered item went on to its next step")
	}
}

func TestSplitConcurrencyAndTimeout(t *testing.T) {
	h := newHarness(t, `
[[chains]]
name = "bounded"
[[chains.steps]]
name = "loop"
[chains.steps.split]
items = "<<origin.payload.items>>"
max_concurrency = 3
[[chains.steps.split.steps]]
name = "work"
provider = "faulty"
payload_template = { sleep_ms = 100 }

[[chains]]
name = "slow"
[[chains.steps]]
name = "loop"
[chains.steps.split]
items = "<<origin.payload.items>>"
timeout_seconds = 1
[[chains.steps.split.steps]]
name = "work"
provider = "faulty"
payload_template = { hang = true }
`)
	start := time.Now()
	res := h.run("bounded", `{"items":[1,2,3,4,5,6,7,8,9]}`)
	if res.Status != store.RunSucceeded {
		t.Fatalf("got %s %+v", res.Status, res.Error)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("9 × 100 ms three at a time took only %v", d)
	}
	// The items hang: only the split's timeout ends it, well within the
	// harness's 30 s wait.
	res = h.run("slow", `{"items":[1,2]}`)
	// An item's call shares the split's deadline, so it may end as timed
	// out on its own a moment before the split cancels it.
	if w := res.Steps["loop[0]/work"].Status; res.Steps["loop"].Status != store.StepTimedOut || (w != store.StepCancelled && w != store.StepTimedOut) {
		t.Fatalf("timeout: %+v", res.Steps)
	}
}

// TestNestedSplits runs 5 regions × 3 hosts, with some hosts filtered and
// some failing within tolerance.
func TestNestedSplits(t *testing.T) {
	rec := filepath.Join(t.TempDir(), "calls.jsonl")
	h := newHarness(t, fmt.Sprintf(`
[[chains]]
name = "c"
[[chains.steps]]
name = "regions"
[chains.steps.split]
items = "<<origin.payload.regions>>"
max_concurrency = 2
[[chains.steps.split.steps]]
name = "hosts"
[chains.steps.split.steps.split]
items = "<<item.hosts>>"
tolerated_failures = 1
[[chains.steps.split.steps.split.steps]]
name = "ping"
provider = "faulty"
when = 'item.up'
payload_template = { host = "<<item.name>>", fail = "<<item.fail ?? \"\">>", record = %q }
[[chains.steps.split.steps]]
name = "tally"
provider = "echo"
payload_template = { ok = "<<steps.hosts.body.succeeded>>", skipped = "<<steps.hosts.body.skipped>>", failed = "<<steps.hosts.body.failed>>" }
`, rec))
	var regions []string
	for r := range 5 {
		var hosts []string
		for i := range 3 {
			host := fmt.Sprintf(`{"name":"r%dh%d","up":%v`, r, i, !(r == 1 && i == 2))
			if r == 3 && i == 0 {
				host += `,"fail":"boom"`
			}
			hosts = append(hosts, host+"}")
		}
		regions = append(regions, `{"hosts":[`+strings.Join(hosts, ",")+`]}`)
	}
	res := h.run("c", `{"regions":[`+strings.Join(regions, ",")+`]}`)
	if res.Status != store.RunSucceeded {
		t.Fatalf("got %s %+v", res.Status, res.Error)
	}
	outer := splitResult(t, res, "regions")
	if outer.Total != 5 || outer.Succeeded != 5 {
		t.Fatalf("outer: %+v", outer)
	}
	var tallies []string
	for _, r := range outer.Results {
		tallies = append(tallies, string(r))
	}
	want := []string{
		`{"failed":0,"ok":3,"skipped":0}`, `{"failed":0,"ok":2,"skipped":1}`, `{"failed":0,"ok":3,"skipped":0}`,
		`{"failed":1,"ok":2,"skipped":0}`, `{"failed":0,"ok":3,"skipped":0}`,
	}
	if !slices.Equal(tallies, want) {
		t.Errorf("tallies:\n got %v\nwant %v", tallies, want)
	}
	// Keys and dedup keys are scoped by the whole lineage.
	if st := res.Steps["regions[3]/hosts[0]/ping"]; st.Status != store.StepFailed {
		t.Errorf("regions[3]/hosts[0]/ping: %+v", st)
	}
	calls := readFileString(t, rec)
	if !strings.Contains(calls, res.ID+"/regions[4]/hosts[2]/ping") || strings.Count(calls, "\n") != 14 {
		t.Errorf("calls (want 14, scoped by lineage):\n%s", calls)
	}
}

func TestSplitWithParallelGroup(t *testing.T) {
	h := newHarness(t, `
[[chains]]
name = "c"
[[chains.steps]]
name = "loop"
[chains.steps.split]
items = "<<origin.payload.items>>"
[[chains.steps.split.steps]]
name = "both"
[chains.steps.split.steps.parallel]
[[chains.steps.split.steps.parallel.steps]]
name = "a"
provider = "echo"
payload_template = { v = "<<item>>" }
[[chains.steps.split.steps.parallel.steps]]
name = "b"
provider = "echo"
payload_template = { w = "<<item_index>>" }
`)
	res := h.run("c", `{"items":["x","y"]}`)
	if res.Status != store.RunSucceeded {
		t.Fatalf("got %s %+v", res.Status, res.Error)
	}
	b := splitResult(t, res, "loop")
	if string(b.Results[1]) != `{"a":{"v":"y"},"b":{"w":1}}` {
		t.Errorf("results: %s", b.Results)
	}
	if res.Steps["loop[0]/both/a"].Status != store.StepSucceeded {
		t.Errorf("steps: %+v", res.Steps)
	}
}

func TestSplitLimits(t *testing.T) {
	h := newHarness(t, `
[gateway.limits]
max_split_items = 5
max_body_bytes = 2048
[[chains]]
name = "c"
[[chains.steps]]
name = "loop"
[chains.steps.split]
items = "<<origin.payload.items>>"
[[chains.steps.split.steps]]
name = "work"
provider = "echo"
payload_template = { pad = "<<origin.payload.pad>>" }
`)
	res := h.run("c", `{"items":[1,2,3,4,5,6],"pad":""}`)
	if res.Status != store.RunFailed || !strings.Contains(res.Steps["loop"].Error.Message, "6 elements, above max_split_items (5)") {
		t.Errorf("too many items: %+v", res.Steps["loop"])
	}
	pad := strings.Repeat("x", 600)
	res = h.run("c", `{"items":[1,2,3,4,5],"pad":"`+pad+`"}`)
	if res.Status != store.RunFailed || !strings.Contains(res.Steps["loop"].Error.Message, "exceed max_body_bytes (2048)") {
		t.Errorf("results too large: %+v", res.Steps["loop"])
	}
	res = h.run("c", `{"items":[1],"pad":"`+strings.Repeat("x", 3000)+`"}`)
	if res.Steps["loop[0]/work"].Error == nil || !strings.Contains(res.Steps["loop[0]/work"].Error.Message, "above max_body_bytes") {
		t.Errorf("body too large: %+v", res.Steps["loop[0]/work"])
	}
}

// TestSplitJoinOfUnevenResults joins more results than the join samples
// before sizing its buffer, the later ones larger than the first: they all
// come back in order, and a total above max_body_bytes still fails the split.
func TestSplitJoinOfUnevenResults(t *testing.T) {
	h := newHarness(t, `
[gateway.limits]
max_body_bytes = 200000
[[chains]]
name = "c"
[[chains.steps]]
name = "loop"
[chains.steps.split]
items = "<<origin.payload.items>>"
max_concurrency = 64
[[chains.steps.split.steps]]
name = "work"
provider = "echo"
payload_template = { s = "<<item>>" }
`)
	payload := func(n int, large string) string {
		items := make([]string, n)
		for i := range items {
			if i >= 1024 {
				items[i] = large
			}
		}
		b, _ := json.Marshal(map[string][]string{"items": items})
		return string(b)
	}
	res := h.run("c", payload(3000, strings.Repeat("x", 40)))
	if res.Status != store.RunSucceeded {
		t.Fatalf("got %s %+v", res.Status, res.Steps["loop"].Error)
	}
	b := splitResult(t, res, "loop")
	if len(b.Results) != 3000 {
		t.Fatalf("%d results, want 3000", len(b.Results))
	}
	for i, r := range b.Results {
		want := `{"s":""}`
		if i >= 1024 {
			want = `{"s":"` + strings.Repeat("x", 40) + `"}`
		}
		if string(r) != want {
			t.Fatalf("result %d = %s, want %s", i, r, want)
		}
	}
	res = h.run("c", payload(3000, strings.Repeat("x", 100)))
	if res.Status != store.RunFailed || !strings.Contains(res.Steps["loop"].Error.Message, "exceed max_body_bytes (200000)") {
		t.Errorf("results too large: %s %+v", res.Status, res.Steps["loop"].Error)
	}
}

// TestSplitResume stops the engine in the middle of a split and checks that
// a new one runs only the items without a recorded result.
func TestSplitResume(t *testing.T) {
	dir := t.TempDir()
	rec := filepath.Join(dir, "calls.jsonl")
	cfg := fmt.Sprintf(`
[[chains]]
name = "c"
[[chains.steps]]
name = "loop"
[chains.steps.split]
items = "<<origin.payload.items>>"
max_concurrency = 4
[[chains.steps.split.steps]]
name = "work"
provider = "faulty"
payload_template = { record = %q, sleep_ms = "<<item>>" }
`, rec)
	var items []string
	for i := range 40 {
		items = append(items, fmt.Sprint(20+(i%5)*30))
	}
	db := filepath.Join(dir, "gw.db")
	ctx := context.Background()
	h1 := newHarness(t, cfg, atStore(db))
	run, err := h1.eng.Start(ctx, "c", engine.Input{Payload: json.RawMessage(`{"items":[` + strings.Join(items, ",") + `]}`)})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for countLines(t, rec) < 16 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	h1.close()
	// The items whose result was written before the stop.
	h2 := newHarness(t, cfg, atStore(db))
	finished := map[string]bool{}
	steps, _ := h2.store.Steps(ctx, run.ID, "loop[")
	for _, s := range steps {
		if !strings.Contains(s.Key, "/") && s.Status.Final() {
			finished[s.Key] = true
		}
	}
	if len(finished) == 0 || len(finished) == 40 {
		t.Fatalf("stopped at the wrong time: %d items finished", len(finished))
	}
	if _, err := h2.eng.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	final, err := h2.eng.Wait(ctx, run.ID)
	if err != nil || final.Status != store.RunSucceeded {
		t.Fatalf("after resume: %+v %v", final, err)
	}
	calls := readFileString(t, rec)
	for i := range 40 {
		key := fmt.Sprintf("loop[%02d]", i)
		n := strings.Count(calls, run.ID+"/"+key+"/work")
		if finished[key] && n != 1 {
			t.Errorf("%s finished before the stop but was called %d times", key, n)
		}
		if n == 0 {
			t.Errorf("%s never ran", key)
		}
	}
	res, _ := h2.eng.Result(ctx, run.ID, true)
	if b := splitResult(t, res, "loop"); b.Succeeded != 40 || len(b.Results) != 40 {
		t.Errorf("body after resume: %+v", b)
	}
}

// TestSplitBodyInConditions branches on a split's counts and on its
// results, which conditions read decoded.
func TestSplitBodyInConditions(t *testing.T) {
	h := newHarness(t, `
[[chains]]
name = "c"
[[chains.steps]]
name = "loop"
default_next = "all-good"
[chains.steps.split]
items = "<<origin.payload.items>>"
tolerated_failures = "100%"
[[chains.steps.split.steps]]
name = "work"
provider = "faulty"
payload_template = "<<item>>"
[[chains.steps.branches]]
when = 'result.body.failed > 0 && len(result.body.results) == 3'
target = "page"
[[chains.steps]]
name = "all-good"
provider = "echo"
default_next = "end"
[[chains.steps]]
name = "page"
provider = "echo"
payload_template = { failed = "<<steps.loop.body.failed>>", second = "<<steps.loop.body.results[1]>>" }
`)
	res := h.run("c", `{"items":[{"a":1},{"fail":"x"},{"b":2}]}`)
	if res.Status != store.RunSucceeded || !slices.Equal(res.Path, []string{"loop", "page"}) {
		t.Fatalf("got %s %v %+v", res.Status, res.Path, res.Error)
	}
	if b := body(t, res, "page"); b["failed"] != float64(1) || !strings.Contains(fmt.Sprint(b["second"]), "error") {
		t.Errorf("page: %v", b)
	}
	res = h.run("c", `{"items":[{"a":1}]}`)
	if !slices.Equal(res.Path, []string{"loop", "all-good"}) {
		t.Errorf("all good: path %v", res.Path)
	}
}

// TestSplitItemResumesWithEarlierResults stops the engine while split items
// wait on their second step and on a parallel group's slow sub-step; after
// resume the items' later steps still read what their earlier steps and
// the group's quick sub-step returned before the stop.
func TestSplitItemResumesWithEarlierResults(t *testing.T) {
	dir := t.TempDir()
	slow, last := filepath.Join(dir, "slow.jsonl"), filepath.Join(dir, "last.jsonl")
	cfg := fmt.Sprintf(`
[[chains]]
name = "c"
[[chains.steps]]
name = "loop"
[chains.steps.split]
items = "<<origin.payload.items>>"
[[chains.steps.split.steps]]
name = "first"
provider = "echo"
payload_template = { v = "first-<<item>>" }
[[chains.steps.split.steps]]
name = "both"
[chains.steps.split.steps.parallel]
[[chains.steps.split.steps.parallel.steps]]
name = "quick"
provider = "echo"
payload_template = { v = "quick-<<item>>" }
[[chains.steps.split.steps.parallel.steps]]
name = "slow"
provider = "faulty"
payload_template = { record = %q, sleep_ms = 1500 }
[[chains.steps.split.steps]]
name = "last"
provider = "faulty"
payload_template = { record = %q, got = "<<steps.first.body.v>> <<steps.both.body.quick.v>>" }
`, slow, last)
	db := filepath.Join(dir, "gw.db")
	ctx := context.Background()
	h1 := newHarness(t, cfg, atStore(db))
	run, err := h1.eng.Start(ctx, "c", engine.Input{Payload: json.RawMessage(`{"items":[1,2,3]}`)})
	if err != nil {
		t.Fatal(err)
	}
	waitLines(t, slow, 3)
	// Wait for the quick sub-steps' results to be durable, then stop.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		steps, _ := h1.store.Steps(ctx, run.ID, "loop[")
		quick := 0
		for _, s := range steps {
			if strings.HasSuffix(s.Key, "/both/quick") && s.Status == store.StepSucceeded {
				quick++
			}
		}
		if quick == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("quick sub-steps durable: %d of 3", quick)
		}
	}
	h1.close()
	h2 := newHarness(t, cfg, atStore(db))
	if _, err := h2.eng.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	final, err := h2.eng.Wait(ctx, run.ID)
	if err != nil || final.Status != store.RunSucceeded {
		t.Fatalf("after resume: %+v %v", final, err)
	}
	calls := readFileString(t, last)
	for i := 1; i <= 3; i++ {
		if want := fmt.Sprintf(`"got":"first-%d quick-%d"`, i, i); !strings.Contains(calls, want) {
			t.Errorf("no call with %s:\n%s", want, calls)
		}
	}
}
