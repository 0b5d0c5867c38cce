// Package jsonx encodes JSON for people and for jq: '<', '>' and '&' stay
// as they are, where encoding/json would write \u003c, \u003e and \u0026.
package jsonx

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"

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

// ValidUTF8 returns a JSON text as strict parsers take it: each byte that
// is not valid UTF-8 replaced with U+FFFD, and each \u escape of a lone
// UTF-16 surrogate with \ufffd, which is what encoding/json decodes them
// to. A text that needs neither is returned as it is, uncopied. It does
// not check that data is valid JSON.
func ValidUTF8(data []byte) []byte {
	if utf8.Valid(data) && !bytes.Contains(data, []byte(`\u`)) {
		return data
	}
	var out []byte // nil until something is replaced
	done := 0      // data before done is in out
	repair := func(at, n int, with string) {
		if out == nil {
			out = make([]byte, 0, len(data)+len(with))
		}
		out = append(append(out, data[done:at]...), with...)
		done = at + n
	}
	for i := 0; i < len(data); {
		c := data[i]
		switch {
		case c == '\\' && i+1 < len(data) && data[i+1] == 'u':
			r, ok := escaped(data, i)
			switch {
			case !ok:
				i += 2
			case r >= 0xd800 && r < 0xdc00:
				if low, ok := escaped(data, i+6); ok && low >= 0xdc00 && low < 0xe000 {
					i += 12
					continue
				}
				repair(i, 6, `\ufffd`)
				i += 6
			case r >= 0xdc00 && r < 0xe000:
				repair(i, 6, `\ufffd`)
				i += 6
			default:
				i += 6
			}
		case c == '\\':
			// The escaped character is ASCII in valid JSON; anything else
			// is read as it is.
			i++
			if i < len(data) && data[i] < utf8.RuneSelf {
				i++
			}
		case c < utf8.RuneSelf:
			i++
		default:
			r, size := utf8.DecodeRune(data[i:])
			if r == utf8.RuneError && size == 1 {
				repair(i, 1, "\uFFFD")
			}
			i += size
		}
	}
	if out == nil {
		return data
	}
	return append(out, data[done:]...)
}

// escaped reads the \uXXXX escape at data[i:], if there is one.
func escaped(data []byte, i int) (rune, bool) {
	if i+6 > len(data) || data[i] != '\\' || data[i+1] != 'u' {
		return 0, false
	}
	var r rune
	for _, c := range data[i+2 : i+6] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}
