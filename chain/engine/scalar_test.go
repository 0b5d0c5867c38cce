package engine

import (
	"reflect"
	"testing"
)

var scalars = []string{
	`"host-1"`, `""`, `"a\"b"`, `"a\\b"`, `"\u00e9t\u00e9"`, `"été"`, "\"tab\there\"", `"\ud83d\ude00"`, `"\ud800"`,
	`0`, `-0`, `7`, `-42`, `9223372036854775807`, `-9223372036854775808`, `9223372036854775808`, `1.5`, `1e3`, `-1.0`,
	`01`, `-`, `+1`, `true`, `false`, `null`, ` true `, `tru`, `"`, `"unterminated`, `1 2`, "\"\xff\"",
}

// TestDecodeScalarReadsAsDecodeJSON: the scalars read without a decoder
// read exactly as through one, whatever their text.
func TestDecodeScalarReadsAsDecodeJSON(t *testing.T) {
	for _, s := range scalars {
		if got, want := decodeScalar([]byte(s)), decodeJSON([]byte(s)); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %#v, want %#v", s, got, want)
		}
	}
}

func FuzzDecodeScalar(f *testing.F) {
	for _, s := range scalars {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := decodeScalar([]byte(s)), decodeJSON([]byte(s)); !reflect.DeepEqual(got, want) {
			t.Errorf("%q: %#v, want %#v", s, got, want)
		}
	})
}

// BenchmarkPayloadField reads the fields of an alert's payload as templates
// do, each from a payload not read before.
func BenchmarkPayloadField(b *testing.B) {
	raw := []byte(`{"alertname":"DiskFull","instance":"db-1:9100","severity":"critical","value":97,"firing":true,"runbook":null}`)
	fields := []string{"alertname", "instance", "severity", "value", "firing", "runbook"}
	b.ReportAllocs()
	for b.Loop() {
		l := &lazyJSON{raw: raw}
		for _, f := range fields {
			if _, ok := l.Field(f); !ok {
				b.Fatal(f)
			}
		}
	}
}
