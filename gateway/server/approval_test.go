package server_test

import (
	"net/http"
	"net/url"
	"slices"
	"strconv"
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
	// Generous: a run of hundreds of steps before it, on a loaded machine.
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
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
	t.Parallel()
	env := newAPI(t, approvalConfig)
	env.token = "alice-tok"
	id := startRun(t, env, "restart-db", `{"host": "db-1"}`)
	waitAsking(t, env, id, "ask")
	metricsSay(t, env, "chaingate_approvals_waiting 1", `chaingate_approvals_answered_total{decision="approved"} 0`)
	if waited := metricValue(t, env, "chaingate_approvals_oldest_waiting_seconds"); waited <= 0 {
		t.Errorf("the oldest waiting approval has waited %v s, want more than 0", waited)
	}

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
	metricsSay(t, env, "chaingate_approvals_waiting 0", `chaingate_approvals_answered_total{decision="approved"} 1`,
		`chaingate_approvals_answered_total{decision="rejected"} 0`, "chaingate_approvals_timed_out_total 0", "chaingate_approvals_oldest_waiting_seconds 0")
	logsSay(t, env, `"msg":"approval waiting"`, `"msg":"approval answered","component":"engine","run":"`+id+`"`, `"decision":"approve","by":"alice (console)"`)
}

// metricsSay checks that the gateway's metrics have each line of want.
func metricsSay(t *testing.T, env *apiEnv, want ...string) {
	t.Helper()
	_, _, body := env.call("GET", "/metrics", "", nil, nil)
	for _, line := range want {
		if !slices.Contains(strings.Split(body, "\n"), line) {
			t.Errorf("the metrics lack %q", line)
		}
	}
}

// metricValue is the value of the gateway's metric series named series
// (with its labels, as the text format writes them).
func metricValue(t *testing.T, env *apiEnv, series string) float64 {
	t.Helper()
	_, _, body := env.call("GET", "/metrics", "", nil, nil)
	for line := range strings.SplitSeq(body, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric %s: %v", series, err)
			}
			return f
		}
	}
	t.Fatalf("the metrics lack %s:\n%s", series, body)
	return 0
}

// logsSay checks that the gateway's log holds each text of want.
func logsSay(t *testing.T, env *apiEnv, want ...string) {
	t.Helper()
	for _, text := range want {
		if !strings.Contains(env.logs.String(), text) {
			t.Errorf("the log lacks %s", text)
		}
	}
}

const lateApprovalConfig = `[gateway.auth]
tokens = [{ name = "alice", token = "alice-tok" }]

[[chains]]
name = "restart-db-soon"
[[chains.steps]]
name = "ask"
timeout_seconds = 1
approval = { message = "Restart <<origin.payload.host>>?", on_timeout = "reject" }
[[chains.steps]]
name = "restart"
provider = "echo"
payload_template = { host = "<<origin.payload.host>>" }

`

// TestApprovalAfterDeadline answers an approval step once its recorded
// deadline has passed, from the console and through the API: both are
// refused naming the deadline, and the run goes on as on_timeout says.
func TestApprovalAfterDeadline(t *testing.T) {
	t.Parallel()
	env := newAPI(t, lateApprovalConfig)
	env.token = "alice-tok"
	id := startRun(t, env, "restart-db-soon", `{"host": "db-1"}`)
	waitAsking(t, env, id, "ask")
	var v struct {
		Steps map[string]struct {
			Deadline time.Time `json:"deadline"`
		} `json:"steps"`
	}
	env.call("GET", "/v1/runs/"+id, "", nil, &v)
	deadline := v.Steps["ask"].Deadline
	if deadline.IsZero() {
		t.Fatal("the waiting step has no deadline")
	}
	time.Sleep(time.Until(deadline))
	for !time.Now().After(deadline) {
		time.Sleep(time.Millisecond)
	}
	says := "deadline was " + deadline.UTC().Format("2006-01-02T15:04:05.000Z")

	writer := newBrowser(t, env)
	writer.post("/ui/login", url.Values{"token": {"alice-tok"}})
	if _, doc, _ := writer.get("/ui/runs/" + id + "/steps/ask"); find(doc, func(n *html.Node) bool { return attr(n, "id") == "answer-approve" }) != nil {
		t.Error("the step's panel offers to answer past the deadline")
	}
	// A panel loaded before the deadline still has its buttons.
	if code, _, body := writer.post("/ui/runs/"+id+"/answer/ask", url.Values{"decision": {"approve"}}); code != http.StatusConflict || !strings.Contains(body, "too late") || !strings.Contains(body, says) {
		t.Errorf("the console's late answer: %d\n%s", code, body)
	}
	var e apiErr
	if code, _, raw := env.call("POST", "/v1/runs/"+id+"/signals/ask", `{"decision": "approve"}`, nil, &e); code != http.StatusConflict || e.Error.Code != "past_deadline" || !strings.Contains(e.Error.Message, says) {
		t.Errorf("the API's late answer: %d %s", code, raw)
	}
	if v := waitRunEnd(t, env, id); v.Status != "failed" {
		t.Errorf("the run: %s", v.Status)
	}
	var said string
	for _, ev := range readSSE(t, env, id, "") {
		if ev.Step == "ask" && ev.Type == "step_failed" {
			said = ev.Message
		}
	}
	if said != "rejected: no answer within the step's timeout" {
		t.Errorf("the approval's event: %q", said)
	}
	metricsSay(t, env, "chaingate_approvals_waiting 0", "chaingate_approvals_timed_out_total 1", `chaingate_approvals_answered_total{decision="approved"} 0`)
	logsSay(t, env, `"msg":"approval timed out"`, `"on_timeout":"reject"`, `"msg":"approval answer refused: the step's deadline had passed"`)
}
