package storetest

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/internal/jsonx"
)

// Filled names what Fill put into a store that a listing does not find:
// idempotency keys and chain definitions.
type Filled struct {
	// Keys are idempotency keys bound for an hour, with their runs.
	Keys map[string]string
	// Lapsing is a key bound for LapsingTTL, to Keys[Lapsing]'s run,
	// claimed at LapsingClaimed.
	Lapsing        string
	LapsingClaimed time.Time
	Defs           []string
	// Unfinished are the runs Fill left unfinished.
	Unfinished []string
}

// LapsingTTL is how long Filled.Lapsing is bound for.
const LapsingTTL = 2 * time.Second

// commitRun commits a batch to run, its events numbered after the run's.
func commitRun(tb testing.TB, s store.Store, b *store.Batch, types ...store.EventType) {
	tb.Helper()
	for _, typ := range types {
		b.Run.Seq++
		b.Events = append(b.Events, store.Event{Seq: b.Run.Seq, Time: time.Now().UTC(), Type: typ, Step: "s", Message: "m"})
	}
	if err := s.Commit(context.Background(), b); err != nil {
		tb.Fatalf("committing run %s: %v", b.Run.ID, err)
	}
}

// Fill puts one of everything a store keeps into s: finished and
// unfinished runs with step records, events, a split's items, values large
// enough to be kept apart, dead-letter entries of both kinds, idempotency
// keys, kept deliveries and chain definitions.
func Fill(tb testing.TB, s store.Store) Filled {
	tb.Helper()
	ctx := context.Background()
	f := Filled{Keys: map[string]string{}}
	now := time.Now().UTC()
	def := &store.Definition{Hash: "hash-fill", Source: []byte("[[chains]]\nname = \"fill\"\n")}
	f.Defs = append(f.Defs, def.Hash)

	done := NewRun("fill", now.Add(-time.Minute))
	done.StartedBy = "trigger:am"
	done.KeyUntil = now.Add(time.Hour)
	commitRun(tb, s, &store.Batch{Run: done, Create: true, Definition: def}, store.EventRunStarted)
	big := largeJSON("a split's results", 70<<10)
	split := &store.StepRecord{Key: "loop", Name: "loop", Status: store.StepSucceeded, Attempts: 1, Body: big, StartedAt: now,
		Split: &store.SplitState{Total: 3, Next: 3, Succeeded: 2, Failed: 1}}
	steps := []*store.StepRecord{split,
		{Key: "check", Name: "check", Status: store.StepSucceeded, DedupKey: done.ID + "/check", Attempts: 2, Body: json.RawMessage(`{"ok":true,"<>&":"x"}`)},
		{Key: "notify/slack", Name: "slack", Status: store.StepFailed, Attempts: 3, Error: &store.ErrorInfo{Message: "boom", Code: "http_500", Retryable: true}},
	}
	for i := range 3 {
		st := store.StepSucceeded
		if i == 2 {
			st = store.StepFailed
		}
		steps = append(steps,
			&store.StepRecord{Key: fmt.Sprintf("loop[%d]", i), Name: "loop", Status: st, Body: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))},
			&store.StepRecord{Key: fmt.Sprintf("loop[%d]/call", i), Name: "call", Status: st, DedupKey: fmt.Sprintf("%s/loop[%d]/call", done.ID, i), Attempts: 1})
	}
	done.Path, done.Status, done.FinishedAt, done.BodyStep = []string{"check", "loop", "notify"}, store.RunSucceeded, now, "loop"
	commitRun(tb, s, &store.Batch{Run: done, Steps: steps,
		DLQ: []*store.DLQEntry{{ID: store.NewID(), RunID: done.ID, Chain: "fill", Step: "notify/slack", Error: store.ErrorInfo{Message: "boom"}, Attempts: 3, Payload: json.RawMessage(`{"text":"hi"}`), CreatedAt: now}}},
		store.EventStepStarted, store.EventStepSucceeded, store.EventStepProgress, store.EventDeadLettered, store.EventRunSucceeded)

	waiting := NewRun("fill", now)
	waiting.Origin.Payload = largeJSON("a million hosts", 80<<10)
	waiting.Deadline = now.Add(time.Hour)
	waiting.StartedBy = "api"
	commitRun(tb, s, &store.Batch{Run: waiting, Create: true, Definition: def}, store.EventRunStarted)
	waiting.Path, waiting.Cursor = []string{"first", "wait"}, "wait"
	commitRun(tb, s, &store.Batch{Run: waiting, Steps: []*store.StepRecord{
		{Key: "first", Name: "first", Status: store.StepSucceeded, Attempts: 1, Body: json.RawMessage(`"done"`)},
		{Key: "wait", Name: "wait", Status: store.StepPending, Attempts: 1, DedupKey: waiting.ID + "/wait", NotBefore: now.Add(time.Minute)},
	}}, store.EventStepSucceeded, store.EventStepRetrying)

	failed := NewRun("other", now.Add(time.Second))
	failed.ParentRun, failed.ParentStep = done.ID, "check"
	commitRun(tb, s, &store.Batch{Run: failed, Create: true}, store.EventRunStarted)
	failed.Status, failed.Error, failed.FinishedAt = store.RunFailed, &store.ErrorInfo{Message: "it broke", Code: "x"}, now
	commitRun(tb, s, &store.Batch{Run: failed}, store.EventRunFailed)

	parked := &store.DLQEntry{ID: store.NewID(), Kind: store.DLQDelivery, Chain: "fill", Trigger: "am",
		Error: store.ErrorInfo{Message: "when failed", Code: "trigger_when"}, Payload: json.RawMessage(`{"alerts":[{"a":1}]}`),
		Headers: map[string]string{"user-agent": "Alertmanager/0.35.0"}, Metadata: json.RawMessage(`{"remote_addr":"10.0.0.9:4411"}`), CreatedAt: now}
	if err := s.AddDLQ(ctx, parked); err != nil {
		tb.Fatal(err)
	}
	for i := range 2 {
		d := &store.Delivery{ID: store.NewID(), Trigger: "am", Body: json.RawMessage(fmt.Sprintf(`{"alerts":[%d]}`, i)), ReceivedAt: now}
		if err := s.PutDelivery(ctx, d); err != nil {
			tb.Fatal(err)
		}
	}
	for key, run := range map[string]string{"key-done": done.ID, "key-waiting": waiting.ID} {
		if _, err := s.ClaimKey(ctx, key, run, time.Hour); err != nil {
			tb.Fatal(err)
		}
		f.Keys[key] = run
	}
	f.Lapsing, f.LapsingClaimed = "key-lapsing", time.Now()
	if _, err := s.ClaimKey(ctx, f.Lapsing, failed.ID, LapsingTTL); err != nil {
		tb.Fatal(err)
	}
	f.Keys[f.Lapsing] = failed.ID
	f.Unfinished = []string{waiting.ID}
	return f
}

// FillRuns commits n small runs of a few steps and events each, one in
// ten left unfinished, for measuring: a store as a busy week leaves it.
// Sixteen runs commit at a time, as under load.
func FillRuns(tb testing.TB, s store.Store, n int) {
	tb.Helper()
	ctx := context.Background()
	body := json.RawMessage(`{"status":"ok","message":"` + strings.Repeat("x", 300) + `"}`)
	commit := func(b *store.Batch, types ...store.EventType) error {
		for _, typ := range types {
			b.Run.Seq++
			b.Events = append(b.Events, store.Event{Seq: b.Run.Seq, Time: time.Now().UTC(), Type: typ, Step: "s"})
		}
		return s.Commit(ctx, b)
	}
	one := func(i int) error {
		run := NewRun("load", time.Now().UTC())
		if err := commit(&store.Batch{Run: run, Create: true}, store.EventRunStarted); err != nil {
			return err
		}
		var steps []*store.StepRecord
		for _, name := range []string{"enrich", "notify", "ticket"} {
			steps = append(steps, &store.StepRecord{Key: name, Name: name, Status: store.StepSucceeded, Attempts: 1, DedupKey: run.ID + "/" + name, Body: body})
		}
		if i%10 != 0 {
			run.Status, run.FinishedAt = store.RunSucceeded, time.Now().UTC()
		}
		return commit(&store.Batch{Run: run, Steps: steps}, store.EventStepSucceeded, store.EventStepSucceeded, store.EventStepSucceeded, store.EventRunSucceeded)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < n; i += 16 {
				if err := one(i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Fatal(err)
	}
}

// FillLabeled commits n finished runs of one commit each, run i labelled
// as an alert's would be, instance=host-i:9100, sixty-four at a time.
func FillLabeled(tb testing.TB, s store.Store, n int) {
	tb.Helper()
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := range 64 {
		wg.Go(func() {
			for i := w; i < n; i += 64 {
				run := NewRun("incident", time.Now().UTC())
				run.Status, run.FinishedAt = store.RunSucceeded, time.Now().UTC()
				run.Labels = map[string]string{"alertname": "DiskFull", "severity": "critical", "instance": fmt.Sprintf("host-%d:9100", i)}
				if err := s.Commit(ctx, &store.Batch{Run: run, Create: true}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Fatal(err)
	}
}

// contents is everything a store answers, as compared.
type contents struct {
	Runs       map[string]runContents `json:"runs"`
	Damaged    []store.DamagedRun     `json:"damaged"`
	Unfinished []string               `json:"unfinished"`
	DLQ        []*store.DLQEntry      `json:"dlq"`
	Deliveries []*store.Delivery      `json:"deliveries"`
	Keys       map[string]string      `json:"keys"`
	Defs       map[string]string      `json:"defs"`
}

type runContents struct {
	Run    *store.Run          `json:"run"`
	Steps  []*store.StepRecord `json:"steps"`
	Events []store.Event       `json:"events"`
}

// Contents reads everything s holds: every run with its steps and events,
// the unfinished ones, the dead-letter queue, kept deliveries, and the
// keys and definitions f names.
func Contents(tb testing.TB, s store.Store, f Filled) map[string]json.RawMessage {
	tb.Helper()
	ctx := context.Background()
	c := contents{Runs: map[string]runContents{}, Keys: map[string]string{}, Defs: map[string]string{}}
	f2 := store.RunFilter{Limit: 1000}
	for {
		page, err := s.ListRuns(ctx, f2)
		if err != nil {
			tb.Fatal(err)
		}
		c.Damaged = append(c.Damaged, page.Damaged...)
		for _, run := range page.Runs {
			rc := runContents{Run: run}
			if rc.Steps, err = s.Steps(ctx, run.ID, ""); err != nil {
				tb.Fatal(err)
			}
			if rc.Events, err = s.Events(ctx, run.ID, 0, 0); err != nil {
				tb.Fatal(err)
			}
			c.Runs[run.ID] = rc
		}
		if f2.Cursor = page.Next; page.Next == "" {
			break
		}
	}
	var err error
	if c.Unfinished, err = s.UnfinishedRuns(ctx); err != nil {
		tb.Fatal(err)
	}
	slices.Sort(c.Unfinished)
	after := ""
	for {
		page, err := s.ListDLQ(ctx, store.DLQFilter{Limit: 1000, After: after})
		if err != nil {
			tb.Fatal(err)
		}
		c.DLQ = append(c.DLQ, page...)
		if len(page) < 1000 {
			break
		}
		after = page[len(page)-1].ID
	}
	if c.Deliveries, err = s.Deliveries(ctx, 0); err != nil {
		tb.Fatal(err)
	}
	for key := range f.Keys {
		if key == f.Lapsing {
			// Bound or not by the time of reading, on a slow machine:
			// LapsingBound checks it on its own.
			continue
		}
		if c.Keys[key], err = s.KeyRun(ctx, key); err != nil {
			tb.Fatal(err)
		}
	}
	for _, h := range f.Defs {
		src, err := s.Definition(ctx, h)
		if err != nil {
			tb.Fatal(err)
		}
		c.Defs[h] = string(src)
	}
	// Compared as the JSON the stores encode, part by part, so that a
	// difference names its place.
	out := map[string]json.RawMessage{}
	parts := map[string]any{"damaged": c.Damaged, "unfinished": c.Unfinished, "dlq": c.DLQ, "deliveries": c.Deliveries, "keys": c.Keys, "defs": c.Defs}
	for _, st := range []store.RunStatus{store.RunSucceeded, store.RunFailed, store.RunCancelled, store.RunTimedOut} {
		ids := []string{}
		err := s.FinishedRuns(ctx, st, func(run *store.Run) (bool, error) {
			ids = append(ids, run.ID)
			return true, nil
		})
		if err != nil {
			tb.Fatal(err)
		}
		parts["finished "+string(st)] = ids
	}
	for id, rc := range c.Runs {
		parts["run "+id] = rc
	}
	for k, v := range parts {
		b, err := jsonx.Marshal(v)
		if err != nil {
			tb.Fatal(err)
		}
		out[k] = b
	}
	return out
}

// Same fails tb unless got holds what want held (Contents of each).
func Same(tb testing.TB, want, got map[string]json.RawMessage) {
	tb.Helper()
	for k, w := range want {
		g, ok := got[k]
		switch {
		case !ok:
			tb.Errorf("%s is missing", k)
		case string(g) != string(w):
			tb.Errorf("%s differs:\n got %.2000s\nwant %.2000s", k, g, w)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			tb.Errorf("%s was not there before", k)
		}
	}
}

// LapsingBound checks that s holds f's lapsing key bound to its run while
// its TTL has not run out: read before then, it must be bound.
func LapsingBound(tb testing.TB, s store.Store, f Filled) {
	tb.Helper()
	got, err := s.KeyRun(context.Background(), f.Lapsing)
	if err != nil {
		tb.Fatal(err)
	}
	if got != f.Keys[f.Lapsing] && time.Since(f.LapsingClaimed) < LapsingTTL {
		tb.Errorf("key %s before its TTL ran out: bound to %q, want %q", f.Lapsing, got, f.Keys[f.Lapsing])
	}
}
