package templates

import (
	"testing"
)

// benchTemplate is a typical notification payload.
func benchTemplate(tb testing.TB) *Template {
	tb.Helper()
	tm, err := Compile(map[string]any{
		"channel":  "#ops-alerts",
		"text":     "Alert: <<origin.payload.alert_name>> (<<steps.check-severity.body.severity>>)",
		"severity": "<<steps.check-severity.body>>",
		"notify":   true,
	})
	if err != nil {
		tb.Fatal(err)
	}
	return tm
}

func benchScope() MapScope {
	return MapScope{
		"origin": map[string]any{
			"id":      "evt-1",
			"payload": map[string]any{"alert_name": "DiskFull", "host": "db-1"},
		},
		"steps": map[string]any{
			"check-severity": map[string]any{
				"status": "succeeded",
				"body":   map[string]any{"severity": "high", "score": 0.93},
			},
		},
	}
}

func BenchmarkRender(b *testing.B) {
	tm, s := benchTemplate(b), benchScope()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tm.Render(s); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAppendJSON(b *testing.B) {
	tm, s := benchTemplate(b), benchScope()
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if buf, err = tm.AppendJSON(buf[:0], s); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRenderWholeBody renders a placeholder that passes a 64-key
// step body through whole, as sub-chain inputs and split items do.
func BenchmarkRenderWholeBody(b *testing.B) {
	body := map[string]any{}
	for i := range 64 {
		body["key-"+string(rune('a'+i%26))+string(rune('a'+i/26))] = map[string]any{"n": int64(i), "s": "v"}
	}
	tm, err := CompileString("<<steps.x.body>>")
	if err != nil {
		b.Fatal(err)
	}
	s := MapScope{"steps": map[string]any{"x": map[string]any{"body": body}}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tm.Render(s); err != nil {
			b.Fatal(err)
		}
	}
}
