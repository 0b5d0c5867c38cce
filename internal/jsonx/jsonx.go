// Package jsonx encodes JSON for people and for jq: '<', '>' and '&' stay
// as they are, where encoding/json would write \u003c, \u003e and \u0026.
package jsonx

import (
	"bytes"
	"encoding/json"

	jsonv1 "github.com/go-json-experiment/json/v1"
)

// Marshal is json.Marshal without HTML escaping.
func Marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// Nesting returns how deeply a JSON text's arrays and objects nest: 0 for
// a scalar, 1 for [1, 2], 2 for {"a": [1]}. It reads the text once and
// does not check that it is valid JSON.
func Nesting(data []byte) int {
	depth, deepest := 0, 0
	inString := false
	for i := 0; i < len(data); i++ {
		c := data[i]
		switch {
		case inString:
			switch c {
			case '\\':
				i++
			case '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '[' || c == '{':
			if depth++; depth > deepest {
				deepest = depth
			}
		case c == ']' || c == '}':
			depth--
		}
	}
	return deepest
}

// Unmarshal is json.Unmarshal, with encoding/json's semantics exactly, on
// the JSON v2 engine (the one Go's encoding/json runs on under
// GOEXPERIMENT=jsonv2): it decodes a step record in about half the time
// (BenchmarkUnmarshalStep), and a run's page decodes hundreds of them.
func Unmarshal(data []byte, v any) error { return jsonv1.Unmarshal(data, v) }
