package server_test

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/chaingate/gateway/chain/store"
)

// TestFourEyes: who started a run cannot answer its four-eyes step —
// through the API, the console or Slack, each refusal the same and in the
// audit log — nor can someone the step does not name; another approver
// can, from Slack.
func TestFourEyes(t *testing.T) {
	t.Setenv("CHAINGATE_SECRET_SLACK_SIGNING_SECRET", slackSigningSecret)
	cfg := strings.Replace(slackApprovalConfig, `tokens = [{ name = "ops", token = "ops-tok" }]`,
		`tokens = [{ name = "alice", token = "alice-tok" }, { name = "bob", token = "bob-tok" }, { name = "carol", token = "carol-tok" }]`, 1)
	cfg = strings.Replace(cfg, `approval = { message = "Restart <<origin.payload.host>>?" }`,
		`approval = { message = "Restart <<origin.payload.host>>?", four_eyes = true, approvers = ["alice", "bob", "group:dba"] }`, 1)
	env := newAPI(t, cfg)
	slack := newFakeSlack(t, env)
	responseURL := slack.srv.URL + "/actions/T0TEAM/1234/abcd"
	env.token = "alice-tok"
	id := startRun(t, env, "restart-db", `{"host": "db-1"}`)
	waitAsking(t, env, id, "ask")
	signal := "/v1/runs/" + id + "/signals/ask"

	n := len(auditLog(t, env))
	code, _, body := env.call("POST", signal, `{"decision": "approve"}`, nil, nil)
	if code != http.StatusForbidden || !strings.Contains(body, "not_an_approver") || !strings.Contains(body, "four eyes: alice started this run") {
		t.Errorf("alice approving her own run through the API: %d %s", code, body)
	}
	if got := newAuditEntries(t, env, n); len(got) != 1 || got[0].Outcome != store.AuditDenied || got[0].Subject != "alice" || !strings.Contains(got[0].Detail, "four eyes") {
		t.Errorf("the API's refusal recorded %+v", got)
	}

	b := newBrowser(t, env)
	b.post("/ui/login", url.Values{"token": {"alice-tok"}})
	b.get("/ui/runs/" + id)
	n = len(auditLog(t, env))
	if code, _, body := b.post("/ui/runs/"+id+"/answer/ask", url.Values{"decision": {"approve"}}); code != http.StatusForbidden || !strings.Contains(body, "four eyes: alice started this run") {
		t.Errorf("alice approving in the console: %d\n%.600s", code, body)
	}
	if got := newAuditEntries(t, env, n); len(got) != 1 || got[0].Outcome != store.AuditDenied || got[0].EntryPoint != "console" {
		t.Errorf("the console's refusal recorded %+v", got)
	}

	n = len(auditLog(t, env))
	if code, body := postSigned(t, env, slackClick(t, responseURL, "U0ALICE1", "chaingate:approve", id+"/ask", nil)); code != http.StatusOK {
		t.Fatalf("alice's click: %d %s", code, body)
	}
	if reply := slack.reply(t); !strings.Contains(fmt.Sprint(reply["text"]), "four eyes: alice started this run") {
		t.Errorf("alice was told in Slack %q", reply["text"])
	}
	if got := newAuditEntries(t, env, n); len(got) != 1 || got[0].Outcome != store.AuditDenied || got[0].EntryPoint != "slack" {
		t.Errorf("Slack's refusal recorded %+v", got)
	}

	env.token = "carol-tok"
	if code, _, body := env.call("POST", signal, `{"decision": "approve"}`, nil, nil); code != http.StatusForbidden || !strings.Contains(body, "carol is not among the step's approvers (alice, bob, group:dba)") {
		t.Errorf("carol approving: %d %s", code, body)
	}

	if code, body := postSigned(t, env, slackClick(t, responseURL, "U0BOB2", "chaingate:approve", id+"/ask", nil)); code != http.StatusOK {
		t.Fatalf("bob's click: %d %s", code, body)
	}
	slack.reply(t)
	env.token = "bob-tok"
	if v := waitRunEnd(t, env, id); v.Status != string(store.RunSucceeded) || !strings.Contains(string(v.Body), "bob (Slack)") {
		t.Errorf("after bob's approval the run is %s: %s", v.Status, v.Body)
	}
}
