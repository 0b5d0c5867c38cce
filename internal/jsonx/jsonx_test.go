package jsonx_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/chaingate/gateway/chain/store"
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

// TestUnmarshalAsEncodingJSON decodes what stores hold, and what they might
// hold after a hand edit or from an older version, exactly as encoding/json
// does: the same value, or an error for the same input.
func TestUnmarshalAsEncodingJSON(t *testing.T) {
	for _, in := range []string{
		`{"key":"a","name":"a","status":"succeeded","attempts":2,"body":{"x":[1,"<b>"]},"started_at":"2026-11-25T10:00:00.123456789Z","finished_at":"2026-11-25T10:00:01+01:00"}`,
		`{"KEY":"a","Status":"failed","error":{"message":"boom","code":"timeout"}}`,
		`{"key":"a","key":"b","body":{"dup":1,"dup":2}}`,
		`{"key":"\xff\ud800","body":"\ud800"}`,
		"{\"key\":\"\xff\"}",
		`{"key":null,"attempts":null,"body":null,"split":{"total":3,"next":1}}`,
		`{"key":"a","unknown":{"deep":[[[1]]]},"child":"r2"}`,
		`{"attempts":1.5}`,
		`{"attempts":"1"}`,
		`{"started_at":"yesterday"}`,
		`{"key":"a"`,
		`[1,2]`,
		``,
		`{"body":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `}`,
	} {
		var want, got store.StepRecord
		wantErr := json.Unmarshal([]byte(in), &want)
		gotErr := jsonx.Unmarshal([]byte(in), &got)
		if (wantErr == nil) != (gotErr == nil) {
			t.Errorf("%.60s: error %v, encoding/json's %v", in, gotErr, wantErr)
			continue
		}
		if wantErr == nil && !reflect.DeepEqual(got, want) {
			t.Errorf("%.60s:\n got %+v\nwant %+v", in, got, want)
		}
	}
}

// BenchmarkUnmarshalStep decodes a step record as a run page reads three
// hundred of them: with encoding/json, and with Unmarshal.
func BenchmarkUnmarshalStep(b *testing.B) {
	data := []byte(`{"key":"s123","name":"s123","status":"succeeded","dedup_key":"01m89xq3qdss6pa18zsen7q6ze/s123","attempts":1,` +
		`"body":{"i":123,"msg":"step 123 of the run","host":"db-1"},"started_at":"2026-11-25T10:00:00.123456789Z","finished_at":"2026-11-25T10:00:00.223456789Z"}`)
	for _, bc := range []struct {
		name string
		fn   func([]byte, any) error
	}{{"encoding_json", json.Unmarshal}, {"jsonx", jsonx.Unmarshal}} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				var st store.StepRecord
				if err := bc.fn(data, &st); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestValidUTF8(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"valid as it is", `{"a":"héllo \u00e9 \ud83d\ude00","b":[1,2]}`, `{"a":"héllo \u00e9 \ud83d\ude00","b":[1,2]}`},
		{"invalid bytes", "{\"a\":\"x\xff\xfey\",\"k\xc3\":1}", "{\"a\":\"x\uFFFD\uFFFDy\",\"k\uFFFD\":1}"},
		{"a UTF-8 encoded surrogate", "\"\xed\xa0\x80\"", "\"\uFFFD\uFFFD\uFFFD\""},
		{"a lone high surrogate", `{"s":"\ud800x"}`, `{"s":"\ufffdx"}`},
		{"a lone low surrogate", `["\uDC00"]`, `["\ufffd"]`},
		{"a high surrogate at the end", `"\ud800"`, `"\ufffd"`},
		{"two high surrogates", `"\ud800\ud800\udc00"`, `"\ufffd\ud800\udc00"`},
		{"an escaped backslash before u", `"\\ud800"`, `"\\ud800"`},
		{"an escaped backslash, then an escape", `"\\\ud800"`, `"\\\ufffd"`},
		{"an escape cut short", `"\ud8`, `"\ud8`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := string(jsonx.ValidUTF8([]byte(tc.in)))
			if got != tc.want {
				t.Errorf("ValidUTF8(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}
