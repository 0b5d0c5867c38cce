package console

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/chaingate/gateway/gateway/authz"
)

// TestEveryActionAsksForWhatItDoes: every console route asks the
// authorization seam, and every form that changes something asks for the
// action it takes, on the run, dead letter, chain, trigger or schedule its
// path names; none asks only to read.
func TestEveryActionAsksForWhatItDoes(t *testing.T) {
	want := map[string]struct {
		action authz.Action
		target authz.Target
	}{
		"POST /runs/{id}/cancel":         {authz.Cancel, authz.Target{Kind: authz.OnRun, Name: "r1"}},
		"POST /runs/{id}/replay":         {authz.Replay, authz.Target{Kind: authz.OnRun, Name: "r1"}},
		"POST /runs/{id}/delete":         {authz.Delete, authz.Target{Kind: authz.OnRun, Name: "r1"}},
		"POST /runs/{id}/answer/{step}":  {authz.Approve, authz.Target{Kind: authz.OnRun, Name: "r1"}},
		"POST /runs/{id}/redrive/{step}": {authz.Redrive, authz.Target{Kind: authz.OnRun, Name: "r1"}},
		"POST /dlq/{id}/replay":          {authz.Replay, authz.Target{Kind: authz.OnDLQ, Name: "r1"}},
		"POST /dlq/{id}/delete":          {authz.Delete, authz.Target{Kind: authz.OnDLQ, Name: "r1"}},
		"POST /dlq-bulk":                 {authz.Delete, authz.Target{Kind: authz.OnDLQ}},
		"POST /chains/{name}/run":        {authz.Start, authz.Target{Kind: authz.OnChain, Name: "n1"}},
		"POST /pauses/{kind}/{name}":     {authz.Pause, authz.Target{Kind: authz.OnTrigger, Name: "n1"}},
		"POST /logout":                   {"", authz.Target{}},
	}
	c := &console{}
	seen := map[string]bool{}
	for _, rt := range c.routes() {
		if rt.ask == nil || rt.handler == nil {
			t.Errorf("%s: no question for the seam, or no handler", rt.pattern)
			continue
		}
		method, path, _ := strings.Cut(rt.pattern, " ")
		target := strings.NewReplacer("{id}", "r1", "{name}", "n1", "{kind}", "trigger", "{step}", "s1", "{key...}", "k1", "{$}", "").Replace(path)
		form := url.Values{"action": {"purge"}}
		req := httptest.NewRequest(method, target, strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		// Path values as the mux sets them.
		mux := http.NewServeMux()
		var a authz.Action
		var tgt authz.Target
		mux.HandleFunc(rt.pattern, func(_ http.ResponseWriter, r *http.Request) { a, tgt = rt.ask(r) })
		mux.ServeHTTP(httptest.NewRecorder(), req)
		if method == http.MethodGet {
			// Reading the audit log is an admin's action; every other page
			// only reads.
			if rt.pattern == "GET /audit" && a != authz.Admin || rt.pattern != "GET /audit" && a != authz.Read {
				t.Errorf("%s asks %q", rt.pattern, a)
			}
			continue
		}
		seen[rt.pattern] = true
		w, ok := want[rt.pattern]
		if !ok {
			t.Errorf("%s changes something and this test does not know what it should ask", rt.pattern)
			continue
		}
		if a != w.action || tgt != w.target {
			t.Errorf("%s asks %q on %v, want %q on %v", rt.pattern, a, tgt, w.action, w.target)
		}
	}
	for p := range want {
		if !seen[p] {
			t.Errorf("%s is no longer a console route", p)
		}
	}
}
