package gateway_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway"
)

// TestApprovalCalls: an approval step that waits notifies at once, reminds
// every remind_every (the latest reminder due, once), escalates once after
// escalate.after, and calls nothing more once answered.
func TestApprovalCalls(t *testing.T) {
	t.Parallel()
	rec := filepath.Join(t.TempDir(), "calls.jsonl")
	env := newAPI(t, strings.ReplaceAll(`external_url = "https://gw.example.com"

[gateway.auth]
tokens = ["full-tok"]

[[providers]]
name = "pager"
type = "faulty"

[[chains]]
name = "restart"
[[chains.steps]]
name = "ask"
timeout_seconds = 7200
[chains.steps.approval]
message = "Restart <<origin.payload.host>>?"
notify = { provider = "pager", action_type = "post", remind_every = "10m", payload_template = { record = "REC", text = "<<approval.message>> <<approval.url>>", reminder = "<<approval.reminder>>", host = "<<origin.payload.host>>" } }
escalate = { provider = "pager", action_type = "page", after = "30m", payload_template = { record = "REC", text = "nobody answered: <<approval.message>>" } }
[[chains.steps]]
name = "do-it"
provider = "echo"
payload_template = { ok = true }
`, "REC", rec))
	env.token = "full-tok"
	ctx := context.Background()
	var started gateway.StartResponse
	if code, _, raw := env.call("POST", "/v1/chains/restart/runs", `{"host": "db-1"}`, nil, &started); code != 202 {
		t.Fatalf("start: %d %s", code, raw)
	}
	var asked time.Time
	for deadline := time.Now().Add(30 * time.Second); asked.IsZero(); time.Sleep(20 * time.Millisecond) {
		run, err := env.gw.Store.RunHeader(ctx, started.ID)
		if err == nil && run.Status == store.RunWaiting {
			recs, _ := env.gw.Store.Steps(ctx, started.ID, "ask")
			asked = recs[0].StartedAt
		}
		if time.Now().After(deadline) {
			t.Fatal("the run never waited")
		}
	}
	calls := func() []map[string]any {
		b, _ := os.ReadFile(rec)
		var out []map[string]any
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if line == "" {
				continue
			}
			var c struct {
				Action  string         `json:"action_type"`
				Payload map[string]any `json:"payload"`
			}
			_ = json.Unmarshal([]byte(line), &c)
			c.Payload["action"] = c.Action
			out = append(out, c.Payload)
		}
		return out
	}
	for _, step := range []struct {
		at   time.Duration
		want int
	}{
		{time.Second, 1},      // the notification
		{2 * time.Second, 1},  // nothing new
		{25 * time.Minute, 2}, // the latest reminder due (the second), not the first
		{26 * time.Minute, 2},
		{31 * time.Minute, 4}, // the escalation, and the third reminder
		{35 * time.Minute, 4},
	} {
		if err := env.gw.ApprovalCalls(ctx, asked.Add(step.at)); err != nil {
			t.Fatal(err)
		}
		if got := calls(); len(got) != step.want {
			t.Fatalf("at +%s: %d calls, want %d: %v", step.at, len(got), step.want, got)
		}
	}
	got := calls()
	if got[0]["text"] != "Restart db-1? https://gw.example.com/ui/runs/"+started.ID+"/steps/ask" || got[0]["reminder"] != float64(0) || got[0]["action"] != "post" {
		t.Errorf("the notification: %v", got[0])
	}
	if got[1]["reminder"] != float64(2) {
		t.Errorf("the reminder: %v", got[1])
	}
	var escalations int
	for _, c := range got {
		if c["action"] == "page" {
			escalations++
		}
	}
	if escalations != 1 {
		t.Errorf("escalations: %d", escalations)
	}
	events, _ := env.gw.Store.Events(ctx, started.ID, 0, 0)
	var notes []string
	for _, ev := range events {
		if ev.Type == store.EventNote {
			notes = append(notes, ev.Message)
		}
	}
	if len(notes) != 4 || !strings.Contains(strings.Join(notes, "\n"), `approval step "ask": escalated through pager`) {
		t.Errorf("notes on the run: %q", notes)
	}
	if _, err := env.gw.Engine.Signal(engine.WithActor(ctx, "alice"), started.ID, "ask", "approve", ""); err != nil {
		t.Fatal(err)
	}
	waitRunEnd(t, env, started.ID)
	if err := env.gw.ApprovalCalls(ctx, asked.Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if n := len(calls()); n != 4 {
		t.Errorf("calls after the answer: %d, want still 4", n)
	}
}
