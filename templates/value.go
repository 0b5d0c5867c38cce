package templates

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"
)

// maxDepth bounds recursion so a cyclic or absurdly deep scope value fails instead of
// exhausting the stack; it matches encoding/json's nesting limit.
const maxDepth = 10000

var errTooDeep = errors.New("value nested too deeply")

// resolve walks p through the scope; ok is false when any step is missing.
func (p *path) resolve(s Scope) (any, bool) {
	if s == nil {
		return nil, false
	}
	v, ok := s.Lookup(p.root)
	for i := 0; ok && i < len(p.segs); i++ {
		v, ok = walk(v, &p.segs[i])
	}
	return v, ok
}

func walk(v any, sg *segment) (any, bool) {
	switch x := v.(type) {
	case map[string]any:
		if sg.kind != segIndex {
			r, ok := x[sg.key]
			return r, ok
		}
	case map[string]string:
		if sg.kind != segIndex {
			r, ok := x[sg.key]
			return r, ok
		}
	case []any:
		if sg.kind != segKey && sg.idx < len(x) {
			return x[sg.idx], true
		}
	case []map[string]any:
		if sg.kind != segKey && sg.idx < len(x) {
			return x[sg.idx], true
		}
	case []string:
		if sg.kind != segKey && sg.idx < len(x) {
			return x[sg.idx], true
		}
	case LazyObject:
		if sg.kind == segKey {
			return x.Field(sg.key)
		}
		return walk(x.Value(), sg)
	case Lazy:
		return walk(x.Value(), sg)
	case json.RawMessage:
		// Decoding per step is slow, but raw values are rare in scopes and this keeps them addressable.
		if d, err := decodeRaw(x); err == nil {
			return walk(d, sg)
		}
	}
	return nil, false
}

// decodeRaw decodes raw JSON keeping numbers exact; empty input is null, as json.Marshal treats it.
func decodeRaw(raw json.RawMessage) (any, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	if !json.Valid(raw) {
		return nil, errors.New("invalid json.RawMessage")
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	err := d.Decode(&v)
	return v, err
}

// normalizeValue converts a scope value to the types Render promises, copying only the
// containers that hold something to convert, so plain JSON-decoded data is returned as is.
func normalizeValue(v any) (any, error) {
	n, _, err := normalize(v, 0, false)
	if err != nil {
		// Of several bad members, report the one appendJSON would. Only a failed value
		// pays for walking its maps in key order.
		_, _, err = normalize(v, 0, true)
	}
	return n, err
}

// normalize does normalizeValue's work; inOrder walks maps in key order.
func normalize(v any, depth int, inOrder bool) (any, bool, error) {
	if depth > maxDepth {
		return nil, false, errTooDeep
	}
	switch x := v.(type) {
	case nil, string, bool, int64:
		return v, false, nil
	case Lazy:
		return normalize(x.Value(), depth, inOrder)
	case float64:
		return v, false, checkFloat(x)
	case json.Number:
		if !isJSONNumber(string(x)) {
			return nil, false, invalidNumber(x)
		}
		return v, false, nil
	case map[string]any:
		if x == nil {
			return nil, true, nil
		}
		if inOrder {
			var arr [16]string
			for _, k := range sortedKeys(x, arr[:0]) {
				if _, _, err := normalize(x[k], depth+1, true); err != nil {
					return nil, false, err
				}
			}
			return v, false, nil
		}
		var out map[string]any
		for k, e := range x {
			ne, changed, err := normalize(e, depth+1, false)
			if err != nil {
				return nil, false, err
			}
			if changed {
				if out == nil {
					out = maps.Clone(x)
				}
				out[k] = ne
			}
		}
		if out != nil {
			return out, true, nil
		}
		return v, false, nil
	case []any:
		if x == nil {
			return nil, true, nil
		}
		var out []any
		for i, e := range x {
			ne, changed, err := normalize(e, depth+1, inOrder)
			if err != nil {
				return nil, false, err
			}
			if changed {
				if out == nil {
					out = slices.Clone(x)
				}
				out[i] = ne
			}
		}
		if out != nil {
			return out, true, nil
		}
		return v, false, nil
	case map[string]string:
		if x == nil {
			return nil, true, nil
		}
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = e
		}
		return out, true, nil
	case []string:
		if x == nil {
			return nil, true, nil
		}
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = e
		}
		return out, true, nil
	case []map[string]any:
		if x == nil {
			return nil, true, nil
		}
		out := make([]any, len(x))
		for i, e := range x {
			ne, _, err := normalize(e, depth+1, inOrder)
			if err != nil {
				return nil, false, err
			}
			out[i] = ne
		}
		return out, true, nil
	case json.RawMessage:
		d, err := decodeRaw(x)
		return d, true, err
	case time.Time:
		return x.Format(time.RFC3339Nano), true, nil
	case float32:
		f := float64(x)
		return f, true, checkFloat(f)
	case uint64:
		if x > math.MaxInt64 {
			return v, false, nil // no int64 holds it; json.Marshal writes it exactly
		}
		return int64(x), true, nil
	case uint:
		if uint64(x) > math.MaxInt64 {
			return uint64(x), true, nil
		}
		return int64(x), true, nil
	}
	if n, ok := asInt64(v); ok {
		return n, true, nil
	}
	return nil, false, unsupported(v)
}

func asInt64(v any) (int64, bool) {
	switch x := v.(type) {
	case int:
		return int64(x), true
	case int8:
		return int64(x), true
	case int16:
		return int64(x), true
	case int32:
		return int64(x), true
	case uint8:
		return int64(x), true
	case uint16:
		return int64(x), true
	case uint32:
		return int64(x), true
	}
	return 0, false
}

type unsupportedError struct{ v any }

func (e unsupportedError) Error() string {
	return fmt.Sprintf("unsupported value of type %T", e.v)
}

func unsupported(v any) error { return unsupportedError{v} }

func invalidNumber(n json.Number) error {
	return errors.New("invalid json.Number " + strconv.Quote(string(n)))
}

func checkFloat(f float64) error {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return errors.New("unsupported number " + strconv.FormatFloat(f, 'g', -1, 64))
	}
	return nil
}

// appendJSON encodes v as encoding/json would (without HTML escaping) but with sorted keys
// guaranteed and no reflection.
func appendJSON(buf []byte, v any, depth int) ([]byte, error) {
	if depth > maxDepth {
		return buf, errTooDeep
	}
	switch x := v.(type) {
	case nil:
		return append(buf, "null"...), nil
	case RawLazy:
		if out, ok := appendCanonical(buf, x.RawJSON()); ok {
			return out, nil
		}
		return appendJSON(buf, x.Value(), depth)
	case Lazy:
		return appendJSON(buf, x.Value(), depth)
	case string:
		return appendString(buf, x), nil
	case bool:
		return strconv.AppendBool(buf, x), nil
	case int64:
		return strconv.AppendInt(buf, x, 10), nil
	case float64:
		return appendFloat(buf, x)
	case map[string]any:
		if x == nil {
			return append(buf, "null"...), nil
		}
		var arr [16]string
		buf = append(buf, '{')
		for i, k := range sortedKeys(x, arr[:0]) {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = appendString(buf, k)
			buf = append(buf, ':')
			var err error
			if buf, err = appendJSON(buf, x[k], depth+1); err != nil {
				return buf, err
			}
		}
		return append(buf, '}'), nil
	case []any:
		if x == nil {
			return append(buf, "null"...), nil
		}
		buf = append(buf, '[')
		for i, e := range x {
			if i > 0 {
				buf = append(buf, ',')
			}
			var err error
			if buf, err = appendJSON(buf, e, depth+1); err != nil {
				return buf, err
			}
		}
		return append(buf, ']'), nil
	case json.Number:
		if !isJSONNumber(string(x)) {
			return buf, invalidNumber(x)
		}
		return append(buf, x...), nil
	case json.RawMessage:
		if len(x) == 0 {
			return append(buf, "null"...), nil
		}
		if !json.Valid(x) {
			return buf, errors.New("invalid json.RawMessage")
		}
		return append(buf, x...), nil
	case map[string]string:
		if x == nil {
			return append(buf, "null"...), nil
		}
		var arr [16]string
		buf = append(buf, '{')
		for i, k := range sortedKeys(x, arr[:0]) {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = appendString(buf, k)
			buf = append(buf, ':')
			buf = appendString(buf, x[k])
		}
		return append(buf, '}'), nil
	case []string:
		if x == nil {
			return append(buf, "null"...), nil
		}
		buf = append(buf, '[')
		for i, e := range x {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = appendString(buf, e)
		}
		return append(buf, ']'), nil
	case []map[string]any:
		if x == nil {
			return append(buf, "null"...), nil
		}
		buf = append(buf, '[')
		for i, e := range x {
			if i > 0 {
				buf = append(buf, ',')
			}
			var err error
			if buf, err = appendJSON(buf, e, depth+1); err != nil {
				return buf, err
			}
		}
		return append(buf, ']'), nil
	case time.Time:
		buf = append(buf, '"')
		buf = x.AppendFormat(buf, time.RFC3339Nano)
		return append(buf, '"'), nil
	case float32:
		return appendFloat(buf, float64(x))
	case uint64:
		return strconv.AppendUint(buf, x, 10), nil
	case uint:
		return strconv.AppendUint(buf, uint64(x), 10), nil
	}
	if n, ok := asInt64(v); ok {
		return strconv.AppendInt(buf, n, 10), nil
	}
	return buf, unsupported(v)
}

// appendText is how a value reads inside a longer string: strings raw, everything else as JSON.
func appendText(buf []byte, v any) ([]byte, error) {
	switch x := v.(type) {
	case Lazy:
		return appendText(buf, x.Value())
	case string:
		return append(buf, x...), nil
	case time.Time:
		return x.AppendFormat(buf, time.RFC3339Nano), nil
	case json.RawMessage:
		// Decode so a raw string reads as its text and objects get sorted, compact keys,
		// exactly as the decoded value does in Render.
		d, err := decodeRaw(x)
		if err != nil {
			return buf, err
		}
		return appendText(buf, d)
	}
	return appendJSON(buf, v, 0)
}

// appendTextJSON appends the text form of v escaped for use inside a JSON string.
func appendTextJSON(buf []byte, v any) ([]byte, error) {
	switch x := v.(type) {
	case string:
		return appendStringBody(buf, x), nil
	case nil, bool, int64, float64, json.Number, time.Time:
		return appendText(buf, v) // plain ASCII: nothing to escape
	}
	text, err := appendText(nil, v)
	if err != nil {
		return buf, err
	}
	return appendStringBody(buf, string(text)), nil
}

// sortedKeys collects m's keys into scratch, which callers back with a stack array
// so small objects encode without allocating.
func sortedKeys[V any](m map[string]V, scratch []string) []string {
	for k := range m {
		scratch = append(scratch, k)
	}
	slices.Sort(scratch)
	return scratch
}

// appendFloat formats like encoding/json: shortest representation, exponent only for
// very large or small magnitudes.
func appendFloat(buf []byte, f float64) ([]byte, error) {
	if err := checkFloat(f); err != nil {
		return buf, err
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	buf = strconv.AppendFloat(buf, f, format, -1, 64)
	if format == 'e' {
		// e-09 → e-9, as encoding/json does.
		n := len(buf)
		if n >= 4 && buf[n-4] == 'e' && buf[n-3] == '-' && buf[n-2] == '0' {
			buf[n-2] = buf[n-1]
			buf = buf[:n-1]
		}
	}
	return buf, nil
}

func appendString(buf []byte, s string) []byte {
	buf = append(buf, '"')
	buf = appendStringBody(buf, s)
	return append(buf, '"')
}

const hexDigits = "0123456789abcdef"

// appendStringBody escapes s like encoding/json with HTML escaping off: invalid UTF-8
// becomes U+FFFD and U+2028/U+2029 are escaped so the output is also safe JavaScript.
func appendStringBody(buf []byte, s string) []byte {
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			buf = append(buf, s[start:i]...)
			switch c {
			case '"', '\\':
				buf = append(buf, '\\', c)
			case '\n':
				buf = append(buf, '\\', 'n')
			case '\r':
				buf = append(buf, '\\', 'r')
			case '\t':
				buf = append(buf, '\\', 't')
			case '\b':
				buf = append(buf, '\\', 'b')
			case '\f':
				buf = append(buf, '\\', 'f')
			default:
				buf = append(buf, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			buf = append(buf, s[start:i]...)
			buf = append(buf, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			buf = append(buf, s[start:i]...)
			buf = append(buf, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	return append(buf, s[start:]...)
}
