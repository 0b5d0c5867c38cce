package engine

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/chaingate/gateway/templates"
)

// TestRawItems checks that items indexed in a payload's raw JSON read as
// the same values decoding the payload would give.
func TestRawItems(t *testing.T) {
	for _, tc := range []struct {
		name, payload string
		path          []string
		want          string // the array at path, or "" when none is found
	}{
		{"objects", `{"hosts": [{"name": "a", "zone": "x"}, {"name": "b ]}\"", "up": true}, 3, null, "s"], "n": 1}`, []string{"hosts"}, "same"},
		{"nested", `{"a": {"b": [[1, 2], {"c": "}"}, []]}}`, []string{"a", "b"}, "same"},
		{"by index", `{"groups": [{"hosts": [1]}, {"hosts": [2, 3]}]}`, []string{"groups", "1", "hosts"}, "same"},
		{"escaped key", `{"ho\u0073ts": [1, 2]}`, []string{"hosts"}, "same"},
		{"empty", `{"hosts": []}`, []string{"hosts"}, "same"},
		{"spaces", " {\n \"hosts\" :\t[ 1 ,\n2 ] } ", []string{"hosts"}, "same"},
		{"key twice", `{"hosts": [1], "hosts": [2, 3]}`, []string{"hosts"}, "same"},
		{"missing", `{"host": [1]}`, []string{"hosts"}, ""},
		{"not an array", `{"hosts": {"a": 1}}`, []string{"hosts"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw := []byte(tc.payload)
			arr, found := rawPath(raw, tc.path)
			var items *rawItems
			ok := false
			if found {
				items, ok = indexItems(raw, arr)
			}
			if tc.want == "" {
				if ok {
					t.Fatalf("found items %v where there are none", items)
				}
				return
			}
			if !ok {
				t.Fatalf("no items at %v", tc.path)
			}
			doc := decodeJSON(raw)
			for _, seg := range tc.path {
				switch x := doc.(type) {
				case map[string]any:
					doc = x[seg]
				case []any:
					var i int
					_ = json.Unmarshal([]byte(seg), &i)
					doc = x[i]
				}
			}
			want := doc.([]any)
			if items.Len() != len(want) {
				t.Fatalf("%d items, want %d", items.Len(), len(want))
			}
			for i := range want {
				if got := materialize(items.At(i), 0); !reflect.DeepEqual(got, want[i]) {
					t.Errorf("item %d: %#v, want %#v", i, got, want[i])
				}
				if b, _ := items.JSON(i); !json.Valid(b) {
					t.Errorf("item %d's JSON %q is not JSON", i, b)
				}
			}
		})
	}
}

func FuzzRawPath(f *testing.F) {
	f.Add(`{"hosts": [{"name": "a"}, 2, "x"]}`, "hosts")
	f.Add(`{"a": "\"[", "hosts": [[], {}]}`, "hosts")
	f.Add(`{"hosts": [1], "hosts": [2]}`, "hosts")
	f.Fuzz(func(t *testing.T, payload, key string) {
		if !json.Valid([]byte(payload)) {
			return
		}
		raw := []byte(payload)
		arr, found := rawPath(raw, []string{key})
		if !found {
			return
		}
		items, ok := indexItems(raw, arr)
		if !ok {
			return
		}
		var whole map[string]json.RawMessage
		if json.Unmarshal(raw, &whole) != nil {
			return
		}
		var want []json.RawMessage
		if json.Unmarshal(whole[key], &want) != nil {
			return
		}
		if items.Len() != len(want) {
			t.Fatalf("%d items, want %d", items.Len(), len(want))
		}
		for i := range want {
			if got := materialize(items.At(i), 0); !reflect.DeepEqual(got, decodeJSON(want[i])) {
				t.Fatalf("item %d: %#v, want %s", i, got, want[i])
			}
		}
	})
}

// A field of a payload that is null reads as null, so that `??` passes
// over it as the template docs say; a scalar reads as its value.
func TestLazyFieldNull(t *testing.T) {
	tpl, err := templates.CompileString(`run <<origin.x ?? "none">>, <<origin.n ?? 0>>, <<origin.s>>`)
	if err != nil {
		t.Fatal(err)
	}
	scope := templates.MapScope{"origin": &lazyJSON{raw: json.RawMessage(`{"x": null, "n": 3, "s": "a"}`)}}
	got, err := tpl.Render(scope)
	if err != nil || got != "run none, 3, a" {
		t.Fatalf("got %q, %v; want %q", got, err, "run none, 3, a")
	}
}
