package templates

import (
	"testing"
)

func FuzzCompileRender(f *testing.F) {
	for _, seed := range []string{
		"",
		"plain text",
		"<<origin.payload.alert_name>>",
		"Alert: <<origin.payload.alert_name>> (<<steps.check-severity.body.severity>>)",
		"<< steps.slack-alert.body.ok >>",
		"<<origin.payload.tags[1]>><<origin.payload.tags.0>>",
		`<<origin.payload["key with spaces"]>>`,
		"<<origin.payload.obj>> in text <<origin.payload.items>>",
		`<<steps.x.body.owner ?? "ops">>`,
		"<<steps.a ?? steps.b ?? origin.payload.count ?? 5>>",
		`<<"<<">>`,
		`a <<"<<">>b>> c`,
		`<<steps.nope ?? ">> ?? <<">>`,
		"<<origin.payload.inject>>",
		"x <<origin.payload.quote>> y",
		"<<origin.payload.raw>> <<origin.payload.raw.a.0>>",
		"<<origin.payload.rawstr>>",
		"<<origin.payload.num>>",
		"<<result.nan>>",
		"<<result.bad ?? 1>>",
		"<<origin.payload.nothing ?? null>>",
		"<<-0.0e-0>>",
		`<<"\ud800">>`,
		"<<steps.x",
		"<<>>",
		"<<foo>>",
		"<<steps[0]>>",
		"<<steps.x ??>>",
		"\xff<<item>>\xfe",
		"<<item_index>>",
	} {
		f.Add(seed)
	}
	s := testScope()
	f.Fuzz(func(t *testing.T, src string) {
		tm, err := CompileString(src)
		if err != nil {
			return
		}
		checkAgree(t, tm, s)
		for _, r := range tm.Refs() {
			// Every reported path must itself compile to the same path.
			again, err := CompileString("<<" + r.Text + ">>")
			if err != nil {
				t.Fatalf("ref %q does not recompile: %v", r.Text, err)
			}
			if got := again.Refs(); len(got) != 1 || got[0].Root != r.Root || len(got[0].Path) != len(r.Path) {
				t.Fatalf("ref %q recompiles to %#v", r.Text, got)
			}
		}
		// The same string inside a tree must behave the same way.
		tree, err := Compile(map[string]any{"k": src, "a": []any{src, int64(1)}})
		if err != nil {
			t.Fatalf("string compiles alone but not in a tree: %v", err)
		}
		checkAgree(t, tree, s)
	})
}
