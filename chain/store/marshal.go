package store

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
	"time"

	"github.com/chaingate/gateway/internal/jsonx"
)

// A run's commits write a record for every step it takes and every event
// it logs, and a group of ten thousand sub-steps writes thirty thousand of
// them. Their common shape (plain keys and names, times in range, bodies
// that are JSON) is encoded here by hand, byte for byte as jsonx.Marshal
// would (TestMarshalAsJSONX, FuzzMarshalStep); anything else goes through
// jsonx.Marshal, which also gives the error for what cannot be encoded.

// marshalStep encodes a step record as jsonx.Marshal does.
func marshalStep(rec *StepRecord) ([]byte, error) {
	if b, ok := appendStep(make([]byte, 0, 160+len(rec.Body)), rec); ok {
		return b, nil
	}
	return jsonx.Marshal(rec)
}

// MarshalEvent encodes an event as the stores keep it.
func MarshalEvent(ev *Event) ([]byte, error) {
	if b, ok := appendEvent(make([]byte, 0, 160+len(ev.Message)+len(ev.Data)), ev); ok {
		return b, nil
	}
	return jsonx.Marshal(ev)
}

// MarshalHeader encodes a run without its origin, the record every
// commit of the run rewrites: as jsonx.Marshal encodes a copy of run whose
// Origin is zero.
func MarshalHeader(run *Run) ([]byte, error) {
	if b, ok := appendHeader(make([]byte, 0, 320+len(run.Body)), run); ok {
		return b, nil
	}
	header := *run
	header.Origin = Origin{}
	return jsonx.Marshal(&header)
}

func appendHeader(b []byte, run *Run) ([]byte, bool) {
	if run.Queue != nil || run.Failure != nil {
		return b, false
	}
	ok := true
	b, ok = appendPlainField(b, `{"id":`, run.ID, ok)
	b, ok = appendPlainField(b, `,"chain":`, run.Chain, ok)
	b, ok = appendPlainField(b, `,"chain_hash":`, run.ChainHash, ok)
	b, ok = appendPlainField(b, `,"status":`, string(run.Status), ok)
	if run.Path == nil {
		b = append(b, `,"path":null`...)
	} else {
		b = append(b, `,"path":[`...)
		sep := ""
		for _, step := range run.Path {
			b, ok = appendPlainField(b, sep, step, ok)
			sep = ","
		}
		b = append(b, ']')
	}
	if run.Cursor != "" {
		b, ok = appendPlainField(b, `,"cursor":`, run.Cursor, ok)
	}
	if !run.Deadline.IsZero() {
		b, ok = appendTime(append(b, `,"deadline":`...), run.Deadline, ok)
	}
	b, ok = appendTime(append(b, `,"created_at":`...), run.CreatedAt, ok)
	b, ok = appendTime(append(b, `,"updated_at":`...), run.UpdatedAt, ok)
	if !run.FinishedAt.IsZero() {
		b, ok = appendTime(append(b, `,"finished_at":`...), run.FinishedAt, ok)
	}
	b, ok = appendError(b, run.Error, ok)
	for _, f := range []struct{ name, v string }{{`,"parent_run":`, run.ParentRun}, {`,"parent_step":`, run.ParentStep}} {
		if f.v != "" {
			b, ok = appendPlainField(b, f.name, f.v, ok)
		}
	}
	if len(run.Body) > 0 {
		b, ok = appendRaw(append(b, `,"body":`...), run.Body, ok)
	}
	if run.BodyStep != "" {
		b, ok = appendPlainField(b, `,"body_step":`, run.BodyStep, ok)
	}
	b = strconv.AppendUint(append(b, `,"seq":`...), run.Seq, 10)
	if run.StartedBy != "" {
		b, ok = appendPlainField(b, `,"started_by":`, run.StartedBy, ok)
	}
	if !run.KeyUntil.IsZero() {
		b, ok = appendTime(append(b, `,"key_until":`...), run.KeyUntil, ok)
	}
	if len(run.Labels) > 0 {
		names := make([]string, 0, len(run.Labels))
		for name := range run.Labels {
			names = append(names, name)
		}
		slices.Sort(names)
		sep := `,"labels":{`
		for _, name := range names {
			b, ok = appendPlainField(b, sep, name, ok)
			b, ok = appendPlainField(b, ":", run.Labels[name], ok)
			sep = ","
		}
		b = append(b, '}')
	}
	if run.Phase != "" {
		b, ok = appendPlainField(b, `,"phase":`, run.Phase, ok)
	}
	if run.Ending != "" {
		b, ok = appendPlainField(b, `,"ending":`, string(run.Ending), ok)
	}
	return append(b, '}'), ok
}

// appendError appends a step's or a run's error, if it has one.
func appendError(b []byte, e *ErrorInfo, ok bool) ([]byte, bool) {
	if e == nil {
		return b, ok
	}
	b, ok = appendPlainField(b, `,"error":{"message":`, e.Message, ok)
	if e.Code != "" {
		b, ok = appendPlainField(b, `,"code":`, e.Code, ok)
	}
	if e.Retryable {
		b = append(b, `,"retryable":true`...)
	}
	return append(b, '}'), ok
}

func appendStep(b []byte, rec *StepRecord) ([]byte, bool) {
	ok := true
	b, ok = appendPlainField(b, `{"key":`, rec.Key, ok)
	b, ok = appendPlainField(b, `,"name":`, rec.Name, ok)
	b, ok = appendPlainField(b, `,"status":`, string(rec.Status), ok)
	if rec.DedupKey != "" {
		b, ok = appendPlainField(b, `,"dedup_key":`, rec.DedupKey, ok)
	}
	b = strconv.AppendInt(append(b, `,"attempts":`...), int64(rec.Attempts), 10)
	if len(rec.Body) > 0 {
		b, ok = appendRaw(append(b, `,"body":`...), rec.Body, ok)
	}
	b, ok = appendError(b, rec.Error, ok)
	for _, t := range []struct {
		name string
		at   time.Time
	}{{`,"started_at":`, rec.StartedAt}, {`,"finished_at":`, rec.FinishedAt}, {`,"not_before":`, rec.NotBefore}, {`,"deadline":`, rec.Deadline}} {
		if !t.at.IsZero() {
			b, ok = appendTime(append(b, t.name...), t.at, ok)
		}
	}
	if s := rec.Split; s != nil {
		for _, n := range []struct {
			name string
			v    int
		}{{`,"split":{"total":`, s.Total}, {`,"next":`, s.Next}, {`,"succeeded":`, s.Succeeded}, {`,"failed":`, s.Failed}, {`,"skipped":`, s.Skipped}} {
			b = strconv.AppendInt(append(b, n.name...), int64(n.v), 10)
		}
		if s.Distributed {
			b = append(b, `,"distributed":true`...)
		}
		if s.Gen != 0 {
			b = strconv.AppendInt(append(b, `,"gen":`...), int64(s.Gen), 10)
		}
		if s.Imported != 0 {
			b = strconv.AppendInt(append(b, `,"imported":`...), int64(s.Imported), 10)
		}
		b = append(b, '}')
	}
	if rec.Child != "" {
		b, ok = appendPlainField(b, `,"child":`, rec.Child, ok)
	}
	return append(b, '}'), ok
}

func appendEvent(b []byte, ev *Event) ([]byte, bool) {
	ok := true
	b, ok = appendPlainField(b, `{"run_id":`, ev.RunID, ok)
	if ev.Chain != "" {
		b, ok = appendPlainField(b, `,"chain":`, ev.Chain, ok)
	}
	b = strconv.AppendUint(append(b, `,"seq":`...), ev.Seq, 10)
	b, ok = appendTime(append(b, `,"time":`...), ev.Time, ok)
	b, ok = appendPlainField(b, `,"type":`, string(ev.Type), ok)
	if ev.Step != "" {
		b, ok = appendPlainField(b, `,"step":`, ev.Step, ok)
	}
	if ev.Attempt != 0 {
		b = strconv.AppendInt(append(b, `,"attempt":`...), int64(ev.Attempt), 10)
	}
	if ev.Message != "" {
		b, ok = appendPlainField(b, `,"message":`, ev.Message, ok)
	}
	if len(ev.Data) > 0 {
		b, ok = appendRaw(append(b, `,"data":`...), ev.Data, ok)
	}
	return append(b, '}'), ok
}

// appendPlainField appends name and s, a string JSON writes as it is
// between quotes; ok turns false for any other.
func appendPlainField(b []byte, name, s string, ok bool) ([]byte, bool) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			return b, false
		}
	}
	b = append(b, name...)
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"'), ok
}

// appendTime appends t as time.Time's MarshalJSON writes it; ok turns
// false for a time it refuses (a year of other than four digits, an offset
// of a day or more).
func appendTime(b []byte, t time.Time, ok bool) ([]byte, bool) {
	n := len(b) + 1
	b = t.AppendFormat(append(b, '"'), time.RFC3339Nano)
	switch {
	case len(b) < n+len("2006-01-02T15:04:05Z") || b[n+4] != '-':
		ok = false
	case b[len(b)-1] != 'Z':
		zone := b[len(b)-len("Z07:00"):]
		if c := zone[0]; c >= '0' && c <= '9' || (zone[1]-'0')*10+(zone[2]-'0') >= 24 {
			ok = false
		}
	}
	return append(b, '"'), ok
}

// appendRaw appends a raw JSON value compacted, as encoding/json writes a
// json.RawMessage; ok turns false if it is not valid JSON.
func appendRaw(b []byte, raw json.RawMessage, ok bool) ([]byte, bool) {
	buf := bytes.NewBuffer(b)
	if err := json.Compact(buf, raw); err != nil {
		return buf.Bytes(), false
	}
	return buf.Bytes(), ok
}
