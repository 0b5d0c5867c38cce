package templates

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

var when = time.Date(2024, 5, 1, 12, 30, 0, 500, time.UTC)

func testScope() MapScope {
	return MapScope{
		"origin": map[string]any{
			"id": "evt-1",
			"payload": map[string]any{
				"alert_name":      "DiskFull",
				"count":           int64(3),
				"ratio":           0.25,
				"whole":           3.0,
				"big":             1e21,
				"tiny":            1e-7,
				"ok":              true,
				"nothing":         nil,
				"tags":            []any{"a", "b"},
				"obj":             map[string]any{"b": int64(1), "a": "x"},
				"items":           []any{map[string]any{"name": "first"}, map[string]any{"name": "second"}},
				"key with spaces": "spaced",
				"0":               "zero-key",
				"nested":          map[string]any{"0": "map-zero"},
				"inject":          "<<secrets.token>>",
				"quote":           "say \"hi\"\n\t\x01</>&\u2028",
				"num":             json.Number("12.50"),
				"raw":             json.RawMessage(`{"z": 1, "a": [true, null]}`),
				"rawstr":          json.RawMessage(`"raw text"`),
				"int":             7,
				"strs":            []string{"x", "y"},
				"maps":            []map[string]any{{"k": "v"}},
				"headers":         map[string]string{"X-Id": "42"},
				"when":            when,
				"mixed":           map[string]any{"n": 5, "s": []string{"q"}},
			},
		},
		"steps": map[string]any{
			"check-severity": map[string]any{
				"status": "succeeded",
				"body":   map[string]any{"severity": "high", "score": 0.93},
			},
			"slack-alert": map[string]any{"body": map[string]any{"ok": true}},
		},
		"item":       "the-item",
		"item_index": 2,
		"secrets":    map[string]any{"token": "s3cr3t"},
		"result":     map[string]any{"nan": math.NaN(), "bad": struct{}{}, "badnum": json.Number("1x"), "badraw": json.RawMessage(`{`)},
	}
}

// marshal is the reference encoding: encoding/json without HTML escaping.
func marshal(t testing.TB, v any) []byte {
	t.Helper()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		t.Fatalf("json.Marshal(%#v): %v", v, err)
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

func decodeJSON(t testing.TB, b []byte) any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return v
}

// checkAgree asserts that Render and AppendJSON agree, returning both results.
func checkAgree(t testing.TB, tm *Template, s Scope) (any, []byte, error) {
	t.Helper()
	const prefix = "prefix:"
	r, rerr := tm.Render(s)
	j, jerr := tm.AppendJSON([]byte(prefix), s)
	if (rerr == nil) != (jerr == nil) {
		t.Fatalf("Render err %v, AppendJSON err %v", rerr, jerr)
	}
	if rerr != nil {
		if rerr.Error() != jerr.Error() {
			t.Fatalf("Render err %q, AppendJSON err %q", rerr, jerr)
		}
		if string(j) != prefix {
			t.Fatalf("AppendJSON on error left %q, want the original buffer", j)
		}
		return nil, nil, rerr
	}
	if !strings.HasPrefix(string(j), prefix) {
		t.Fatalf("AppendJSON lost the buffer prefix: %q", j)
	}
	j = j[len(prefix):]
	if !json.Valid(j) {
		t.Fatalf("AppendJSON produced invalid JSON %q", j)
	}
	if got, want := decodeJSON(t, j), decodeJSON(t, marshal(t, r)); !reflect.DeepEqual(got, want) {
		t.Fatalf("AppendJSON %s disagrees with Render %s", j, marshal(t, r))
	}
	return r, j, nil
}

func TestRender(t *testing.T) {
	s := testScope()
	tests := []struct {
		name string
		tmpl any
		want any
		json string // empty: the reference encoding of want
	}{
		{"plain string", "hello", "hello", ""},
		{"lone path", "<<origin.payload.alert_name>>", "DiskFull", ""},
		{"spaces inside", "<<  origin.payload.alert_name\t>>", "DiskFull", ""},
		{"hyphenated step", "<<steps.slack-alert.body.ok>>", true, ""},
		{"hyphenated in text", "sev=<<steps.check-severity.body.severity>>", "sev=high", ""},
		{"bracket index", "<<origin.payload.tags[1]>>", "b", ""},
		{"dot index", "<<origin.payload.tags.0>>", "a", ""},
		{"nested bracket", "<<origin.payload.items[1].name>>", "second", ""},
		{"nested dot index", "<<origin.payload.items.0.name>>", "first", ""},
		{"quoted key", `<<origin.payload["key with spaces"]>>`, "spaced", ""},
		{"quoted key escape", `<<origin["pay\u006coad"].ok>>`, true, ""},
		{"numeric key on map", "<<origin.payload.nested.0>>", "map-zero", ""},
		{"numeric key on map root", "<<origin.payload.0>>", "zero-key", ""},
		{"int64 keeps type", "<<origin.payload.count>>", int64(3), "3"},
		{"float keeps type", "<<origin.payload.ratio>>", 0.25, "0.25"},
		{"integral float", "<<origin.payload.whole>>", 3.0, "3"},
		{"big float", "<<origin.payload.big>>", 1e21, "1e+21"},
		{"tiny float", "<<origin.payload.tiny>>", 1e-7, "1e-7"},
		{"bool keeps type", "<<origin.payload.ok>>", true, "true"},
		{"null keeps type", "<<origin.payload.nothing>>", nil, "null"},
		{"object keeps type", "<<origin.payload.obj>>", map[string]any{"a": "x", "b": int64(1)}, `{"a":"x","b":1}`},
		{"array keeps type", "<<origin.payload.tags>>", []any{"a", "b"}, `["a","b"]`},
		{"go int normalized", "<<origin.payload.int>>", int64(7), "7"},
		{"item_index root", "<<item_index>>", int64(2), "2"},
		{"item root", "<<item>>", "the-item", ""},
		{"string slice", "<<origin.payload.strs>>", []any{"x", "y"}, `["x","y"]`},
		{"string slice index", "<<origin.payload.strs[1]>>", "y", ""},
		{"map slice index", "<<origin.payload.maps.0.k>>", "v", ""},
		{"string map", "<<origin.payload.headers>>", map[string]any{"X-Id": "42"}, `{"X-Id":"42"}`},
		{"string map key", "<<origin.payload.headers.X-Id>>", "42", ""},
		{"nested conversions", "<<origin.payload.mixed>>", map[string]any{"n": int64(5), "s": []any{"q"}}, `{"n":5,"s":["q"]}`},
		{"time value", "<<origin.payload.when>>", "2024-05-01T12:30:00.0000005Z", ""},
		{"json number", "<<origin.payload.num>>", json.Number("12.50"), "12.50"},
		{"json number in text", "n=<<origin.payload.num>>", "n=12.50", ""},
		{"raw message decoded", "<<origin.payload.raw>>", map[string]any{"z": json.Number("1"), "a": []any{true, nil}}, `{"z": 1, "a": [true, null]}`},
		{"raw message walked", "<<origin.payload.raw.a[0]>>", true, ""},
		{"raw message in text", "r=<<origin.payload.raw>>", `r={"a":[true,null],"z":1}`, ""},
		{"raw string in text", "r=<<origin.payload.rawstr>>", "r=raw text", ""},
		{"whitespace makes text", " <<origin.payload.count>>", " 3", ""},
		{"trailing text", "<<origin.payload.ok>>\n", "true\n", ""},
		{"scalars in text", "<<origin.payload.count>>/<<origin.payload.ratio>>/<<origin.payload.whole>>/<<origin.payload.ok>>/<<origin.payload.nothing>>/<<origin.payload.big>>",
			"3/0.25/3/true/null/1e+21", ""},
		{"object in text", "obj=<<origin.payload.obj>> tags=<<origin.payload.tags>>", `obj={"a":"x","b":1} tags=["a","b"]`, ""},
		{"escaping in text", "q: <<origin.payload.quote>>", "q: say \"hi\"\n\t\x01</>&\u2028", `"q: say \"hi\"\n\t\u0001</>&\u2028"`},
		{"escaping lone", "<<origin.payload.quote>>", "say \"hi\"\n\t\x01</>&\u2028", `"say \"hi\"\n\t\u0001</>&\u2028"`},
		{"typical", "Alert: <<origin.payload.alert_name>> (<<steps.check-severity.body.severity>>)", "Alert: DiskFull (high)", ""},
		{"no rescan lone", "<<origin.payload.inject>>", "<<secrets.token>>", ""},
		{"no rescan text", "x <<origin.payload.inject>> y", "x <<secrets.token>> y", ""},
		{"escape", `<<"<<">>`, "<<", ""},
		{"escape in text", `a <<"<<">>b>> c`, "a <<b>> c", ""},
		{"closing marks are text", "a >> b", "a >> b", ""},
		{"markers in literal", `<<steps.nope ?? ">> ?? <<">>`, ">> ?? <<", ""},
		{"literal int", "<<42>>", int64(42), "42"},
		{"literal float", "<<-1.5e2>>", -150.0, "-150"},
		{"literal true", "<<true>>", true, ""},
		{"literal null", "<<null>>", nil, "null"},
		{"literal in text", `n=<<1.50>> s=<<"a\"b">> b=<<false>>`, `n=1.5 s=a"b b=false`, ""},
		{"default literal", `<<steps.x.body.owner ?? "ops">>`, "ops", ""},
		{"default unused", `<<origin.payload.alert_name ?? "unused">>`, "DiskFull", ""},
		{"default path", "<<steps.x.body.owner ?? origin.payload.alert_name>>", "DiskFull", ""},
		{"default chain", "<<steps.a ?? steps.b ?? 5>>", int64(5), "5"},
		{"default chain path wins", "<<steps.a ?? origin.payload.count ?? 5>>", int64(3), "3"},
		{"default number", "<<steps.a ?? 1.5>>", 1.5, ""},
		{"default bool", "<<steps.a ?? false>>", false, ""},
		{"default null", "<<steps.a ?? null>>", nil, "null"},
		{"default skips null", `<<origin.payload.nothing ?? "dflt">>`, "dflt", ""},
		{"only nulls", "<<origin.payload.nothing ?? steps.a>>", nil, "null"},
		{"default in text", `owner=<<steps.x.body.owner ?? "ops">>!`, "owner=ops!", ""},
		{"default keeps type", "<<steps.a ?? origin.payload.obj>>", map[string]any{"a": "x", "b": int64(1)}, `{"a":"x","b":1}`},
		{"spaces around ??", "<<steps.a??7>>", int64(7), "7"},
		{"non-string leaves", map[string]any{"n": int64(1), "f": 2.5, "b": true, "s": "x"},
			map[string]any{"n": int64(1), "f": 2.5, "b": true, "s": "x"}, `{"b":true,"f":2.5,"n":1,"s":"x"}`},
		{"tree", map[string]any{
			"text":            "Alert: <<origin.payload.alert_name>>",
			"list":            []any{"<<item>>", 2.5, "<<origin.payload.obj>>"},
			"blocks":          []map[string]any{{"t": "<<item_index>>", "k": "static"}},
			"tags":            []string{"<<origin.payload.tags.1>>", "z"},
			"hdrs":            map[string]string{"X-Run": "<<origin.id>>"},
			"empty":           map[string]any{},
			"<<not scanned>>": "<<origin.id>>",
		}, map[string]any{
			"text":            "Alert: DiskFull",
			"list":            []any{"the-item", 2.5, map[string]any{"a": "x", "b": int64(1)}},
			"blocks":          []any{map[string]any{"t": int64(2), "k": "static"}},
			"tags":            []any{"b", "z"},
			"hdrs":            map[string]any{"X-Run": "evt-1"},
			"empty":           map[string]any{},
			"<<not scanned>>": "evt-1",
		}, `{"<<not scanned>>":"evt-1","blocks":[{"k":"static","t":2}],"empty":{},"hdrs":{"X-Run":"evt-1"},"list":["the-item",2.5,{"a":"x","b":1}],"tags":["b","z"],"text":"Alert: DiskFull"}`},
		{"toml local date", time.Date(2024, 5, 1, 0, 0, 0, 0, time.FixedZone("date-local", 3600)), "2024-05-01", ""},
		{"toml local time", time.Date(0, 1, 1, 7, 32, 0, 5e8, time.FixedZone("time-local", 0)), "07:32:00.5", ""},
		{"toml local datetime", time.Date(1979, 5, 27, 7, 32, 0, 0, time.FixedZone("datetime-local", 0)), "1979-05-27T07:32:00", ""},
		{"toml datetime", time.Date(1979, 5, 27, 7, 32, 0, 0, time.FixedZone("", -7*3600)), "1979-05-27T07:32:00-07:00", ""},
		{"stringer", stringer{}, "str", ""},
		{"go int leaf", []any{int(4), uint8(5), float32(0.5)}, []any{int64(4), int64(5), 0.5}, "[4,5,0.5]"},
		{"nil leaf", nil, nil, "null"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tm, err := Compile(tt.tmpl)
			if err != nil {
				t.Fatalf("Compile: %v", err)
			}
			got, j, err := checkAgree(t, tm, s)
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Render = %#v, want %#v", got, tt.want)
			}
			want := tt.json
			if want == "" {
				want = string(marshal(t, tt.want))
			}
			if string(j) != want {
				t.Errorf("AppendJSON = %s, want %s", j, want)
			}
		})
	}
}

type stringer struct{}

func (stringer) String() string { return "str" }

func TestRenderErrors(t *testing.T) {
	s := testScope()
	tests := []struct {
		tmpl    string
		missing string // MissingError.Path, or empty for another error
		err     string
	}{
		{"<<steps.x.body.owner>>", "steps.x.body.owner", "missing value for <<steps.x.body.owner>>"},
		{"Owner: <<steps.x.body.owner>>!", "steps.x.body.owner", "missing value for <<steps.x.body.owner>>"},
		{"<< run.id >>", "run.id", "missing value for <<run.id>>"},
		{"<<origin.payload.tags[5]>>", "origin.payload.tags[5]", ""},
		{"<<origin.payload.tags.2>>", "origin.payload.tags.2", ""},
		{"<<origin.payload.alert_name.x>>", "origin.payload.alert_name.x", ""},
		{"<<origin.payload.alert_name[0]>>", "origin.payload.alert_name[0]", ""},
		{"<<origin.payload.nothing.x>>", "origin.payload.nothing.x", ""},
		{"<<origin.payload[0]>>", "origin.payload[0]", ""},
		{"<<origin.payload.tags.x>>", "origin.payload.tags.x", ""},
		{`<<origin.payload.tags["0"]>>`, `origin.payload.tags["0"]`, ""},
		{"<<steps.a ?? steps.b>>", "steps.a ?? steps.b", "missing value for <<steps.a ?? steps.b>>"},
		{"<<result.nan>>", "", "<<result.nan>>: unsupported number NaN"},
		{"x <<result.nan>>", "", "<<result.nan>>: unsupported number NaN"},
		{"<<result.bad>>", "", "<<result.bad>>: unsupported value of type struct {}"},
		{"x <<result.bad>>", "", "<<result.bad>>: unsupported value of type struct {}"},
		{"<<result>>", "", ""},
		{"<<result.badnum>>", "", `<<result.badnum>>: invalid json.Number "1x"`},
		{"x <<result.badnum>>", "", `<<result.badnum>>: invalid json.Number "1x"`},
		{"<<result.badraw>>", "", "<<result.badraw>>: invalid json.RawMessage"},
		{"x <<result.badraw>>", "", "<<result.badraw>>: invalid json.RawMessage"},
	}
	for _, tt := range tests {
		t.Run(tt.tmpl, func(t *testing.T) {
			tm, err := CompileString(tt.tmpl)
			if err != nil {
				t.Fatalf("Compile: %v", err)
			}
			_, _, err = checkAgree(t, tm, s)
			if err == nil {
				t.Fatal("no error")
			}
			var me *MissingError
			if errors.As(err, &me) != (tt.missing != "") || me != nil && me.Path != tt.missing {
				t.Errorf("error %v (%T), want MissingError for %q", err, err, tt.missing)
			}
			if tt.err != "" && err.Error() != tt.err {
				t.Errorf("error %q, want %q", err, tt.err)
			}
		})
	}
}

func TestNilScope(t *testing.T) {
	tm, err := CompileString(`<<steps.x ?? "d">>`)
	if err != nil {
		t.Fatal(err)
	}
	if got, _, err := checkAgree(t, tm, nil); err != nil || got != "d" {
		t.Errorf("Render(nil) = %v, %v", got, err)
	}
}

func TestCyclicValue(t *testing.T) {
	m := map[string]any{}
	m["self"] = m
	tm, err := CompileString("<<item>>")
	if err != nil {
		t.Fatal(err)
	}
	for _, tmpl := range []*Template{tm, mustCompile(t, "x<<item>>")} {
		if _, _, err := checkAgree(t, tmpl, MapScope{"item": m}); !errors.Is(err, errTooDeep) {
			t.Errorf("cyclic value: err %v", err)
		}
	}
	if _, err := Compile(m); !errors.Is(err, errTooDeep) {
		t.Errorf("Compile(cyclic): err %v", err)
	}
}

func mustCompile(t testing.TB, s string) *Template {
	t.Helper()
	tm, err := CompileString(s)
	if err != nil {
		t.Fatal(err)
	}
	return tm
}

func TestCompileErrors(t *testing.T) {
	const roots = "(valid roots: origin, steps, prev, run, chain, result, item, item_index, secrets, failure)"
	tests := []struct {
		tmpl any
		err  string
	}{
		{"<<steps.x", "unterminated placeholder at offset 0"},
		{"ok <<steps.x >", "unterminated placeholder at offset 3"},
		{"<<", "unterminated placeholder at offset 0"},
		{"<<steps.x ??", "unterminated placeholder at offset 0"},
		{"ab <<>>", "empty placeholder at offset 3"},
		{"<< \t >>", "empty placeholder at offset 0"},
		{"<<foo.bar>>", `unknown root "foo" ` + roots + " at offset 2"},
		{"<<Steps.x>>", `unknown root "Steps" ` + roots + " at offset 2"},
		{"<<item-index>>", `unknown root "item-index" ` + roots + " at offset 2"},
		{"<<steps.>>", "expected a name after '.' at offset 8"},
		{"<<steps..x>>", "expected a name after '.' at offset 8"},
		{"<<steps[x]>>", "expected an index or a quoted key after '[' at offset 8"},
		{"<<steps[-1]>>", "expected an index or a quoted key after '[' at offset 8"},
		{"<<steps[0>>", "expected ']' at offset 9"},
		{`<<steps["a">>`, "expected ']' at offset 11"},
		{`<<steps["a>>`, "unterminated string literal at offset 8"},
		{`<<"\x">>`, "invalid string literal at offset 2"},
		{"<<\"a\nb\">>", "invalid string literal at offset 2"},
		{`<<"abc>>`, "unterminated string literal at offset 2"},
		{"<<01>>", "invalid number literal at offset 2"},
		{"<<1.>>", "invalid number literal at offset 2"},
		{"<<-x>>", "invalid number literal at offset 2"},
		{"<<1e>>", "invalid number literal at offset 2"},
		{"<<1x>>", "invalid number literal at offset 2"},
		{"<<1e999>>", "number literal 1e999 out of range at offset 2"},
		{"<<steps[99999999999999999999]>>", "index 99999999999999999999 out of range at offset 8"},
		{"<<steps.99999999999999999999>>", "index 99999999999999999999 out of range at offset 8"},
		{"<<steps.x ??>>", "nothing after ?? at offset 10"},
		{"<<steps.x ?? >>", "nothing after ?? at offset 10"},
		{"<<?? steps.x>>", `unexpected '?', want a path or a JSON literal at offset 2`},
		{"<<steps.x steps.y>>", `unexpected 's', want ?? or >> at offset 10`},
		{"<<steps.x > 1>>", `unexpected '>', want ?? or >> at offset 10`},
		{"<<steps .x>>", `unexpected '.', want ?? or >> at offset 8`},
		{"<<<steps.x>>", `unexpected '<', want a path or a JSON literal at offset 2`},
		{"<<steps.x ?? TRUE>>", `unknown root "TRUE" ` + roots + " at offset 13"},
		{"<<é>>", `unexpected byte 0xc3, want a path or a JSON literal at offset 2`},
		{"fine <<item>> then <<bad", "unterminated placeholder at offset 19"},
		{map[string]any{"text": "<<steps.x"}, "text: unterminated placeholder at offset 0"},
		{map[string]any{"blocks": []any{"ok", map[string]any{"text": "<<>>"}}}, "blocks[1].text: empty placeholder at offset 0"},
		{map[string]any{"a b": map[string]any{"c.d": "<<x>>"}}, `["a b"]["c.d"]: unknown root "x" ` + roots + " at offset 2"},
		{[]any{"<<x>>"}, `[0]: unknown root "x" ` + roots + " at offset 2"},
		{map[string]any{"x": struct{}{}}, "x: unsupported value of type struct {}"},
		{map[string]any{"f": []any{math.Inf(1)}}, "f[0]: unsupported number +Inf"},
		{math.NaN(), "unsupported number NaN"},
		{json.Number("0x1"), `invalid json.Number "0x1"`},
	}
	for _, tt := range tests {
		t.Run(tt.err, func(t *testing.T) {
			tm, err := Compile(tt.tmpl)
			if err == nil {
				t.Fatalf("Compile(%q) succeeded: %#v", tt.tmpl, tm)
			}
			if err.Error() != tt.err {
				t.Errorf("error %q\n         want %q", err, tt.err)
			}
			if s, ok := tt.tmpl.(string); ok {
				var ce *CompileError
				if !errors.As(err, &ce) || ce.Offset < 0 || ce.Offset > len(s) {
					t.Errorf("error %#v is not a CompileError with an offset in range", err)
				}
			}
		})
	}
}

func TestRefs(t *testing.T) {
	tm, err := Compile(map[string]any{
		"b": `<<steps.a-b.body.x[0]>> and <<origin.payload["k k"].y.1 ?? prev.body ?? "d">>`,
		"a": []any{"<<item>>", "static", `<<"lit" ?? run.id>>`},
		"c": int64(1),
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []Ref{
		{Root: "item", Text: "item", Key: "a[0]"},
		{Root: "run", Path: []string{"id"}, Text: "run.id", Key: "a[2]"},
		{Root: "steps", Path: []string{"a-b", "body", "x", "0"}, Text: "steps.a-b.body.x[0]", Key: "b"},
		{Root: "origin", Path: []string{"payload", "k k", "y", "1"}, Text: `origin.payload["k k"].y.1`, HasDefault: true, Key: "b"},
		{Root: "prev", Path: []string{"body"}, Text: "prev.body", HasDefault: true, Key: "b"},
	}
	if got := tm.Refs(); !reflect.DeepEqual(got, want) {
		t.Errorf("Refs =\n%#v\nwant\n%#v", got, want)
	}
	tm.Refs()[0].Root = "changed"
	if tm.Refs()[0].Root != "item" {
		t.Error("Refs exposes internal state")
	}
}

func TestDefaulted(t *testing.T) {
	tests := []struct {
		tmpl any
		want bool
	}{
		{"<<secrets.A>>", false},
		{"plain", false},
		{"Bearer <<secrets.A>> <<secrets.B>>", false},
		{`<<secrets.A ?? "dev">>`, true},
		// A literal first always wins: the path after it is never read.
		{`<<"dev" ?? secrets.A>>`, true},
		// Literal-only placeholders fold into the text, and still count.
		{`Bearer <<"a" ?? "b">>`, true},
		{map[string]any{"k": []any{"x", `<<secrets.A ?? secrets.B>> and <<secrets.C>>`}}, true},
	}
	for _, tc := range tests {
		tm, err := Compile(tc.tmpl)
		if err != nil {
			t.Fatalf("%v: %v", tc.tmpl, err)
		}
		if got := tm.Defaulted(); got != tc.want {
			t.Errorf("%v: Defaulted = %v, want %v", tc.tmpl, got, tc.want)
		}
	}
}

func TestStatic(t *testing.T) {
	tests := []struct {
		tmpl   any
		static bool
	}{
		{"hello", true},
		{`<<"<<">>`, true},
		{`a <<1>> b <<null ?? "x">>`, true},
		{map[string]any{"a": []any{"x", int64(1)}, "b": true}, true},
		{"<<item>>", false},
		{"x <<item ?? 1>>", false},
		{map[string]any{"a": []any{"x", "<<run.id>>"}}, false},
	}
	for _, tt := range tests {
		tm, err := Compile(tt.tmpl)
		if err != nil {
			t.Fatal(err)
		}
		if tm.Static() != tt.static {
			t.Errorf("Static(%v) = %v", tt.tmpl, !tt.static)
		}
		if tt.static {
			// A static template must render without consulting the scope.
			if _, _, err := checkAgree(t, tm, nil); err != nil {
				t.Errorf("static %v: %v", tt.tmpl, err)
			}
		}
	}
}

func TestRenderReturnsFreshContainers(t *testing.T) {
	tm, err := Compile(map[string]any{"a": []any{"x"}, "b": "<<item>>"})
	if err != nil {
		t.Fatal(err)
	}
	s := MapScope{"item": "i"}
	first, _ := tm.Render(s)
	first.(map[string]any)["a"].([]any)[0] = "mutated"
	first.(map[string]any)["c"] = 1
	second, _ := tm.Render(s)
	if want := map[string]any{"a": []any{"x"}, "b": "i"}; !reflect.DeepEqual(second, want) {
		t.Errorf("second Render = %v, want %v", second, want)
	}
}

func TestAppendJSONMatchesEncodingJSON(t *testing.T) {
	strs := []string{"", "plain", "\x00\x1f\x7f", "\"\\/", "<>&", "\u2028\u2029", "日本語", "bad\xffutf8", "\xe2\x28\xa1", "\ufffd"}
	floats := []float64{0, math.Copysign(0, -1), 1, -1.5, 1e20, 1e21, 123456789.125, 1e-6, 9.9e-7, 5e-324, math.MaxFloat64, 0.1 + 0.2}
	for _, v := range []any{strs, floats} {
		tm, err := CompileString("<<item>>")
		if err != nil {
			t.Fatal(err)
		}
		var items []any
		switch x := v.(type) {
		case []string:
			for _, s := range x {
				items = append(items, s)
			}
		case []float64:
			for _, f := range x {
				items = append(items, f)
			}
		}
		for _, item := range items {
			got, err := tm.AppendJSON(nil, MapScope{"item": item})
			if err != nil {
				t.Fatal(err)
			}
			if want := marshal(t, item); !bytes.Equal(got, want) {
				t.Errorf("AppendJSON(%#v) = %s, want %s", item, got, want)
			}
		}
	}
}

func TestConcurrentUse(t *testing.T) {
	tm := benchTemplate(t)
	s := benchScope()
	want, err := tm.AppendJSON(nil, s)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			var buf []byte
			for range 100 {
				var err error
				if buf, err = tm.AppendJSON(buf[:0], s); err != nil || !bytes.Equal(buf, want) {
					t.Errorf("concurrent AppendJSON = %s, %v", buf, err)
					return
				}
				if _, err := tm.Render(s); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

type lazyValue struct {
	v     any
	calls *int
}

func (l lazyValue) Value() any { *l.calls++; return l.v }

func TestLazyValues(t *testing.T) {
	calls := 0
	scope := MapScope{"steps": map[string]any{"s": map[string]any{"body": lazyValue{v: map[string]any{"n": int64(2), "xs": []any{"a"}}, calls: &calls}}}}
	tpl, err := Compile(map[string]any{"n": "<<steps.s.body.n>>", "all": "<<steps.s.body>>", "text": "got <<steps.s.body.xs>>"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := tpl.AppendJSON(nil, scope)
	if err != nil || string(got) != `{"all":{"n":2,"xs":["a"]},"n":2,"text":"got [\"a\"]"}` {
		t.Errorf("AppendJSON = %s, %v", got, err)
	}
	if _, err := tpl.Render(scope); err != nil {
		t.Error(err)
	}
	if calls == 0 {
		t.Error("the lazy value was never asked for")
	}
}

// TestBarePlaceholderCostsNothing checks that a value passed through whole
// is not walked in key order, which only matters when it holds a bad member.
func TestBarePlaceholderCostsNothing(t *testing.T) {
	body := map[string]any{}
	for i := range 64 {
		body[strings.Repeat("k", i+1)] = map[string]any{"n": int64(i), "s": "v", "tags": []any{"a", true}}
	}
	tm, err := CompileString("<<steps.x.body>>")
	if err != nil {
		t.Fatal(err)
	}
	s := MapScope{"steps": map[string]any{"x": map[string]any{"body": body}}}
	if allocs := testing.AllocsPerRun(20, func() {
		if _, err := tm.Render(s); err != nil {
			t.Fatal(err)
		}
	}); allocs != 0 {
		t.Errorf("rendering a 64-key body allocated %v times, want 0", allocs)
	}
}

// TestBadMemberErrorIsStable checks that of several bad members, every
// render names the first in key order, as AppendJSON does.
func TestBadMemberErrorIsStable(t *testing.T) {
	body := map[string]any{}
	for _, k := range []string{"m", "c", "x", "a", "q", "z"} {
		body[k] = json.Number("bad-" + k)
	}
	tm, err := CompileString("<<steps.x.body>>")
	if err != nil {
		t.Fatal(err)
	}
	s := MapScope{"steps": map[string]any{"x": map[string]any{"body": map[string]any{"nested": body, "ok": int64(1)}}}}
	want := `<<steps.x.body>>: invalid json.Number "bad-a"`
	for range 50 {
		if _, err := tm.Render(s); err == nil || err.Error() != want {
			t.Fatalf("error %v, want %s", err, want)
		}
		if _, err := tm.AppendJSON(nil, s); err == nil || err.Error() != want {
			t.Fatalf("AppendJSON error %v, want %s", err, want)
		}
	}
}

// lazyObject hands out its fields one at a time and counts whole reads.
type lazyObject struct {
	fields map[string]any
	whole  *int
}

func (l lazyObject) Value() any { *l.whole++; return l.fields }
func (l lazyObject) Field(name string) (any, bool) {
	v, ok := l.fields[name]
	return v, ok
}

func TestLazyObjectFields(t *testing.T) {
	whole := 0
	scope := MapScope{"origin": map[string]any{"payload": lazyObject{fields: map[string]any{"n": int64(3), "hosts": []any{"a", "b"}}, whole: &whole}}}
	tpl, err := Compile(map[string]any{"n": "<<origin.payload.n>>", "h": "<<origin.payload.hosts[1]>>", "missing": "<<origin.payload.nope ?? \"none\">>"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := tpl.AppendJSON(nil, scope)
	if err != nil || string(got) != `{"h":"b","missing":"none","n":3}` {
		t.Errorf("AppendJSON = %s, %v", got, err)
	}
	if whole != 0 {
		t.Errorf("paths into the object read it whole %d times", whole)
	}
	for _, tc := range []struct {
		src  string
		ok   bool
		path string
	}{
		{"<<origin.payload.hosts>>", true, "payload.hosts"},
		{`<<origin.payload.hosts ?? "none">>`, false, ""},
		{"hosts: <<origin.payload.hosts>>", false, ""},
		{`<<"x">>`, false, ""},
	} {
		tpl, err := CompileString(tc.src)
		if err != nil {
			t.Fatal(err)
		}
		ref, ok := tpl.SinglePath()
		if ok != tc.ok || (ok && ref.Root+"."+strings.Join(ref.Path, ".") != "origin."+tc.path) {
			t.Errorf("SinglePath(%s) = %+v %t", tc.src, ref, ok)
		}
	}
}

func TestWritten(t *testing.T) {
	tpl, err := Compile(map[string]any{
		"host": "<<origin.payload.host>>",
		"args": map[string]any{"dir": "/var/log/<<origin.payload.app>>", "n": int64(3), "a/b": "<<item>>"},
		"list": []any{"x", "<<prev.body ?? 1>>"},
		"lit":  `<<"<<">>`,
	})
	if err != nil {
		t.Fatal(err)
	}
	v, holes := tpl.Written()
	want := map[string]any{
		"host": nil,
		"args": map[string]any{"dir": nil, "n": int64(3), "a/b": nil},
		"list": []any{"x", nil},
		"lit":  "<<",
	}
	if !reflect.DeepEqual(v, want) {
		t.Errorf("value %#v, want %#v", v, want)
	}
	wantHoles := map[string]string{"/host": "<<origin.payload.host>>", "/args/dir": "/var/log/<<origin.payload.app>>", "/args/a~1b": "<<item>>", "/list/1": "<<prev.body ?? 1>>"}
	if !reflect.DeepEqual(holes, wantHoles) {
		t.Errorf("holes %v, want %v", holes, wantHoles)
	}
	whole, _ := Compile("<<origin.payload>>")
	if v, holes := whole.Written(); v != nil || holes[""] != "<<origin.payload>>" {
		t.Errorf("whole: %v %v", v, holes)
	}
}
