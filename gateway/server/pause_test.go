package server_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/internal/testutil/redistest"
)

// TestPauseTrigger: a paused trigger answers its sender and keeps each
// delivery in the dead-letter queue, saying so; the same delivery sent
// again is kept once; unpaused, it starts runs again. Pausing twice keeps
// the first pause, and what is not paused cannot be unpaused.
func TestPauseTrigger(t *testing.T) {
	env := newTriggerAPI(t)
	env.token = "full-tok"
	var p api.Pause
	if code, _, raw := env.call("POST", "/v1/pauses/trigger/hook", `{"reason": "noisy after the deploy"}`, nil, &p); code != http.StatusCreated || p.By == "" || p.Reason != "noisy after the deploy" {
		t.Fatalf("pause: %d %s", code, raw)
	}
	if code, _, _ := env.call("POST", "/v1/pauses/trigger/hook", `{}`, nil, &p); code != http.StatusOK || p.Reason != "noisy after the deploy" {
		t.Errorf("pausing again: %d %+v", code, p)
	}
	var list struct {
		Pauses []api.Pause `json:"pauses"`
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
func hookPost(t *testing.T, env *apiEnv, body string) (int, api.TriggerResponse, string) {
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
	if _, err := env.srv.Door().Pause(ctx, api.PauseSchedule, "every-5m", "maintenance"); err != nil {
		t.Fatal(err)
	}
	for _, f := range env.srv.Scheduler().Due(ctx, at(t, "2026-11-25T09:06:00Z")) {
		if f.Schedule == "every-5m" && (f.Action != "paused" || f.Run != "" || !strings.Contains(f.Reason, "paused by alice")) {
			t.Errorf("a paused schedule's tick: %+v", f)
		}
	}
	if p, err := env.srv.Door().Resume(ctx, api.PauseSchedule, "every-5m"); err != nil || p == nil || p.Reason != "maintenance" {
		t.Fatalf("resume: %v %+v", err, p)
	}
	for _, f := range env.srv.Scheduler().Due(ctx, at(t, "2026-11-25T09:11:00Z")) {
		if f.Schedule == "every-5m" && f.Action != "started" {
			t.Errorf("the tick once resumed: %+v", f)
		}
	}
}

// pausedAlertsConfig is a trigger that pages for disks only, per alert and
// per group.
const pausedAlertsConfig = `
[gateway.auth]
tokens = ["full-tok"]

[[triggers]]
name = "disk"
type = "alertmanager"
chain = "page"
when = 'alert.labels.alertname == "DiskAlmostFull"'
payload = { host = "<<alert.labels.instance>>", fp = "<<alert.fingerprint>>" }

[[triggers]]
name = "disk-groups"
type = "alertmanager"
chain = "page"
per = "group"
payload = { group = "<<group.groupKey>>" }

[[chains]]
name = "page"
[[chains.steps]]
name = "call"
provider = "echo"
payload_template = "<<origin.payload>>"
`

// namedAlerts is a firing notification of group gk holding alerts, each
// "alertname fingerprint".
func namedAlerts(gk string, alerts ...string) string {
	var list []string
	for _, a := range alerts {
		name, fp, _ := strings.Cut(a, " ")
		list = append(list, fmt.Sprintf(`{"status":"firing","labels":{"alertname":%q,"instance":"%s:9100"},"startsAt":"2026-11-25T03:12:00Z","fingerprint":%q}`, name, fp, fp))
	}
	return fmt.Sprintf(`{"version":"4","groupKey":%q,"status":"firing","receiver":"chaingate","alerts":[%s]}`, gk, strings.Join(list, ","))
}

// TestPausedTriggerKeepsEachAlertOnce: a paused trigger answers with one
// result per alert, and keeps each alert once, however many times, and
// through however many gateways, its notification comes at once; a
// notification that adds an alert keeps only that one anew. Unpaused,
// replaying an entry starts each alert its when selects, once, says the
// others were skipped, and removes the entry, so the queue empties; an
// entry of skipped alerts alone starts nothing and goes too.
func TestPausedTriggerKeepsEachAlertOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		store    string
		gateways int
	}{{"bolt", 1}, {"redis", 1}, {"redis", 2}} {
		t.Run(fmt.Sprintf("%s/%d-gateways", tc.store, tc.gateways), func(t *testing.T) {
			t.Parallel()
			state := ""
			if tc.store == "redis" {
				state = redistest.Open(t)
			}
			var envs []*apiEnv
			for range tc.gateways {
				env := newAPIOn(t, pausedAlertsConfig, state)
				env.token = "full-tok"
				envs = append(envs, env)
			}
			env := envs[0]
			if code, _, raw := env.call("POST", "/v1/pauses/trigger/disk", `{"reason": "storage migration"}`, nil, nil); code != http.StatusCreated {
				t.Fatalf("pause: %d %s", code, raw)
			}
			mixed := namedAlerts("g1", "DiskAlmostFull d1", "HighLoad h1")
			answers := atOnce(t, envs, 4, "disk", mixed)
			entry := ""
			for _, res := range answers {
				if len(res.Results) != 2 {
					t.Fatalf("a paused notification of two alerts: %+v", res)
				}
				for i, r := range res.Results {
					if r.Action != "parked" || r.Alert != []string{"d1", "h1"}[i] || !strings.Contains(r.Reason, "paused") || !strings.Contains(r.Reason, "unpause") {
						t.Errorf("alert %d while paused: %+v", i, r)
					}
					if entry == "" {
						entry = r.DeadLetter
					}
					if r.DeadLetter != entry {
						t.Errorf("the same alert kept in %s and %s", entry, r.DeadLetter)
					}
				}
			}
			more := namedAlerts("g1", "DiskAlmostFull d1", "HighLoad h1", "DiskAlmostFull d2")
			var res api.TriggerResponse
			if code, _, raw := env.call("POST", "/v1/triggers/disk", more, nil, &res); code != http.StatusAccepted || len(res.Results) != 3 {
				t.Fatalf("a notification adding an alert: %d %s", code, raw)
			}
			added := res.Results[2].DeadLetter
			if res.Results[0].DeadLetter != entry || res.Results[1].DeadLetter != entry || added == "" || added == entry {
				t.Fatalf("the alerts kept before, and the new one: %+v", res.Results)
			}
			if code, _, raw := env.call("POST", "/v1/triggers/disk", namedAlerts("g2", "HighLoad h2"), nil, &res); code != http.StatusAccepted {
				t.Fatalf("a notification of an alert when leaves out: %d %s", code, raw)
			}
			unselected := res.Results[0].DeadLetter
			entries, err := env.gw.Store.ListDLQ(context.Background(), store.DLQFilter{})
			if err != nil || len(entries) != 3 {
				t.Fatalf("kept: %v %+v", err, entries)
			}
			for _, e := range entries {
				if e.Error.Code != "trigger_paused" || e.Kind != store.DLQDelivery {
					t.Errorf("entry %s: %+v", e.ID, e)
				}
			}

			if code, _, raw := env.call("DELETE", "/v1/pauses/trigger/disk", "", nil, nil); code != http.StatusOK {
				t.Fatalf("unpause: %d %s", code, raw)
			}
			replays := replayAtOnce(t, envs, entry)
			ok := 0
			for _, r := range replays {
				switch r.code {
				case http.StatusAccepted:
					ok++
					if r.Run == "" || len(r.Results) != 2 || r.Results[0].Run != r.Run || r.Results[1].Action != "skipped" || !strings.Contains(r.Results[1].Reason, "when is false") {
						t.Errorf("replaying the mixed entry: %+v", r)
					}
				case http.StatusNotFound:
					// Replayed and removed by a replay at once with it.
				default:
					t.Errorf("replaying the mixed entry: %d %+v", r.code, r)
				}
			}
			if ok == 0 {
				t.Errorf("no replay of the mixed entry answered 202: %+v", replays)
			}
			if r := replayAtOnce(t, envs[:1], added)[0]; r.code != http.StatusAccepted || r.Run == "" {
				t.Errorf("replaying the added alert's entry: %+v", r)
			}
			if r := replayAtOnce(t, envs[:1], unselected)[0]; r.code != http.StatusOK || r.Run != "" || len(r.Results) != 1 || r.Results[0].Action != "skipped" {
				t.Errorf("replaying an entry of an alert when leaves out: %+v", r)
			}
			if _, _, raw := env.call("GET", "/metrics", "", nil, nil); !strings.Contains(raw, "\nchaingate_dlq_depth 0\n") {
				t.Errorf("the queue did not empty:\n%s", grepLines(raw, "chaingate_dlq_depth"))
			}
			started := map[string]int{}
			var page api.RunPage
			env.call("GET", "/v1/runs?limit=100", "", nil, &page)
			for _, run := range page.Runs {
				var p struct{ FP string }
				_ = json.Unmarshal(run.Origin.Payload, &p)
				started[p.FP]++
			}
			if fmt.Sprint(started) != "map[d1:1 d2:1]" {
				t.Errorf("runs by alert: %v", started)
			}
		})
	}
}

// TestPausedGroupKeptOnce: a paused per-group trigger keeps a group's
// notification once, however often it comes, and its replay starts the
// group's run.
func TestPausedGroupKeptOnce(t *testing.T) {
	t.Parallel()
	env := newAPI(t, pausedAlertsConfig)
	env.token = "full-tok"
	if code, _, raw := env.call("POST", "/v1/pauses/trigger/disk-groups", "", nil, nil); code != http.StatusCreated {
		t.Fatalf("pause: %d %s", code, raw)
	}
	notification := namedAlerts("g1", "DiskAlmostFull d1", "HighLoad h1")
	answers := atOnce(t, []*apiEnv{env}, 3, "disk-groups", notification)
	entry := answers[0].Results[0].DeadLetter
	for _, res := range answers {
		if len(res.Results) != 1 || res.Results[0].Action != "parked" || res.Results[0].Group != "g1" || res.Results[0].DeadLetter != entry {
			t.Errorf("a group's notification while paused: %+v", res)
		}
	}
	if n, err := env.gw.Store.CountDLQ(context.Background()); err != nil || n != 1 {
		t.Fatalf("kept: %d %v", n, err)
	}
	env.call("DELETE", "/v1/pauses/trigger/disk-groups", "", nil, nil)
	if r := replayAtOnce(t, []*apiEnv{env}, entry)[0]; r.code != http.StatusAccepted || r.Run == "" || len(r.Results) != 1 || r.Results[0].Action != "started" {
		t.Errorf("replaying the group's entry: %+v", r)
	}
}

// atOnce posts body to a trigger n times at once, spread over envs, and
// returns the answers.
func atOnce(t *testing.T, envs []*apiEnv, n int, trigger, body string) []api.TriggerResponse {
	t.Helper()
	out := make([]api.TriggerResponse, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			code, _, raw := envs[i%len(envs)].call("POST", "/v1/triggers/"+trigger, body, nil, &out[i])
			if code != http.StatusAccepted {
				t.Errorf("delivery %d: %d %s", i, code, raw)
			}
		})
	}
	wg.Wait()
	return out
}

// entryReplay is an answer to POST /v1/dlq/{id}/replay.
type entryReplay struct {
	code    int
	Run     string              `json:"run"`
	Results []api.TriggerResult `json:"results"`
	raw     string
}

// replayAtOnce replays an entry through each of envs at once.
func replayAtOnce(t *testing.T, envs []*apiEnv, entry string) []entryReplay {
	t.Helper()
	out := make([]entryReplay, len(envs))
	var wg sync.WaitGroup
	for i, env := range envs {
		wg.Go(func() {
			out[i].code, _, out[i].raw = env.call("POST", "/v1/dlq/"+entry+"/replay", "", nil, &out[i])
		})
	}
	wg.Wait()
	return out
}
