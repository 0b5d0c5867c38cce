package server_test

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/chaingate/gateway/chain/store"
)

const rolesConfig = `[gateway.auth]
tokens = [
  { name = "root", token = "root-tok" },
  { name = "dep", token = "dep-tok", roles = ["deployer"] },
  { name = "chg", token = "chg-tok", roles = ["changer"] },
]

[gateway.auth.roles.deployer]
grants = [
  { actions = ["read", "start", "cancel", "replay", "delete"], chains = ["deploy"] },
  { actions = ["pause"], triggers = ["deploys"] },
]

[gateway.auth.roles.changer]
grants = [
  { actions = ["read", "start", "approve", "cancel"], chains = ["change", "restart-*"] },
  { actions = ["pause"], schedules = ["nightly-*"] },
  { actions = ["backup"] },
]
`

// TestRolesMatrix asks, through the API, for each action on each kind of
// target, as a token whose role grants it and as one whose role does not:
// the one gets its answer, the other a 403 naming what was missing, and the
// audit log has one entry per attempt that changes something or is refused.
func TestRolesMatrix(t *testing.T) {
	t.Parallel()
	env := newActionsAPI(t, rolesConfig)
	env.token = "root-tok"
	deployRun := startWait(t, env, "deploy", `{"host": "web-1"}`)
	changeRun := startRun(t, env, "change", `{"what": "dns"}`)
	waitAsking(t, env, changeRun, "approve-change")

	tests := []struct {
		token, method, path, body string
		allowed                   bool
	}{
		{"dep-tok", "POST", "/v1/chains/deploy/runs", `{"host": "web-2"}`, true},
		{"dep-tok", "POST", "/v1/chains/change/runs", `{"what": "x"}`, false},
		{"chg-tok", "POST", "/v1/chains/change/runs", `{"what": "y"}`, true},
		{"chg-tok", "POST", "/v1/chains/restart-db/runs", `{"host": "db-2"}`, true},
		{"chg-tok", "POST", "/v1/chains/deploy/runs", `{"host": "web-3"}`, false},
		{"dep-tok", "GET", "/v1/runs/" + deployRun, "", true},
		{"dep-tok", "GET", "/v1/runs/" + changeRun, "", false},
		{"chg-tok", "GET", "/v1/runs/" + changeRun, "", true},
		{"chg-tok", "GET", "/v1/runs/" + deployRun + "/dag", "", false},
		{"dep-tok", "GET", "/v1/runs?chain=deploy", "", true},
		{"dep-tok", "GET", "/v1/runs?chain=change", "", false},
		{"dep-tok", "GET", "/v1/runs", "", false},
		{"root-tok", "GET", "/v1/runs", "", true},
		{"dep-tok", "POST", "/v1/runs/" + changeRun + "/signals/approve-change", `{"decision": "approve"}`, false},
		{"dep-tok", "POST", "/v1/runs/" + changeRun + "/cancel", "", false},
		{"chg-tok", "POST", "/v1/runs/" + changeRun + "/signals/approve-change", `{"decision": "approve"}`, true},
		{"chg-tok", "POST", "/v1/runs/" + deployRun + "/replay", `{"mode": "restart"}`, false},
		{"dep-tok", "POST", "/v1/runs/" + deployRun + "/replay", `{"mode": "restart"}`, true},
		{"chg-tok", "DELETE", "/v1/runs/" + deployRun, "", false},
		{"dep-tok", "DELETE", "/v1/runs/" + deployRun, "", true},
		{"chg-tok", "POST", "/v1/pauses/trigger/deploys", `{"reason": "x"}`, false},
		{"dep-tok", "POST", "/v1/pauses/trigger/deploys", `{"reason": "deploy freeze"}`, true},
		{"dep-tok", "DELETE", "/v1/pauses/trigger/deploys", "", true},
		{"dep-tok", "POST", "/v1/pauses/schedule/nightly-restart", `{"reason": "x"}`, false},
		{"chg-tok", "POST", "/v1/pauses/schedule/nightly-restart", `{"reason": "change window"}`, true},
		{"dep-tok", "POST", "/v1/admin/backup", "", false},
		{"chg-tok", "POST", "/v1/admin/backup", "", true},
		{"dep-tok", "POST", "/v1/admin/reload", "", false},
		{"root-tok", "POST", "/v1/admin/reload", "", true},
		{"chg-tok", "GET", "/v1/audit", "", false},
		{"root-tok", "GET", "/v1/audit", "", true},
		{"dep-tok", "POST", "/v1/dlq/replay", `{"all": true}`, false},
		{"dep-tok", "POST", "/v1/runs/prune", `{"older_than": "30d"}`, false},
	}
	names := map[string]string{"root-tok": "root", "dep-tok": "dep", "chg-tok": "chg"}
	for _, tc := range tests {
		n := len(auditLog(t, env))
		env.token = tc.token
		code, _, body := env.call(tc.method, tc.path, tc.body, nil, nil)
		if (code == http.StatusForbidden) == tc.allowed || (!tc.allowed && !strings.Contains(body, "grants")) {
			t.Errorf("%s %s %s: %d %.300s; want allowed %v", names[tc.token], tc.method, tc.path, code, body, tc.allowed)
			continue
		}
		got := newAuditEntries(t, env, n)
		switch {
		case !tc.allowed:
			if len(got) != 1 || got[0].Outcome != store.AuditDenied || got[0].Subject != names[tc.token] || !strings.Contains(got[0].Detail, "grants") {
				t.Errorf("%s %s %s was refused; the audit log gained %+v", names[tc.token], tc.method, tc.path, got)
			}
		case tc.method == "GET" && !strings.HasPrefix(tc.path, "/v1/audit"):
			if len(got) != 0 {
				t.Errorf("%s %s %s: a read let through was recorded: %+v", names[tc.token], tc.method, tc.path, got[0])
			}
		default:
			if len(got) != 1 || got[0].Outcome != store.AuditOK || got[0].Subject != names[tc.token] || got[0].Status != code {
				t.Errorf("%s %s %s answered %d; the audit log gained %+v", names[tc.token], tc.method, tc.path, code, got)
			}
		}
	}

	// The console: a role that may not cancel is refused there too, the
	// refusal recorded as the console's.
	b := newBrowser(t, env)
	b.post("/ui/login", url.Values{"token": {"dep-tok"}})
	b.get("/ui/runs?chain=deploy")
	n := len(auditLog(t, env))
	if code, _, body := b.post("/ui/chains/change/run", url.Values{"field.what": {"z"}}); code != http.StatusForbidden || !strings.Contains(body, "grants start") {
		t.Errorf("starting change in the console as dep: %d\n%.500s", code, body)
	}
	if got := newAuditEntries(t, env, n); len(got) != 1 || got[0].EntryPoint != "console" || got[0].Outcome != store.AuditDenied || got[0].Chain != "change" {
		t.Errorf("the console's refusal recorded %+v", got)
	}
	if code, _, body := b.get("/ui/audit"); code != http.StatusForbidden || !strings.Contains(body, "grants admin") {
		t.Errorf("the audit page as dep: %d", code)
	}
	root := newBrowser(t, env)
	root.post("/ui/login", url.Values{"token": {"root-tok"}})
	code, _, body := root.get("/ui/audit?outcome=denied&subject=dep")
	if code != http.StatusOK || !strings.Contains(body, "no role of dep (deployer) grants start on chain change") || strings.Contains(body, ">chg <") {
		t.Errorf("the audit page as root: %d\n%.2000s", code, body)
	}
	// A page of one entry links to the next, its filter kept.
	_, _, body = root.get("/ui/audit?outcome=denied&limit=1")
	if !strings.Contains(body, `id="older"`) || !strings.Contains(body, "cursor=") || !strings.Contains(body, "outcome=denied") {
		t.Errorf("the audit page's link to older entries:\n%.3000s", body)
	}
}

// TestSlackAnswersFollowRoles: with roles, a Slack user answers what the
// roles [gateway.auth.users] gives their name grant, and the refusal and
// the answer are both in the audit log as Slack's.
func TestSlackAnswersFollowRoles(t *testing.T) {
	t.Setenv("CHAINGATE_SECRET_SLACK_SIGNING_SECRET", slackSigningSecret)
	env := newAPI(t, strings.Replace(slackApprovalConfig, "[gateway.slack]", `[gateway.auth.roles.dbops]
grants = [{ actions = ["approve"], chains = ["restart-*"] }]

[gateway.auth.roles.webops]
grants = [{ actions = ["approve"], chains = ["deploy-*"] }]

[gateway.auth.users]
alice = ["dbops"]
bob = ["webops"]

[gateway.slack]`, 1))
	env.token = "ops-tok"
	slack := newFakeSlack(t, env)
	responseURL := slack.srv.URL + "/actions/T0TEAM/1234/abcd"
	id := startRun(t, env, "restart-db", `{"host": "db-1"}`)
	waitAsking(t, env, id, "ask")

	n := len(auditLog(t, env))
	if code, body := postSigned(t, env, slackClick(t, responseURL, "U0BOB2", "chaingate:approve", id+"/ask", nil)); code != http.StatusOK {
		t.Fatalf("bob's click: %d %s", code, body)
	}
	if reply := slack.reply(t); !strings.Contains(fmt.Sprint(reply["text"]), "no role of bob (webops) grants approve") {
		t.Errorf("bob was told %q", reply["text"])
	}
	got := newAuditEntries(t, env, n)
	if len(got) != 1 || got[0].Outcome != store.AuditDenied || got[0].EntryPoint != "slack" || got[0].Subject != "bob" || got[0].Chain != "restart-db" {
		t.Errorf("bob's refusal recorded %+v", got)
	}
	n = len(auditLog(t, env))
	if code, body := postSigned(t, env, slackClick(t, responseURL, "U0ALICE1", "chaingate:approve", id+"/ask", nil)); code != http.StatusOK {
		t.Fatalf("alice's click: %d %s", code, body)
	}
	slack.reply(t)
	if v := waitRunEnd(t, env, id); v.Status != string(store.RunSucceeded) {
		t.Errorf("the run after alice's approval: %s", v.Status)
	}
	got = newAuditEntries(t, env, n)
	if len(got) != 1 || got[0].Outcome != store.AuditOK || got[0].EntryPoint != "slack" || got[0].Subject != "alice" || got[0].Detail != "approve step ask" {
		t.Errorf("alice's answer recorded %+v", got)
	}
}
