package engine_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/loader"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/bolt"
	"github.com/chaingate/gateway/plugins/host"
	"github.com/chaingate/gateway/providers/builtin"
)

// TestSecretsNeverWritten sends a secret to providers that echo it back,
// fail with it in their message, and park it in the dead-letter queue, and
// checks that nothing the store holds or the events carry contains it.
func TestSecretsNeverWritten(t *testing.T) {
	const secret = "s3cr3t-T0KEN-\"quoted\"-value"
	cfg, err := loader.LoadBytes("test.toml", []byte(testProviders+`
[[providers]]
name = "configured"
type = "echo"
[providers.config]
token = "<<secrets.API_TOKEN>>"

[[chains]]
name = "c"
[[chains.steps]]
name = "echoed"
provider = "echo"
payload_template = { auth = "Bearer <<secrets.API_TOKEN>>", nested = { raw = "<<secrets.API_TOKEN>>" } }
[[chains.steps]]
name = "with-config"
provider = "configured"
[[chains.steps]]
name = "fails"
provider = "faulty"
payload_template = { fail = "rejected key <<secrets.API_TOKEN>>", key = "<<secrets.API_TOKEN>>" }
on_failure = "dlq"
`), loader.Options{ProviderTypes: builtin.Types()})
	if err != nil {
		t.Fatal(err)
	}
	st, err := bolt.Open(filepath.Join(t.TempDir(), "gw.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	pm := host.NewManager(host.Options{Executable: exe})
	defer pm.Close()
	var mu sync.Mutex
	var published []store.Event
	eng, err := engine.New(engine.Options{
		Store: st, Config: cfg, Providers: resolver{pm},
		Secrets: map[string]string{"API_TOKEN": secret},
		OnEvent: func(ev store.Event) { mu.Lock(); published = append(published, ev); mu.Unlock() },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	ctx := context.Background()
	run, err := eng.Start(ctx, "c", engine.Input{})
	if err != nil {
		t.Fatal(err)
	}
	final, err := eng.Wait(ctx, run.ID)
	if err != nil || final.Status != store.RunFailed {
		t.Fatalf("run: %+v %v", final, err)
	}

	var dump strings.Builder
	add := func(v any) {
		b, _ := json.Marshal(v)
		dump.Write(b)
		dump.WriteByte('\n')
	}
	stored, _ := st.Run(ctx, run.ID)
	add(stored)
	steps, _ := st.Steps(ctx, run.ID, "")
	add(steps)
	evs, _ := st.Events(ctx, run.ID, 0, 0)
	add(evs)
	dlq, _ := st.ListDLQ(ctx, store.DLQFilter{})
	add(dlq)
	mu.Lock()
	add(published)
	mu.Unlock()
	res, _ := eng.Result(ctx, run.ID, true)
	add(res)
	all := dump.String()
	for _, form := range []string{secret, `s3cr3t-T0KEN-\"quoted\"-value`, "s3cr3t-T0KEN"} {
		if strings.Contains(all, form) {
			t.Errorf("the secret (%q) was written:\n%s", form, all)
		}
	}
	// The providers did get it.
	var echoed struct {
		Auth string `json:"auth"`
	}
	_ = json.Unmarshal(res.Steps["echoed"].Body, &echoed)
	if echoed.Auth != "Bearer [REDACTED]" {
		t.Errorf("echoed body: %s", res.Steps["echoed"].Body)
	}
	if !strings.Contains(string(res.Steps["with-config"].Body), "{}") && res.Steps["with-config"].Status != store.StepSucceeded {
		t.Errorf("with-config: %+v", res.Steps["with-config"])
	}
	if len(dlq) != 1 || !strings.Contains(string(dlq[0].Payload), "[REDACTED]") || !strings.Contains(dlq[0].Error.Message, "[REDACTED]") {
		t.Errorf("dlq entry: %+v %s", dlq, dlq[0].Payload)
	}
}

// TestSecretsRedactedWhateverTheEncoding has an upstream answer with the
// secret in JSON escapes nobody lists (\u002d for -, \/ for /) and a
// webhook URL holding it percent-encoded in an error, and checks that
// nothing written holds it in any form, decoded or not.
func TestSecretsRedactedWhateverTheEncoding(t *testing.T) {
	const secret = "hook T0|B1-x9/z"
	cfg, err := loader.LoadBytes("test.toml", []byte(testProviders+`
[[providers]]
name = "hooks"
type = "webhook"
[providers.config]
url = "http://127.0.0.1:1/services/<<secrets.HOOK>>"

[[chains]]
name = "c"
[[chains.steps]]
name = "escaped"
provider = "faulty"
payload_template = { raw = '{"echo": "hook T0|B1\u002dx9\/z", "list": ["hook\u0020T0\u007cB1-x9\/z"]}' }
[[chains.steps]]
name = "notify"
provider = "hooks"
action_type = "post"
on_failure = "dlq"
`), loader.Options{ProviderTypes: builtin.Types()})
	if err != nil {
		t.Fatal(err)
	}
	st, err := bolt.Open(filepath.Join(t.TempDir(), "gw.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	exe, _ := os.Executable()
	pm := host.NewManager(host.Options{Executable: exe})
	defer pm.Close()
	eng, err := engine.New(engine.Options{Store: st, Config: cfg, Providers: resolver{pm}, Secrets: map[string]string{"HOOK": secret}})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	ctx := context.Background()
	run, err := eng.Start(ctx, "c", engine.Input{})
	if err != nil {
		t.Fatal(err)
	}
	if final, err := eng.Wait(ctx, run.ID); err != nil || final.Status != store.RunFailed {
		t.Fatalf("run: %+v %v", final, err)
	}
	steps, _ := st.Steps(ctx, run.ID, "")
	evs, _ := st.Events(ctx, run.ID, 0, 0)
	dlq, _ := st.ListDLQ(ctx, store.DLQFilter{})
	var texts []string
	for _, rec := range steps {
		texts = append(texts, string(rec.Body))
		if rec.Error != nil {
			texts = append(texts, rec.Error.Message)
		}
		if rec.Key == "escaped" {
			// Decoded, the body must not spell it either.
			var v any
			if err := json.Unmarshal(rec.Body, &v); err != nil {
				t.Fatalf("escaped body %s: %v", rec.Body, err)
			}
			decoded, _ := json.Marshal(v)
			texts = append(texts, string(decoded))
			if !strings.Contains(string(rec.Body), "[REDACTED]") {
				t.Errorf("the escaped body was not redacted: %s", rec.Body)
			}
		}
	}
	for _, ev := range evs {
		texts = append(texts, ev.Message)
	}
	for _, e := range dlq {
		texts = append(texts, e.Error.Message, string(e.Payload))
	}
	all := strings.Join(texts, "\n")
	for _, form := range []string{secret, "hook%20T0%7CB1-x9", "hook+T0%7CB1-x9", "hook%20T0%7cB1-x9", `hook T0|B1\u002dx9`, "T0|B1-x9"} {
		if strings.Contains(all, form) {
			t.Errorf("the secret was written as %q:\n%s", form, all)
		}
	}
	if len(dlq) != 1 || !strings.Contains(dlq[0].Error.Message, "[REDACTED]") {
		t.Errorf("the webhook's error does not show where the secret was: %+v", dlq)
	}
}
