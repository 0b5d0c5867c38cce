package store

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/chaingate/gateway/internal/jsonx"
)

// TestMarshalAsJSONX encodes step records and events of every shape a run
// writes, and some it should not: each is written byte for byte as
// jsonx.Marshal writes it, or fails as it fails.
func TestMarshalAsJSONX(t *testing.T) {
	at := time.Date(2026, 11, 26, 6, 40, 7, 123456789, time.UTC)
	steps := []*StepRecord{
		{},
		{Key: "group/s00001", Name: "s00001", Status: StepSucceeded, Attempts: 1, Body: json.RawMessage(`{"sleep_ms":10,"attempt":1}`), StartedAt: at, FinishedAt: at.Add(time.Second)},
		{Key: "loop", Name: "loop", Status: StepRunning, Attempts: 1, StartedAt: at, Deadline: at.Add(time.Hour),
			Split: &SplitState{Total: 1000000, Next: 20, Succeeded: 3, Failed: 2, Skipped: 1, Distributed: true, Gen: 2, Imported: 7}},
		{Key: "loop", Name: "loop", Status: StepRunning, Split: &SplitState{}},
		{Key: "notify", Name: "notify", Status: StepPending, DedupKey: "r1/notify", Attempts: 2, NotBefore: at,
			Error: &ErrorInfo{Message: "upstream said 503", Code: "http_503", Retryable: true}},
		{Key: "sub", Name: "sub", Status: StepRunning, Child: "r2"},
		{Key: "a", Body: json.RawMessage(" {\n  \"x\": [1, 2],\n  \"html\": \"<b>&</b>\"\n} ")},
		{Key: "a", Body: json.RawMessage(`{"x":`)},
		{Key: `quote"d`, Name: "back\\slash"},
		{Key: "tab\there", Name: "ünïcode", Status: "line\u2028sep"},
		{Key: "bad\xffutf8"},
		{Key: "a", Error: &ErrorInfo{Message: `he said "no"`}},
		{Key: "a", StartedAt: at.In(time.FixedZone("east", 5*3600+1800))},
		{Key: "a", StartedAt: at.In(time.FixedZone("west", -7*3600))},
		{Key: "a", StartedAt: at.In(time.FixedZone("far", 24*3600))},
		{Key: "a", StartedAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
		{Key: "a", StartedAt: time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC)},
		{Key: "a", StartedAt: time.Date(12, 1, 1, 0, 0, 0, 0, time.UTC)},
	}
	for _, rec := range steps {
		same(t, rec, marshalStep)
	}
	events := []*Event{
		{},
		{RunID: "r1", Chain: "c", Seq: 7, Time: at, Type: EventStepSucceeded, Step: "group/s00001", Attempt: 1},
		{RunID: "r1", Seq: 1 << 63, Time: at, Type: EventStepProgress, Step: "loop", Message: "3/10 items", Data: json.RawMessage(` {"done": 3} `)},
		{RunID: "r1", Time: at, Type: EventStepFailed, Message: "said \"no\"\n"},
		{RunID: "r1", Time: at, Data: json.RawMessage(`nope`)},
	}
	for _, ev := range events {
		same(t, ev, MarshalEvent)
	}
	runs := []*Run{
		{},
		{ID: "01m8jkxg0bkxv6mbgwdce35j4t", Chain: "links", ChainHash: "ad6f", Status: RunRunning, Cursor: "post", CreatedAt: at, UpdatedAt: at, Seq: 1},
		{ID: "r1", Chain: "c", Status: RunSucceeded, Path: []string{"post", "each"}, CreatedAt: at, UpdatedAt: at, FinishedAt: at, Deadline: at,
			Body: json.RawMessage(` {"results": [1, "<b>&</b>"]} `), Seq: 7, StartedBy: "trigger:am", KeyUntil: at.Add(time.Hour),
			Labels: map[string]string{"severity": "page", "alertname": "DiskFull", "instance": "db-1:9100"}, ParentRun: "p", ParentStep: "s"},
		{ID: "r1", Status: RunFailed, Path: []string{}, Error: &ErrorInfo{Message: "boom", Code: "internal", Retryable: true}, Phase: PhaseOnFailure, Ending: RunFailed, BodyStep: "loop"},
		{ID: "r1", Labels: map[string]string{"a\"b": "x"}},
		{ID: "r1", Labels: map[string]string{"a": "ünïcode"}},
		{ID: "r1", Path: []string{"tab\there"}},
		{ID: "r1", Body: json.RawMessage(`{"x":`)},
		{ID: "r1", Queue: &QueuePlace{}},
		{ID: "r1", Failure: &Failure{}},
		{ID: "r1", Origin: Origin{ID: "o1", Payload: json.RawMessage(`{"alert":"disk"}`)}, CreatedAt: at.In(time.FixedZone("far", 24*3600))},
	}
	for _, run := range runs {
		sameHeader(t, run)
	}
}

// sameHeader checks MarshalHeader against jsonx.Marshal of the run with
// no origin.
func sameHeader(t *testing.T, run *Run) {
	t.Helper()
	header := *run
	header.Origin = Origin{}
	got, err := MarshalHeader(run)
	want, wantErr := jsonx.Marshal(&header)
	if (err != nil) != (wantErr != nil) || (err != nil && err.Error() != wantErr.Error()) || !bytes.Equal(got, want) {
		t.Errorf("encoding %+v:\n got %s, %v\nwant %s, %v", run, got, err, want, wantErr)
	}
}

func same[T any](t *testing.T, v T, encode func(T) ([]byte, error)) {
	t.Helper()
	got, err := encode(v)
	want, wantErr := jsonx.Marshal(v)
	if (err != nil) != (wantErr != nil) || (err != nil && err.Error() != wantErr.Error()) || !bytes.Equal(got, want) {
		t.Errorf("encoding %+v:\n got %s, %v\nwant %s, %v", v, got, err, want, wantErr)
	}
}

func FuzzMarshalStep(f *testing.F) {
	f.Add("group/s00001", "succeeded", "r1/x", `{"a":1}`, "boom", "code", int64(1795672160), int64(3600), 3)
	f.Add("a\"b", "x\x00", "", " [1, 2] ", "", "", int64(-62135596800), int64(0), 0)
	f.Add("loop[001]", "running", "", "", "m\u2028", "", int64(253402300800), int64(-86400), 1)
	f.Fuzz(func(t *testing.T, key, status, dedup, body, msg, code string, unix, offset int64, n int) {
		at := time.Unix(unix, int64(n)).In(time.FixedZone("z", int(offset%(48*3600))))
		rec := &StepRecord{Key: key, Name: key, Status: StepStatus(status), DedupKey: dedup, Attempts: n, Body: json.RawMessage(body), StartedAt: at, Child: code}
		if msg != "" {
			rec.Error = &ErrorInfo{Message: msg, Code: code, Retryable: n%2 == 0}
		}
		if n%3 == 0 {
			rec.Split = &SplitState{Total: n, Next: n / 2, Distributed: n%2 == 1, Gen: n % 5}
		}
		same(t, rec, marshalStep)
		same(t, &Event{RunID: key, Chain: status, Seq: uint64(n), Time: at, Type: EventType(status), Step: dedup, Attempt: n, Message: msg, Data: json.RawMessage(body)}, MarshalEvent)
		run := &Run{ID: key, Chain: dedup, Status: RunStatus(status), Path: []string{key, code}, Cursor: code, CreatedAt: at, UpdatedAt: at, KeyUntil: at,
			Body: json.RawMessage(body), Seq: uint64(n), StartedBy: msg, Labels: map[string]string{key: msg, code: status}}
		if n%2 == 0 {
			run.Path, run.Labels, run.Error = nil, nil, &ErrorInfo{Message: msg, Code: code}
		}
		sameHeader(t, run)
	})
}

// BenchmarkMarshalStep encodes a sub-step's result record and its two
// events, as a group's commit does for each sub-step.
func BenchmarkMarshalStep(b *testing.B) {
	at := time.Now().UTC()
	rec := &StepRecord{Key: "group/s00001", Name: "s00001", Status: StepSucceeded, Attempts: 1, Body: json.RawMessage(`{"sleep_ms":10,"attempt":1}`), StartedAt: at, FinishedAt: at}
	evs := []*Event{
		{RunID: "01m8b99yd2svej39sh64tz7nk3", Chain: "big", Seq: 7, Time: at, Type: EventStepStarted, Step: "group/s00001", Attempt: 1},
		{RunID: "01m8b99yd2svej39sh64tz7nk3", Chain: "big", Seq: 8, Time: at, Type: EventStepSucceeded, Step: "group/s00001", Attempt: 1},
	}
	for _, tc := range []struct {
		name  string
		step  func(*StepRecord) ([]byte, error)
		event func(*Event) ([]byte, error)
	}{
		{"marshal", func(r *StepRecord) ([]byte, error) { return jsonx.Marshal(r) }, func(e *Event) ([]byte, error) { return jsonx.Marshal(e) }},
		{"by-hand", marshalStep, MarshalEvent},
	} {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := tc.step(rec); err != nil {
					b.Fatal(err)
				}
				for _, ev := range evs {
					if _, err := tc.event(ev); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// BenchmarkMarshalHeader encodes a started alert's run record, as every
// commit of the run does.
func BenchmarkMarshalHeader(b *testing.B) {
	at := time.Now().UTC()
	run := &Run{ID: "01m8jkxg0bkxv6mbgwdce35j4t", Chain: "three-echo", ChainHash: "ad6ff99b13629b13d5ac0cbcf9cd88e4aad2ced76a1dcef1874bba1a1db7b995",
		Status: RunRunning, Path: []string{"one"}, Cursor: "two", CreatedAt: at, UpdatedAt: at, Seq: 4, StartedBy: "trigger:alerts", KeyUntil: at.Add(24 * time.Hour),
		Labels: map[string]string{"alertname": "DiskFull", "instance": "db-1:9100", "severity": "page"}}
	for _, tc := range []struct {
		name   string
		encode func(*Run) ([]byte, error)
	}{
		{"marshal", func(r *Run) ([]byte, error) { h := *r; h.Origin = Origin{}; return jsonx.Marshal(&h) }},
		{"by-hand", MarshalHeader},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := tc.encode(run); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
