package server_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway/authz"
)

// auditLog reads every entry of env's audit log, oldest first.
func auditLog(t *testing.T, env *apiEnv) []*store.AuditEntry {
	t.Helper()
	var out []*store.AuditEntry
	err := env.gw.Store.WalkAudit(context.Background(), store.AuditScan{Oldest: true}, func(e *store.AuditEntry) (bool, error) {
		out = append(out, e)
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// newAuditEntries is what the log gained since it held n entries.
func newAuditEntries(t *testing.T, env *apiEnv, n int) []*store.AuditEntry {
	t.Helper()
	all := auditLog(t, env)
	return all[n:]
}

// TestEveryWriteRouteIsAudited sends every API route that may change
// something, as a full token and as a read token: each attempt appends
// exactly one entry, naming the route, the way in, who asked from where,
// and what came of it (ok, failed with the answer's status and message, or
// denied with what was missing).
func TestEveryWriteRouteIsAudited(t *testing.T) {
	t.Parallel()
	env := newActionsAPI(t, `[gateway.auth]
tokens = [{ name = "alice", token = "write-tok" }]
read_tokens = [{ name = "dash", token = "read-tok" }]
`)
	fill := strings.NewReplacer("{name}", "deploy", "{id}", "r1", "{step}", "ask", "{key...}", "ask", "{kind}", "trigger")
	checked := 0
	for _, rt := range env.srv.Routes() {
		method, pattern, _ := strings.Cut(rt.Pattern, " ")
		if rt.Action == "" || rt.Action == authz.Read {
			continue
		}
		path := fill.Replace(pattern)
		for _, who := range []struct{ token, name string }{{"write-tok", "alice"}, {"read-tok", "dash"}} {
			n := len(auditLog(t, env))
			env.token = who.token
			code, _, body := env.call(method, path, "{}", nil, nil)
			got := newAuditEntries(t, env, n)
			if len(got) != 1 {
				t.Errorf("%s as %s (%d): %d audit entries, want 1", rt.Pattern, who.name, code, len(got))
				continue
			}
			e := got[0]
			want := store.AuditOK
			switch {
			case code == http.StatusForbidden:
				want = store.AuditDenied
			case code >= 400:
				want = store.AuditFailed
			}
			if e.Outcome != want || e.Status != code || e.Subject != who.name || e.SubjectKind != "token" || e.EntryPoint != "api" ||
				e.Route != rt.Pattern || e.Action != string(rt.Action) || e.Address != "127.0.0.1" {
				t.Errorf("%s as %s answered %d %.200s; recorded %+v", rt.Pattern, who.name, code, body, e)
			}
			if want != store.AuditOK && e.Detail == "" {
				t.Errorf("%s as %s: the %s entry says not why", rt.Pattern, who.name, want)
			}
			checked++
		}
	}
	if checked < 20 {
		t.Fatalf("only %d attempts checked; the route table lists fewer write routes than expected", checked)
	}

	// A start records the run it started; a delivery its trigger.
	env.token = "write-tok"
	n := len(auditLog(t, env))
	id := startRun(t, env, "deploy", `{"host": "web-1"}`)
	if got := newAuditEntries(t, env, n); len(got) != 1 || got[0].Run != id || got[0].Chain != "deploy" || got[0].Outcome != store.AuditOK {
		t.Errorf("a start recorded %+v, want run %s of chain deploy", got, id)
	}
	n = len(auditLog(t, env))
	env.call("POST", "/v1/triggers/deploys", `{"host": "web-2"}`, nil, nil)
	if got := newAuditEntries(t, env, n); len(got) != 1 || got[0].EntryPoint != "trigger" || got[0].Trigger != "deploys" || got[0].Action != "deliver" || got[0].Run == "" {
		t.Errorf("a delivery recorded %+v", got)
	}

	// The console's actions are recorded as the console's.
	b := newBrowser(t, env)
	b.post("/ui/login", url.Values{"token": {"write-tok"}})
	b.get("/ui/chains")
	n = len(auditLog(t, env))
	if code, _, body := b.post("/ui/runs/"+id+"/cancel", url.Values{}); code >= 400 {
		t.Fatalf("cancelling in the console: %d %s", code, body)
	}
	if got := newAuditEntries(t, env, n); len(got) != 1 || got[0].EntryPoint != "console" || got[0].Route != "POST /ui/runs/{id}/cancel" || got[0].Run != id || got[0].Chain != "deploy" || got[0].Subject != "alice" {
		t.Errorf("a cancel in the console recorded %+v", got)
	}
}
