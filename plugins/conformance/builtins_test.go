package conformance_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/chaingate/gateway/plugins/conformance"
	"github.com/chaingate/gateway/providers/builtin"
)

// builtinRows says how to check each built-in provider: the options, with
// whatever local server its payloads need started by setup. Every built-in
// type must have a row.
var builtinRows = []struct {
	typ   string
	setup func(t *testing.T) conformance.Options
}{
	{"echo", func(*testing.T) conformance.Options {
		return conformance.Options{
			AcceptsAnyPayload: true, // echo answers with whatever it is sent
			Payloads:          map[string]json.RawMessage{"echo": json.RawMessage(`{"text": "hello"}`)},
		}
	}},
	{"faulty", func(*testing.T) conformance.Options {
		return conformance.Options{
			AcceptsAnyPayload: true, // a payload that is not an object has no controls
			Payloads:          map[string]json.RawMessage{"succeed": json.RawMessage(`{"note": "no faults asked for"}`)},
		}
	}},
	{"http", func(t *testing.T) conformance.Options {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"ok": true}`))
		}))
		t.Cleanup(srv.Close)
		return conformance.Options{
			Config:   json.RawMessage(`{"base_url": "` + srv.URL + `"}`),
			Payloads: map[string]json.RawMessage{"get": json.RawMessage(`{"url": "/healthz"}`)},
		}
	}},
}

// TestBuiltinsConform puts every built-in provider through the checklist.
func TestBuiltinsConform(t *testing.T) {
	var covered []string
	for _, row := range builtinRows {
		covered = append(covered, row.typ)
		t.Run(row.typ, func(t *testing.T) {
			t.Parallel()
			r := conformance.Check(t.Context(), conformance.Target{Builtin: row.typ}, row.setup(t))
			var text strings.Builder
			_ = r.WriteText(&text)
			if !r.OK() {
				t.Errorf("the built-in %s provider does not conform:\n%s", row.typ, text.String())
			}
			for _, res := range r.Results {
				if res.Status == conformance.Skip && res.Check != "config" {
					t.Errorf("%s was skipped: %s\n%s", res.Check, res.Detail, text.String())
				}
			}
		})
	}
	for _, typ := range builtin.Types() {
		if !slices.Contains(covered, typ) {
			t.Errorf("built-in type %q has no row in builtinRows", typ)
		}
	}
}
