package server_test

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway/api"
)

const limitsConfig = `[gateway]
secrets_file = "secrets.env"

[[providers]]
name = "echo"
type = "echo"
max_concurrency = 4
rate_limit = { per_second = 1000.0 }

[[providers]]
name = "faulty"
type = "faulty"
BREAKER

[[chains]]
name = "down"
[[chains.steps]]
name = "call"
provider = "faulty"
payload_template = { fail_retryable = "service unavailable", record = "<<origin.payload.record>>" }

[[chains]]
name = "up"
[[chains.steps]]
name = "call"
provider = "echo"
`

// TestCircuitBreakerAcrossRuns reloads a gateway with provider limits, fails
// two runs against a provider whose breaker opens after two failures, and
// checks that a third run fails fast without reaching it, that /metrics
// shows it, and that a reload taking the breaker away lets calls through.
func TestCircuitBreakerAcrossRuns(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	reload := func(breaker string) {
		t.Helper()
		env.write(strings.Replace(limitsConfig, "BREAKER", breaker, 1))
		if code, _, body := env.call("POST", "/v1/admin/reload", "", nil, nil); code != http.StatusOK {
			t.Fatalf("reload: %d %s", code, body)
		}
	}
	reload("circuit_breaker = { failures = 2, open_seconds = 600 }")
	record := filepath.Join(env.dir, "calls.jsonl")
	calls := func() int {
		data, _ := os.ReadFile(record)
		return bytes.Count(data, []byte("\n"))
	}
	run := func(chainName string) *api.Step {
		t.Helper()
		var res api.StartResponse
		code, _, body := env.call("POST", "/v1/chains/"+chainName+"/runs?wait=20s", `{"record":"`+record+`"}`, nil, &res)
		if code != http.StatusOK || res.Run == nil || res.Run.Steps["call"] == nil {
			t.Fatalf("run of %s: %d %s", chainName, code, body)
		}
		return res.Run.Steps["call"]
	}
	for i := range 2 {
		if s := run("down"); s.Error == nil || s.Error.Code != "faulty" {
			t.Fatalf("run %d: step %s with %+v, want the provider's own error", i+1, s.Status, s.Error)
		}
	}
	s := run("down")
	if s.Error == nil || s.Error.Code != "circuit_open" || !s.Error.Retryable ||
		!strings.Contains(s.Error.Message, "provider faulty's circuit is open after 2 consecutive failures; next trial in") {
		t.Fatalf("third run: step %s with %+v, want a retryable circuit_open error", s.Status, s.Error)
	}
	if n := calls(); n != 2 {
		t.Errorf("the provider was called %d times, want 2", n)
	}
	if s := run("up"); s.Status != string(store.StepSucceeded) {
		t.Errorf("a run of another provider: step %s with %+v", s.Status, s.Error)
	}

	_, _, body := env.call("GET", "/metrics", "", nil, nil)
	for _, want := range []string{
		"# TYPE chaingate_provider_circuit_state gauge",
		`chaingate_provider_circuit_state{provider="faulty"} 1`,
		`chaingate_provider_circuit_opened_total{provider="faulty"} 1`,
		`chaingate_provider_calls_rejected_total{provider="faulty",reason="circuit_open"} 1`,
		`chaingate_provider_calls_rejected_total{provider="echo",reason="rate_limited"} 0`,
		`chaingate_provider_rate_limited_total{provider="echo"} 0`,
		`chaingate_provider_rate_limit_wait_seconds_total{provider="echo"} 0`,
		`chaingate_provider_concurrency_in_use{provider="echo"} 0`,
		`chaingate_provider_concurrency_waiting{provider="echo"} 0`,
		`chaingate_provider_concurrency_limit{provider="echo"} 4`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if strings.Contains(body, `chaingate_provider_circuit_state{provider="echo"}`) {
		t.Error("metrics show a circuit for a provider without a breaker")
	}
	if t.Failed() {
		t.Log(body)
	}

	// Without its breaker the provider is called again; what it counted
	// stays.
	reload("")
	if s := run("down"); s.Error == nil || s.Error.Code != "faulty" {
		t.Fatalf("after the reload: step %s with %+v, want the provider's own error", s.Status, s.Error)
	}
	if n := calls(); n != 3 {
		t.Errorf("the provider was called %d times, want 3", n)
	}
	_, _, body = env.call("GET", "/metrics", "", nil, nil)
	if strings.Contains(body, `chaingate_provider_circuit_state{provider="faulty"}`) || !strings.Contains(body, `chaingate_provider_circuit_opened_total{provider="faulty"} 1`) {
		t.Errorf("metrics after the reload:\n%s", body)
	}
}
