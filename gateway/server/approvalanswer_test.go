package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/gateway/ops"
)

// answerFieldsConfig asks before restarting; the step after the question
// reads every field of its answer. Each chain answers its question
// another way: a person, the timeout, or the alert's resolution.
var answerFieldsConfig = `[gateway.auth]
tokens = [{ name = "ops", token = "ops-tok" }]

[gateway.slack]
signing_secret = "<<secrets.SLACK_SIGNING_SECRET>>"
users = { U0ALICE1 = "alice" }

[[triggers]]
name = "am-approve"
type = "alertmanager"
chain = "resolve-approve"
when = 'alert.labels.severity == "critical"'
payload = { host = "<<alert.labels.instance>>" }

[[triggers]]
name = "am-reject"
type = "alertmanager"
chain = "resolve-reject"
when = 'alert.labels.severity == "critical"'
payload = { host = "<<alert.labels.instance>>" }
` + answerChain("person", "") + answerChain("timeout-approve", `on_timeout = "approve"`) + answerChain("timeout-reject", `on_timeout = "reject"`) +
	answerChain("resolve-approve", `on_resolve = "approve"`) + answerChain("resolve-reject", `on_resolve = "reject"`)

// answerChain is a chain whose question is answered as how says, then
// told what the answer was.
func answerChain(name, how string) string {
	timeout := ""
	if strings.HasPrefix(how, "on_timeout") {
		timeout = "timeout_seconds = 1\n"
	}
	if how != "" {
		how = ", " + how
	}
	return `
[[chains]]
name = "` + name + `"
[[chains.steps]]
name = "ask"
` + timeout + `approval = { message = "Restart <<origin.payload.host>>?", on_reject = "continue"` + how + ` }
[[chains.steps]]
name = "told"
provider = "echo"
payload_template = { decision = "<<steps.ask.body.decision>>", by = "<<steps.ask.body.by>>", comment = "<<steps.ask.body.comment>>", at = "<<steps.ask.body.at>>", timed_out = "<<steps.ask.body.timed_out>>", message = "<<steps.ask.body.message>>" }
`
}

// TestApprovalAnswerFields answers a question on every path there is —
// the API, the command line through the API and on the store, the
// console, a Slack button, on_timeout and on_resolve — and checks that
// the answer has the same fields whoever gave it, so the step after it
// reads <<steps.ask.body.timed_out>> and the rest on every path.
func TestApprovalAnswerFields(t *testing.T) {
	t.Setenv("CHAINGATE_SECRET_SLACK_SIGNING_SECRET", slackSigningSecret)
	env := newAPI(t, answerFieldsConfig)
	env.token = "ops-tok"
	slack := newFakeSlack(t, env)
	ctx := context.Background()
	console := newBrowser(t, env)
	console.post("/ui/login", url.Values{"token": {"ops-tok"}})

	// alert starts the chain of trigger tr with a firing alert, and
	// returns its run once it waits.
	alert := func(t *testing.T, tr string) string {
		var res api.TriggerResponse
		if code, _, raw := env.call("POST", "/v1/triggers/"+tr, triggerFixture(t, "alertmanager-firing.json"), nil, &res); code != http.StatusAccepted || len(res.Results) == 0 {
			t.Fatalf("firing: %d %s", code, raw)
		}
		waitAsking(t, env, res.Results[0].Run, "ask")
		return res.Results[0].Run
	}
	asked := func(t *testing.T, chainName string) string {
		id := startRun(t, env, chainName, `{"host": "db-1:9100"}`)
		waitAsking(t, env, id, "ask")
		return id
	}
	for _, tc := range []struct {
		path string
		// answer answers the question of a run it starts, and returns the
		// run.
		answer                func(t *testing.T) string
		decision, by, comment string
		timedOut              bool
	}{
		{"API", func(t *testing.T) string {
			id := asked(t, "person")
			var d map[string]any
			if code, _, raw := env.call("POST", "/v1/runs/"+id+"/signals/ask", `{"decision": "approve", "comment": "window open"}`, nil, &d); code != http.StatusAccepted {
				t.Fatalf("answering: %d %s", code, raw)
			}
			if keys := sortedKeys(d); !slices.Equal(keys, []string{"at", "by", "comment", "decision", "message", "timed_out"}) || d["timed_out"] != false || d["message"] != "Restart db-1:9100?" {
				t.Errorf("the API's answer: %v", d)
			}
			return id
		}, "approve", "ops (API)", "window open", false},
		{"command line, through the API", func(t *testing.T) string {
			id := asked(t, "person")
			d, err := api.NewClient(env.url, "ops-tok").Signal(ctx, id, "ask", "reject", "")
			if err != nil || d.TimedOut || d.Message != "Restart db-1:9100?" {
				t.Fatalf("answering: %+v %v", d, err)
			}
			return id
		}, "reject", "ops (API)", "", false},
		{"command line, on the store", func(t *testing.T) string {
			id := asked(t, "person")
			if _, err := (&ops.Local{GW: env.gw}).Signal(engine.WithActor(ctx, "root@ops-1 (CLI)"), id, "ask", "approve", "by hand"); err != nil {
				t.Fatal(err)
			}
			return id
		}, "approve", "root@ops-1 (CLI)", "by hand", false},
		{"console", func(t *testing.T) string {
			id := asked(t, "person")
			console.get("/ui/runs/" + id + "/steps/ask")
			if code, _, raw := console.post("/ui/runs/"+id+"/answer/ask", url.Values{"decision": {"reject"}}); code != http.StatusSeeOther {
				t.Fatalf("answering: %d %s", code, raw)
			}
			return id
		}, "reject", "ops (console)", "", false},
		{"Slack", func(t *testing.T) string {
			id := asked(t, "person")
			click := slackClick(t, slack.srv.URL+"/actions/T0/1/x", "U0ALICE1", "chaingate:approve", id+"/ask", nil)
			if code, raw := postSigned(t, env, click); code != http.StatusOK {
				t.Fatalf("answering: %d %s", code, raw)
			}
			slack.reply(t)
			return id
		}, "approve", "alice (Slack)", "", false},
		{"on_timeout approve", func(t *testing.T) string { return asked(t, "timeout-approve") }, "approve", "timeout", "", true},
		{"on_timeout reject", func(t *testing.T) string { return asked(t, "timeout-reject") }, "reject", "timeout", "", true},
		{"on_resolve approve", func(t *testing.T) string {
			id := alert(t, "am-approve")
			env.call("POST", "/v1/triggers/am-approve", triggerFixture(t, "alertmanager-resolved.json"), nil, nil)
			return id
		}, "approve", "alert resolved (am-approve)", "the alert resolved", false},
		{"on_resolve reject", func(t *testing.T) string {
			id := alert(t, "am-reject")
			env.call("POST", "/v1/triggers/am-reject", triggerFixture(t, "alertmanager-resolved.json"), nil, nil)
			return id
		}, "reject", "alert resolved (am-reject)", "the alert resolved", false},
	} {
		t.Run(tc.path, func(t *testing.T) {
			id := tc.answer(t)
			v := waitRunEnd(t, env, id)
			if v.Status != "succeeded" {
				t.Fatalf("the run: %s %+v", v.Status, v.Error)
			}
			for _, step := range []string{"ask", "told"} {
				var body map[string]any
				if err := json.Unmarshal(v.Steps[step].Body, &body); err != nil {
					t.Fatalf("%s: %v", step, err)
				}
				if keys := sortedKeys(body); !slices.Equal(keys, []string{"at", "by", "comment", "decision", "message", "timed_out"}) {
					t.Errorf("%s's body has %q: %s", step, keys, v.Steps[step].Body)
				}
				at, _ := time.Parse(time.RFC3339Nano, body["at"].(string))
				if body["decision"] != tc.decision || body["by"] != tc.by || body["comment"] != tc.comment || body["timed_out"] != tc.timedOut ||
					body["message"] != "Restart db-1:9100?" || at.IsZero() {
					t.Errorf("%s's body: %s", step, v.Steps[step].Body)
				}
			}
		})
	}
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
