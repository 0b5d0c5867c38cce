package server_test

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/internal/testutil/redistest"
)

// doorConfig is a trigger of each kind and a chain whose one step records
// each call it gets in the file named by %[1]q.
const doorConfig = `
[[triggers]]
name = "am"
type = "alertmanager"
chain = "door"
payload = { alert = "<<alert.fingerprint>>" }

[[triggers]]
name = "am-group"
type = "alertmanager"
chain = "door"
per = "group"
payload = { group = "<<group.groupKey>>" }

[[chains]]
name = "door"
[[chains.steps]]
name = "page"
provider = "faulty"
payload_template = { record = %[1]q, sleep_ms = 20 }
`

// TestConcurrentDeliveriesStartOneRun sends the same alert, alert group or
// Idempotency-Key several times at once, to one gateway or to two sharing
// Redis, and counts the calls the chain's step got: one run per key, one
// call per run, every answer naming that run, none refused.
func TestConcurrentDeliveriesStartOneRun(t *testing.T) {
	const keys = 10
	for _, tc := range []struct {
		store    string
		gateways int
	}{{"bolt", 1}, {"redis", 1}, {"redis", 2}} {
		for _, n := range []int{2, 8} {
			t.Run(fmt.Sprintf("%s/%d-gateways/%d-at-once", tc.store, tc.gateways, n), func(t *testing.T) {
				record := filepath.Join(t.TempDir(), "calls.jsonl")
				extra := fmt.Sprintf(doorConfig, record)
				state := ""
				if tc.store == "redis" {
					state = redistest.Open(t)
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				var envs []*apiEnv
				for range tc.gateways {
					env := newAPIOn(t, extra, state)
					// What a delivery keeps past its answer's budget is
					// started by the inbox, as serve runs it.
					go env.srv.Door().RunInbox(ctx)
					envs = append(envs, env)
				}
				type answer struct {
					code int
					run  string
					body string
				}
				var (
					mu      sync.Mutex
					answers = map[string][]answer{}
					wg      sync.WaitGroup
				)
				send := func(key string, i int, req func(env *apiEnv) (int, string, string)) {
					defer wg.Done()
					code, run, body := req(envs[i%len(envs)])
					mu.Lock()
					answers[key] = append(answers[key], answer{code, run, body})
					mu.Unlock()
				}
				for k := range keys {
					alert := fmt.Sprintf(`{"version":"4","groupKey":"g-%[1]d","status":"firing","alerts":[{"status":"firing","labels":{"alertname":"A%[1]d"},"startsAt":"2026-11-25T03:12:00Z","fingerprint":"fp-%[1]d"}]}`, k)
					for i := range n {
						wg.Add(3)
						go send(fmt.Sprintf("alert %d", k), i, func(env *apiEnv) (int, string, string) {
							return postTrigger(t, env, "am", alert)
						})
						go send(fmt.Sprintf("group %d", k), i, func(env *apiEnv) (int, string, string) {
							return postTrigger(t, env, "am-group", alert)
						})
						go send(fmt.Sprintf("key %d", k), i, func(env *apiEnv) (int, string, string) {
							var out api.StartResponse
							code, _, body := env.call("POST", "/v1/chains/door/runs", `{}`, map[string]string{"Idempotency-Key": fmt.Sprint("k-", k)}, &out)
							return code, out.ID, body
						})
					}
				}
				wg.Wait()

				runs := map[string]bool{}
				for key, as := range answers {
					named := ""
					for _, a := range as {
						if a.code != http.StatusOK && a.code != http.StatusAccepted {
							t.Errorf("%s: answered %d %s", key, a.code, a.body)
						}
						if a.run == "" && strings.Contains(a.body, `"action":"queued"`) {
							// Not started within the answer's budget on a
							// loaded machine: kept, and started after it.
							continue
						}
						if named == "" {
							named = a.run
						}
						if a.run == "" || a.run != named {
							t.Errorf("%s: the answers name runs %q and %q: %s", key, named, a.run, a.body)
						}
					}
					if named != "" {
						runs[named] = true
					}
				}
				if len(runs) > 3*keys {
					t.Errorf("%d runs started for %d keys", len(runs), 3*keys)
				}
				for id := range runs {
					if v := waitRunEnd(t, envs[0], id); v.Status != "succeeded" {
						t.Errorf("run %s is %s", id, v.Status)
					}
				}
				// The runs of answers that were all queued end too: every
				// key's one step is called, once.
				calls := map[string]int{}
				for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
					clear(calls)
					for _, line := range readLines(t, record) {
						var rec struct {
							DedupKey string `json:"dedup_key"`
						}
						if err := json.Unmarshal([]byte(line), &rec); err != nil {
							t.Fatalf("record %q: %v", line, err)
						}
						calls[rec.DedupKey]++
					}
					if len(calls) >= 3*keys || time.Now().After(deadline) {
						break
					}
				}
				for key, c := range calls {
					if c != 1 {
						t.Errorf("step %s called %d times", key, c)
					}
				}
				if len(calls) != 3*keys {
					t.Errorf("%d steps called, want %d", len(calls), 3*keys)
				}
				for _, env := range envs {
					if strings.Contains(env.logs.String(), "lease") {
						t.Errorf("the gateway logged about leases:\n%s", env.logs)
					}
				}
			})
		}
	}
}

// postTrigger posts an alert notification to a trigger that needs the
// API's token, and returns the answer and the run its one result names.
func postTrigger(t *testing.T, env *apiEnv, name, body string) (int, string, string) {
	var out api.TriggerResponse
	code, _, raw := env.call("POST", "/v1/triggers/"+name, body, nil, &out)
	if len(out.Results) != 1 {
		return code, "", raw
	}
	return code, out.Results[0].Run, raw
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return lines
}

// doorTriggers are an alert trigger whose mapping needs a label, a group
// trigger with a resolve chain, and a signed webhook that maps headers.
const doorTriggers = `
[[triggers]]
name = "am"
type = "alertmanager"
chain = "door"
resolve_chain = "close"
max_alerts = MAX
payload = { host = "<<alert.labels.instance>>" }
resolve_payload = { host = "<<alert.labels.instance ?? \"none\">>", firing = "<<firing_run.id ?? \"none\">>" }

[[triggers]]
name = "am-group"
type = "alertmanager"
chain = "door"
resolve_chain = "close"
per = "group"
payload = { group = "<<group.groupKey>>" }
resolve_payload = { firing = "<<firing_run.id ?? \"none\">>" }

[[triggers]]
name = "hook"
type = "webhook"
chain = "door"
secret = "<<secrets.HOOK_SECRET>>"
payload = { headers = "<<headers>>" }

[[chains]]
name = "door"
[[chains.steps]]
name = "page"
provider = "faulty"
payload_template = { record = "RECORD" }

[[chains]]
name = "close"
[[chains.steps]]
name = "close"
provider = "echo"
payload_template = "<<origin.payload>>"
`

// newDoorAPI serves doorTriggers, each call of the door chain's step
// recorded in the file it returns.
func newDoorAPI(t *testing.T, maxAlerts int) (*apiEnv, string) {
	t.Helper()
	return newDoorAPIOn(t, maxAlerts, "")
}

// newDoorAPIOn is newDoorAPI on the store at state ("": a bbolt file).
func newDoorAPIOn(t *testing.T, maxAlerts int, state string) (*apiEnv, string) {
	t.Helper()
	t.Setenv("CHAINGATE_SECRET_HOOK_SECRET", "hook-hmac-key")
	record := filepath.Join(t.TempDir(), "calls.jsonl")
	cfg := strings.NewReplacer("RECORD", record, "MAX", fmt.Sprint(maxAlerts)).Replace(doorTriggers)
	return newAPIOn(t, cfg, state), record
}

// onEachStore runs fn on a bbolt file and on Redis.
func onEachStore(t *testing.T, fn func(t *testing.T, state string)) {
	t.Run("bolt", func(t *testing.T) { fn(t, "") })
	t.Run("redis", func(t *testing.T) { fn(t, redistest.Open(t)) })
}

// alertGroup is an Alertmanager notification of group gk holding alerts,
// each "fingerprint startsAt status".
func alertGroup(gk, status string, alerts ...string) string {
	var list []string
	for _, a := range alerts {
		f := strings.Fields(a)
		list = append(list, fmt.Sprintf(`{"status":%q,"labels":{"alertname":"A","instance":"%s:9100"},"startsAt":%q,"fingerprint":%q}`, f[2], f[0], f[1], f[0]))
	}
	return fmt.Sprintf(`{"version":"4","groupKey":%q,"status":%q,"receiver":"chaingate","alerts":[%s]}`, gk, status, strings.Join(list, ","))
}

func deliver(t *testing.T, env *apiEnv, trigger, body string) (int, api.TriggerResponse, string) {
	t.Helper()
	var out api.TriggerResponse
	code, _, raw := env.call("POST", "/v1/triggers/"+trigger, body, nil, &out)
	return code, out, raw
}

// TestAlertKeysDoNotCollide sends alerts whose fingerprint and startsAt,
// joined, read alike, and a firing alert whose startsAt is crafted to
// look like another alert's resolution: each is an alert of its own, and
// the real resolution still starts its chain.
func TestAlertKeysDoNotCollide(t *testing.T) {
	env, _ := newDoorAPI(t, 10)
	runs := map[string]bool{}
	for _, a := range []string{"x/y z firing", "x y/z firing", "fp T1/resolved firing"} {
		code, res, raw := deliver(t, env, "am", alertGroup("g", "firing", a))
		if code != http.StatusAccepted || res.Results[0].Action != "started" {
			t.Fatalf("alert %q: %d %s", a, code, raw)
		}
		runs[res.Results[0].Run] = true
	}
	if len(runs) != 3 {
		t.Errorf("3 alerts started %d runs", len(runs))
	}
	code, res, raw := deliver(t, env, "am", alertGroup("g", "firing", "fp T1 firing"))
	if code != http.StatusAccepted || res.Results[0].Action != "started" {
		t.Fatalf("the real alert: %d %s", code, raw)
	}
	firing := res.Results[0].Run
	code, res, raw = deliver(t, env, "am", alertGroup("g", "resolved", "fp T1 resolved"))
	if code != http.StatusAccepted || res.Results[0].Action != "started" || res.Results[0].Chain != "close" || res.Results[0].FiringRun != firing {
		t.Fatalf("its resolution: %d %s", code, raw)
	}
}

// TestLongAlertKeys: an alert whose fingerprint is longer than a store
// keeps in a key starts its run, and again finds it; a short fingerprint
// written as the long one's digest is an alert of its own.
func TestLongAlertKeys(t *testing.T) {
	env, _ := newDoorAPI(t, 10)
	env.write(strings.Replace(readFile(t, env.cfg), "max_request_bytes = 2048", "max_request_bytes = 1048576", 1))
	if code, _, raw := env.call("POST", "/v1/admin/reload", "", nil, nil); code != http.StatusOK {
		t.Fatalf("reload: %d %s", code, raw)
	}
	long := strings.Repeat("f", store.MaxKeyBytes+1)
	code, res, raw := deliver(t, env, "am", alertGroup("g", "firing", long+" T1 firing"))
	if code != http.StatusAccepted || res.Results[0].Action != "started" {
		t.Fatalf("an alert with a %d-byte fingerprint: %d %.300s", len(long), code, raw)
	}
	run := res.Results[0].Run
	code, res, raw = deliver(t, env, "am", alertGroup("g", "firing", long+" T1 firing"))
	if code != http.StatusOK || res.Results[0].Action != "replayed" || res.Results[0].Run != run {
		t.Fatalf("the same alert again: %d %.300s", code, raw)
	}
	sum := sha256.Sum256([]byte(long))
	code, res, raw = deliver(t, env, "am", alertGroup("g", "firing", "%sha256-"+hex.EncodeToString(sum[:])+" T1 firing"))
	if code != http.StatusAccepted || res.Results[0].Action != "started" || res.Results[0].Run == run {
		t.Fatalf("a fingerprint written as the long one's digest: %d %.300s", code, raw)
	}
}

// TestAlertGroupLifetime follows one alert group: its first firing
// notification starts a run; while it fires, notifications with other
// members start nothing and are noted on the run, once each whichever HA
// member sends them; its resolution starts the resolve chain once; a later
// firing starts a new run.
func TestAlertGroupLifetime(t *testing.T) { onEachStore(t, alertGroupLifetime) }

func alertGroupLifetime(t *testing.T, state string) {
	env, record := newDoorAPIOn(t, 10, state)
	first := alertGroup("{}:{alertname=\"A\"}", "firing", "a T1 firing", "b T2 firing")
	code, res, raw := deliver(t, env, "am-group", first)
	if code != http.StatusAccepted || res.Results[0].Action != "started" || res.Results[0].Group != `{}:{alertname="A"}` {
		t.Fatalf("first notification: %d %s", code, raw)
	}
	run := res.Results[0].Run
	waitRunEnd(t, env, run)
	for _, body := range []string{
		first, // the other member of the HA pair
		alertGroup("{}:{alertname=\"A\"}", "firing", "a T1 firing", "b T2 resolved"),
		alertGroup("{}:{alertname=\"A\"}", "firing", "a T1 firing", "b T2 resolved"),
		alertGroup("{}:{alertname=\"A\"}", "firing", "a T1 firing"),
	} {
		code, res, raw := deliver(t, env, "am-group", body)
		if code != http.StatusOK || res.Results[0].Action != "replayed" || res.Results[0].Run != run {
			t.Fatalf("a notification while the group fires: %d %s", code, raw)
		}
	}
	resolved := alertGroup("{}:{alertname=\"A\"}", "resolved", "a T1 resolved")
	code, res, raw = deliver(t, env, "am-group", resolved)
	if code != http.StatusAccepted || res.Results[0].Action != "started" || res.Results[0].Chain != "close" || res.Results[0].FiringRun != run {
		t.Fatalf("the group resolved: %d %s", code, raw)
	}
	closing := res.Results[0].Run
	if body := runPayload(t, env, closing); body["firing"] != run {
		t.Errorf("the resolve run's payload: %v", body)
	}
	if _, res, raw = deliver(t, env, "am-group", resolved); res.Results[0].Action != "replayed" || res.Results[0].Run != closing {
		t.Errorf("the resolution again: %s", raw)
	}
	var notes []string
	evs, err := env.gw.Store.Events(t.Context(), run, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		if ev.Type == "note" {
			notes = append(notes, ev.Message)
		}
	}
	want := []string{"alert group notified again: firing, 1 firing, 1 resolved", "alert group notified again: firing, 1 firing, 0 resolved", "alert group resolved: 1 alerts"}
	if strings.Join(notes, "|") != strings.Join(want, "|") {
		t.Errorf("notes on the group's run:\n%q\nwant\n%q", notes, want)
	}

	code, res, raw = deliver(t, env, "am-group", alertGroup("{}:{alertname=\"A\"}", "firing", "a T9 firing"))
	if code != http.StatusAccepted || res.Results[0].Action != "started" || res.Results[0].Run == run {
		t.Fatalf("the group firing again: %d %s", code, raw)
	}
	waitRunEnd(t, env, res.Results[0].Run)
	if n := len(readLines(t, record)); n != 2 {
		t.Errorf("the group's page step was called %d times over two firings", n)
	}
}

// TestParkedDeliveryReplays sends an alert the trigger's mapping cannot
// turn into a run: it is parked as a delivery entry, loudly, once however
// often it comes; the entry replays into a run once the config is fixed,
// and goes.
func TestParkedDeliveryReplays(t *testing.T) { onEachStore(t, parkedDeliveryReplays) }

func parkedDeliveryReplays(t *testing.T, state string) {
	env, record := newDoorAPIOn(t, 10, state)
	noInstance := `{"version":"4","groupKey":"g","status":"firing","alerts":[{"status":"firing","labels":{"alertname":"A"},"startsAt":"T1","fingerprint":"fp1"}]}`
	code, res, raw := deliver(t, env, "am", noInstance)
	if code != http.StatusAccepted || res.Results[0].Action != "parked" || res.Results[0].DeadLetter == "" ||
		!strings.Contains(res.Results[0].Reason, "<<alert.labels.instance>>") {
		t.Fatalf("an alert the mapping fails on: %d %s", code, raw)
	}
	entry := res.Results[0].DeadLetter
	if _, again, _ := deliver(t, env, "am", noInstance); again.Results[0].DeadLetter != entry {
		t.Errorf("the alert again: parked as %s, first as %s", again.Results[0].DeadLetter, entry)
	}
	var list struct {
		Entries []api.DLQEntry `json:"entries"`
	}
	env.call("GET", "/v1/dlq", "", nil, &list)
	if len(list.Entries) != 1 || list.Entries[0].Kind != "delivery" || list.Entries[0].Trigger != "am" || list.Entries[0].RunID != "" ||
		list.Entries[0].Error.Code != "trigger_mapping" || !strings.Contains(string(list.Entries[0].Payload), `"fingerprint":"fp1"`) {
		t.Fatalf("the dead-letter queue: %+v", list.Entries)
	}
	if !strings.Contains(env.logs.String(), `"level":"ERROR","msg":"a trigger delivery was parked in the dead-letter queue`) {
		t.Error("no ERROR line for the parked delivery")
	}
	var metrics string
	_, _, metrics = env.call("GET", "/metrics", "", nil, nil)
	if !strings.Contains(metrics, `chaingate_trigger_deliveries_total{outcome="parked",trigger="am"} 2`) {
		t.Errorf("the metrics count no parked deliveries:\n%s", grepLines(metrics, "trigger_deliveries"))
	}

	b := newBrowser(t, env)
	if code, _, page := b.get("/ui/"); code != http.StatusOK || !strings.Contains(page, "trigger am: no run started") {
		t.Errorf("the console's Now page does not show the parked delivery: %d", code)
	}
	if code, _, page := b.get("/ui/dlq/" + entry); code != http.StatusOK || !strings.Contains(page, "Replay: deliver it again to trigger am") {
		t.Errorf("the console's page of the entry: %d", code)
	}

	// Still broken: the replay says so, and the entry stays.
	if code, _, raw := env.call("POST", "/v1/dlq/"+entry+"/replay", `{}`, nil, nil); code != http.StatusConflict || !strings.Contains(raw, "instance") {
		t.Errorf("a replay on the same config: %d %s", code, raw)
	}
	env.write(strings.Replace(readFile(t, env.cfg), `payload = { host = "<<alert.labels.instance>>" }`, `payload = { host = "<<alert.labels.instance ?? \"unknown\">>" }`, 1))
	if code, _, raw := env.call("POST", "/v1/admin/reload", "", nil, nil); code != http.StatusOK {
		t.Fatalf("reload: %d %s", code, raw)
	}
	var replayed struct {
		Run string `json:"run"`
	}
	if code, _, raw := env.call("POST", "/v1/dlq/"+entry+"/replay", `{}`, nil, &replayed); code != http.StatusAccepted || replayed.Run == "" {
		t.Fatalf("the replay once fixed: %d %s", code, raw)
	}
	v := waitRunEnd(t, env, replayed.Run)
	var meta map[string]string
	_ = json.Unmarshal(v.Origin.Metadata, &meta)
	if v.Status != "succeeded" || meta["alert_fingerprint"] != "fp1" || meta["trigger"] != "am" {
		t.Errorf("the replayed run: %s %v", v.Status, meta)
	}
	if code, _, _ := env.call("GET", "/v1/dlq/"+entry, "", nil, nil); code != http.StatusNotFound {
		t.Errorf("the entry after its replay: %d", code)
	}
	// Alertmanager's next repeat finds the run the replay started.
	if _, again, raw := deliver(t, env, "am", noInstance); again.Results[0].Action != "replayed" || again.Results[0].Run != replayed.Run {
		t.Errorf("the alert after the replay: %s", raw)
	}
	if n := len(readLines(t, record)); n != 1 {
		t.Errorf("the page step was called %d times", n)
	}
}

// TestLargeDelivery sends more alerts than the trigger's max_alerts: the
// answer starts or keeps those within it and parks the rest, in entries of
// at most max_alerts each; every kept alert's run starts after the answer,
// each step once. With no time to start any before the answer, all are
// kept and started after it.
func TestLargeDelivery(t *testing.T) {
	for _, budget := range []time.Duration{time.Second, 0} {
		t.Run(fmt.Sprint("budget ", budget), func(t *testing.T) {
			onEachStore(t, func(t *testing.T, state string) { largeDelivery(t, state, budget) })
		})
	}
}

func largeDelivery(t *testing.T, state string, budget time.Duration) {
	const limit, sent = 300, 750
	env, record := newDoorAPIOn(t, limit, state)
	env.srv.SetDeliveryBudget(budget)
	env.write(strings.Replace(readFile(t, env.cfg), "max_request_bytes = 2048", "max_request_bytes = 1048576", 1))
	if code, _, raw := env.call("POST", "/v1/admin/reload", "", nil, nil); code != http.StatusOK {
		t.Fatalf("reload: %d %s", code, raw)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go env.srv.Door().RunInbox(ctx)
	var alerts []string
	for i := range sent {
		alerts = append(alerts, fmt.Sprintf("fp%04d T1 firing", i))
	}
	code, res, raw := deliver(t, env, "am", alertGroup("g", "firing", alerts...))
	if code != http.StatusAccepted || res.TruncatedAlerts != sent-limit {
		t.Fatalf("%d alerts: %d %.300s", sent, code, raw)
	}
	actions := map[string]int{}
	for _, r := range res.Results {
		actions[r.Action]++
	}
	if actions["started"]+actions["queued"] != limit || actions["parked"] != 2 || len(res.Results) != limit+2 ||
		(budget == 0 && actions["queued"] != limit) {
		t.Errorf("what the answer says: %v", actions)
	}
	for deadline := time.Now().Add(60 * time.Second); len(readLines(t, record)) < limit && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
	}
	calls := map[string]int{}
	for _, line := range readLines(t, record) {
		var rec struct {
			DedupKey string `json:"dedup_key"`
		}
		_ = json.Unmarshal([]byte(line), &rec)
		calls[rec.DedupKey]++
	}
	if len(calls) != limit {
		t.Errorf("%d steps called, want %d", len(calls), limit)
	}
	for key, n := range calls {
		if n != 1 {
			t.Errorf("step %s called %d times", key, n)
		}
	}
	// The inbox lets go of a delivery once every alert in it has started,
	// which may be after their runs have called their steps.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ds, err := env.gw.Store.Deliveries(ctx, 0)
		if err == nil && len(ds) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("kept deliveries once started: %d %v", len(ds), err)
			break
		}
	}
	var list struct {
		Entries []api.DLQEntry `json:"entries"`
	}
	env.call("GET", "/v1/dlq", "", nil, &list)
	total := 0
	for _, e := range list.Entries {
		var g struct {
			Alerts []any `json:"alerts"`
		}
		_ = json.Unmarshal(e.Payload, &g)
		if e.Error.Code != "max_alerts" || len(g.Alerts) > limit {
			t.Errorf("entry %s: %s, %d alerts", e.ID, e.Error.Code, len(g.Alerts))
		}
		total += len(g.Alerts)
	}
	if total != sent-limit {
		t.Errorf("the entries hold %d alerts, want %d", total, sent-limit)
	}
}

// TestWebhookDoor checks what a webhook delivery keeps and refuses: no
// header that may carry a credential reaches the run, and a signed body
// captured and sent again starts nothing new.
func TestWebhookDoor(t *testing.T) {
	env, _ := newDoorAPI(t, 10)
	body := `{"event":"push"}`
	mac := hmac.New(sha256.New, []byte("hook-hmac-key"))
	mac.Write([]byte(body))
	headers := map[string]string{
		"X-Hub-Signature-256": "sha256=" + hex.EncodeToString(mac.Sum(nil)),
		"X-Github-Delivery":   "72d3162e-cc78-11e3-81ab-4c9367dc0958",
		"X-Gitlab-Token":      "gl-secret", "Proxy-Authorization": "Basic cHJveHk6c2VjcmV0", "X-Api-Key": "k-123",
		"X-Amz-Security-Token": "amz", "X-Custom": "Bearer abc.def", "Cookie": "session=1", "X-Event": "push",
	}
	env.token = ""
	var res api.TriggerResponse
	code, _, raw := env.call("POST", "/v1/triggers/hook", body, headers, &res)
	if code != http.StatusAccepted || res.Results[0].Action != "started" {
		t.Fatalf("signed delivery: %d %s", code, raw)
	}
	v := waitRunEnd(t, env, res.Results[0].Run)
	if s := string(v.Origin.Payload); !strings.Contains(s, `"x-event":"push"`) || !strings.Contains(s, `"x-github-delivery"`) {
		t.Errorf("the run's payload lacks the plain headers: %s", s)
	}
	for _, secret := range []string{"gl-secret", "cHJveHk6c2VjcmV0", "k-123", "amz", "abc.def", "session=1", "sha256="} {
		if strings.Contains(string(v.Origin.Payload), secret) {
			t.Errorf("the run keeps %q: %s", secret, v.Origin.Payload)
		}
	}
	var again api.TriggerResponse
	headers["X-Github-Delivery"] = "another-id"
	code, _, raw = env.call("POST", "/v1/triggers/hook", body, headers, &again)
	if code != http.StatusOK || again.Results[0].Action != "replayed" || again.Results[0].Run != res.Results[0].Run {
		t.Errorf("the captured request sent again: %d %s", code, raw)
	}
}

// TestEmptyDelivery answers a notification with no alerts with an empty
// list of results.
func TestEmptyDelivery(t *testing.T) {
	env, _ := newDoorAPI(t, 10)
	code, _, raw := deliver(t, env, "am", `{"alerts":[]}`)
	if code != http.StatusOK || !strings.Contains(raw, `"results":[]`) {
		t.Errorf("no alerts: %d %s", code, raw)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestTriggerGuessesAreSlowed sends wrong signatures to a trigger: they
// count against the sender's address as wrong API tokens do.
func TestTriggerGuessesAreSlowed(t *testing.T) {
	env, _ := newDoorAPI(t, 10)
	wrong := map[string]string{"X-Hub-Signature-256": "sha256=" + strings.Repeat("ab", 32)}
	for i := range 10 {
		if code, _, raw := env.call("POST", "/v1/triggers/hook", `{}`, wrong, nil); code != http.StatusUnauthorized {
			t.Fatalf("wrong signature %d: %d %s", i+1, code, raw)
		}
	}
	code, h, raw := env.call("POST", "/v1/triggers/hook", `{}`, wrong, nil)
	if code != http.StatusTooManyRequests || h.Get("Retry-After") == "" || !strings.Contains(raw, "too_many_auth_failures") {
		t.Errorf("the eleventh wrong signature: %d %s", code, raw)
	}
	if code, _, _ := env.call("POST", "/v1/triggers/nope", `{}`, map[string]string{"Authorization": "Bearer x"}, nil); code != http.StatusTooManyRequests {
		t.Errorf("a token to an unknown trigger from the same address: %d", code)
	}
}

// panicky panics when a run of a chain calling provider "boom" starts: a
// bug met in the door's work.
type panicky struct{ engine.ProviderResolver }

func (panicky) CheckProvider(_ context.Context, p *chain.Provider) error {
	if p.Name == "boom" {
		panic("a bug met starting a run")
	}
	return nil
}

// TestDoorBugFailsTheDelivery: a bug met while the door takes an alert,
// an alert group or a body fails that delivery, answered 503 so that its
// sender sends it again, logged with its stack and counted as failed;
// the gateway goes on serving.
func TestDoorBugFailsTheDelivery(t *testing.T) {
	t.Parallel()
	cfg := `
[gateway.auth]
tokens = ["full-tok"]

[[providers]]
name = "boom"
type = "echo"

[[triggers]]
name = "boom-alerts"
type = "alertmanager"
chain = "boom"

[[triggers]]
name = "boom-groups"
type = "alertmanager"
chain = "boom"
per = "group"

[[triggers]]
name = "boom-hook"
type = "webhook"
chain = "boom"

[[chains]]
name = "boom"
[[chains.steps]]
name = "call"
provider = "boom"
`
	env := newAPIOn(t, cfg, "", func(o *gateway.Options) {
		o.Providers = func(r engine.ProviderResolver) engine.ProviderResolver { return panicky{r} }
	})
	env.token = "full-tok"
	two := alertGroup("g", "firing", "f1 T1 firing", "f2 T1 firing")
	for _, tc := range []struct{ trigger, body string }{
		{"boom-alerts", two}, {"boom-groups", two}, {"boom-hook", `{"x": 1}`},
	} {
		code, res, raw := deliver(t, env, tc.trigger, tc.body)
		if code != http.StatusServiceUnavailable || len(res.Results) == 0 {
			t.Fatalf("%s: %d %s", tc.trigger, code, raw)
		}
		for _, r := range res.Results {
			if r.Action != "failed" || !strings.Contains(r.Reason, "hit a bug") {
				t.Errorf("%s: %+v", tc.trigger, r)
			}
		}
	}
	if code, _, raw := env.call("POST", "/v1/chains/hello/runs", `{}`, nil, nil); code != http.StatusAccepted {
		t.Errorf("the gateway after the bugs: %d %s", code, raw)
	}
	logs := env.logs.String()
	if !strings.Contains(logs, "the door hit a bug taking a delivery") || !strings.Contains(logs, "a bug met starting a run") || !strings.Contains(logs, "door.go") {
		t.Errorf("the bug's log, with its stack:\n%s", grepLines(logs, "bug"))
	}
	_, _, metrics := env.call("GET", "/metrics", "", nil, nil)
	for _, want := range []string{
		`chaingate_trigger_deliveries_total{outcome="failed",trigger="boom-alerts"} 2`,
		`chaingate_trigger_deliveries_total{outcome="failed",trigger="boom-groups"} 1`,
		`chaingate_trigger_deliveries_total{outcome="failed",trigger="boom-hook"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(metrics, "chaingate_trigger_deliveries_total"))
		}
	}
}
