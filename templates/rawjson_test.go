package templates

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"testing"
)

// decodeAsEngine decodes raw as the engine hands values to templates:
// whole numbers as int64, other finite numbers as float64, the rest as
// strings.
func decodeAsEngine(raw []byte) (any, bool) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if d.Decode(&v) != nil || d.More() {
		return nil, false
	}
	var norm func(any) any
	norm = func(v any) any {
		switch x := v.(type) {
		case json.Number:
			if i, err := strconv.ParseInt(string(x), 10, 64); err == nil {
				return i
			}
			if f, err := x.Float64(); err == nil && !math.IsInf(f, 0) {
				return f
			}
			return string(x)
		case map[string]any:
			for k, e := range x {
				x[k] = norm(e)
			}
		case []any:
			for i, e := range x {
				x[i] = norm(e)
			}
		}
		return v
	}
	return norm(v), true
}

func TestAppendCanonical(t *testing.T) {
	tests := []struct {
		raw  string
		want string // "" when the text must be decoded instead
	}{
		{`{"name": "host-0000001", "status": "up", "zone": "eu-west-1a"}`, `{"name":"host-0000001","status":"up","zone":"eu-west-1a"}`},
		{" [1, -2, 0, true, false, null, [], {}] \n", `[1,-2,0,true,false,null,[],{}]`},
		{`{"a": {"b": [{"c": "d"}]}, "b": 9223372036854775807}`, `{"a":{"b":[{"c":"d"}]},"b":9223372036854775807}`},
		{`"héllo"`, `"héllo"`},
		{`{"b": 1, "a": 2}`, ""},
		{`{"a": 1, "a": 2}`, ""},
		{`1.5`, ""},
		{`1e3`, ""},
		{`-0`, ""},
		{`9223372036854775808`, ""},
		{`"a\nb"`, ""},
		{`"a\u0041"`, ""},
		{"\"\u2028\"", ""},
		{"\"\xff\"", ""},
		{`[1,]`, ""},
		{`{"a":1} x`, ""},
		{`tru`, ""},
		{``, ""},
	}
	for _, tc := range tests {
		got, ok := appendCanonical([]byte("prefix:"), []byte(tc.raw))
		switch {
		case tc.want == "" && ok:
			t.Errorf("%q copied as %q; want it decoded", tc.raw, got)
		case tc.want == "" && string(got) != "prefix:":
			t.Errorf("%q refused but the buffer changed to %q", tc.raw, got)
		case tc.want != "" && (!ok || string(got) != "prefix:"+tc.want):
			t.Errorf("%q: %q %v, want %q", tc.raw, got, ok, tc.want)
		}
	}
}

// FuzzAppendCanonical checks that the copy of a value's text is exactly
// what writing its decoded value gives.
func FuzzAppendCanonical(f *testing.F) {
	for _, seed := range []string{
		`{"name": "host-0000001", "status": "up", "zone": "eu-west-1a"}`,
		`[1, -2, 0, true, false, null, [], {}]`,
		`{"b": 1, "a": 2}`, `"héllo"`, `-0`, `1.5`, `"a\u0041"`, `{"a":{"a":{"a":[]}}}`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		got, ok := appendCanonical(nil, []byte(raw))
		if !ok {
			return
		}
		v, valid := decodeAsEngine([]byte(raw))
		if !valid {
			t.Fatalf("%q is not JSON, but was copied as %q", raw, got)
		}
		want, err := appendJSON(nil, v, 0)
		if err != nil {
			t.Fatalf("%q: writing its value: %v", raw, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%q copied as %q, its value writes as %q", raw, got, want)
		}
	})
}
