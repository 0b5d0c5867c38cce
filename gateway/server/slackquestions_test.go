package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/internal/testutil/redistest"
	"github.com/chaingate/gateway/providers/slack/slacktest"
)

// questionConfig asks in Slack before restarting: a step posts the
// question with answer buttons and a link, and the approval's notify
// posts it again. TIMEOUT and APPROVAL change how the question ends.
const questionConfig = `[gateway.auth]
tokens = [{ name = "ops", token = "ops-tok" }]

[[triggers]]
name = "am"
type = "alertmanager"
chain = "restart-db"
when = 'alert.labels.severity == "critical"'
payload = { host = "<<alert.labels.instance>>" }

[[providers]]
name = "slack"
type = "slack"
[providers.config]
token = "<<secrets.SLACK_BOT_TOKEN>>"
base_url = "BASE_URL"

[[chains]]
name = "restart-db"
[[chains.steps]]
name = "post"
provider = "slack"
action_type = "post_message"
[chains.steps.payload_template]
channel = "#db"
text = "Restart <<origin.payload.host>>?"
[[chains.steps.payload_template.blocks]]
type = "section"
text = { type = "mrkdwn", text = "Restart *<<origin.payload.host>>*?" }
[[chains.steps.payload_template.blocks]]
type = "actions"
elements = [
  { type = "button", action_id = "chaingate:approve", value = "<<run.id>>/ask", text = { type = "plain_text", text = "Approve" } },
  { type = "button", action_id = "chaingate:reject", value = "<<run.id>>/ask", text = { type = "plain_text", text = "Reject" } },
  { type = "button", action_id = "open", url = "https://gw.example.com/ui/runs/<<run.id>>/steps/ask", text = { type = "plain_text", text = "Open" } },
]
[[chains.steps]]
name = "ask"
TIMEOUT
[chains.steps.approval]
message = "Restart <<origin.payload.host>>?"
on_reject = "continue"
APPROVAL
[chains.steps.approval.notify]
provider = "slack"
action_type = "post_message"
payload_template = { channel = "#db-oncall", text = "<<approval.message>>", blocks = [{ type = "actions", elements = [{ type = "button", action_id = "chaingate:approve", value = "<<run.id>>/<<approval.step>>", text = { type = "plain_text", text = "Approve" } }] }] }
[[chains.steps]]
name = "restart"
provider = "echo"
payload_template = { host = "<<origin.payload.host>>" }
`

// questionEnv serves questionConfig, with Slack's Web API a fake's.
func questionEnv(t *testing.T, state, timeout, approval string) (*apiEnv, *slacktest.Server) {
	t.Helper()
	slack := slacktest.NewServer()
	t.Cleanup(slack.Close)
	config := strings.NewReplacer("BASE_URL", slack.BaseURL(), "TIMEOUT", timeout, "APPROVAL", approval).Replace(questionConfig)
	env := newAPIOn(t, config, state)
	env.token = "ops-tok"
	return env, slack
}

// waitSettled waits for both messages that asked run id's question to be
// updated without their answer buttons and with a line that says said,
// the link kept, and for their record to go.
func waitSettled(t *testing.T, env *apiEnv, slack *slacktest.Server, id, said string) {
	t.Helper()
	var msgs []slacktest.Message
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		msgs = slack.Messages()
		settled := 0
		for _, m := range msgs {
			if m.Edited && !strings.Contains(string(m.Blocks), "chaingate:") && strings.Contains(string(m.Blocks), said) {
				settled++
			}
		}
		bound, err := env.gw.Store.KeyRun(context.Background(), "slack/question/"+id+"/ask")
		if len(msgs) == 2 && settled == 2 && bound == "" && err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the question's messages were not settled saying %q (record %q %v): %+v", said, bound, err, msgs)
		}
	}
	for _, m := range msgs {
		switch m.Channel {
		case slacktest.ChannelID("#db"):
			if m.Text != "Restart db-1:9100?" || !strings.Contains(string(m.Blocks), `"text":"Restart *db-1:9100*?"`) || !strings.Contains(string(m.Blocks), `"action_id":"open"`) {
				t.Errorf("the posted question, settled: %s %s", m.Text, m.Blocks)
			}
		case slacktest.ChannelID("#db-oncall"):
			if m.Text != "Restart db-1:9100?" {
				t.Errorf("the notification, settled: %s %s", m.Text, m.Blocks)
			}
		default:
			t.Errorf("a message in %s", m.Channel)
		}
	}
}

// waitAskedTwice waits for the question's two messages to be posted.
func waitAskedTwice(t *testing.T, slack *slacktest.Server) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); len(slack.Messages()) < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the question was posted %d times, want 2", len(slack.Messages()))
		}
	}
}

// TestSlackQuestionSettled ends a question asked in Slack every way one
// ends — answered elsewhere, on_timeout, a timeout that fails the step,
// the run cancelled through the API or by on_resolve — and checks that
// both its messages, the step's and the notification's, lose their answer
// buttons and say what became of it.
func TestSlackQuestionSettled(t *testing.T) {
	t.Setenv("CHAINGATE_SECRET_SLACK_BOT_TOKEN", slacktest.Token)
	for _, tc := range []struct {
		name, timeout, approval string
		// end ends the question of run id, and returns its run.
		end  func(t *testing.T, env *apiEnv) string
		said string
	}{
		{"answered through the API", "", "", func(t *testing.T, env *apiEnv) string {
			id := startRun(t, env, "restart-db", `{"host": "db-1:9100"}`)
			waitAsking(t, env, id, "ask")
			if code, _, raw := env.call("POST", "/v1/runs/"+id+"/signals/ask", `{"decision": "reject"}`, nil, nil); code != http.StatusAccepted {
				t.Fatalf("answering: %d %s", code, raw)
			}
			return id
		}, ":x: Rejected by ops (API) at "},
		{"cancelled through the API", "", "", func(t *testing.T, env *apiEnv) string {
			id := startRun(t, env, "restart-db", `{"host": "db-1:9100"}`)
			waitAsking(t, env, id, "ask")
			if code, _, raw := env.call("POST", "/v1/runs/"+id+"/cancel", "", nil, nil); code != http.StatusAccepted {
				t.Fatalf("cancelling: %d %s", code, raw)
			}
			return id
		}, ":no_entry_sign: No longer asked: run cancelled by ops (API) at "},
		{"on_resolve cancel", "", `on_resolve = "cancel"`, func(t *testing.T, env *apiEnv) string {
			var res api.TriggerResponse
			if code, _, raw := env.call("POST", "/v1/triggers/am", triggerFixture(t, "alertmanager-firing.json"), nil, &res); code != http.StatusAccepted || len(res.Results) == 0 {
				t.Fatalf("firing: %d %s", code, raw)
			}
			id := res.Results[0].Run
			waitAsking(t, env, id, "ask")
			env.call("POST", "/v1/triggers/am", triggerFixture(t, "alertmanager-resolved.json"), nil, nil)
			return id
		}, ":no_entry_sign: No longer asked: run cancelled by alert resolved (am) at "},
		{"on_timeout approve", "timeout_seconds = 1", `on_timeout = "approve"`, func(t *testing.T, env *apiEnv) string {
			return startRun(t, env, "restart-db", `{"host": "db-1:9100"}`)
		}, ": no answer before the step's deadline"},
		{"on_timeout fail", "timeout_seconds = 1", "", func(t *testing.T, env *apiEnv) string {
			return startRun(t, env, "restart-db", `{"host": "db-1:9100"}`)
		}, ":hourglass: No answer before the step's deadline, "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env, slack := questionEnv(t, "", tc.timeout, tc.approval)
			runApprovalLoop(t, env)
			id := tc.end(t, env)
			waitRunEnd(t, env, id)
			waitSettled(t, env, slack, id, tc.said)
			logsSay(t, env, `"msg":"settled a Slack message of an approval step's question"`)
		})
	}
}

// TestSlackQuestionSettledAcrossGateways: a question that ended while no
// gateway's approval loop ran is settled by the next to start, from what
// the store kept; and two gateways that both hear a question end settle
// it once between them, as the same message.
func TestSlackQuestionSettledAcrossGateways(t *testing.T) {
	t.Setenv("CHAINGATE_SECRET_SLACK_BOT_TOKEN", slacktest.Token)
	t.Run("the next gateway to start", func(t *testing.T) {
		state := redistest.Open(t)
		env, slack := questionEnv(t, state, "", "")
		stop := runApprovalLoop(t, env)
		id := startRun(t, env, "restart-db", `{"host": "db-1:9100"}`)
		waitAsking(t, env, id, "ask")
		waitAskedTwice(t, slack)
		// Slack has the notification once it is posted; the gateway keeps
		// it as asking once the answer is back, which a gateway stopped in
		// between never hears.
		waitNoted(t, env, id, `approval step "ask": notified through slack`)
		stop()
		if code, _, raw := env.call("POST", "/v1/runs/"+id+"/cancel", "", nil, nil); code != http.StatusAccepted {
			t.Fatalf("cancelling: %d %s", code, raw)
		}
		waitRunEnd(t, env, id)
		for _, m := range slack.Messages() {
			if m.Edited {
				t.Fatalf("a message settled with no approval loop running: %+v", m)
			}
		}
		next := newAPIOn(t, strings.Replace(questionConfigFor(slack), "TIMEOUT", "", 1), state)
		runApprovalLoop(t, next)
		waitSettled(t, next, slack, id, ":no_entry_sign: No longer asked: run cancelled by ops (API) at ")
	})
	t.Run("two gateways", func(t *testing.T) {
		state := redistest.Open(t)
		env, slack := questionEnv(t, state, "", "")
		other := newAPIOn(t, strings.Replace(questionConfigFor(slack), "TIMEOUT", "", 1), state)
		runApprovalLoop(t, env)
		runApprovalLoop(t, other)
		id := startRun(t, env, "restart-db", `{"host": "db-1:9100"}`)
		waitAsking(t, env, id, "ask")
		waitAskedTwice(t, slack)
		if code, _, raw := env.call("POST", "/v1/runs/"+id+"/cancel", "", nil, nil); code != http.StatusAccepted {
			t.Fatalf("cancelling: %d %s", code, raw)
		}
		waitRunEnd(t, env, id)
		waitSettled(t, env, slack, id, ":no_entry_sign: No longer asked: run cancelled by ops (API) at ")
		for _, e := range []*apiEnv{env, other} {
			if strings.Contains(e.logs.String(), "trying again later") {
				t.Errorf("a gateway failed to settle the question:\n%s", e.logs)
			}
		}
	})
}

// waitNoted waits for a note on the run saying msg.
func waitNoted(t *testing.T, env *apiEnv, id, msg string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		evs, err := env.gw.Store.Events(context.Background(), id, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			if ev.Type == store.EventNote && ev.Message == msg {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s never noted %q: %+v", id, msg, evs)
		}
	}
}

// questionConfigFor is questionConfig on slack, asking as it does by
// default.
func questionConfigFor(slack *slacktest.Server) string {
	return strings.NewReplacer("BASE_URL", slack.BaseURL(), "APPROVAL", "").Replace(questionConfig)
}
