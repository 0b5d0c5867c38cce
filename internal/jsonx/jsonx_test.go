package jsonx_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/chaingate/gateway/internal/jsonx"
)

func TestMarshalKeepsHTMLCharacters(t *testing.T) {
	v := map[string]any{"text": "<b>a & b</b>", "raw": json.RawMessage(`{"x":"<i>"}`)}
	got, err := jsonx.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"raw":{"x":"<i>"},"text":"<b>a & b</b>"}`; string(got) != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

func TestNesting(t *testing.T) {
	for in, want := range map[string]int{
		`1`: 0, `"[[["`: 0, `[]`: 1, `{"a": [1, {"b": "]"}]}`: 3, `["\"[", ["x\\"], []]`: 2,
		strings.Repeat("[", 9999) + strings.Repeat("]", 9999): 9999,
	} {
		if got := jsonx.Nesting([]byte(in)); got != want {
			t.Errorf("Nesting(%.40s) = %d, want %d", in, got, want)
		}
	}
}

func BenchmarkNesting(b *testing.B) {
	body := []byte(`{"hosts":[` + strings.Repeat(`{"name":"host-0000001","status":"up","zone":"eu-west-1a"},`, 1700) + `{}]}`)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		jsonx.Nesting(body)
	}
}
