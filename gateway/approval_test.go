package gateway_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/html"
)

const approvalConfig = `[gateway.auth]
tokens = [{ name = "alice", token = "alice-tok" }, { name = "bob", token = "bob-tok" }]
read_tokens = ["read-tok"]

[[chains]]
name = "restart-db"
[[chains.steps]]
name = "ask"
approval = { message = "Restart <<origin.payload.host>>?" }
[[chains.steps]]
name = "restart"
provider = "echo"
payload_template = { host = "<<origin.payload.host>>", by = "<<steps.ask.body.by>>", why = "<<steps.ask.body.comment>>" }

`

// waitAsking waits for a run's approval step to wait for its answer.
func waitAsking(t *testing.T, env *apiEnv, id, step string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		var v struct {
			Steps map[string]struct {
				Status string `json:"status"`
			} `json:"steps"`
		}
		env.call("GET", "/v1/runs/"+id, "", nil, &v)
		if v.Steps[step].Status == "running" {
			return
		}
	}
	t.Fatalf("step %s of run %s never waited", step, id)
}

// TestApprovalFromConsoleAndAPI answers an approval step from its console
// panel: a read token sees the question and no buttons, a write token
// answers, the answer and its author reach the next step and the event
// log, and a second answer through the API is refused naming the first.
func TestApprovalFromConsoleAndAPI(t *testing.T) {
	env := newAPI(t, approvalConfig)
	env.token = "alice-tok"
	id := startRun(t, env, "restart-db", `{"host": "db-1"}`)
	waitAsking(t, env, id, "ask")

	reader := newBrowser(t, env)
	reader.post("/ui/login", url.Values{"token": {"read-tok"}})
	_, doc, body := reader.get("/ui/runs/" + id + "/steps/ask")
	if !strings.Contains(body, "Restart db-1?") || !strings.Contains(body, "a person&#39;s answer") {
		t.Errorf("the waiting step's page does not ask or say what it waits on:\n%s", body)
	}
	if forms := writeForms(doc); len(forms) > 0 {
		t.Errorf("a read token sees answer buttons: %v", forms)
	}
	if code, _, _ := reader.post("/ui/runs/"+id+"/answer/ask", url.Values{"decision": {"approve"}}); code != http.StatusForbidden {
		t.Errorf("a read session's answer: %d, want 403", code)
	}

	for _, tc := range []struct {
		step, body string
		code       int
		says       string
	}{
		{"ask", `{"decision": "maybe"}`, http.StatusBadRequest, `decision must be \"approve\" or \"reject\"`},
		{"restart", `{"decision": "approve"}`, http.StatusConflict, "not_waiting"},
		{"nope", `{"decision": "approve"}`, http.StatusNotFound, "has no step"},
	} {
		if code, _, raw := env.call("POST", "/v1/runs/"+id+"/signals/"+tc.step, tc.body, nil, nil); code != tc.code || !strings.Contains(raw, tc.says) {
			t.Errorf("signal %s %s: %d %s, want %d saying %s", tc.step, tc.body, code, raw, tc.code, tc.says)
		}
	}

	writer := newBrowser(t, env)
	writer.post("/ui/login", url.Values{"token": {"alice-tok"}})
	_, doc, _ = writer.get("/ui/runs/" + id + "/steps/ask")
	if find(doc, func(n *html.Node) bool { return attr(n, "id") == "answer-approve" }) == nil {
		t.Fatal("a write token sees no approve button")
	}
	if code, loc, raw := writer.post("/ui/runs/"+id+"/answer/ask", url.Values{"decision": {"approve"}, "comment": {"window open"}}); code != http.StatusSeeOther || !strings.Contains(loc, "/ui/runs/"+id) {
		t.Fatalf("the console's answer: %d %q %s", code, loc, raw)
	}
	env.token = "bob-tok"
	if code, _, raw := env.call("POST", "/v1/runs/"+id+"/signals/ask", `{"decision": "reject"}`, nil, nil); code != http.StatusConflict || !strings.Contains(raw, "already answered: approve by alice (console)") {
		t.Errorf("bob's later answer: %d %s", code, raw)
	}
	v := waitRunEnd(t, env, id)
	if v.Status != "succeeded" || !strings.Contains(string(v.Body), `"by":"alice (console)"`) || !strings.Contains(string(v.Body), `"why":"window open"`) {
		t.Errorf("the run: %s %s", v.Status, v.Body)
	}
	var said string
	for _, ev := range readSSE(t, env, id, "") {
		if ev.Step == "ask" && ev.Type == "step_succeeded" {
			said = ev.Message
		}
	}
	if said != "approved by alice (console): window open" {
		t.Errorf("the approval's event: %q", said)
	}
}
