package builtin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/chaingate/gateway/internal/testutil"
	"github.com/chaingate/gateway/plugins/host"
	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/builtin"
	"github.com/chaingate/gateway/providers/opsgenie/opsgenietest"
	"github.com/chaingate/gateway/providers/pagerduty/pagerdutytest"
	"github.com/chaingate/gateway/providers/slack/slacktest"
	"github.com/chaingate/gateway/providers/webhook/webhooktest"
)

func TestMain(m *testing.M) {
	host.ServeBuiltinIfRequested(builtin.New)
	testutil.QuickRaceExit()
	os.Exit(m.Run())
}

func TestRegistry(t *testing.T) {
	if got, want := builtin.Types(), []string{"echo", "email", "exec", "faulty", "http", "opsgenie", "pagerduty", "slack", "ssh", "webhook"}; !slices.Equal(got, want) {
		t.Errorf("Types() = %v, want %v", got, want)
	}
	for _, typ := range builtin.Types() {
		p, ok := builtin.New(typ)
		if !ok {
			t.Fatalf("New(%q) found nothing", typ)
		}
		info, err := p.Describe(context.Background())
		if err != nil || info.Name != typ {
			t.Errorf("New(%q).Describe() = %+v, %v", typ, info, err)
		}
	}
	if _, ok := builtin.New("nope"); ok {
		t.Error(`New("nope") found a provider`)
	}
}

// TestConfigSchemas compiles every config schema as draft 2020-12 and
// checks it against configs it must accept and refuse.
func TestConfigSchemas(t *testing.T) {
	for _, tc := range []struct {
		typ     string
		secrets []string // the keys marked x-secret
		valid   []string
		invalid []string
	}{
		{
			typ: "slack", secrets: []string{"token", "webhook_url"},
			valid:   []string{`{"token":"x"}`, `{"webhook_url":"https://hooks.slack.com/services/T/B/X"}`, `{"token":"x","base_url":"http://127.0.0.1/api"}`},
			invalid: []string{`{}`, `{"base_url":"x"}`, `{"token":"x","channel":"C1"}`, `{"token":""}`},
		},
		{
			typ: "pagerduty", secrets: []string{"routing_key"},
			valid:   []string{`{"routing_key":"k"}`, `{"routing_key":"k","base_url":"http://127.0.0.1"}`},
			invalid: []string{`{}`, `{"routing_key":1}`, `{"routing_key":"k","service_key":"k"}`},
		},
		{
			typ: "opsgenie", secrets: []string{"api_key"},
			valid:   []string{`{"api_key":"k"}`, `{"api_key":"k","base_url":"https://api.eu.opsgenie.com"}`},
			invalid: []string{`{}`, `{"api_key":"k","region":"eu"}`},
		},
		{
			typ: "ssh", secrets: []string{"passphrase", "password", "private_key"},
			valid: []string{`{"allowed_hosts":["web-*"],"private_key":"k","known_hosts":"/etc/ssh/ssh_known_hosts"}`,
				`{"allowed_hosts":["10.0.0.*"],"password":"p","host_keys":["ssh-ed25519 AAAA"],"port":2222,"jump_host":"bastion","max_sessions_per_host":2,"kill_grace_seconds":1}`},
			invalid: []string{`{}`, `{"allowed_hosts":[]}`, `{"allowed_hosts":["web-*"],"forward_agent":true}`, `{"allowed_hosts":["web-*"],"port":0}`,
				`{"allowed_hosts":["web-*"],"connect_timeout_seconds":0}`, `{"allowed_hosts":["web-*"],"host_keys":"ssh-ed25519 AAAA"}`},
		},
		{
			typ: "webhook", secrets: []string{"secret"},
			valid:   []string{`{"url":"https://x"}`, `{"url":"https://x","secret":"s","headers":{"X-A":"b"}}`},
			invalid: []string{`{}`, `{"url":"https://x","headers":{"X-A":1}}`, `{"url":"https://x","method":"PUT"}`},
		},
	} {
		t.Run(tc.typ, func(t *testing.T) {
			p, _ := builtin.New(tc.typ)
			info, err := p.Describe(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(info.ConfigSchema))
			if err != nil {
				t.Fatal(err)
			}
			c := jsonschema.NewCompiler()
			c.DefaultDraft(jsonschema.Draft2020)
			if err := c.AddResource(tc.typ+".json", doc); err != nil {
				t.Fatal(err)
			}
			schema, err := c.Compile(tc.typ + ".json")
			if err != nil {
				t.Fatalf("compiling: %v", err)
			}
			var raw struct {
				Schema               string                    `json:"$schema"`
				AdditionalProperties *bool                     `json:"additionalProperties"`
				Properties           map[string]map[string]any `json:"properties"`
			}
			if err := json.Unmarshal(info.ConfigSchema, &raw); err != nil {
				t.Fatal(err)
			}
			if raw.Schema != "https://json-schema.org/draft/2020-12/schema" || raw.AdditionalProperties == nil || *raw.AdditionalProperties {
				t.Errorf("$schema %q, additionalProperties %v", raw.Schema, raw.AdditionalProperties)
			}
			var secrets []string
			for k, prop := range raw.Properties {
				if prop["x-secret"] == true {
					secrets = append(secrets, k)
				}
			}
			slices.Sort(secrets)
			if want := slices.Sorted(slices.Values(tc.secrets)); !slices.Equal(secrets, want) {
				t.Errorf("x-secret keys %v, want %v", secrets, want)
			}
			for _, cfg := range append(tc.valid, tc.invalid...) {
				inst, err := jsonschema.UnmarshalJSON(strings.NewReader(cfg))
				if err != nil {
					t.Fatal(err)
				}
				err = schema.Validate(inst)
				if want := slices.Contains(tc.valid, cfg); (err == nil) != want {
					t.Errorf("config %s: valid %v, want %v (%v)", cfg, err == nil, want, err)
				}
			}
		})
	}
}

// TestThroughPlugin calls each provider as the gateway does, in a plugin
// process, against its fake service, and checks that answers and error
// classes cross the wire.
func TestThroughPlugin(t *testing.T) {
	slackSrv := slacktest.NewServer()
	defer slackSrv.Close()
	pdSrv := pagerdutytest.NewServer()
	defer pdSrv.Close()
	ogSrv := opsgenietest.NewServer()
	defer ogSrv.Close()
	hookSrv := webhooktest.NewServer()
	defer hookSrv.Close()

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	logs := &testutil.Buffer{}
	m := host.NewManager(host.Options{Executable: exe, Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	defer m.Close()
	defer func() {
		if t.Failed() {
			t.Logf("manager log:\n%s", logs)
		}
	}()

	type fault = struct {
		inject     func()
		code       string
		retry      bool
		retryAfter time.Duration
	}
	for _, tc := range []struct {
		typ, action, config, payload string
		wantInBody                   string
		faults                       []fault
	}{
		{
			typ: "slack", action: "post_message", config: `{"token":"` + slacktest.Token + `","base_url":"` + slackSrv.BaseURL() + `"}`,
			payload: `{"channel":"C0123456789","text":"db down"}`, wantInBody: `"channel":"C0123456789"`,
			faults: []fault{
				{func() { slackSrv.FailNext(1, slacktest.RateLimited(1)) }, "slack_ratelimited", true, time.Second},
				{func() { slackSrv.FailNext(1, slacktest.APIError("channel_not_found")) }, "slack_channel_not_found", false, 0},
			},
		},
		{
			typ: "pagerduty", action: "trigger", config: `{"routing_key":"` + pagerdutytest.RoutingKey + `","base_url":"` + pdSrv.URL + `"}`,
			payload: `{"summary":"db down","source":"db-1","severity":"critical"}`, wantInBody: `"dedup_key":"run-1/page"`,
			faults: []fault{
				{func() { pdSrv.FailNext(1, pagerdutytest.RateLimited(1)) }, "pagerduty_http_429", true, time.Second},
				{func() { pdSrv.FailNext(1, pagerdutytest.InvalidEvent("bad")) }, "pagerduty_invalid_event", false, 0},
			},
		},
		{
			typ: "opsgenie", action: "create_alert", config: `{"api_key":"` + opsgenietest.APIKey + `","base_url":"` + ogSrv.URL + `"}`,
			payload: `{"message":"db down"}`, wantInBody: `"alias":"run-1/page"`,
			faults: []fault{
				{func() { ogSrv.FailNext(1, opsgenietest.Error(503, "unavailable")) }, "opsgenie_http_503", true, 0},
				{func() { ogSrv.FailNext(1, opsgenietest.Error(422, "Request has validation errors")) }, "opsgenie_http_422", false, 0},
			},
		},
		{
			typ: "webhook", action: "post", config: `{"url":"` + hookSrv.URL + `/in","secret":"` + webhooktest.Secret + `"}`,
			payload: `{"alert":"db down"}`, wantInBody: `"received":true`,
			faults: []fault{
				{func() { hookSrv.FailNext(1, webhooktest.RateLimited(1)) }, "webhook_http_429", true, time.Second},
				{func() { hookSrv.FailNext(1, webhooktest.Fault{Status: 404}) }, "webhook_http_404", false, 0},
			},
		},
	} {
		t.Run(tc.typ, func(t *testing.T) {
			p := m.Provider(host.Spec{Name: "my-" + tc.typ, Builtin: tc.typ})
			info, err := p.Describe(context.Background())
			if err != nil || info.Name != tc.typ || len(info.ConfigSchema) == 0 {
				t.Fatalf("Describe = %+v, %v", info, err)
			}
			req := providers.Request{
				ActionType: tc.action, Config: json.RawMessage(tc.config), Payload: json.RawMessage(tc.payload),
				DedupKey: "run-1/page", Attempt: 1, RunID: "run-1", Step: "page",
			}
			resp, err := p.Execute(context.Background(), req)
			if err != nil || !strings.Contains(string(resp.Body), tc.wantInBody) {
				t.Fatalf("Execute = %s, %v; want a body containing %s", resp.Body, err, tc.wantInBody)
			}
			for _, f := range tc.faults {
				f.inject()
				_, err := p.Execute(context.Background(), req)
				var pe *providers.Error
				if !errors.As(err, &pe) {
					t.Errorf("error %v, want a *providers.Error", err)
				} else if pe.Code != f.code || pe.Retryable != f.retry || pe.RetryAfter != f.retryAfter {
					t.Errorf("error %v (retry after %v), want code %s retryable %v retry after %v", err, pe.RetryAfter, f.code, f.retry, f.retryAfter)
				}
			}
			if tc.typ == "webhook" {
				return // its payload is the body, whatever its fields
			}
			bad := req
			bad.Payload = json.RawMessage(`{"unknown_field":1}`)
			_, err = p.Execute(context.Background(), bad)
			var pe *providers.Error
			if !errors.As(err, &pe) || pe.Code != "bad_payload" || pe.Retryable {
				t.Errorf("unknown field: %v, want a permanent bad_payload", err)
			}
		})
	}
}

// TestDocsListEveryBuiltin keeps the lists of built-in providers in the
// docs whole, and each provider that has a page of its own linked.
func TestDocsListEveryBuiltin(t *testing.T) {
	read := func(path string) string {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	config, plugins := read("../../docs/configuration.md"), read("../../docs/plugins.md")
	typeRow := regexp.MustCompile("(?m)^\\| `type` \\|.*$").FindString(config)
	pluginsList := regexp.MustCompile(`The built-in providers \(([^)]*)\)`).FindStringSubmatch(plugins)
	if typeRow == "" || pluginsList == nil {
		t.Fatal("the lists of built-in providers moved; update this test")
	}
	for _, typ := range builtin.Types() {
		quoted := "`" + typ + "`"
		if !strings.Contains(typeRow, quoted) {
			t.Errorf("docs/configuration.md's [[providers]] type row does not list %s", quoted)
		}
		if !strings.Contains(pluginsList[1], quoted) {
			t.Errorf("docs/plugins.md's list of built-in providers does not list %s", quoted)
		}
		if !strings.Contains(config, "- **"+quoted+"**") {
			t.Errorf("docs/configuration.md's built-in providers section does not describe %s", quoted)
		}
		if _, err := os.Stat("../../docs/providers/" + typ + ".md"); err == nil && !strings.Contains(config, "(providers/"+typ+".md)") {
			t.Errorf("docs/configuration.md does not link docs/providers/%s.md", typ)
		}
	}
}

// TestCommandProvidersCheckCalls: a built-in whose config declares
// commands checks the calls a config makes of it, so that validate and
// gateway test refuse what its Execute would.
func TestCommandProvidersCheckCalls(t *testing.T) {
	for _, typ := range builtin.Types() {
		p, _ := builtin.New(typ)
		info, err := p.Describe(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		var schema struct {
			Properties map[string]json.RawMessage `json:"properties"`
		}
		_ = json.Unmarshal(info.ConfigSchema, &schema)
		_, declares := schema.Properties["commands"]
		_, checks := p.(providers.CallChecker)
		if declares != checks {
			t.Errorf("%s: its config declares commands: %v; it checks calls: %v", typ, declares, checks)
		}
		if declares != (typ == "exec" || typ == "ssh") {
			t.Errorf("%s: declares commands: %v", typ, declares)
		}
	}
}
