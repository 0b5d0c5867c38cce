package server_test

import (
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/internal/testutil/redistest"
)

// haConfig is onResolveConfig with a short lease, so that the gateway
// advancing a run reads what the other asked of it within a second.
func haConfig(onResolve string) string {
	return "lease_ttl_seconds = 3\n" + strings.ReplaceAll(onResolveConfig, "ON_RESOLVE", onResolve)
}

// TestOtherGatewayActsOnRun: with two gateways on one Redis, what one may
// do to a run the other advances, the other does too: cancel it through
// the API, answer its approval step, resolve the alert that started it
// (on_resolve cancels the run or answers its question, and the answer
// says so), whether the resolution reaches the other gateway or both at
// once; the cancel goes through the API client the command line uses; and a run cancelled so is replayed through the gateway that did
// not advance it, and cancelled again through the one that did.
func TestOtherGatewayActsOnRun(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, onResolve, act, status string
		both                         bool
	}{
		{name: "API cancel", onResolve: "cancel", act: "cancel", status: "cancelled"},
		{name: "approve", onResolve: "reject", act: "approve", status: "succeeded"},
		{name: "on_resolve cancel", onResolve: "cancel", act: "resolve", status: "cancelled"},
		{name: "on_resolve cancel through both", onResolve: "cancel", act: "resolve", status: "cancelled", both: true},
		{name: "on_resolve reject", onResolve: "reject", act: "resolve", status: "succeeded"},
		{name: "on_resolve reject through both", onResolve: "reject", act: "resolve", status: "succeeded", both: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			state := redistest.Open(t)
			owner, other := newAPIOn(t, haConfig(tc.onResolve), state), newAPIOn(t, haConfig(tc.onResolve), state)
			owner.token, other.token = "full-tok", "full-tok"
			id := waitingRun(t, owner)

			switch tc.act {
			case "cancel":
				// As gateway runs cancel --server does.
				if err := api.NewClient(other.url, other.token).CancelRun(t.Context(), id); err != nil {
					t.Fatalf("cancel through the other gateway: %v", err)
				}
			case "approve":
				if code, _, raw := other.call("POST", "/v1/runs/"+id+"/signals/ask", `{"decision": "approve"}`, nil, nil); code != http.StatusAccepted {
					t.Fatalf("approve through the other gateway: %d %s", code, raw)
				}
			case "resolve":
				to := []*apiEnv{other}
				if tc.both {
					to = append(to, owner)
				}
				answers := resolveAt(t, to)
				acted := 0
				for _, res := range answers {
					if res.Action == "resolved" {
						acted++
						want := map[string]string{"cancel": "cancelled", "reject": "rejected"}[tc.onResolve]
						if res.Run != id || len(res.OnResolve) != 1 || res.OnResolve[0].Outcome != want || res.OnResolve[0].Step != "ask" {
							t.Errorf("the resolution's answer: %+v", res)
						}
					}
				}
				if acted == 0 {
					t.Errorf("no answer says what on_resolve did: %+v", answers)
				}
			}
			v := waitRunEnd(t, owner, id)
			if v.Status != tc.status {
				t.Fatalf("run %s ended %s, want %s: %+v", id, v.Status, tc.status, v.Error)
			}
			if tc.status != "cancelled" {
				return
			}
			// The other gateway takes the run up again, and the first one
			// cancels it there.
			if code, _, raw := other.call("POST", "/v1/runs/"+id+"/replay", `{"mode": "resume"}`, nil, nil); code != http.StatusAccepted {
				t.Fatalf("replay through the other gateway: %d %s", code, raw)
			}
			waitStatus(t, owner, id, "waiting")
			if code, _, raw := owner.call("POST", "/v1/runs/"+id+"/cancel", "", nil, nil); code != http.StatusAccepted {
				t.Fatalf("cancel through the first gateway: %d %s", code, raw)
			}
			if v := waitRunEnd(t, other, id); v.Status != "cancelled" || v.Error == nil || !strings.Contains(v.Error.Message, "(API)") {
				t.Errorf("after the second cancel: %s %+v", v.Status, v.Error)
			}
		})
	}
}

// waitingRun fires the alert through env and waits for its run to wait at
// its approval step.
func waitingRun(t *testing.T, env *apiEnv) string {
	t.Helper()
	var res api.TriggerResponse
	if code, _, raw := env.call("POST", "/v1/triggers/am", triggerFixture(t, "alertmanager-firing.json"), nil, &res); code != http.StatusAccepted {
		t.Fatalf("firing: %d %s", code, raw)
	}
	id := res.Results[0].Run
	waitStatus(t, env, id, "waiting")
	return id
}

// resolveAt sends the alert's resolution to each gateway at once, and
// returns the result for the alert from each answer.
func resolveAt(t *testing.T, envs []*apiEnv) []api.TriggerResult {
	t.Helper()
	out := make([]api.TriggerResult, len(envs))
	var wg sync.WaitGroup
	for i, env := range envs {
		wg.Go(func() {
			var res api.TriggerResponse
			code, _, raw := env.call("POST", "/v1/triggers/am", triggerFixture(t, "alertmanager-resolved.json"), nil, &res)
			if code >= 300 || len(res.Results) != 1 {
				t.Errorf("resolved: %d %s", code, raw)
				return
			}
			out[i] = res.Results[0]
		})
	}
	wg.Wait()
	return out
}
