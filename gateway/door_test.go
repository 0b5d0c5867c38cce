package gateway_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/chaingate/gateway/gateway"
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
				var envs []*apiEnv
				for range tc.gateways {
					envs = append(envs, newAPIOn(t, extra, state))
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
							var out gateway.StartResponse
							code, _, body := env.call("POST", "/v1/chains/door/runs", `{}`, map[string]string{"Idempotency-Key": fmt.Sprint("k-", k)}, &out)
							return code, out.ID, body
						})
					}
				}
				wg.Wait()

				runs := map[string]bool{}
				for key, as := range answers {
					for _, a := range as {
						if a.code != http.StatusOK && a.code != http.StatusAccepted {
							t.Errorf("%s: answered %d %s", key, a.code, a.body)
						}
						if a.run == "" || a.run != as[0].run {
							t.Errorf("%s: the answers name runs %q and %q: %s", key, as[0].run, a.run, a.body)
						}
					}
					runs[as[0].run] = true
				}
				if len(runs) != 3*keys {
					t.Errorf("%d runs started for %d keys", len(runs), 3*keys)
				}
				for id := range runs {
					if v := waitRunEnd(t, envs[0], id); v.Status != "succeeded" {
						t.Errorf("run %s is %s", id, v.Status)
					}
				}
				calls := map[string]int{}
				for _, line := range readLines(t, record) {
					var rec struct {
						DedupKey string `json:"dedup_key"`
					}
					if err := json.Unmarshal([]byte(line), &rec); err != nil {
						t.Fatalf("record %q: %v", line, err)
					}
					calls[rec.DedupKey]++
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
	var out gateway.TriggerResponse
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
