package server_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/providers/webhook"
)

const triggerConfig = `[gateway.auth]
tokens = ["full-tok"]

[[triggers]]
name = "alertmanager"
type = "alertmanager"
chain = "page"
resolve_chain = "resolved"
when = 'alert.labels.severity == "critical"'
token = "<<secrets.AM_TOKEN>>"
payload = { host = "<<alert.labels.instance>>", summary = "<<alert.annotations.summary>>", severity = "<<alert.labels.severity>>" }
resolve_payload = { host = "<<alert.labels.instance>>", firing_run = "<<firing_run.id>>", firing_status = "<<firing_run.status>>", paged = "<<firing_run.steps.call.body.host>>" }

[[triggers]]
name = "am-groups"
type = "alertmanager"
chain = "page"
per = "group"
payload = { host = "<<group.commonLabels.alertname>>", summary = "<<group.alerts[0].annotations.summary>>" }

[[triggers]]
name = "grafana"
type = "grafana"
chain = "page"
token = "<<secrets.AM_TOKEN>>"
payload = { host = "<<alert.labels.service>>", summary = "<<alert.annotations.summary>>", severity = "<<alert.labels.severity>>", dashboard = "<<alert.dashboardURL>>" }

[[triggers]]
name = "hook"
type = "webhook"
chain = "page"
secret = "<<secrets.HOOK_SECRET>>"
idempotency_key = "<<body.id>>"
when = 'body.action != "ignored"'
payload = { host = "<<body.host>>", summary = "<<headers.x-event ?? \"none\">>" }

[[triggers]]
name = "signed"
type = "webhook"
chain = "page"
secret = "<<secrets.HOOK_SECRET>>"
signature = "chaingate"

[[chains]]
name = "page"
[[chains.steps]]
name = "call"
provider = "echo"
payload_template = "<<origin.payload>>"

[[chains]]
name = "resolved"
[[chains.steps]]
name = "close"
provider = "echo"
payload_template = "<<origin.payload>>"

`

func newTriggerAPI(t *testing.T) *apiEnv {
	t.Setenv("CHAINGATE_SECRET_AM_TOKEN", "am-secret-token")
	t.Setenv("CHAINGATE_SECRET_HOOK_SECRET", "hook-hmac-key")
	return newAPI(t, triggerConfig)
}

func triggerFixture(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "triggers", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// fire posts to a trigger as its sender would.
func fire(t *testing.T, env *apiEnv, name, body string, headers map[string]string) (int, api.TriggerResponse, string) {
	t.Helper()
	env.token = ""
	var out api.TriggerResponse
	code, _, raw := env.call("POST", "/v1/triggers/"+name, body, headers, &out)
	env.token = "full-tok"
	return code, out, raw
}

func runPayload(t *testing.T, env *apiEnv, id string) map[string]any {
	t.Helper()
	v := waitRunEnd(t, env, id)
	if v.Status != "succeeded" {
		t.Fatalf("run %s is %s", id, v.Status)
	}
	var body map[string]any
	if err := json.Unmarshal(v.Body, &body); err != nil {
		t.Fatalf("run %s's body: %v %s", id, err, v.Body)
	}
	return body
}

// TestAlertmanagerTrigger drives the trigger with Alertmanager's webhook:
// a group of two firing alerts starts one run, for the critical one; the
// same notification repeated starts nothing; the resolved one starts the
// resolve chain with the firing run at hand.
func TestAlertmanagerTrigger(t *testing.T) {
	env := newTriggerAPI(t)
	bearer := map[string]string{"Authorization": "Bearer am-secret-token"}
	firing := triggerFixture(t, "alertmanager-firing.json")

	code, res, raw := fire(t, env, "alertmanager", firing, bearer)
	if code != http.StatusAccepted || len(res.Results) != 2 {
		t.Fatalf("firing: %d %s", code, raw)
	}
	started, skipped := res.Results[0], res.Results[1]
	if started.Action != "started" || started.Alert != "4c5b3c1a9e2d7f10" || started.Chain != "page" || started.Run == "" {
		t.Errorf("the critical alert: %+v", started)
	}
	if skipped.Action != "skipped" || !strings.Contains(skipped.Reason, "when is false") {
		t.Errorf("the warning alert: %+v", skipped)
	}
	body := runPayload(t, env, started.Run)
	if body["host"] != "db-1:9100" || body["summary"] != "Disk almost full" || body["severity"] != "critical" {
		t.Errorf("the run's payload: %v", body)
	}
	v := waitRunEnd(t, env, started.Run)
	var meta map[string]string
	_ = json.Unmarshal(v.Origin.Metadata, &meta)
	if meta["trigger"] != "alertmanager" || meta["alert_fingerprint"] != "4c5b3c1a9e2d7f10" || meta["alert_status"] != "firing" {
		t.Errorf("the run's metadata: %v", meta)
	}

	// Alertmanager sends the group again every repeat_interval.
	code, res, raw = fire(t, env, "alertmanager", firing, bearer)
	if code != http.StatusOK || res.Results[0].Action != "replayed" || res.Results[0].Run != started.Run {
		t.Fatalf("the repeat: %d %s", code, raw)
	}

	code, res, raw = fire(t, env, "alertmanager", triggerFixture(t, "alertmanager-resolved.json"), bearer)
	if code != http.StatusAccepted || len(res.Results) != 1 {
		t.Fatalf("resolved: %d %s", code, raw)
	}
	resolved := res.Results[0]
	if resolved.Action != "started" || resolved.Chain != "resolved" || resolved.FiringRun != started.Run || resolved.AlertStatus != "resolved" {
		t.Fatalf("the resolved alert: %+v", resolved)
	}
	body = runPayload(t, env, resolved.Run)
	if body["firing_run"] != started.Run || body["firing_status"] != "succeeded" || body["paged"] != "db-1:9100" || body["host"] != "db-1:9100" {
		t.Errorf("the resolve run's payload: %v", body)
	}
	code, res, _ = fire(t, env, "alertmanager", triggerFixture(t, "alertmanager-resolved.json"), bearer)
	if code != http.StatusOK || res.Results[0].Action != "replayed" || res.Results[0].Run != resolved.Run {
		t.Errorf("the resolved repeat: %d %+v", code, res)
	}

	// An alert that fires again later is a new incident.
	again := strings.ReplaceAll(firing, "2026-11-25T03:12:00.000Z", "2026-11-25T05:00:00.000Z")
	if _, res, _ = fire(t, env, "alertmanager", again, bearer); res.Results[0].Action != "started" || res.Results[0].Run == started.Run {
		t.Errorf("the alert firing again: %+v", res.Results[0])
	}
}

func TestAlertGroupTrigger(t *testing.T) {
	env := newTriggerAPI(t)
	env.token = "full-tok"
	firing := triggerFixture(t, "alertmanager-firing.json")
	var res api.TriggerResponse
	code, _, raw := env.call("POST", "/v1/triggers/am-groups", firing, nil, &res)
	if code != http.StatusAccepted || len(res.Results) != 1 || res.Results[0].Action != "started" {
		t.Fatalf("a group: %d %s", code, raw)
	}
	if body := runPayload(t, env, res.Results[0].Run); body["host"] != "DiskFull" || body["summary"] != "Disk almost full" {
		t.Errorf("the group's run payload: %v", body)
	}
	var again api.TriggerResponse
	env.call("POST", "/v1/triggers/am-groups", firing, nil, &again)
	if again.Results[0].Action != "replayed" || again.Results[0].Run != res.Results[0].Run {
		t.Errorf("the group repeated: %+v", again.Results[0])
	}
	// Without a credential of its own, the trigger takes the API's tokens.
	env.token = ""
	if code, _, _ := env.call("POST", "/v1/triggers/am-groups", firing, nil, nil); code != http.StatusUnauthorized {
		t.Errorf("no token: %d", code)
	}
}

func TestGrafanaTrigger(t *testing.T) {
	env := newTriggerAPI(t)
	code, res, raw := fire(t, env, "grafana", triggerFixture(t, "grafana-firing.json"), map[string]string{"Authorization": "Bearer am-secret-token"})
	if code != http.StatusAccepted || len(res.Results) != 1 || res.Results[0].Alert != "a3f9b27c41d0e865" {
		t.Fatalf("grafana: %d %s", code, raw)
	}
	body := runPayload(t, env, res.Results[0].Run)
	if body["host"] != "checkout" || body["dashboard"] != "https://grafana.example/d/checkout" {
		t.Errorf("the run's payload: %v", body)
	}
}

func TestWebhookTriggerSignatures(t *testing.T) {
	env := newTriggerAPI(t)
	body := `{"id": 9007199254740993, "host": "web-3", "action": "page"}`
	mac := hmac.New(sha256.New, []byte("hook-hmac-key"))
	mac.Write([]byte(body))
	good := "sha256=" + hex.EncodeToString(mac.Sum(nil))

	code, res, raw := fire(t, env, "hook", body, map[string]string{"X-Hub-Signature-256": good, "X-Event": "deploy"})
	if code != http.StatusAccepted || res.Results[0].Action != "started" {
		t.Fatalf("signed: %d %s", code, raw)
	}
	if payload := runPayload(t, env, res.Results[0].Run); payload["host"] != "web-3" || payload["summary"] != "deploy" {
		t.Errorf("the run's payload: %v", payload)
	}
	// The body's id keys the run: the sender's retry is the same run.
	if _, again, _ := fire(t, env, "hook", body, map[string]string{"X-Hub-Signature-256": good}); again.Results[0].Run != res.Results[0].Run {
		t.Errorf("the retry started run %s, not %s", again.Results[0].Run, res.Results[0].Run)
	}

	ignored := `{"id": 2, "host": "web-3", "action": "ignored"}`
	mac = hmac.New(sha256.New, []byte("hook-hmac-key"))
	mac.Write([]byte(ignored))
	if code, res, _ := fire(t, env, "hook", ignored, map[string]string{"X-Hub-Signature-256": "sha256=" + hex.EncodeToString(mac.Sum(nil))}); code != http.StatusOK || res.Results[0].Action != "skipped" {
		t.Errorf("a body the condition leaves out: %d %+v", code, res)
	}

	// A refusal does not say what the trigger takes, nor whether there is
	// such a trigger, to a client the API does not trust: the log does.
	const refused = "a valid bearer token or signature is required"
	ts := time.Now().Unix()
	for _, tc := range []struct {
		name, trigger string
		headers       map[string]string
		code          int
		says, logs    string
	}{
		{"no signature", "hook", nil, http.StatusUnauthorized, refused, "needs an X-Hub-Signature-256 signature"},
		{"a signature of another body", "hook", map[string]string{"X-Hub-Signature-256": "sha256=" + strings.Repeat("ab", 32)}, http.StatusUnauthorized, refused, "does not match the body"},
		{"the API's token", "hook", map[string]string{"Authorization": "Bearer full-tok"}, http.StatusUnauthorized, refused, "needs an X-Hub-Signature-256"},
		{"the webhook provider's signature", "signed", map[string]string{webhook.TimestampHeader: itoa(ts), webhook.SignatureHeader: webhook.Sign([]byte("hook-hmac-key"), ts, []byte(body))}, http.StatusAccepted, `"action":"started"`, ""},
		{"a stale one", "signed", map[string]string{webhook.TimestampHeader: itoa(ts - 3600), webhook.SignatureHeader: webhook.Sign([]byte("hook-hmac-key"), ts-3600, []byte(body))}, http.StatusUnauthorized, refused, "outside the tolerance"},
		{"an unknown trigger", "hooks", nil, http.StatusUnauthorized, refused, ""},
		{"an unknown trigger with a wrong token", "hooks", map[string]string{"Authorization": "Bearer am-secret-token"}, http.StatusUnauthorized, refused, ""},
		{"an unknown trigger with the API's token", "hooks", map[string]string{"Authorization": "Bearer full-tok"}, http.StatusNotFound, `no trigger \"hooks\" (did you mean \"hook\"?)`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, raw := fire(t, env, tc.trigger, body, tc.headers)
			if code != tc.code || !strings.Contains(raw, tc.says) {
				t.Errorf("%d %s, want %d saying %s", code, raw, tc.code, tc.says)
			}
			if tc.logs != "" && !strings.Contains(env.logs.String(), tc.logs) {
				t.Errorf("the log does not say %q", tc.logs)
			}
		})
	}
}

func TestTriggerBadInput(t *testing.T) {
	env := newTriggerAPI(t)
	bearer := map[string]string{"Authorization": "Bearer am-secret-token"}
	for _, tc := range []struct {
		name, body string
		code       int
		says       string
	}{
		{"broken JSON", `{"alerts": [`, http.StatusBadRequest, "invalid_json"},
		{"no alerts", `{"status": "firing"}`, http.StatusBadRequest, "a JSON object with an alerts array"},
		{"an alert that is no object", `{"alerts": [42]}`, http.StatusAccepted, `"action":"parked","chain":"page","dead_letter":`},
		{"a label missing", `{"alerts": [{"status": "firing", "labels": {"severity": "critical"}, "annotations": {}, "fingerprint": "x", "startsAt": "2026-11-25T00:00:00Z"}]}`, http.StatusAccepted, `"reason":"mapping the payload: missing value for <<alert.labels.instance>>"`},
		{"too large", `{"alerts": [], "pad": "` + strings.Repeat("x", 4096) + `"}`, http.StatusRequestEntityTooLarge, "payload_too_large"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, raw := fire(t, env, "alertmanager", tc.body, bearer)
			if code != tc.code || !strings.Contains(raw, tc.says) {
				t.Errorf("%d %s, want %d saying %s", code, raw, tc.code, tc.says)
			}
		})
	}
}

func itoa(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}
