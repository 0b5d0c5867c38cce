package engine_test

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/loader"
	"github.com/chaingate/gateway/chain/secrets"
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

// TestSecretsRedactedInEveryEncoding has an upstream that hands the secret
// the gateway sent it back encoded, in its answer and in an error, through
// the http provider's plugin, once per encoding, and checks that nothing
// the store holds or the events carry spells it in that encoding.
func TestSecretsRedactedInEveryEncoding(t *testing.T) {
	const secret = "s3cr3t?>~ÿ-T0KEN/v+1"
	encodings := []struct {
		name, contentType string
		encode            func(string) string
	}{
		{"base64", "text/plain", func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }},
		{"base64-raw", "text/plain", func(s string) string { return base64.RawStdEncoding.EncodeToString([]byte(s)) }},
		{"base64-url", "text/plain", func(s string) string { return base64.URLEncoding.EncodeToString([]byte(s)) }},
		{"base64-url-raw", "text/plain", func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }},
		{"basic-credential", "text/plain", func(s string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte("ops:"+s)) }},
		{"hex", "text/plain", func(s string) string { return hex.EncodeToString([]byte(s)) }},
		{"hex-upper", "text/plain", func(s string) string { return strings.ToUpper(hex.EncodeToString([]byte(s))) }},
		{"url-query", "text/plain", url.QueryEscape},
		{"url-path", "text/plain", url.PathEscape},
		{"json-escaped", "application/json", func(s string) string {
			var b strings.Builder
			for _, r := range s {
				fmt.Fprintf(&b, `\u%04x`, r)
			}
			return `{"seen":"` + b.String() + `"}`
		}},
	}
	byName := map[string]func(string) string{}
	for _, e := range encodings {
		byName[e.name] = e.encode
	}
	// The upstream answers /ok/NAME and fails /fail/NAME with the token it
	// was sent in the encoding NAME.
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		kind, name, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
		enc := byName[name]
		if enc == nil || r.Header.Get("X-Token") != secret {
			http.Error(w, "unexpected request", http.StatusTeapot)
			return
		}
		for _, e := range encodings {
			if e.name == name {
				w.Header().Set("Content-Type", e.contentType)
			}
		}
		if kind == "fail" {
			w.WriteHeader(http.StatusBadRequest)
		}
		_, _ = io.WriteString(w, enc(secret))
	}))
	defer upstream.Close()

	var conf strings.Builder
	fmt.Fprintf(&conf, `
[[providers]]
name = "upstream"
type = "http"
[providers.config]
base_url = %q
headers = { X-Token = "<<secrets.TOKEN>>" }
`, upstream.URL)
	for _, e := range encodings {
		fmt.Fprintf(&conf, `
[[chains]]
name = %[1]q
[[chains.steps]]
name = "answer"
provider = "upstream"
payload_template = { url = "/ok/%[1]s" }
[[chains.steps]]
name = "refused"
provider = "upstream"
payload_template = { url = "/fail/%[1]s" }
on_failure = "dlq"
`, e.name)
	}
	cfg, err := loader.LoadBytes("test.toml", []byte(conf.String()), loader.Options{ProviderTypes: builtin.Types()})
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
	var mu sync.Mutex
	var published []store.Event
	eng, err := engine.New(engine.Options{
		Store: st, Config: cfg, Providers: resolver{pm}, Secrets: map[string]string{"TOKEN": secret},
		OnEvent: func(ev store.Event) { mu.Lock(); published = append(published, ev); mu.Unlock() },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	ctx := context.Background()
	for _, e := range encodings {
		t.Run(e.name, func(t *testing.T) {
			run, err := eng.Start(ctx, e.name, engine.Input{})
			if err != nil {
				t.Fatal(err)
			}
			final, err := eng.Wait(ctx, run.ID)
			if err != nil || final.Status != store.RunFailed {
				t.Fatalf("run: %+v %v", final, err)
			}
			steps, _ := st.Steps(ctx, run.ID, "")
			evs, _ := st.Events(ctx, run.ID, 0, 0)
			dlq, _ := st.ListDLQ(ctx, store.DLQFilter{Chain: e.name})
			res, _ := eng.Result(ctx, run.ID, true)
			mu.Lock()
			dump, _ := json.Marshal([]any{final, steps, evs, dlq, res, published})
			mu.Unlock()
			encoded := e.encode(secret)
			if e.name == "json-escaped" {
				encoded = strings.TrimSuffix(strings.TrimPrefix(encoded, `{"seen":"`), `"}`)
			}
			if strings.Contains(string(dump), encoded) || strings.Contains(string(dump), secret) {
				t.Errorf("the secret was written as %q:\n%s", encoded, dump)
			}
			if a := res.Steps["answer"]; a.Status != store.StepSucceeded || !strings.Contains(string(a.Body), secrets.Placeholder) {
				t.Errorf("the answer does not show where the secret was: %+v", a)
			}
			if len(dlq) != 1 || !strings.Contains(dlq[0].Error.Message, secrets.Placeholder) {
				t.Errorf("the refusal does not show where the secret was: %+v", dlq)
			}
		})
	}
}

// TestSubChainInputSecretNotWritten: a sub-chain's input that reads a
// secret, or a request's payload that carries one, is the origin of a run,
// which is written: the child gets the value, its record does not keep it.
func TestSubChainInputSecretNotWritten(t *testing.T) {
	const secret = "child-s3cr3t-value"
	record := filepath.Join(t.TempDir(), "calls.jsonl")
	cfg, err := loader.LoadBytes("test.toml", []byte(testProviders+`
[[chains]]
name = "child"
[[chains.steps]]
name = "use"
provider = "faulty"
payload_template = { record = "`+record+`", token = "<<origin.payload.token>>" }

[[chains]]
name = "parent"
[[chains.steps]]
name = "sub"
sub_chain = "child"
input = { token = "<<secrets.T>>" }
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
	eng, err := engine.New(engine.Options{Store: st, Config: cfg, Providers: resolver{pm}, Secrets: map[string]string{"T": secret}})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	ctx := context.Background()
	for _, start := range []struct{ chain, payload string }{
		{"parent", `{}`},
		{"child", `{"token": "` + base64.StdEncoding.EncodeToString([]byte(secret)) + `"}`},
	} {
		run, err := eng.Start(ctx, start.chain, engine.Input{Payload: json.RawMessage(start.payload)})
		if err != nil {
			t.Fatal(err)
		}
		if final, err := eng.Wait(ctx, run.ID); err != nil || final.Status != store.RunSucceeded {
			t.Fatalf("run of %s: %+v %v", start.chain, final, err)
		}
	}
	if calls, _ := os.ReadFile(record); !strings.Contains(string(calls), secret) {
		t.Errorf("the child was not given the secret:\n%s", calls)
	}
	page, err := st.ListRuns(ctx, store.RunFilter{})
	if err != nil || len(page.Runs) != 3 {
		t.Fatalf("runs: %+v %v", page, err)
	}
	for _, r := range page.Runs {
		full, _ := st.Run(ctx, r.ID)
		dump, _ := json.Marshal(full)
		if strings.Contains(string(dump), secret) || strings.Contains(string(dump), base64.RawStdEncoding.EncodeToString([]byte(secret))[:20]) {
			t.Errorf("run %s (%s) holds the secret: %s", r.ID, r.Chain, dump)
		}
	}
}
