package store

import (
	"bytes"
	"encoding/json"
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
	if e := rec.Error; e != nil {
		b, ok = appendPlainField(b, `,"error":{"message":`, e.Message, ok)
		if e.Code != "" {
			b, ok = appendPlainField(b, `,"code":`, e.Code, ok)
		}
		if e.Retryable {
			b = append(b, `,"retryable":true`...)
		}
		b = append(b, '}')
	}
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
