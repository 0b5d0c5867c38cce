// Package storetest is the conformance suite every store.Store must pass.
package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/store"
)

// Factory opens a fresh, empty store for one test. Reopen, when not nil,
// closes s and opens the same underlying data again, to check durability.
// Damage overwrites the stored record of a run with bytes that do not
// decode, as a corrupted file or an older version's write would leave it,
// and returns the store to go on with.
type Factory struct {
	Open   func(t *testing.T) store.Store
	Reopen func(t *testing.T, s store.Store) store.Store
	Damage func(t *testing.T, s store.Store, runID string) store.Store
}

// Run runs the conformance suite.
func Run(t *testing.T, f Factory) {
	tests := []struct {
		name string
		fn   func(t *testing.T, f Factory)
	}{
		{"CreateAndRead", testCreateAndRead},
		{"CreateTwice", testCreateTwice},
		{"CommitUnknownRun", testCommitUnknownRun},
		{"EventSequence", testEventSequence},
		{"StepsByPrefix", testStepsByPrefix},
		{"EventsPaging", testEventsPaging},
		{"Unfinished", testUnfinished},
		{"ListRuns", testListRuns},
		{"ListRunsByHowStarted", testListRunsByHowStarted},
		{"ListRunsByLabel", testListRunsByLabel},
		{"DLQ", testDLQ},
		{"DeliveryDLQ", testDeliveryDLQ},
		{"Deliveries", testDeliveries},
		{"ReleaseKey", testReleaseKey},
		{"ForEachKey", testForEachKey},
		{"FinishedRuns", testFinishedRuns},
		{"DeleteRun", testDeleteRun},
		{"Prune", testPrune},
		{"Definitions", testDefinitions},
		{"Leases", testLeases},
		{"DeleteSteps", testDeleteSteps},
		{"IdempotencyKeys", testIdempotencyKeys},
		{"CreateClaimsKey", testCreateClaimsKey},
		{"CreatesClaimingOneKey", testCreatesClaimingOneKey},
		{"ConcurrentCommits", testConcurrentCommits},
		{"Reopen", testReopen},
		{"Closed", testClosed},
		{"Damaged", testDamaged},
		{"DeepValues", testDeepValues},
		{"LargeValues", testLargeValues},
		{"Slots", testSlots},
		{"SlotsConcurrent", testSlotsConcurrent},
		{"Audit", testAudit},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, f) })
	}
}

// NewRun returns a run record as the engine would create it.
func NewRun(chain string, created time.Time) *store.Run {
	return &store.Run{
		ID:        store.NewID(),
		Chain:     chain,
		ChainHash: "hash-" + chain,
		Status:    store.RunRunning,
		Origin:    store.Origin{ID: "o1", Payload: json.RawMessage(`{"alert":"disk"}`), ReceivedAt: created},
		CreatedAt: created,
		UpdatedAt: created,
	}
}

// appendEvents gives events the run's next sequence numbers.
func appendEvents(run *store.Run, types ...store.EventType) []store.Event {
	out := make([]store.Event, len(types))
	for i, typ := range types {
		run.Seq++
		out[i] = store.Event{Seq: run.Seq, Time: time.Now().UTC(), Type: typ}
	}
	return out
}

func create(t *testing.T, s store.Store, run *store.Run) {
	t.Helper()
	b := &store.Batch{Run: run, Create: true, Events: appendEvents(run, store.EventRunStarted)}
	if err := s.Commit(context.Background(), b); err != nil {
		t.Fatalf("creating run: %v", err)
	}
}

func testCreateAndRead(t *testing.T, f Factory) {
	ctx := context.Background()
	s := f.Open(t)
	run := NewRun("c", time.Now().UTC())
	run.Deadline = run.CreatedAt.Add(time.Hour)
	create(t, s, run)

	run.Path = []string{"a"}
	run.Cursor = "b"
	step := &store.StepRecord{Key: "a", Name: "a", Status: store.StepSucceeded, DedupKey: run.ID + "/a", Attempts: 1, Body: json.RawMessage(`{"ok":true}`)}
	err := s.Commit(ctx, &store.Batch{Run: run, Steps: []*store.StepRecord{step}, Events: appendEvents(run, store.EventStepSucceeded)})
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Run(ctx, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Cursor != "b" || len(got.Path) != 1 || got.Seq != 2 || !got.Deadline.Equal(run.Deadline) || string(got.Origin.Payload) != `{"alert":"disk"}` {
		t.Errorf("run read back as %+v", got)
	}
	steps, err := s.Steps(ctx, run.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != 1 || steps[0].Status != store.StepSucceeded || string(steps[0].Body) != `{"ok":true}` || steps[0].DedupKey != run.ID+"/a" {
		t.Errorf("steps read back as %+v", steps)
	}
	if _, err := s.Run(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("missing run: got %v, want ErrNotFound", err)
	}
}

func testCreateTwice(t *testing.T, f Factory) {
	s := f.Open(t)
	run := NewRun("c", time.Now().UTC())
	create(t, s, run)
	again := *run
	again.Seq = 0
	err := s.Commit(context.Background(), &store.Batch{Run: &again, Create: true, Events: appendEvents(&again, store.EventRunStarted)})
	if !errors.Is(err, store.ErrExists) {
		t.Fatalf("second create: got %v, want ErrExists", err)
	}
}

func testCommitUnknownRun(t *testing.T, f Factory) {
	s := f.Open(t)
	run := NewRun("c", time.Now().UTC())
	err := s.Commit(context.Background(), &store.Batch{Run: run})
	if !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("commit to unknown run: got %v, want ErrNotFound", err)
	}
}

func testEventSequence(t *testing.T, f Factory) {
	ctx := context.Background()
	s := f.Open(t)
	run := NewRun("c", time.Now().UTC())
	create(t, s, run)

	// A gap in the sequence is rejected and leaves nothing behind.
	bad := *run
	bad.Seq = run.Seq + 2
	bad.Cursor = "should-not-stick"
	err := s.Commit(ctx, &store.Batch{
		Run:    &bad,
		Steps:  []*store.StepRecord{{Key: "x", Name: "x", Status: store.StepRunning}},
		Events: []store.Event{{Seq: run.Seq + 2, Type: store.EventStepStarted, Time: time.Now()}},
	})
	if err == nil {
		t.Fatal("commit with an event sequence gap succeeded")
	}
	got, _ := s.Run(ctx, run.ID)
	if got.Cursor == "should-not-stick" || got.Seq != run.Seq {
		t.Errorf("rejected batch changed the run: %+v", got)
	}
	if steps, _ := s.Steps(ctx, run.ID, ""); len(steps) != 0 {
		t.Errorf("rejected batch wrote steps: %+v", steps)
	}
	// Run.Seq must match the last event.
	bad = *run
	bad.Seq = run.Seq + 5
	if err := s.Commit(ctx, &store.Batch{Run: &bad}); err == nil {
		t.Error("commit with run seq ahead of its events succeeded")
	}
}

func testStepsByPrefix(t *testing.T, f Factory) {
	ctx := context.Background()
	s := f.Open(t)
	run := NewRun("c", time.Now().UTC())
	create(t, s, run)
	other := NewRun("c", time.Now().UTC())
	create(t, s, other)
	keys := []string{"notify/slack", "check", "notify", "notify/email", "resolve"}
	var steps []*store.StepRecord
	for _, k := range keys {
		steps = append(steps, &store.StepRecord{Key: k, Name: k, Status: store.StepPending})
	}
	if err := s.Commit(ctx, &store.Batch{Run: run, Steps: steps}); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, &store.Batch{Run: other, Steps: []*store.StepRecord{{Key: "notify/x", Name: "x"}}}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Steps(ctx, run.ID, "notify/")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Key != "notify/email" || got[1].Key != "notify/slack" {
		t.Errorf("prefix notify/: got %v", stepKeys(got))
	}
	all, _ := s.Steps(ctx, run.ID, "")
	if want := "[check notify notify/email notify/slack resolve]"; fmt.Sprint(stepKeys(all)) != want {
		t.Errorf("all steps: got %v, want %s", stepKeys(all), want)
	}
	var walked []string
	err = s.ForEachStep(ctx, run.ID, store.StepScan{Prefix: "notify"}, func(st *store.StepRecord) error {
		walked = append(walked, st.Key)
		if st.Key == "notify/email" {
			return errStop
		}
		return nil
	})
	if !errors.Is(err, errStop) || fmt.Sprint(walked) != "[notify notify/email]" {
		t.Errorf("ForEachStep: walked %v, err %v", walked, err)
	}
	// A split's items, more than a page of them, are passed over.
	var items []*store.StepRecord
	for i := range 2500 {
		items = append(items, &store.StepRecord{Key: fmt.Sprintf("loop[%04d]", i), Name: "loop", Status: store.StepSucceeded},
			&store.StepRecord{Key: fmt.Sprintf("loop[%04d]/work", i), Name: "work", Status: store.StepSucceeded})
	}
	items = append(items, &store.StepRecord{Key: "loop", Name: "loop", Status: store.StepRunning})
	if err := s.Commit(ctx, &store.Batch{Run: run, Steps: items}); err != nil {
		t.Fatal(err)
	}
	walked, n := nil, 0
	err = s.ForEachStep(ctx, run.ID, store.StepScan{SkipItems: true}, func(st *store.StepRecord) error {
		walked = append(walked, st.Key)
		return nil
	})
	if want := "[check loop notify notify/email notify/slack resolve]"; err != nil || fmt.Sprint(walked) != want {
		t.Errorf("ForEachStep without items: walked %v (err %v), want %s", walked, err, want)
	}
	err = s.ForEachStep(ctx, run.ID, store.StepScan{Prefix: "loop["}, func(*store.StepRecord) error {
		n++
		return nil
	})
	if err != nil || n != 5000 {
		t.Errorf("ForEachStep over the items: %d records, err %v", n, err)
	}
	for _, key := range []string{"loop", "notify", "loop[0042]", "loo", "nowhere", ""} {
		walked = nil
		err = s.ForEachStep(ctx, run.ID, store.StepScan{Prefix: key, Exact: true}, func(st *store.StepRecord) error {
			walked = append(walked, st.Key)
			return nil
		})
		want := "[" + key + "]"
		if key == "loo" || key == "nowhere" || key == "" {
			want = "[]"
		}
		if err != nil || fmt.Sprint(walked) != want {
			t.Errorf("ForEachStep exactly %q: walked %v (err %v), want %s", key, walked, err, want)
		}
	}
	// Replacing by key keeps one record.
	steps[1].Status = store.StepSucceeded
	if err := s.Commit(ctx, &store.Batch{Run: run, Steps: steps[1:2]}); err != nil {
		t.Fatal(err)
	}
	got, _ = s.Steps(ctx, run.ID, "check")
	if len(got) != 1 || got[0].Status != store.StepSucceeded {
		t.Errorf("replaced step: got %+v", got)
	}
}

var errStop = errors.New("stop")

func stepKeys(steps []*store.StepRecord) []string {
	out := make([]string, len(steps))
	for i, s := range steps {
		out[i] = s.Key
	}
	return out
}

func testEventsPaging(t *testing.T, f Factory) {
	ctx := context.Background()
	s := f.Open(t)
	run := NewRun("c", time.Now().UTC())
	create(t, s, run)
	for i := 0; i < 5; i++ {
		evs := appendEvents(run, store.EventStepStarted, store.EventStepSucceeded)
		if err := s.Commit(ctx, &store.Batch{Run: run, Events: evs}); err != nil {
			t.Fatal(err)
		}
	}
	all, err := s.Events(ctx, run.ID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 11 {
		t.Fatalf("got %d events, want 11", len(all))
	}
	for i, ev := range all {
		if ev.Seq != uint64(i+1) || ev.RunID != run.ID {
			t.Fatalf("event %d: seq %d run %q", i, ev.Seq, ev.RunID)
		}
	}
	page, _ := s.Events(ctx, run.ID, 4, 3)
	if len(page) != 3 || page[0].Seq != 5 || page[2].Seq != 7 {
		t.Errorf("after 4 limit 3: got %+v", page)
	}
	if rest, _ := s.Events(ctx, run.ID, 11, 0); len(rest) != 0 {
		t.Errorf("after the last event: got %d events", len(rest))
	}
	// A Last-Event-ID of 2^64-1 is past every event, not before the first.
	for _, after := range []uint64{math.MaxUint64, math.MaxUint64 - 1, math.MaxInt64, math.MaxInt64 + 1} {
		if rest, err := s.Events(ctx, run.ID, after, 0); err != nil || len(rest) != 0 {
			t.Errorf("after %d: got %d events, %v", after, len(rest), err)
		}
	}
}

// testDamaged checks that a run whose record cannot be read back is named,
// not fatal: listings pass over it and say so, and every other run reads.
func testDamaged(t *testing.T, f Factory) {
	if f.Damage == nil {
		t.Skip("the store's test gives no way to damage a record")
	}
	ctx := context.Background()
	s := f.Open(t)
	now := time.Now().UTC()
	runs := []*store.Run{NewRun("c", now), NewRun("c", now.Add(time.Millisecond)), NewRun("c", now.Add(2*time.Millisecond))}
	for _, r := range runs {
		create(t, s, r)
	}
	bad := runs[1]
	s = f.Damage(t, s, bad.ID)

	if _, err := s.Run(ctx, bad.ID); !errors.Is(err, store.ErrDamaged) {
		t.Errorf("reading the damaged run: %v, want ErrDamaged", err)
	}
	for _, r := range []*store.Run{runs[0], runs[2]} {
		if _, err := s.Run(ctx, r.ID); err != nil {
			t.Errorf("reading run %s beside a damaged one: %v", r.ID, err)
		}
	}
	page, err := s.ListRuns(ctx, store.RunFilter{})
	if err != nil {
		t.Fatalf("listing beside a damaged run: %v", err)
	}
	if len(page.Runs) != 2 || page.Runs[0].ID != runs[2].ID || page.Runs[1].ID != runs[0].ID {
		t.Errorf("listed %d runs, want the two readable ones newest first", len(page.Runs))
	}
	if len(page.Damaged) != 1 || page.Damaged[0].ID != bad.ID || page.Damaged[0].Error == "" {
		t.Errorf("damaged runs named: %+v", page.Damaged)
	}
	filtered, err := s.ListRuns(ctx, store.RunFilter{Chain: "other"})
	if err != nil || len(filtered.Runs) != 0 || len(filtered.Damaged) != 1 {
		t.Errorf("a filtered listing: %+v %v; a damaged run is named whatever the filter", filtered, err)
	}
	ids, err := s.UnfinishedRuns(ctx)
	if err != nil || len(ids) != 3 {
		t.Errorf("unfinished runs: %v %v", ids, err)
	}
}

// testDeepValues writes values nested as deeply as MaxNesting allows, in
// the places a run keeps them, and reads them back.
func testDeepValues(t *testing.T, f Factory) {
	ctx := context.Background()
	s := f.Open(t)
	deep := json.RawMessage(strings.Repeat("[", store.MaxNesting) + strings.Repeat("]", store.MaxNesting))
	run := NewRun("c", time.Now().UTC())
	run.Origin.Payload = deep
	create(t, s, run)
	run.Body = deep
	b := &store.Batch{Run: run, Events: appendEvents(run, store.EventStepSucceeded),
		Steps: []*store.StepRecord{{Key: "a", Name: "a", Status: store.StepSucceeded, Body: deep}},
		DLQ:   []*store.DLQEntry{{ID: store.NewID(), RunID: run.ID, Chain: "c", Step: "a", Payload: deep, CreatedAt: time.Now().UTC()}},
	}
	if err := s.Commit(ctx, b); err != nil {
		t.Fatal(err)
	}
	got, err := s.Run(ctx, run.ID)
	if err != nil || string(got.Origin.Payload) != string(deep) || string(got.Body) != string(deep) {
		t.Fatalf("reading the run back: %v", err)
	}
	steps, err := s.Steps(ctx, run.ID, "")
	if err != nil || len(steps) != 1 || string(steps[0].Body) != string(deep) {
		t.Fatalf("reading the step back: %v", err)
	}
	if page, err := s.ListRuns(ctx, store.RunFilter{}); err != nil || len(page.Runs) != 1 || len(page.Damaged) != 0 {
		t.Fatalf("listing: %+v %v", page, err)
	}
	if entries, err := s.ListDLQ(ctx, store.DLQFilter{}); err != nil || len(entries) != 1 || string(entries[0].Payload) != string(deep) {
		t.Fatalf("reading the dead-letter entry back: %v", err)
	}
}

// largeJSON is a JSON array of about n bytes, marked so that two are told
// apart.
func largeJSON(mark string, n int) json.RawMessage {
	return json.RawMessage(`["` + mark + `"` + strings.Repeat(`,"`+mark+`"`, n/(len(mark)+3)) + `]`)
}

// testLargeValues writes payloads and bodies of hundreds of kilobytes, the
// results of a split among them, and reads them back whole however they are
// read; a step rewritten with a small body, or deleted, leaves no trace of
// its large one.
func testLargeValues(t *testing.T, f Factory) {
	ctx := context.Background()
	s := f.Open(t)
	run := NewRun("c", time.Now().UTC())
	run.Origin.Payload = largeJSON("host", 300<<10)
	create(t, s, run)
	results, item := largeJSON("result", 200<<10), largeJSON("item", 100<<10)
	steps := []*store.StepRecord{
		{Key: "loop", Name: "loop", Status: store.StepSucceeded, Body: results},
		{Key: "loop[0]", Name: "loop", Status: store.StepSucceeded, Body: item},
		{Key: "loop[0]/get", Name: "get", Status: store.StepSucceeded, Body: item},
		{Key: "loop[1]", Name: "loop", Status: store.StepSucceeded, Body: json.RawMessage(`1`)},
		{Key: "loop2", Name: "loop2", Status: store.StepSucceeded, Body: item},
	}
	if err := s.Commit(ctx, &store.Batch{Run: run, Steps: steps}); err != nil {
		t.Fatal(err)
	}
	bodies := func(scan store.StepScan) string {
		t.Helper()
		var out []string
		err := s.ForEachStep(ctx, run.ID, scan, func(rec *store.StepRecord) error {
			out = append(out, fmt.Sprintf("%s:%d", rec.Key, len(rec.Body)))
			if len(rec.Body) > 0 && !json.Valid(rec.Body) {
				t.Errorf("%+v: the body of %s is not JSON", scan, rec.Key)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%+v: %v", scan, err)
		}
		return strings.Join(out, " ")
	}
	r, i := len(results), len(item)
	for _, tc := range []struct {
		scan store.StepScan
		want string
	}{
		{store.StepScan{}, fmt.Sprintf("loop:%d loop2:%d loop[0]:%d loop[0]/get:%d loop[1]:1", r, i, i, i)},
		{store.StepScan{SkipItems: true}, fmt.Sprintf("loop:%d loop2:%d", r, i)},
		{store.StepScan{Prefix: "loop", Exact: true}, fmt.Sprintf("loop:%d", r)},
		{store.StepScan{Prefix: "loop[0]", Exact: true}, fmt.Sprintf("loop[0]:%d", i)},
		{store.StepScan{Prefix: "loop["}, fmt.Sprintf("loop[0]:%d loop[0]/get:%d loop[1]:1", i, i)},
	} {
		if got := bodies(tc.scan); got != tc.want {
			t.Errorf("%+v: got %s, want %s", tc.scan, got, tc.want)
		}
	}
	var got []*store.StepRecord
	_ = s.ForEachStep(ctx, run.ID, store.StepScan{Prefix: "loop", Exact: true}, func(rec *store.StepRecord) error {
		got = append(got, rec)
		return nil
	})
	if len(got) != 1 || string(got[0].Body) != string(results) || got[0].Status != store.StepSucceeded {
		t.Errorf("the split's record did not come back as written")
	}
	back, err := s.Run(ctx, run.ID)
	if err != nil || string(back.Origin.Payload) != string(run.Origin.Payload) || back.Origin.ID != run.Origin.ID {
		t.Fatalf("reading the origin back: %v", err)
	}
	header, err := s.RunHeader(ctx, run.ID)
	if err != nil || header.ID != run.ID || header.Chain != run.Chain || header.Origin.Payload != nil {
		t.Errorf("the run's header: %+v, %v; want the run without its origin", header, err)
	}
	if _, err := s.RunHeader(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the header of a run not there: %v, want ErrNotFound", err)
	}
	// A replayed split starts without its results; a forgotten item goes.
	steps = []*store.StepRecord{{Key: "loop", Name: "loop", Status: store.StepRunning}}
	if err := s.Commit(ctx, &store.Batch{Run: run, Steps: steps, DeleteSteps: []string{"loop[0]", "loop[0]/get"}}); err != nil {
		t.Fatal(err)
	}
	if got, want := bodies(store.StepScan{}), fmt.Sprintf("loop:0 loop2:%d loop[1]:1", i); got != want {
		t.Errorf("after the rewrite: got %s, want %s", got, want)
	}
	if err := s.Commit(ctx, &store.Batch{Run: run, Steps: []*store.StepRecord{{Key: "loop", Name: "loop", Status: store.StepSucceeded, Body: item}}}); err != nil {
		t.Fatal(err)
	}
	if got, want := bodies(store.StepScan{Prefix: "loop", Exact: true}), fmt.Sprintf("loop:%d", i); got != want {
		t.Errorf("large again: got %s, want %s", got, want)
	}
	// A body that is not JSON is refused, large or not.
	bad := append(largeJSON("x", 100<<10), '{')
	err = s.Commit(ctx, &store.Batch{Run: run, Steps: []*store.StepRecord{{Key: "bad", Name: "bad", Body: bad}}})
	if err == nil {
		t.Error("a large body that is not JSON was committed")
	}
}

func testUnfinished(t *testing.T, f Factory) {
	ctx := context.Background()
	s := f.Open(t)
	a := NewRun("c", time.Now().UTC())
	b := NewRun("c", time.Now().UTC())
	create(t, s, a)
	create(t, s, b)
	ids, err := s.UnfinishedRuns(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(ids) != fmt.Sprint([]string{a.ID, b.ID}) {
		t.Errorf("unfinished: got %v, want [%s %s]", ids, a.ID, b.ID)
	}
	a.Status = store.RunSucceeded
	a.FinishedAt = time.Now().UTC()
	if err := s.Commit(ctx, &store.Batch{Run: a, Events: appendEvents(a, store.EventRunSucceeded)}); err != nil {
		t.Fatal(err)
	}
	ids, _ = s.UnfinishedRuns(ctx)
	if len(ids) != 1 || ids[0] != b.ID {
		t.Errorf("after finishing one: got %v, want [%s]", ids, b.ID)
	}
	// A finished run made to run again (a replay) is unfinished again.
	a.Status = store.RunRunning
	if err := s.Commit(ctx, &store.Batch{Run: a, Events: appendEvents(a, store.EventRunReplayed)}); err != nil {
		t.Fatal(err)
	}
	ids, _ = s.UnfinishedRuns(ctx)
	if len(ids) != 2 {
		t.Errorf("after replaying one: got %v, want both", ids)
	}
}

func testListRuns(t *testing.T, f Factory) {
	ctx := context.Background()
	s := f.Open(t)
	base := time.Now().UTC().Add(-time.Hour)
	var runs []*store.Run
	for i := 0; i < 7; i++ {
		chain := "a"
		if i%2 == 1 {
			chain = "b"
		}
		r := NewRun(chain, base.Add(time.Duration(i)*time.Minute))
		create(t, s, r)
		runs = append(runs, r)
	}
	runs[6].Status = store.RunFailed
	if err := s.Commit(ctx, &store.Batch{Run: runs[6]}); err != nil {
		t.Fatal(err)
	}

	page, err := s.ListRuns(ctx, store.RunFilter{Limit: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Runs) != 3 || page.Runs[0].ID != runs[6].ID || page.Runs[2].ID != runs[4].ID || page.Next == "" {
		t.Fatalf("first page: got %v next %q", runIDs(page.Runs), page.Next)
	}
	for _, r := range page.Runs {
		if string(r.Origin.Payload) != `{"alert":"disk"}` {
			t.Errorf("listed run %s has origin %s", r.ID, r.Origin.Payload)
		}
	}
	page2, err := s.ListRuns(ctx, store.RunFilter{Limit: 3, Cursor: page.Next})
	if err != nil {
		t.Fatal(err)
	}
	if len(page2.Runs) != 3 || page2.Runs[0].ID != runs[3].ID || page2.Runs[2].ID != runs[1].ID {
		t.Fatalf("second page: got %v", runIDs(page2.Runs))
	}
	page3, _ := s.ListRuns(ctx, store.RunFilter{Limit: 3, Cursor: page2.Next})
	if len(page3.Runs) != 1 || page3.Runs[0].ID != runs[0].ID || page3.Next != "" {
		t.Fatalf("last page: got %v next %q", runIDs(page3.Runs), page3.Next)
	}

	byChain, _ := s.ListRuns(ctx, store.RunFilter{Chain: "b"})
	if len(byChain.Runs) != 3 || string(byChain.Runs[0].Origin.Payload) != `{"alert":"disk"}` {
		t.Errorf("chain b: got %d runs, want 3 with their origins", len(byChain.Runs))
	}
	bare, _ := s.ListRuns(ctx, store.RunFilter{Chain: "b", NoOrigins: true})
	if len(bare.Runs) != 3 || bare.Runs[0].ID != byChain.Runs[0].ID || bare.Runs[0].Origin.Payload != nil || bare.Runs[0].Chain != "b" {
		t.Errorf("chain b without origins: got %d runs, the first %+v", len(bare.Runs), bare.Runs[0])
	}
	byStatus, _ := s.ListRuns(ctx, store.RunFilter{Status: store.RunFailed})
	if len(byStatus.Runs) != 1 || byStatus.Runs[0].ID != runs[6].ID {
		t.Errorf("failed runs: got %v", runIDs(byStatus.Runs))
	}
	since, _ := s.ListRuns(ctx, store.RunFilter{Since: base.Add(4*time.Minute + time.Second)})
	if len(since.Runs) != 2 {
		t.Errorf("since: got %v, want the 2 newest", runIDs(since.Runs))
	}
	for _, c := range []string{"%%%", "zzzz", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"} {
		if _, err := s.ListRuns(ctx, store.RunFilter{Cursor: c}); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("cursor %q, not one the store returned: got %v, want ErrInvalid", c, err)
		}
	}
}

// testListRunsByHowStarted filters runs by how they started, and leaves
// chains out.
func testListRunsByHowStarted(t *testing.T, f Factory) {
	ctx := context.Background()
	s := f.Open(t)
	base := time.Now().UTC().Add(-time.Hour)
	var runs []*store.Run
	for i, by := range []string{"schedule:health", "trigger:am", "api", "schedule:health", "trigger:grafana", "cli", "replay", ""} {
		chain := "incident"
		if strings.HasPrefix(by, "schedule") {
			chain = "health-check"
		}
		r := NewRun(chain, base.Add(time.Duration(i)*time.Minute))
		r.StartedBy = by
		create(t, s, r)
		runs = append(runs, r)
	}
	for _, tc := range []struct {
		filter store.RunFilter
		want   []int
	}{
		{store.RunFilter{StartedBy: "schedule"}, []int{3, 0}},
		{store.RunFilter{StartedBy: "trigger"}, []int{4, 1}},
		{store.RunFilter{StartedBy: "trigger:am"}, []int{1}},
		{store.RunFilter{StartedBy: "api"}, []int{2}},
		{store.RunFilter{StartedBy: "cli"}, []int{5}},
		{store.RunFilter{StartedBy: "replay"}, []int{6}},
		{store.RunFilter{HideChains: []string{"health-check"}}, []int{7, 6, 5, 4, 2, 1}},
		{store.RunFilter{HideChains: []string{"health-check"}, StartedBy: "trigger", Limit: 1}, []int{4}},
	} {
		page, err := s.ListRuns(ctx, tc.filter)
		if err != nil {
			t.Fatal(err)
		}
		var want []string
		for _, i := range tc.want {
			want = append(want, runs[i].ID)
		}
		if fmt.Sprint(runIDs(page.Runs)) != fmt.Sprint(want) {
			t.Errorf("%+v: got %v, want %v", tc.filter, runIDs(page.Runs), want)
		}
		if len(page.Runs) > 0 && page.Runs[0].StartedBy == "" && tc.filter.StartedBy != "" {
			t.Errorf("%+v: a run listed without how it started", tc.filter)
		}
	}
}

// testListRunsByLabel finds runs by their labels, among more runs than a
// page holds, and lists them with their labels.
func testListRunsByLabel(t *testing.T, f Factory) {
	ctx := context.Background()
	s := f.Open(t)
	base := time.Now().UTC().Add(-time.Hour)
	var runs []*store.Run
	for i := range 300 {
		r := NewRun("incident", base.Add(time.Duration(i)*time.Second))
		r.Labels = map[string]string{"alertname": "DiskFull", "instance": fmt.Sprintf("db-%d:9100", i)}
		if i%100 == 7 {
			r.Labels["severity"] = "critical"
		}
		create(t, s, r)
		runs = append(runs, r)
	}
	for _, tc := range []struct {
		labels map[string]string
		want   []int
	}{
		{map[string]string{"instance": "db-3:9100"}, []int{3}},
		{map[string]string{"severity": "critical"}, []int{207, 107, 7}},
		{map[string]string{"severity": ""}, []int{207, 107, 7}},
		{map[string]string{"severity": "critical", "instance": "db-107:9100"}, []int{107}},
		{map[string]string{"instance": "db-3"}, nil},
		{map[string]string{"team": ""}, nil},
	} {
		page, err := s.ListRuns(ctx, store.RunFilter{Labels: tc.labels, Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		var want []string
		for _, i := range tc.want {
			want = append(want, runs[i].ID)
		}
		if fmt.Sprint(runIDs(page.Runs)) != fmt.Sprint(want) {
			t.Errorf("labels %v: got %v, want %v", tc.labels, runIDs(page.Runs), want)
		}
		for _, r := range page.Runs {
			if r.Labels["alertname"] != "DiskFull" {
				t.Errorf("labels %v: a run listed without its labels: %v", tc.labels, r.Labels)
			}
		}
	}
	got, err := s.Run(ctx, runs[5].ID)
	if err != nil || got.Labels["instance"] != "db-5:9100" {
		t.Fatalf("a run's labels read back: %v %v", err, got)
	}
}

func runIDs(runs []*store.Run) []string {
	out := make([]string, len(runs))
	for i, r := range runs {
		out[i] = r.ID
	}
	return out
}

func testDLQ(t *testing.T, f Factory) {
	ctx := context.Background()
	s := f.Open(t)
	if n, err := s.CountDLQ(ctx); err != nil || n != 0 {
		t.Errorf("CountDLQ on an empty store: %d %v", n, err)
	}
	run := NewRun("c", time.Now().UTC())
	create(t, s, run)
	old := time.Now().UTC().Add(-time.Hour)
	entries := []*store.DLQEntry{
		{ID: store.NewID(), RunID: run.ID, Chain: "c", Step: "page", Error: store.ErrorInfo{Message: "boom"}, Attempts: 3, CreatedAt: old},
		{ID: store.NewID(), RunID: run.ID, Chain: "c", Step: "mail", Error: store.ErrorInfo{Message: "bounce"}, Attempts: 1, CreatedAt: time.Now().UTC()},
	}
	if err := s.Commit(ctx, &store.Batch{Run: run, DLQ: entries}); err != nil {
		t.Fatal(err)
	}
	got, err := s.DLQ(ctx, entries[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Error.Message != "boom" || got.Attempts != 3 || got.RunID != run.ID {
		t.Errorf("entry read back as %+v", got)
	}
	list, _ := s.ListDLQ(ctx, store.DLQFilter{})
	if len(list) != 2 || list[0].ID != entries[0].ID {
		t.Errorf("list: got %d entries", len(list))
	}
	if n, err := s.CountDLQ(ctx); err != nil || n != 2 {
		t.Errorf("CountDLQ: %d %v, want 2", n, err)
	}
	if l, _ := s.ListDLQ(ctx, store.DLQFilter{Step: "mail"}); len(l) != 1 || l[0].Step != "mail" {
		t.Errorf("by step: got %+v", l)
	}
	if l, _ := s.ListDLQ(ctx, store.DLQFilter{Since: old.Add(time.Minute)}); len(l) != 1 {
		t.Errorf("since: got %d entries, want 1", len(l))
	}
	first, _ := s.ListDLQ(ctx, store.DLQFilter{Limit: 1})
	if next, _ := s.ListDLQ(ctx, store.DLQFilter{Limit: 1, After: first[0].ID}); len(next) != 1 || next[0].ID != entries[1].ID {
		t.Errorf("page after %s: got %+v", first[0].ID, next)
	}
	if l, _ := s.ListDLQ(ctx, store.DLQFilter{After: entries[1].ID}); len(l) != 0 {
		t.Errorf("after the last entry: got %d entries", len(l))
	}
	if err := s.DeleteDLQ(ctx, entries[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DLQ(ctx, entries[0].ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("deleted entry: got %v, want ErrNotFound", err)
	}
	if err := s.DeleteDLQ(ctx, entries[0].ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("deleting twice: got %v, want ErrNotFound", err)
	}
}

// testDeliveryDLQ parks an entry that belongs to no run beside a run's.
func testDeliveryDLQ(t *testing.T, f Factory) {
	ctx := context.Background()
	s := f.Open(t)
	run := NewRun("c", time.Now().UTC())
	create(t, s, run)
	step := &store.DLQEntry{ID: store.NewID(), RunID: run.ID, Chain: "c", Step: "page", CreatedAt: time.Now().UTC()}
	if err := s.Commit(ctx, &store.Batch{Run: run, DLQ: []*store.DLQEntry{step}}); err != nil {
		t.Fatal(err)
	}
	parked := &store.DLQEntry{ID: store.NewID(), Kind: store.DLQDelivery, Chain: "c", Trigger: "am",
		Error: store.ErrorInfo{Message: "when failed", Code: "trigger_when"}, Payload: json.RawMessage(`{"alerts":[{"a":1}]}`),
		Headers: map[string]string{"user-agent": "Alertmanager/0.35.0"}, Metadata: json.RawMessage(`{"remote_addr":"10.0.0.9:4411"}`),
		CreatedAt: time.Now().UTC()}
	if err := s.AddDLQ(ctx, parked); err != nil {
		t.Fatal(err)
	}
	got, err := s.DLQ(ctx, parked.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Kind != store.DLQDelivery || got.Trigger != "am" || got.RunID != "" || string(got.Payload) != string(parked.Payload) ||
		got.Headers["user-agent"] != "Alertmanager/0.35.0" || string(got.Metadata) != string(parked.Metadata) {
		t.Errorf("the delivery read back as %+v", got)
	}
	list, err := s.ListDLQ(ctx, store.DLQFilter{Chain: "c"})
	if err != nil || len(list) != 2 || list[0].ID != step.ID || list[1].ID != parked.ID {
		t.Errorf("listing: %v %+v", err, list)
	}
	if n, err := s.CountDLQ(ctx); err != nil || n != 2 {
		t.Errorf("CountDLQ: %d %v, want 2", n, err)
	}
	if err := s.DeleteDLQ(ctx, parked.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DLQ(ctx, parked.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("deleted entry: got %v, want ErrNotFound", err)
	}
}

// testDeliveries keeps deliveries, lists them oldest first and deletes
// them, a second delete included.
func testDeliveries(t *testing.T, f Factory) {
	ctx := context.Background()
	s := f.Open(t)
	if got, err := s.Deliveries(ctx, 10); err != nil || len(got) != 0 {
		t.Fatalf("an empty inbox: %v %v", got, err)
	}
	var ids []string
	for i := range 3 {
		d := &store.Delivery{ID: store.NewID(), Trigger: "am", Body: json.RawMessage(fmt.Sprintf(`{"alerts":[%d]}`, i)),
			Metadata: json.RawMessage(`{"remote_addr":"10.0.0.9:4411"}`), ReceivedAt: time.Now().UTC()}
		if err := s.PutDelivery(ctx, d); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, d.ID)
	}
	got, err := s.Deliveries(ctx, 2)
	if err != nil || len(got) != 2 || got[0].ID != ids[0] || got[1].ID != ids[1] || string(got[1].Body) != `{"alerts":[1]}` || got[0].Trigger != "am" {
		t.Fatalf("the first two: %v %+v", err, got)
	}
	if err := s.DeleteDelivery(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteDelivery(ctx, ids[0]); err != nil {
		t.Errorf("deleting twice: %v", err)
	}
	got, err = s.Deliveries(ctx, 0)
	if err != nil || len(got) != 2 || got[0].ID != ids[1] || got[1].ID != ids[2] {
		t.Errorf("after a delete: %v %+v", err, got)
	}
}

// testReleaseKey unbinds a key only from the run it is bound to.
func testReleaseKey(t *testing.T, f Factory) {
	ctx := context.Background()
	s := f.Open(t)
	key := "group/" + store.NewID()
	if _, err := s.ClaimKey(ctx, key, "run-1", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.ReleaseKey(ctx, key, "run-2"); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.KeyRun(ctx, key); got != "run-1" {
		t.Errorf("after a release for another run, the key is bound to %q", got)
	}
	if err := s.ReleaseKey(ctx, key, "run-1"); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.KeyRun(ctx, key); got != "" {
		t.Errorf("after its release, the key is bound to %q", got)
	}
	if got, err := s.ClaimKey(ctx, key, "run-3", time.Minute); err != nil || got != "" {
		t.Errorf("a claim after the release: %q %v", got, err)
	}
	if err := s.ReleaseKey(ctx, "never/"+store.NewID(), "run-1"); err != nil {
		t.Errorf("releasing a key never bound: %v", err)
	}
}

// testForEachKey lists the keys bound under a prefix, and only those:
// not one released, lapsed, or under another prefix.
func testForEachKey(t *testing.T, f Factory) {
	ctx := context.Background()
	s := f.Open(t)
	prefix := "listed/" + store.NewID() + "/"
	for key, ttl := range map[string]time.Duration{"a": time.Hour, "b/c": time.Hour, "gone": time.Hour, "lapsed": 50 * time.Millisecond} {
		if _, err := s.ClaimKey(ctx, prefix+key, "bound-"+key, ttl); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.ClaimKey(ctx, strings.TrimSuffix(prefix, "/")+"x", "elsewhere", time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.ReleaseKey(ctx, prefix+"gone", "bound-gone"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	got := map[string]string{}
	if err := s.ForEachKey(ctx, prefix, func(key, bound string) error {
		got[key] = bound
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{prefix + "a": "bound-a", prefix + "b/c": "bound-b/c"}; !maps.Equal(got, want) {
		t.Errorf("keys under %s: %v, want %v", prefix, got, want)
	}
	stop := errors.New("stop")
	if err := s.ForEachKey(ctx, prefix, func(string, string) error { return stop }); !errors.Is(err, stop) {
		t.Errorf("fn's error: %v, want it returned", err)
	}
}

// finish ends a run with status at ended.
func finish(t *testing.T, s store.Store, run *store.Run, status store.RunStatus, ended time.Time) {
	t.Helper()
	run.Status, run.FinishedAt = status, ended
	if err := s.Commit(context.Background(), &store.Batch{Run: run, Events: appendEvents(run, store.EventType("run_"+string(status)))}); err != nil {
		t.Fatalf("finishing run %s: %v", run.ID, err)
	}
}

// finished lists the ids FinishedRuns gives for status.
func finished(t *testing.T, s store.Store, status store.RunStatus) []string {
	t.Helper()
	var ids []string
	err := s.FinishedRuns(context.Background(), status, func(r *store.Run) (bool, error) {
		ids = append(ids, r.ID)
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// testFinishedRuns lists runs by how and when they ended, follows a
// replayed run out of the index and back in with its new end, and keeps
// one entry for a run committed again once ended.
func testFinishedRuns(t *testing.T, f Factory) {
	ctx := context.Background()
	s := f.Open(t)
	base := time.Now().UTC().Add(-time.Hour)
	var runs []*store.Run
	for i := range 4 {
		r := NewRun("c", base.Add(time.Duration(i)*time.Second))
		create(t, s, r)
		runs = append(runs, r)
	}
	finish(t, s, runs[0], store.RunSucceeded, base.Add(10*time.Minute))
	finish(t, s, runs[1], store.RunFailed, base.Add(5*time.Minute))
	finish(t, s, runs[2], store.RunSucceeded, base.Add(2*time.Minute))
	if got, want := finished(t, s, store.RunSucceeded), []string{runs[2].ID, runs[0].ID}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("succeeded: %v, want %v (by when they ended)", got, want)
	}
	if got := finished(t, s, store.RunFailed); fmt.Sprint(got) != fmt.Sprint([]string{runs[1].ID}) {
		t.Errorf("failed: %v", got)
	}
	if got := finished(t, s, store.RunCancelled); len(got) != 0 {
		t.Errorf("cancelled: %v", got)
	}
	n := 0
	if err := s.FinishedRuns(ctx, store.RunSucceeded, func(*store.Run) (bool, error) { n++; return false, nil }); err != nil || n != 1 {
		t.Errorf("a walk told to stop went on: %d %v", n, err)
	}
	if err := s.FinishedRuns(ctx, store.RunRunning, func(*store.Run) (bool, error) { return true, nil }); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("running runs are not finished: %v", err)
	}

	// A replay makes the failed run unfinished, and it then succeeds.
	runs[1].Status, runs[1].FinishedAt = store.RunRunning, time.Time{}
	if err := s.Commit(ctx, &store.Batch{Run: runs[1], Events: appendEvents(runs[1], store.EventRunReplayed)}); err != nil {
		t.Fatal(err)
	}
	if got := finished(t, s, store.RunFailed); len(got) != 0 {
		t.Errorf("failed, after the replay: %v", got)
	}
	finish(t, s, runs[1], store.RunSucceeded, base.Add(20*time.Minute))
	// Committed again once ended (a note): still one entry.
	runs[1].Seq++
	if err := s.Commit(ctx, &store.Batch{Run: runs[1], Events: []store.Event{{Seq: runs[1].Seq, Time: time.Now().UTC(), Type: store.EventNote}}}); err != nil {
		t.Fatal(err)
	}
	if got, want := finished(t, s, store.RunSucceeded), []string{runs[2].ID, runs[0].ID, runs[1].ID}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("succeeded, after the replay ended: %v, want %v", got, want)
	}
}

// testDeleteRun deletes a run of many records, apart values included, and
// leaves every other run, and the deleted run's dead-letter entry, alone.
func testDeleteRun(t *testing.T, f Factory) {
	ctx := context.Background()
	s := f.Open(t)
	now := time.Now().UTC()
	keep, gone, running := NewRun("c", now), NewRun("c", now.Add(time.Second)), NewRun("c", now.Add(2*time.Second))
	gone.Origin.Payload = largeJSON("payload", 100<<10)
	for _, r := range []*store.Run{keep, gone, running} {
		create(t, s, r)
	}
	const items = 1500
	var batch []*store.StepRecord
	for i := range items {
		batch = append(batch, &store.StepRecord{Key: fmt.Sprintf("split[%d]", i), Status: store.StepSucceeded, Body: json.RawMessage(`{"ok":true}`)})
		if len(batch) == 500 || i == items-1 {
			if err := s.Commit(ctx, &store.Batch{Run: gone, Steps: batch, Events: appendEvents(gone, store.EventStepProgress)}); err != nil {
				t.Fatal(err)
			}
			batch = nil
		}
	}
	big := &store.StepRecord{Key: "split", Status: store.StepSucceeded, Body: largeJSON("results", 200<<10)}
	entry := &store.DLQEntry{ID: store.NewID(), RunID: gone.ID, Chain: "c", Step: "split", CreatedAt: now}
	if err := s.Commit(ctx, &store.Batch{Run: gone, Steps: []*store.StepRecord{big}, DLQ: []*store.DLQEntry{entry}, Events: appendEvents(gone, store.EventDeadLettered)}); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, &store.Batch{Run: keep, Steps: []*store.StepRecord{{Key: "a", Status: store.StepSucceeded}}, Events: appendEvents(keep, store.EventStepSucceeded)}); err != nil {
		t.Fatal(err)
	}
	finish(t, s, keep, store.RunSucceeded, now)
	finish(t, s, gone, store.RunFailed, now)

	if _, err := s.DeleteRun(ctx, running.ID); !errors.Is(err, store.ErrUnfinished) {
		t.Errorf("deleting a running run: %v", err)
	}
	if _, err := s.DeleteRun(ctx, store.NewID()); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("deleting no run: %v", err)
	}
	freed, err := s.DeleteRun(ctx, gone.ID)
	if err != nil {
		t.Fatal(err)
	}
	if freed.Records < 1 || freed.Bytes < 300<<10 {
		t.Errorf("deleting a run of %d records and 300 KiB apart freed %+v", items+5, freed)
	}
	if _, err := s.Run(ctx, gone.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the deleted run reads: %v", err)
	}
	if _, err := s.RunHeader(ctx, gone.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the deleted run's header reads: %v", err)
	}
	if recs, err := s.Steps(ctx, gone.ID, ""); err != nil || len(recs) != 0 {
		t.Errorf("the deleted run's steps: %d %v", len(recs), err)
	}
	if evs, err := s.Events(ctx, gone.ID, 0, 0); err != nil || len(evs) != 0 {
		t.Errorf("the deleted run's events: %d %v", len(evs), err)
	}
	page, err := s.ListRuns(ctx, store.RunFilter{})
	if err != nil || fmt.Sprint(runIDs(page.Runs)) != fmt.Sprint([]string{running.ID, keep.ID}) {
		t.Errorf("listed after the deletion: %v %v", runIDs(page.Runs), err)
	}
	if got := finished(t, s, store.RunFailed); len(got) != 0 {
		t.Errorf("the deleted run is still indexed as failed: %v", got)
	}
	if got := finished(t, s, store.RunSucceeded); fmt.Sprint(got) != fmt.Sprint([]string{keep.ID}) {
		t.Errorf("succeeded after the deletion: %v", got)
	}
	if recs, err := s.Steps(ctx, keep.ID, ""); err != nil || len(recs) != 1 {
		t.Errorf("the kept run's steps: %d %v", len(recs), err)
	}
	if _, err := s.DLQ(ctx, entry.ID); err != nil {
		t.Errorf("the deleted run's dead-letter entry: %v", err)
	}
	if _, err := s.DeleteRun(ctx, gone.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("deleting it again: %v", err)
	}
	if f.Reopen != nil {
		s = f.Reopen(t, s)
		if _, err := s.Run(ctx, gone.ID); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("the deleted run reads after reopening: %v", err)
		}
		if recs, err := s.Steps(ctx, gone.ID, ""); err != nil || len(recs) != 0 {
			t.Errorf("the deleted run's steps after reopening: %d %v", len(recs), err)
		}
	}
}

// testPrune prunes runs and dead-letter entries past an hour, and keeps
// what must be kept however old: a running or waiting run, a run with a
// dead-letter entry still there, a sub-chain's run while its parent is
// there, a run whose idempotency key holds, and what the policy keeps for
// ever.
func testPrune(t *testing.T, f Factory) {
	ctx := context.Background()
	s := f.Open(t)
	now := time.Now().UTC()
	old := now.Add(-2 * time.Hour)
	mk := func(chain string, status store.RunStatus, ended time.Time, edit func(*store.Run)) *store.Run {
		r := NewRun(chain, old.Add(-time.Minute))
		if edit != nil {
			edit(r)
		}
		create(t, s, r)
		if status.Final() {
			finish(t, s, r, status, ended)
		}
		return r
	}
	var (
		plain      = mk("c", store.RunSucceeded, old, nil)
		failed     = mk("c", store.RunFailed, old, nil)
		running    = mk("c", store.RunRunning, time.Time{}, nil)
		withDLQ    = mk("c", store.RunFailed, old, nil)
		oldDLQ     = mk("c", store.RunFailed, old, nil)
		parent     = mk("c", store.RunSucceeded, now.Add(-30*time.Minute), nil)
		child      = mk("c", store.RunSucceeded, old, func(r *store.Run) { r.ParentRun, r.ParentStep = parent.ID, "sub" })
		orphan     = mk("c", store.RunSucceeded, old, func(r *store.Run) { r.ParentRun, r.ParentStep = store.NewID(), "sub" })
		keyed      = mk("c", store.RunSucceeded, old, func(r *store.Run) { r.KeyUntil = now.Add(time.Hour) })
		keyLapsed  = mk("c", store.RunSucceeded, old, func(r *store.Run) { r.KeyUntil = now.Add(-time.Minute) })
		recent     = mk("c", store.RunSucceeded, now.Add(-10*time.Minute), nil)
		forever    = mk("keep-all", store.RunSucceeded, old, nil)
		cancelled  = mk("c", store.RunCancelled, old, nil)
		youngEntry = &store.DLQEntry{ID: store.NewID(), RunID: withDLQ.ID, Chain: "c", Step: "a", CreatedAt: now.Add(-time.Minute)}
		oldEntry   = &store.DLQEntry{ID: store.NewID(), RunID: oldDLQ.ID, Chain: "c", Step: "a", CreatedAt: old}
	)
	for _, e := range []*store.DLQEntry{youngEntry, oldEntry} {
		if err := s.AddDLQ(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	policy := func(dry bool, removed *[]string) store.PrunePolicy {
		return store.PrunePolicy{
			Now: now,
			Keep: func(r *store.Run) time.Duration {
				if r.Chain == "keep-all" {
					return 0
				}
				return time.Hour
			},
			Shortest:       func(store.RunStatus) time.Duration { return time.Hour },
			KeepDeadLetter: func(*store.DLQEntry) time.Duration { return time.Hour },
			DryRun:         dry,
			BatchSize:      2,
			Pause:          time.Millisecond,
			Removed:        func(r *store.Run, _ store.Freed) { *removed = append(*removed, r.ID) },
		}
	}
	want := []string{plain.ID, orphan.ID, keyLapsed.ID, failed.ID, oldDLQ.ID, cancelled.ID}
	var dry []string
	if _, err := store.Prune(ctx, s, policy(true, &dry)); err != nil {
		t.Fatal(err)
	}
	// A dry run removes no dead-letter entry, so the run of the old one
	// stays in it.
	if got := fmt.Sprint(sortedIDs(dry)); got != fmt.Sprint(sortedIDs(slices.DeleteFunc(slices.Clone(want), func(id string) bool { return id == oldDLQ.ID }))) {
		t.Errorf("a dry run would prune %v", got)
	}
	if _, err := s.RunHeader(ctx, plain.ID); err != nil {
		t.Errorf("a dry run removed a run: %v", err)
	}
	var removed []string
	stats, err := store.Prune(ctx, s, policy(false, &removed))
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(sortedIDs(removed)) != fmt.Sprint(sortedIDs(want)) || stats.Runs != len(want) || stats.DeadLetters != 1 {
		t.Errorf("pruned %v (%d runs, %d entries), want %v and the old entry", removed, stats.Runs, stats.DeadLetters, want)
	}
	if stats.KeptForDeadLetter != 1 || stats.KeptForKey != 1 || stats.KeptForParent != 1 {
		t.Errorf("kept for an entry %d, for a key %d, for a parent %d; want 1 each", stats.KeptForDeadLetter, stats.KeptForKey, stats.KeptForParent)
	}
	if !stats.OldestKept.Equal(old) {
		t.Errorf("the oldest kept ended %s, want %s", stats.OldestKept, old)
	}
	for _, r := range []*store.Run{running, withDLQ, parent, child, keyed, recent, forever} {
		if _, err := s.RunHeader(ctx, r.ID); err != nil {
			t.Errorf("run %s was pruned: %v", r.ID, err)
		}
	}
	for _, id := range want {
		if _, err := s.RunHeader(ctx, id); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("run %s was kept: %v", id, err)
		}
	}
	if _, err := s.DLQ(ctx, youngEntry.ID); err != nil {
		t.Errorf("the young entry: %v", err)
	}
	if _, err := s.DLQ(ctx, oldEntry.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the old entry: %v", err)
	}
	// The parent goes: its sub-chain's run goes with the next prune.
	if _, err := s.DeleteRun(ctx, parent.ID); err != nil {
		t.Fatal(err)
	}
	removed = nil
	if _, err := store.Prune(ctx, s, policy(false, &removed)); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(removed) != fmt.Sprint([]string{child.ID}) {
		t.Errorf("once its parent is gone, pruned %v, want the sub-chain's run", removed)
	}
}

func sortedIDs(ids []string) []string {
	out := slices.Clone(ids)
	slices.Sort(out)
	return out
}

func testDefinitions(t *testing.T, f Factory) {
	ctx := context.Background()
	s := f.Open(t)
	run := NewRun("c", time.Now().UTC())
	run.Seq = 1
	def := &store.Definition{Hash: "h1", Source: []byte("[[chains]]\nname = \"c\"\n")}
	err := s.Commit(ctx, &store.Batch{Run: run, Create: true, Definition: def,
		Events: []store.Event{{Seq: 1, Type: store.EventRunStarted, Time: time.Now()}}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Definition(ctx, "h1")
	if err != nil || string(got) != string(def.Source) {
		t.Fatalf("definition: %q %v", got, err)
	}
	// The first definition stored under a hash stays.
	if err := s.Commit(ctx, &store.Batch{Run: run, Definition: &store.Definition{Hash: "h1", Source: []byte("other")}}); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Definition(ctx, "h1"); string(got) != string(def.Source) {
		t.Errorf("definition replaced: %q", got)
	}
	if _, err := s.Definition(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("missing definition: %v", err)
	}
}

func testLeases(t *testing.T, f Factory) {
	ctx := context.Background()
	s := f.Open(t)
	run := NewRun("c", time.Now().UTC())
	const ttl = 300 * time.Millisecond

	a, err := s.AcquireLease(ctx, run.ID, "gw-a", ttl)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.AcquireLease(ctx, run.ID, "gw-b", ttl); !errors.Is(err, store.ErrLeaseHeld) {
		t.Fatalf("second owner: got %v, want ErrLeaseHeld", err)
	}
	again, err := s.AcquireLease(ctx, run.ID, "gw-a", ttl)
	if err != nil || again.Fence != a.Fence {
		t.Fatalf("re-acquiring one's own lease: %+v %v", again, err)
	}
	run.Seq = 1
	err = s.Commit(ctx, &store.Batch{Run: run, Create: true, Lease: &a, Events: []store.Event{{Seq: 1, Type: store.EventRunStarted, Time: time.Now()}}})
	if err != nil {
		t.Fatalf("committing under the lease: %v", err)
	}
	if a, err = s.RenewLease(ctx, a, ttl); err != nil {
		t.Fatalf("renewing: %v", err)
	}

	time.Sleep(ttl + 100*time.Millisecond)
	b, err := s.AcquireLease(ctx, run.ID, "gw-b", ttl)
	if err != nil {
		t.Fatalf("taking over an expired lease: %v", err)
	}
	if b.Fence <= a.Fence {
		t.Errorf("fence did not grow: %d after %d", b.Fence, a.Fence)
	}
	if _, err := s.RenewLease(ctx, a, ttl); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("renewing a lost lease: got %v, want ErrLeaseLost", err)
	}
	stale := *run
	stale.Cursor = "written-by-a"
	stale.Seq = 2
	err = s.Commit(ctx, &store.Batch{Run: &stale, Lease: &a, Events: []store.Event{{Seq: 2, Type: store.EventStepStarted, Time: time.Now()}}})
	if !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("commit under a lost lease: got %v, want ErrLeaseLost", err)
	}
	if got, _ := s.Run(ctx, run.ID); got.Cursor == "written-by-a" || got.Seq != 1 {
		t.Errorf("the fenced-off commit was written: %+v", got)
	}
	run.Cursor = "written-by-b"
	run.Seq = 2
	if err := s.Commit(ctx, &store.Batch{Run: run, Lease: &b, Events: []store.Event{{Seq: 2, Type: store.EventStepStarted, Time: time.Now()}}}); err != nil {
		t.Fatalf("commit under the new lease: %v", err)
	}
	if err := s.ReleaseLease(ctx, a); err != nil {
		t.Errorf("releasing a lost lease: %v", err)
	}
	if _, err := s.AcquireLease(ctx, run.ID, "gw-c", ttl); !errors.Is(err, store.ErrLeaseHeld) {
		t.Errorf("releasing a lost lease freed the current one: %v", err)
	}
	if err := s.ReleaseLease(ctx, b); err != nil {
		t.Fatal(err)
	}
	c, err := s.AcquireLease(ctx, run.ID, "gw-c", ttl)
	if err != nil || c.Fence <= b.Fence {
		t.Errorf("after release: %+v %v", c, err)
	}
}

func testDeleteSteps(t *testing.T, f Factory) {
	ctx := context.Background()
	s := f.Open(t)
	run := NewRun("c", time.Now().UTC())
	create(t, s, run)
	steps := []*store.StepRecord{{Key: "a", Name: "a"}, {Key: "b", Name: "b"}, {Key: "b/x", Name: "x"}}
	if err := s.Commit(ctx, &store.Batch{Run: run, Steps: steps}); err != nil {
		t.Fatal(err)
	}
	err := s.Commit(ctx, &store.Batch{Run: run, DeleteSteps: []string{"b", "b/x"}, Steps: []*store.StepRecord{{Key: "c", Name: "c"}}})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := s.Steps(ctx, run.ID, "")
	if fmt.Sprint(stepKeys(got)) != "[a c]" {
		t.Errorf("after deleting: %v", stepKeys(got))
	}
}

func testIdempotencyKeys(t *testing.T, f Factory) {
	ctx := context.Background()
	s := f.Open(t)
	key := "chain-a/" + store.NewID()
	if got, err := s.ClaimKey(ctx, key, "run-1", 300*time.Millisecond); err != nil || got != "" {
		t.Fatalf("first claim: %q %v", got, err)
	}
	if got, err := s.KeyRun(ctx, key); err != nil || got != "run-1" {
		t.Fatalf("the key's run: %q %v", got, err)
	}
	if got, err := s.KeyRun(ctx, key+"-unbound"); err != nil || got != "" {
		t.Fatalf("an unbound key's run: %q %v", got, err)
	}
	if got, err := s.ClaimKey(ctx, key, "run-2", 300*time.Millisecond); err != nil || got != "run-1" {
		t.Fatalf("second claim: %q %v, want run-1", got, err)
	}
	// A claim retried after a lost answer finds the key its own.
	if got, err := s.ClaimKey(ctx, key, "run-1", 300*time.Millisecond); err != nil || got != "" {
		t.Fatalf("claim by the run it is bound to: %q %v", got, err)
	}
	time.Sleep(400 * time.Millisecond)
	if got, err := s.KeyRun(ctx, key); err != nil || got != "" {
		t.Errorf("a lapsed key's run: %q %v", got, err)
	}
	// Its holder claiming it again keeps it past its first ttl.
	held := "chain-a/" + store.NewID()
	if got, err := s.ClaimKey(ctx, held, "run-1", 300*time.Millisecond); err != nil || got != "" {
		t.Fatalf("claim to hold: %q %v", got, err)
	}
	if got, err := s.ClaimKey(ctx, held, "run-1", time.Hour); err != nil || got != "" {
		t.Fatalf("claim again by its holder: %q %v", got, err)
	}
	time.Sleep(400 * time.Millisecond)
	if got, err := s.KeyRun(ctx, held); err != nil || got != "run-1" {
		t.Errorf("a key claimed again past its first ttl: %q %v, want run-1", got, err)
	}
	if got, err := s.ClaimKey(ctx, key, "run-3", time.Second); err != nil || got != "" {
		t.Errorf("claim after expiry: %q %v", got, err)
	}
}

// testCreateClaimsKey binds a key as a run is created, in the same
// commit: a create whose key another run holds writes nothing and names
// that run; one whose run cannot be created binds nothing.
func testCreateClaimsKey(t *testing.T, f Factory) {
	ctx := context.Background()
	s := f.Open(t)
	key := "chain-a/" + store.NewID()
	claimed := func(run *store.Run, ttl time.Duration) *store.Batch {
		return &store.Batch{Run: run, Create: true, Events: appendEvents(run, store.EventRunStarted), Claim: &store.KeyClaim{Key: key, TTL: ttl}}
	}
	first := NewRun("c", time.Now().UTC())
	if err := s.Commit(ctx, claimed(first, 300*time.Millisecond)); err != nil {
		t.Fatalf("creating a run that claims a key: %v", err)
	}
	if got, err := s.KeyRun(ctx, key); err != nil || got != first.ID {
		t.Fatalf("the key's run after the create: %q %v, want %s", got, err, first.ID)
	}
	second := NewRun("c", time.Now().UTC())
	err := s.Commit(ctx, claimed(second, time.Minute))
	var kb *store.KeyBoundError
	if !errors.As(err, &kb) || !errors.Is(err, store.ErrKeyBound) || kb.Run != first.ID || kb.Key != key {
		t.Fatalf("creating a second run under the key: %v, want a KeyBoundError naming %s", err, first.ID)
	}
	if _, err := s.RunHeader(ctx, second.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the run refused its key was written: %v", err)
	}
	if ids, _ := s.UnfinishedRuns(ctx); slices.Contains(ids, second.ID) {
		t.Errorf("the run refused its key is listed unfinished")
	}
	// The run its key's claim names is created: a key bound to the run
	// before (by ClaimKey) counts as claimed.
	pre := NewRun("c", time.Now().UTC())
	preKey := "chain-a/" + store.NewID()
	if got, err := s.ClaimKey(ctx, preKey, pre.ID, time.Minute); err != nil || got != "" {
		t.Fatalf("claiming ahead: %q %v", got, err)
	}
	if err := s.Commit(ctx, &store.Batch{Run: pre, Create: true, Events: appendEvents(pre, store.EventRunStarted), Claim: &store.KeyClaim{Key: preKey, TTL: time.Minute}}); err != nil {
		t.Errorf("creating the run a key was bound to ahead: %v", err)
	}
	// A create that fails for another reason binds nothing.
	again := *first
	again.Seq = 0
	dup := &store.Batch{Run: &again, Create: true, Events: appendEvents(&again, store.EventRunStarted), Claim: &store.KeyClaim{Key: "chain-a/" + store.NewID(), TTL: time.Minute}}
	if err := s.Commit(ctx, dup); !errors.Is(err, store.ErrExists) {
		t.Fatalf("creating a run twice: %v, want ErrExists", err)
	}
	if got, _ := s.KeyRun(ctx, dup.Claim.Key); got != "" {
		t.Errorf("a create that failed bound its key to %q", got)
	}
	// Once the binding lapses, another run's create takes the key.
	time.Sleep(400 * time.Millisecond)
	third := NewRun("c", time.Now().UTC())
	if err := s.Commit(ctx, claimed(third, time.Minute)); err != nil {
		t.Fatalf("creating a run under a lapsed key: %v", err)
	}
	if got, _ := s.KeyRun(ctx, key); got != third.ID {
		t.Errorf("the lapsed key's run after a new create: %q, want %s", got, third.ID)
	}
	// A key longer than a store keeps is refused before anything is
	// written, whichever way it is claimed; one at the limit is bound.
	long := "chain-a/" + strings.Repeat("k", store.MaxKeyBytes)
	for _, b := range []*store.Batch{
		{Run: NewRun("c", time.Now().UTC()), Claim: &store.KeyClaim{Key: "k", TTL: time.Minute}},
		{Run: NewRun("c", time.Now().UTC()), Create: true, Claim: &store.KeyClaim{TTL: time.Minute}},
		{Run: NewRun("c", time.Now().UTC()), Create: true, Claim: &store.KeyClaim{Key: "k"}},
		{Run: NewRun("c", time.Now().UTC()), Create: true, Claim: &store.KeyClaim{Key: long, TTL: time.Minute}},
	} {
		b.Events = appendEvents(b.Run, store.EventRunStarted)
		if err := s.Commit(ctx, b); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("a claim of a %d-byte key, ttl %s (create %v): %v, want ErrInvalid", len(b.Claim.Key), b.Claim.TTL, b.Create, err)
		}
		if _, err := s.RunHeader(ctx, b.Run.ID); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("a create refused its claim was written: %v", err)
		}
	}
	if _, err := s.ClaimKey(ctx, long, "run-1", time.Minute); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("claiming a %d-byte key: %v, want ErrInvalid", len(long), err)
	}
	if _, err := s.ClaimKey(ctx, "", "run-1", time.Minute); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("claiming an empty key: %v, want ErrInvalid", err)
	}
	atLimit := long[:store.MaxKeyBytes]
	limited := NewRun("c", time.Now().UTC())
	if err := s.Commit(ctx, &store.Batch{Run: limited, Create: true, Events: appendEvents(limited, store.EventRunStarted), Claim: &store.KeyClaim{Key: atLimit, TTL: time.Minute}}); err != nil {
		t.Fatalf("creating a run under a key of %d bytes: %v", len(atLimit), err)
	}
	if got, _ := s.KeyRun(ctx, atLimit); got != limited.ID {
		t.Errorf("the %d-byte key is bound to %q, want %s", len(atLimit), got, limited.ID)
	}
}

// testCreatesClaimingOneKey creates runs under one key at once: one is
// created, and every other is told that one's id.
func testCreatesClaimingOneKey(t *testing.T, f Factory) {
	ctx := context.Background()
	s := f.Open(t)
	key := "chain-a/" + store.NewID()
	const n = 16
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			run := NewRun("c", time.Now().UTC())
			ids[i] = run.ID
			errs[i] = s.Commit(ctx, &store.Batch{Run: run, Create: true, Events: appendEvents(run, store.EventRunStarted), Claim: &store.KeyClaim{Key: key, TTL: time.Minute}})
		})
	}
	wg.Wait()
	created := ""
	for i, err := range errs {
		if err == nil {
			if created != "" {
				t.Fatalf("runs %s and %s were both created under one key", created, ids[i])
			}
			created = ids[i]
		}
	}
	if created == "" {
		t.Fatalf("no run was created: %v", errs)
	}
	for i, err := range errs {
		var kb *store.KeyBoundError
		if err != nil && (!errors.As(err, &kb) || kb.Run != created) {
			t.Errorf("run %s: %v, want a KeyBoundError naming %s", ids[i], err, created)
		}
	}
	if got, _ := s.KeyRun(ctx, key); got != created {
		t.Errorf("the key is bound to %q, want %s", got, created)
	}
}

func testConcurrentCommits(t *testing.T, f Factory) {
	ctx := context.Background()
	s := f.Open(t)
	const runs, steps = 20, 25
	var wg sync.WaitGroup
	errs := make(chan error, runs)
	ids := make([]string, runs)
	for i := 0; i < runs; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			run := NewRun("c", time.Now().UTC())
			ids[i] = run.ID
			if err := s.Commit(ctx, &store.Batch{Run: run, Create: true, Events: appendEvents(run, store.EventRunStarted)}); err != nil {
				errs <- err
				return
			}
			for j := 0; j < steps; j++ {
				st := &store.StepRecord{Key: fmt.Sprintf("s%02d", j), Name: "s", Status: store.StepSucceeded}
				if err := s.Commit(ctx, &store.Batch{Run: run, Steps: []*store.StepRecord{st}, Events: appendEvents(run, store.EventStepSucceeded)}); err != nil {
					errs <- err
					return
				}
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, id := range ids {
		st, _ := s.Steps(ctx, id, "")
		ev, _ := s.Events(ctx, id, 0, 0)
		if len(st) != steps || len(ev) != steps+1 {
			t.Fatalf("run %s: %d steps, %d events; want %d, %d", id, len(st), len(ev), steps, steps+1)
		}
	}
}

func testReopen(t *testing.T, f Factory) {
	if f.Reopen == nil {
		t.Skip("store has no reopen")
	}
	ctx := context.Background()
	s := f.Open(t)
	run := NewRun("c", time.Now().UTC())
	create(t, s, run)
	s = f.Reopen(t, s)
	got, err := s.Run(ctx, run.ID)
	if err != nil {
		t.Fatalf("after reopen: %v", err)
	}
	if got.Seq != 1 {
		t.Errorf("after reopen: seq %d", got.Seq)
	}
	// The sequence continues where it stopped.
	if err := s.Commit(ctx, &store.Batch{Run: run, Events: appendEvents(run, store.EventStepStarted)}); err != nil {
		t.Errorf("committing after reopen: %v", err)
	}
}

func testClosed(t *testing.T, f Factory) {
	s := f.Open(t)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	run := NewRun("c", time.Now().UTC())
	err := s.Commit(context.Background(), &store.Batch{Run: run, Create: true, Events: appendEvents(run, store.EventRunStarted)})
	if !errors.Is(err, store.ErrClosed) {
		t.Errorf("commit after close: got %v, want ErrClosed", err)
	}
	if _, err := s.Run(context.Background(), run.ID); !errors.Is(err, store.ErrClosed) {
		t.Errorf("read after close: got %v, want ErrClosed", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
}
