package server_test

import (
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/chaingate/gateway/gateway/authz"
	"github.com/chaingate/gateway/gateway/server"
)

// seamRecorder stands in for the authorization seam's rule: it notes every
// question and refuses them all, reads too unless allowRead.
type seamRecorder struct {
	mu        sync.Mutex
	asked     []seamQuestion
	allowRead bool
}

type seamQuestion struct {
	sub    authz.Subject
	action authz.Action
	target authz.Target
}

func (r *seamRecorder) decide(s authz.Subject, a authz.Action, t authz.Target) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked = append(r.asked, seamQuestion{s, a, t})
	if a == authz.Read && r.allowRead {
		return nil
	}
	return &authz.Denied{Subject: s, Action: a, Target: t, Missing: "refused by the test's rule"}
}

// take returns the questions asked since the last take.
func (r *seamRecorder) take() []seamQuestion {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.asked
	r.asked = nil
	return out
}

func recordSeam(srv *server.Server) *seamRecorder {
	rec := &seamRecorder{}
	srv.SetDecide(rec.decide)
	return rec
}

// TestEveryRouteAsksTheSeam sends a full token to every route of the API:
// each but the health checks and the routes that check their own
// credential asks the authorization seam once, for the action the route
// declares, as the token's holder, and is refused with the seam's reason
// before it acts. Every route that changes something declares an action
// other than read.
func TestEveryRouteAsksTheSeam(t *testing.T) {
	t.Parallel()
	env := newActionsAPI(t, "[gateway.auth]\ntokens = [{ name = \"alice\", token = \"write-tok\" }]\n")
	env.token = "write-tok"
	rec := recordSeam(env.srv)
	fill := strings.NewReplacer("{name}", "deploy", "{id}", "r1", "{step}", "ask", "{key...}", "ask", "{kind}", "trigger")
	own := map[string]bool{"GET /healthz": true, "GET /readyz": true, "POST /v1/triggers/{name}": true, "POST /v1/slack/interactions": true}
	for _, rt := range env.srv.Routes() {
		method, pattern, _ := strings.Cut(rt.Pattern, " ")
		if rt.Action == "" {
			if !own[rt.Pattern] {
				t.Errorf("%s asks the seam nothing and is not one of the routes that check their own credential", rt.Pattern)
			}
			continue
		}
		if method != http.MethodGet && rt.Action == authz.Read {
			t.Errorf("%s changes something and asks only to read", rt.Pattern)
		}
		path := fill.Replace(pattern)
		code, _, body := env.call(method, path, "{}", nil, nil)
		asked := rec.take()
		if code != http.StatusForbidden || !strings.Contains(body, "refused by the test's rule") {
			t.Errorf("%s %s: %d %s, want the seam's 403", method, path, code, body)
		}
		if len(asked) != 1 || asked[0].action != rt.Action || asked[0].sub.Name != "alice" || asked[0].sub.Kind != authz.Token || !asked[0].sub.Write {
			t.Errorf("%s asked the seam %+v, want once for %q as alice's full token", rt.Pattern, asked, rt.Action)
		}
	}

	// A trigger delivery asks to deliver to that trigger.
	code, _, body := env.call("POST", "/v1/triggers/deploys", `{"host": "web-1"}`, nil, nil)
	if asked := rec.take(); code != http.StatusForbidden || len(asked) != 1 || asked[0].action != authz.Deliver || asked[0].target != (authz.Target{Kind: authz.OnTrigger, Name: "deploys"}) {
		t.Errorf("a delivery: %d %s, asked %+v", code, body, asked)
	}

	// The console's actions ask the same seam, as the signed-in token.
	rec.mu.Lock()
	rec.allowRead = true
	rec.mu.Unlock()
	b := newBrowser(t, env)
	b.post("/ui/login", url.Values{"token": {"write-tok"}})
	b.get("/ui/chains")
	rec.take()
	for _, a := range []struct {
		path   string
		form   url.Values
		action authz.Action
		target authz.Target
	}{
		{"/ui/runs/r1/cancel", url.Values{}, authz.Cancel, authz.Target{Kind: authz.OnRun, Name: "r1"}},
		{"/ui/runs/r1/answer/ask", url.Values{"decision": {"approve"}}, authz.Approve, authz.Target{Kind: authz.OnRun, Name: "r1"}},
		{"/ui/dlq/d1/replay", url.Values{}, authz.Replay, authz.Target{Kind: authz.OnDLQ, Name: "d1"}},
		{"/ui/chains/deploy/run", url.Values{"field.host": {"web-1"}}, authz.Start, authz.Target{Kind: authz.OnChain, Name: "deploy"}},
		{"/ui/pauses/trigger/deploys", url.Values{"action": {"pause"}}, authz.Pause, authz.Target{Kind: authz.OnTrigger, Name: "deploys"}},
	} {
		code, _, body := b.post(a.path, a.form)
		asked := rec.take()
		if code != http.StatusForbidden || !strings.Contains(body, "refused by the test") {
			t.Errorf("the console's %s: %d, want the seam's 403:\n%s", a.path, code, body)
		}
		if len(asked) != 1 || asked[0].action != a.action || asked[0].target != a.target || asked[0].sub.Name != "alice" {
			t.Errorf("the console's %s asked the seam %+v, want once for %q on %v as alice", a.path, asked, a.action, a.target)
		}
	}
}

// TestSlackAnswerAsksTheSeam: an answer clicked in Slack, signed and from a
// user the config names, asks the seam to approve on the run as that
// person, and is not recorded when refused.
func TestSlackAnswerAsksTheSeam(t *testing.T) {
	t.Setenv("CHAINGATE_SECRET_SLACK_SIGNING_SECRET", slackSigningSecret)
	env := newAPI(t, slackApprovalConfig)
	rec := recordSeam(env.srv)
	if code, body := postSigned(t, env, slackClick(t, "", "U0ALICE1", "chaingate:approve", "r1/ask", nil)); code != http.StatusOK {
		t.Fatalf("the click: %d %s", code, body)
	}
	asked := rec.take()
	if len(asked) != 1 || asked[0].action != authz.Approve || asked[0].target != (authz.Target{Kind: authz.OnRun, Name: "r1"}) || !reflect.DeepEqual(asked[0].sub, authz.Subject{Kind: authz.Slack, Name: "alice"}) {
		t.Errorf("the click asked the seam %+v, want once to approve on run r1 as alice", asked)
	}
}
