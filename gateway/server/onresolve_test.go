package server_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/gateway/api"
)

// onResolveConfig asks before restarting what an alert names; the alert's
// resolution applies on_resolve to the question.
const onResolveConfig = `
[gateway.auth]
tokens = ["full-tok"]

[[triggers]]
name = "am"
type = "alertmanager"
chain = "restart"
when = 'alert.labels.severity == "critical"'
payload = { host = "<<alert.labels.instance>>" }

[[chains]]
name = "restart"
[[chains.steps]]
name = "ask"
approval = { message = "Restart <<origin.payload.host>>?", on_resolve = "ON_RESOLVE", on_reject = "continue" }
branches = [{ when = 'result.body.decision == "approve"', target = "do-it" }]
default_next = "told"
[[chains.steps]]
name = "do-it"
provider = "echo"
payload_template = { restarted = "<<origin.payload.host>>" }
default_next = "end"
[[chains.steps]]
name = "told"
provider = "echo"
payload_template = { kept = "<<origin.payload.host>>", why = "<<steps.ask.body.decision>> by <<steps.ask.body.by>>" }
`

// TestApprovalOnResolve: a run waiting to restart what a firing alert
// named is cancelled (or its question answered) when the alert resolves,
// and a repeat of the resolution does nothing more.
func TestApprovalOnResolve(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		onResolve, status, told string
	}{
		{"cancel", "cancelled", ""},
		{"reject", "succeeded", "reject by alert resolved (am)"},
	} {
		t.Run(tc.onResolve, func(t *testing.T) {
			env := newAPI(t, strings.ReplaceAll(onResolveConfig, "ON_RESOLVE", tc.onResolve))
			env.token = "full-tok"
			var res api.TriggerResponse
			if code, _, raw := env.call("POST", "/v1/triggers/am", triggerFixture(t, "alertmanager-firing.json"), nil, &res); code != http.StatusAccepted {
				t.Fatalf("firing: %d %s", code, raw)
			}
			id := res.Results[0].Run
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				var v api.RunView
				env.call("GET", "/v1/runs/"+id, "", nil, &v)
				if v.Status == "waiting" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the run never waited: %s", v.Status)
				}
			}
			for range 2 {
				var resolved api.TriggerResponse
				if code, _, raw := env.call("POST", "/v1/triggers/am", triggerFixture(t, "alertmanager-resolved.json"), nil, &resolved); code >= 300 || resolved.Results[0].FiringRun != id {
					t.Fatalf("resolved: %d %s", code, raw)
				}
			}
			v := waitRunEnd(t, env, id)
			if v.Status != tc.status {
				t.Fatalf("after the resolution: %s %+v", v.Status, v.Error)
			}
			if tc.told != "" {
				if body := fmt.Sprint(v.Steps["told"].Body); !strings.Contains(string(v.Steps["told"].Body), tc.told) {
					t.Errorf("told: %s, want %q in it", body, tc.told)
				}
			}
			if tc.onResolve == "cancel" && (v.Error == nil || !strings.Contains(v.Error.Message, "by alert resolved (am)")) {
				t.Errorf("the cancel: %+v", v.Error)
			}
		})
	}
}
