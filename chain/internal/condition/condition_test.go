package condition_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/chaingate/gateway/chain/internal/condition"
)

var roots = []string{"origin", "steps", "prev", "run", "chain", "result"}

func env() condition.Env {
	var e condition.Env
	_ = json.Unmarshal([]byte(`{
		"origin": {"payload": {"env": "prod", "tags": ["db", "disk"]}},
		"steps": {
			"slack-alert": {"status": "succeeded", "body": {"ok": true, "ts": "1.2"}},
			"check": {"status": "succeeded", "body": {"count": 5, "x-y": 1}}
		},
		"prev": {"body": {"count": 5}},
		"result": {"status": "succeeded", "body": {"score": 91, "severity": "critical", "owner": null}}
	}`), &e)
	return e
}

func TestExpr(t *testing.T) {
	tests := []struct {
		src   string
		want  bool
		steps []string
	}{
		{`origin.payload.env != "test"`, true, nil},
		{`steps.slack-alert.body.ok == true`, true, []string{"slack-alert"}},
		{`steps.slack-alert.status == "succeeded" && steps.check.body.count > 3`, true, []string{"slack-alert", "check"}},
		{`result.body.score > 80 && origin.payload.env == "prod"`, true, nil},
		{`prev.body.count-1 == 4`, true, nil},   // subtraction without spaces after a digit
		{`prev.body.count - 1 == 4`, true, nil}, // and with spaces
		{`steps.check.body?.x-y == 1`, true, []string{"check"}},
		{`"disk" in origin.payload.tags`, true, nil},
		{`(result.body.owner ?? "ops") == "ops"`, true, nil},
		{`'steps.a-b' == "steps.a-b"`, true, nil}, // no rewriting inside strings
		{`result.body.severity in ["critical", "major"]`, true, nil},
	}
	for _, tc := range tests {
		e, err := condition.CompileExpr(tc.src, roots)
		if err != nil {
			t.Errorf("%s: %v", tc.src, err)
			continue
		}
		got, err := e.Eval(env())
		if err != nil || got != tc.want {
			t.Errorf("%s = %v, %v; want %v", tc.src, got, err, tc.want)
		}
		if strings.Join(e.StepRefs(), ",") != strings.Join(tc.steps, ",") {
			t.Errorf("%s: step refs %v, want %v", tc.src, e.StepRefs(), tc.steps)
		}
	}
}

func TestExprErrors(t *testing.T) {
	tests := []struct{ src, compileErr, evalErr string }{
		{``, "empty", ""},
		{`origin.payload.env !=`, "parsing condition", ""},
		{`unknown.x == 1`, "unknown name unknown", ""},
		{`"text"`, "expected bool", ""},
		{`result.body.missing.deeper == 1`, "", "cannot fetch deeper"},
		{`result.body.severity > 3`, "", "evaluating condition"},
	}
	for _, tc := range tests {
		e, err := condition.CompileExpr(tc.src, roots)
		if tc.compileErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.compileErr) {
				t.Errorf("%q: compile error %v, want %q", tc.src, err, tc.compileErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.src, err)
			continue
		}
		if _, err := e.Eval(env()); err == nil || !strings.Contains(err.Error(), tc.evalErr) {
			t.Errorf("%q: eval error %v, want %q", tc.src, err, tc.evalErr)
		}
	}
}

func TestField(t *testing.T) {
	tests := []struct {
		field, op string
		value     any
		want      bool
	}{
		{"body.severity", "eq", "critical", true},
		{"body.severity", "neq", "critical", false},
		{"body.score", "eq", int64(91), true},
		{"body.score", "eq", 91.0, true},
		{"body.score", "gt", int64(80), true},
		{"body.score", "lt", int64(80), false},
		{"body.score", "gte", int64(91), true},
		{"body.score", "lte", int64(90), false},
		{"body.severity", "gt", "alpha", true},
		{"body.severity", "contains", "crit", true},
		{"body.severity", "exists", nil, true},
		{"body.nothing", "exists", nil, false},
		{"body.nothing", "exists", false, true},
		{"body.nothing", "eq", "x", false},
		{"body.nothing", "neq", "x", false},
		{"body.owner", "eq", nil, false}, // compile rejects a missing value; see TestFieldErrors
		{"status", "eq", "succeeded", true},
	}
	for _, tc := range tests {
		f, err := condition.CompileField(tc.field, tc.op, tc.value)
		if tc.value == nil && tc.op != "exists" {
			if err == nil {
				t.Errorf("%s %s <nil>: compiled without a value", tc.field, tc.op)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s %s %v: %v", tc.field, tc.op, tc.value, err)
			continue
		}
		got, err := f.Eval(env())
		if err != nil || got != tc.want {
			t.Errorf("%s %s %v = %v, %v; want %v", tc.field, tc.op, tc.value, got, err, tc.want)
		}
	}
}

func TestFieldContainsArray(t *testing.T) {
	f, err := condition.CompileField("body.tags", "contains", "disk")
	if err != nil {
		t.Fatal(err)
	}
	ok, err := f.Eval(condition.Env{"result": map[string]any{"body": map[string]any{"tags": []any{"db", "disk"}}}})
	if !ok || err != nil {
		t.Errorf("contains on an array: %v %v", ok, err)
	}
}

func TestFieldErrors(t *testing.T) {
	tests := []struct {
		field, op string
		value     any
		want      string
	}{
		{"output.x", "eq", "a", "must start with body"},
		{"body.x", "equals", "a", "unknown operator"},
		{"body.x", "exists", "yes", "true or false"},
		{"body.x", "gt", true, "compares numbers or strings"},
		{"body.x[", "eq", 1, "unclosed"},
		{"", "eq", 1, "empty path"},
	}
	for _, tc := range tests {
		if _, err := condition.CompileField(tc.field, tc.op, tc.value); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q %s %v: %v, want %q", tc.field, tc.op, tc.value, err, tc.want)
		}
	}
	f, _ := condition.CompileField("body.severity", "gt", int64(1))
	if _, err := f.Eval(env()); err == nil {
		t.Error("ordering a string against a number did not fail")
	}
}

func TestParsePath(t *testing.T) {
	tests := map[string]string{
		"body.items[0].name":  "body items 0 name",
		"body.items.0.name":   "body items 0 name",
		"body.m[1][2]":        "body m 1 2",
		"body.slack-alert.ok": "body slack-alert ok",
	}
	for in, want := range tests {
		got, err := condition.ParsePath(in)
		if err != nil || strings.Join(got, " ") != want {
			t.Errorf("%s: %v %v, want %s", in, got, err, want)
		}
	}
}

func FuzzExpr(f *testing.F) {
	for _, s := range []string{
		`origin.payload.env != "test"`, `steps.slack-alert.body.ok`, `result.body.score > 80 && x`,
		`prev.body.count-1 > 2`, `a?.b-c`, `'x' + "y"`, "`raw`", `steps["a-b"].x`, `.a-b`, `1..2`,
		`steps[origin.payload.x].body.y`, `origin?.payload?.a[0].b`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		e, err := condition.CompileExpr(src, roots)
		if err != nil {
			return
		}
		for _, p := range e.Paths() {
			if p.Root == "" || !strings.HasPrefix(p.String(), p.Root) {
				t.Fatalf("%q: path %+v", src, p)
			}
		}
		_, _ = e.Eval(env())
	})
}

func FuzzField(f *testing.F) {
	f.Add("body.x[0]", "eq", "v")
	f.Add("status", "contains", "succ")
	f.Add("body..x", "gt", "1")
	f.Fuzz(func(t *testing.T, field, op, value string) {
		c, err := condition.CompileField(field, op, value)
		if err != nil {
			return
		}
		_, _ = c.Eval(env())
	})
}

func TestPaths(t *testing.T) {
	tests := []struct {
		src  string
		want []string
	}{
		{`origin.payload.env != "test"`, []string{"origin.payload.env"}},
		{`steps.slack-alert.body.ok && steps.slack-alert.status == "ok"`, []string{"steps.slack-alert.body.ok", "steps.slack-alert.status"}},
		{`origin.payload.tags[0] == "db" && origin.payload.env == "x"`, []string{"origin.payload.tags[0]", "origin.payload.env"}},
		{`steps.check.body?.x-y == 1`, []string{"steps.check.body.x-y"}},
		{`steps[origin.payload.env].body.x`, []string{"origin.payload.env", "steps"}},
		{`len(prev.body.items) > 0 && item_index > 2`, []string{"prev.body.items"}},
		{`origin.payload.env == origin.payload.env`, []string{"origin.payload.env"}},
	}
	for _, tc := range tests {
		e, err := condition.CompileExpr(tc.src, append(roots, "item_index"))
		if err != nil {
			t.Errorf("%s: %v", tc.src, err)
			continue
		}
		var got []string
		for _, p := range e.Paths() {
			got = append(got, p.String())
		}
		if strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("%s: paths %q, want %q", tc.src, got, tc.want)
		}
	}
}
