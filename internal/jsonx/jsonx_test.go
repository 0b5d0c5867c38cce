package jsonx_test

import (
	"encoding/json"
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
