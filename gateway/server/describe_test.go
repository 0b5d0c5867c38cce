package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/builtin"
)

// lookupProvider serves the built-ins and, for the plugin tests, a provider
// that declares action types and a config schema with a credential.
func lookupProvider(typ string) (providers.Provider, bool) {
	if typ == "ticketing" {
		return ticketing{}, true
	}
	return builtin.New(typ)
}

type ticketing struct{}

func (ticketing) Describe(context.Context) (providers.Info, error) {
	return providers.Info{Name: "ticketing", ActionTypes: []string{"open", "close"}, ConfigSchema: json.RawMessage(`{
		"type": "object", "additionalProperties": false, "required": ["project"],
		"properties": {"project": {"type": "string", "minLength": 1}, "token": {"type": "string", "x-secret": true}}}`)}, nil
}

func (ticketing) Execute(context.Context, providers.Request) (providers.Response, error) {
	return providers.Response{}, nil
}

// writePlugin writes an executable that serves a provider of this test
// binary, as an external plugin binary would.
func writePlugin(t *testing.T, dir, typ string) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, typ+"-plugin")
	script := "#!/bin/sh\nCHAINGATE_BUILTIN_PROVIDER=" + typ + " exec '" + exe + "' \"$@\"\n"
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

func diagnostics(t *testing.T, err error, dir string) string {
	t.Helper()
	var ce *chain.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("error %v is not a *chain.ConfigError", err)
	}
	return strings.ReplaceAll(ce.Error(), dir+string(filepath.Separator), "")
}

func TestLoadConfigChecksBuiltinConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, config, want string
	}{
		{
			name: "valid",
			config: `
[[providers]]
name = "api"
type = "http"
[providers.config]
base_url = "<<secrets.API_URL>>"
headers = { Accept = "application/json" }
`,
		},
		{
			name: "schema errors at their keys",
			config: `
[[providers]]
name = "api"
type = "http"
[providers.config]
base_url = 8080
max_response_bytes = 0
heders = { Accept = "application/json" }
[providers.config.headers]
"X Trace" = 1
`,
			want: `gw.toml:6:1: providers[api].config.base_url: got number, want string
gw.toml:7:1: providers[api].config.max_response_bytes: minimum: got 0, want 1
gw.toml:8:1: providers[api].config.heders: unknown key: the provider's config schema does not allow it; it knows allowed_hosts, base_url, deny_private_networks, follow_redirects, headers, max_response_bytes
gw.toml:10:1: providers[api].config.headers["X Trace"]: got number, want string`,
		},
		{
			name: "what the provider's own check finds",
			config: `
[[providers]]
name = "api"
type = "http"
[providers.config]
headers = { "X-Api-Key" = "k" }
allowed_hosts = ["*example.com"]
`,
			want: `gw.toml:5:1: providers[api].config: the http provider cannot use this config: allowed_hosts[0] "*example.com" is not a host name, *.domain, an IP address or *`,
		},
		{
			name: "nowhere to go",
			config: `
[[providers]]
name = "api"
type = "http"
`,
			want: `gw.toml:2:1: providers[api].config: the http provider cannot use this config: give base_url, allowed_hosts or both: with neither, there is nowhere a request may go`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "gw.toml")
			if err := os.WriteFile(path, []byte(tc.config+chainUsing("api", "get")), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := gateway.LoadConfig([]string{path})
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if got := diagnostics(t, err, dir); got != tc.want {
				t.Errorf("diagnostics\n--- got\n%s\n--- want\n%s", got, tc.want)
			}
		})
	}
}

func chainUsing(provider string, actions ...string) string {
	var b strings.Builder
	b.WriteString("\n[[chains]]\nname = \"c\"\n")
	for i, a := range actions {
		b.WriteString("[[chains.steps]]\nname = \"s" + string(rune('0'+i)) + "\"\nprovider = \"" + provider + "\"\n")
		if a != "" {
			b.WriteString("action_type = \"" + a + "\"\n")
		}
	}
	return b.String()
}

func TestCheckPlugins(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writePlugin(t, dir, "ticketing")
	if err := os.WriteFile(filepath.Join(dir, "not-a-plugin"), []byte("#!/bin/sh\necho 'usage: not-a-plugin' >&2\nexit 2\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	config := `
[[providers]]
name = "tickets"
plugin = "ticketing-plugin"
[providers.config]
project = "OPS"
token = "<<secrets.TICKETS_TOKEN>>"

[[providers]]
name = "leaky"
plugin = "ticketing-plugin"
[providers.config]
token = "hunter2"

[[providers]]
name = "broken"
plugin = "not-a-plugin"
` + chainUsing("tickets", "open", "opne", "") + `
[[chains.steps]]
name = "s3"
provider = "leaky"
action_type = "close"
[[chains.steps]]
name = "s4"
provider = "broken"
action_type = "anything"
`
	path := filepath.Join(dir, "gw.toml")
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := gateway.LoadConfig([]string{path})
	if err != nil {
		t.Fatalf("external plugins are not started by LoadConfig, so it should pass: %v", err)
	}
	if got := strings.Join(gateway.ExternalProviders(cfg), ","); got != "tickets,leaky,broken" {
		t.Errorf("ExternalProviders = %s", got)
	}
	got := diagnostics(t, &chain.ConfigError{Diagnostics: gateway.CheckPlugins(t.Context(), cfg, gateway.PluginCheckOptions{})}, dir)
	want := `gw.toml:12:1: providers[leaky].config: missing property 'project'
gw.toml:13:1: providers[leaky].config.token: is a credential, so it must come from a secret, never be written into the config: write "<<secrets.NAME>>" and set CHAINGATE_SECRET_NAME in the environment or NAME=VALUE in [gateway].secrets_file
gw.toml:17:1: providers[broken].plugin: starting the plugin to read what it accepts: plugin_start: starting plugin "broken": plugin stderr: usage: not-a-plugin: …
gw.toml:28:1: chains[c].steps[s1].action_type: provider "tickets" does not accept action type "opne"; it accepts "open", "close"
gw.toml:29:1: chains[c].steps[s2].action_type: provider "tickets" needs an action_type: one of "open", "close"`
	// go-plugin's own explanation of a failed start runs over many lines.
	got = regexp.MustCompile(`(?s)(usage: not-a-plugin: ).*?\n(gw.toml:28)`).ReplaceAllString(got, "$1…\n$2")
	if got != want {
		t.Errorf("diagnostics\n--- got\n%s\n--- want\n%s", got, want)
	}
}
