package gateway_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway"
)

// TestPauseTrigger: a paused trigger answers its sender and keeps each
// delivery in the dead-letter queue, saying so; the same delivery sent
// again is kept once; unpaused, it starts runs again. Pausing twice keeps
// the first pause, and what is not paused cannot be unpaused.
func TestPauseTrigger(t *testing.T) {
	env := newTriggerAPI(t)
	env.token = "full-tok"
	var p gateway.Pause
	if code, _, raw := env.call("POST", "/v1/pauses/trigger/hook", `{"reason": "noisy after the deploy"}`, nil, &p); code != http.StatusCreated || p.By == "" || p.Reason != "noisy after the deploy" {
		t.Fatalf("pause: %d %s", code, raw)
	}
	if code, _, _ := env.call("POST", "/v1/pauses/trigger/hook", `{}`, nil, &p); code != http.StatusOK || p.Reason != "noisy after the deploy" {
		t.Errorf("pausing again: %d %+v", code, p)
	}
	var list struct {
		Pauses []gateway.Pause `json:"pauses"`
	}
	if env.call("GET", "/v1/pauses", "", nil, &list); len(list.Pauses) != 1 || list.Pauses[0].Name != "hook" {
		t.Errorf("pauses: %+v", list)
	}

	body := `{"id": "evt-1", "host": "db-1"}`
	for range 2 {
		code, _, raw := hookPost(t, env, body)
		if code != http.StatusAccepted || !strings.Contains(raw, `"action":"parked"`) || !strings.Contains(raw, `trigger \"hook\" is paused`) {
			t.Fatalf("a delivery while paused: %d %s", code, raw)
		}
	}
	entries, err := env.gw.Store.ListDLQ(context.Background(), store.DLQFilter{})
	if err != nil || len(entries) != 1 || entries[0].Error.Code != "trigger_paused" || !strings.Contains(string(entries[0].Payload), "db-1") {
		t.Fatalf("kept deliveries: %v %+v", err, entries)
	}

	if code, _, raw := env.call("DELETE", "/v1/pauses/trigger/hook", "", nil, nil); code != http.StatusOK {
		t.Fatalf("unpause: %d %s", code, raw)
	}
	if code, _, raw := env.call("DELETE", "/v1/pauses/trigger/hook", "", nil, nil); code != http.StatusNotFound || !strings.Contains(raw, "not_paused") {
		t.Errorf("unpausing again: %d %s", code, raw)
	}
	if code, _, raw := env.call("POST", "/v1/pauses/trigger/nope", `{}`, nil, nil); code != http.StatusNotFound {
		t.Errorf("pausing an unknown trigger: %d %s", code, raw)
	}
	code, _, raw := hookPost(t, env, `{"id": "evt-2", "host": "db-2"}`)
	if code != http.StatusAccepted || !strings.Contains(raw, `"action":"started"`) {
		t.Fatalf("a delivery once unpaused: %d %s", code, raw)
	}
	// The kept delivery is replayed as any parked one.
	var replayed map[string]any
	if code, _, raw := env.call("POST", "/v1/dlq/"+entries[0].ID+"/replay", `{}`, nil, &replayed); code != http.StatusAccepted || replayed["run"] == nil {
		t.Errorf("replaying the kept delivery: %d %s", code, raw)
	}
}

// hookPost delivers body to the hook trigger, signed as its sender signs.
func hookPost(t *testing.T, env *apiEnv, body string) (int, gateway.TriggerResponse, string) {
	t.Helper()
	mac := hmac.New(sha256.New, []byte("hook-hmac-key"))
	mac.Write([]byte(body))
	return fire(t, env, "hook", body, map[string]string{"X-Hub-Signature-256": "sha256=" + hex.EncodeToString(mac.Sum(nil))})
}

// TestPauseSchedule: a paused schedule's tick starts nothing, and says so.
func TestPauseSchedule(t *testing.T) {
	t.Parallel()
	env := newAPI(t, scheduleConfig)
	ctx := engine.WithActor(context.Background(), "alice")
	if _, err := env.gw.Pause(ctx, gateway.PauseSchedule, "every-5m", "maintenance"); err != nil {
		t.Fatal(err)
	}
	for _, f := range env.srv.Scheduler().Due(ctx, at(t, "2026-11-25T09:06:00Z")) {
		if f.Schedule == "every-5m" && (f.Action != "paused" || f.Run != "" || !strings.Contains(f.Reason, "paused by alice")) {
			t.Errorf("a paused schedule's tick: %+v", f)
		}
	}
	if p, err := env.gw.Resume(ctx, gateway.PauseSchedule, "every-5m"); err != nil || p == nil || p.Reason != "maintenance" {
		t.Fatalf("resume: %v %+v", err, p)
	}
	for _, f := range env.srv.Scheduler().Due(ctx, at(t, "2026-11-25T09:11:00Z")) {
		if f.Schedule == "every-5m" && f.Action != "started" {
			t.Errorf("the tick once resumed: %+v", f)
		}
	}
}
