package engine

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"

	"github.com/chaingate/gateway/chain/store"
)

// decodeJSON turns a stored JSON document into the values templates and
// conditions read. Integers stay int64 so ids above 2^53 keep every digit;
// other numbers become float64. Invalid JSON reads as a string.
func decodeJSON(raw json.RawMessage) any {
	if len(raw) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return string(raw)
	}
	return normalizeNumbers(v)
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
		"error":    errorValue(rec.Error),
		"attempts": int64(rec.Attempts),
	}
}

func errorValue(e *store.ErrorInfo) any {
	if e == nil {
		return nil
	}
	return map[string]any{"message": e.Message, "code": e.Code, "retryable": e.Retryable}
}

// vars holds the values a run's templates and conditions read. It is built
// once per run and updated as steps finish, so rendering never rebuilds it.
type vars struct {
	origin map[string]any
	run    map[string]any
	chain  map[string]any
	steps  map[string]any
}

func newVars(run *store.Run) *vars {
	return &vars{
		origin: map[string]any{
			"id":          run.Origin.ID,
			"payload":     decodeJSON(run.Origin.Payload),
			"metadata":    decodeJSON(run.Origin.Metadata),
			"received_at": run.Origin.ReceivedAt.Format("2006-01-02T15:04:05.999999999Z07:00"),
		},
		run:   map[string]any{"id": run.ID},
		chain: map[string]any{"name": run.Chain},
		steps: map[string]any{},
	}
}

// scope resolves template roots for one step.
type scope struct {
	v *vars
	// prev is the previous step's value on the path taken; nil for the first.
	prev map[string]any
}

func (s *scope) Lookup(root string) (any, bool) {
	switch root {
	case "origin":
		return s.v.origin, true
	case "steps":
		return s.v.steps, true
	case "prev":
		if s.prev == nil {
			return nil, false
		}
		return s.prev, true
	case "run":
		return s.v.run, true
	case "chain":
		return s.v.chain, true
	}
	return nil, false
}

func (s *scope) env(result map[string]any) map[string]any {
	env := map[string]any{
		"origin": s.v.origin,
		"steps":  s.v.steps,
		"run":    s.v.run,
		"chain":  s.v.chain,
		"prev":   nil,
	}
	if s.prev != nil {
		env["prev"] = s.prev
	}
	if result != nil {
		env["result"] = result
	}
	return env
}
