package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/templates"
)

// decodeJSON turns a stored JSON document into the values templates and
// conditions read. Integers stay int64 so ids above 2^53 keep every digit;
// other numbers become float64. Invalid JSON reads as a string.
func decodeJSON(raw json.RawMessage) any {
	if len(raw) == 0 {
		return nil
	}
	v, err := parseJSON(raw)
	if err != nil {
		return string(raw)
	}
	return v
}

// decodeScalar is decodeJSON for a JSON scalar, without a decoder for the
// common ones: a string with nothing escaped, a whole number, true, false,
// null. Anything else goes through decodeJSON, so both read alike.
func decodeScalar(raw []byte) any {
	t := bytes.Trim(raw, " \t\r\n")
	if len(t) == 0 {
		return decodeJSON(raw)
	}
	switch c := t[0]; {
	case c == '"':
		if len(t) < 2 || t[len(t)-1] != '"' {
			break
		}
		if s := t[1 : len(t)-1]; utf8.Valid(s) && !bytes.ContainsFunc(s, func(r rune) bool { return r < ' ' || r == '\\' || r == '"' }) {
			return string(s)
		}
	case string(t) == "true":
		return true
	case string(t) == "false":
		return false
	case string(t) == "null":
		return nil
	case c == '-' || (c >= '0' && c <= '9'):
		if i, ok := jsonInt(t); ok {
			return i
		}
	}
	return decodeJSON(raw)
}

// jsonInt reads t if it is a JSON number with no fraction or exponent that
// fits an int64.
func jsonInt(t []byte) (int64, bool) {
	d := t
	if d[0] == '-' {
		d = d[1:]
	}
	if len(d) == 0 || (d[0] == '0' && len(d) > 1) {
		return 0, false
	}
	for _, b := range d {
		if b < '0' || b > '9' {
			return 0, false
		}
	}
	i, err := strconv.ParseInt(string(t), 10, 64)
	return i, err == nil
}

// DecodeJSON decodes one JSON value as templates and conditions read it:
// whole numbers as int64, others as float64; empty input is null. Anything
// after the value is an error.
func DecodeJSON(raw []byte) (any, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	return parseJSON(raw)
}

// parseJSON decodes one JSON value, numbers kept exact, and refuses
// anything after it.
func parseJSON(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("more than one JSON value")
	}
	return normalizeNumbers(v), nil
}

func normalizeNumbers(v any) any {
	switch t := v.(type) {
	case json.Number:
		if i, err := strconv.ParseInt(string(t), 10, 64); err == nil {
			return i
		}
		if f, err := t.Float64(); err == nil && !math.IsInf(f, 0) {
			return f
		}
		return string(t)
	case map[string]any:
		for k, e := range t {
			t[k] = normalizeNumbers(e)
		}
	case []any:
		for i, e := range t {
			t[i] = normalizeNumbers(e)
		}
	}
	return v
}

// stepValue is what steps.NAME reads as.
func stepValue(rec *store.StepRecord, body any) map[string]any {
	return map[string]any{
		"status":   string(rec.Status),
		"body":     body,
		"error":    errorValueOf(rec),
		"attempts": int64(rec.Attempts),
	}
}

func errorValue(e *store.ErrorInfo) any {
	if e == nil {
		return nil
	}
	return map[string]any{"message": e.Message, "code": e.Code, "retryable": e.Retryable}
}

// vars holds the values every step of a run reads. Step results live in
// each list's own namespace (seq.vars).
type vars struct {
	origin  map[string]any
	run     map[string]any
	chain   map[string]any
	secrets map[string]any
	// failure is what the failure root reads (handlers.go).
	failure map[string]any
}

// newVars are run's values; runURL is its console page as people reach
// it, left out of run when the gateway has none.
func newVars(run *store.Run, runURL string, secrets map[string]any) *vars {
	v := &vars{
		secrets: secrets,
		// The payload is decoded when something reads it: a worker running
		// the items of a split over a large payload may never need it.
		origin: map[string]any{
			"id":          run.Origin.ID,
			"payload":     &lazyJSON{raw: run.Origin.Payload},
			"metadata":    &lazyJSON{raw: run.Origin.Metadata},
			"received_at": run.Origin.ReceivedAt.Format("2006-01-02T15:04:05.999999999Z07:00"),
		},
		run:   map[string]any{"id": run.ID},
		chain: map[string]any{"name": run.Chain},
	}
	if runURL != "" {
		v.run["url"] = runURL
	}
	v.failure = failureValue(run)
	return v
}

// scope resolves template roots for one step.
type scope struct {
	v     *vars
	steps map[string]any
	seq   *seq
	// prev is the previous step's value on the path taken; nil for the first.
	prev map[string]any
}

func (s *scope) Lookup(root string) (any, bool) {
	switch root {
	case "origin":
		return s.v.origin, true
	case "steps":
		return s.steps, true
	case "prev":
		if s.prev == nil {
			return nil, false
		}
		return s.prev, true
	case "run":
		return s.v.run, true
	case "chain":
		return s.v.chain, true
	case "secrets":
		return s.v.secrets, true
	case "failure":
		return s.v.failure, true
	case "item":
		if s.seq != nil && s.seq.inItem() {
			return s.seq.item, true
		}
	case "item_index":
		if s.seq != nil && s.seq.inItem() {
			return int64(s.seq.index), true
		}
	}
	return nil, false
}

// env is what a condition reads. Conditions cannot look inside lazy values
// (steps' bodies, split results, the origin, an item), so a condition that
// names one gets it decoded.
func (s *scope) env(cond fmt.Stringer, result map[string]any) map[string]any {
	steps, prev, origin := s.steps, s.prev, s.v.origin
	var text string
	if cond != nil {
		text = cond.String()
	}
	if strings.Contains(text, "body") || strings.Contains(text, "results") {
		steps, _ = materialize(steps, 0).(map[string]any)
		prev, _ = materialize(prev, 0).(map[string]any)
		result, _ = materialize(result, 0).(map[string]any)
	}
	if strings.Contains(text, "origin") {
		origin, _ = materialize(origin, 0).(map[string]any)
	}
	env := map[string]any{
		"origin": origin,
		"steps":  steps,
		"run":    s.v.run,
		"chain":  s.v.chain,
		"prev":   nil,
	}
	if s.v.failure != nil {
		env["failure"] = s.v.failure
	}
	if prev != nil {
		env["prev"] = prev
	}
	if result != nil {
		env["result"] = result
	}
	if s.seq != nil && s.seq.inItem() {
		env["item"] = s.seq.item
		if strings.Contains(text, "item") {
			env["item"] = materialize(s.seq.item, 0)
		}
		env["item_index"] = int64(s.seq.index)
	}
	return env
}

// materialize replaces lazy values within the first few levels of maps.
func materialize(v any, depth int) any {
	switch x := v.(type) {
	case templates.Lazy:
		return x.Value()
	case map[string]any:
		if depth > 3 || x == nil {
			return x
		}
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = materialize(e, depth+1)
		}
		return out
	}
	return v
}

// lazyJSON is raw JSON decoded the first time something reads inside it.
type lazyJSON struct {
	raw  json.RawMessage
	once sync.Once
	v    any

	mu     sync.Mutex
	fields map[string]any
}

func (l *lazyJSON) Value() any {
	l.once.Do(func() { l.v = decodeJSON(l.raw) })
	return l.v
}

// RawJSON is the value's text, which a template writing the whole value
// copies when it can.
func (l *lazyJSON) RawJSON() []byte { return l.raw }

// Field reads one field of an object without decoding the others: a path
// into a large payload decodes what it passes through, and the split's
// items under it are indexed rather than decoded (rawItems).
func (l *lazyJSON) Field(name string) (any, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if v, ok := l.fields[name]; ok {
		return v, true
	}
	raw, ok := rawField(l.raw, name)
	if !ok {
		return nil, false
	}
	if l.fields == nil {
		l.fields = map[string]any{}
	}
	// Only objects and arrays are worth deferring; a scalar is decoded now,
	// so that a null reads as null (to `??`, say) and not as a value.
	var v any = &lazyJSON{raw: raw}
	if t := bytes.TrimLeft(raw, " \t\r\n"); len(t) > 0 && t[0] != '{' && t[0] != '[' {
		v = decodeScalar(raw)
	}
	l.fields[name] = v
	return v, true
}
