package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/providers/builtin"
	"github.com/chaingate/gateway/providers/configschema"
)

// TestCredentialsTakeNoDefault writes a ?? default into every value a
// built-in provider's schema marks as a credential, found from the schemas
// themselves: each is refused at its key, a literal first too, and none
// shows the default.
func TestCredentialsTakeNoDefault(t *testing.T) {
	t.Parallel()
	var found int
	for _, typ := range builtin.Types() {
		impl, _ := builtin.New(typ)
		info, err := impl.Describe(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var schema struct {
			Properties map[string]map[string]any `json:"properties"`
		}
		if len(info.ConfigSchema) > 0 {
			if err := json.Unmarshal(info.ConfigSchema, &schema); err != nil {
				t.Fatalf("%s: %v", typ, err)
			}
		}
		for key, prop := range schema.Properties {
			if prop[configschema.SecretKeyword] != true {
				continue
			}
			found++
			for _, tc := range []struct {
				value   string
				refused bool
			}{
				{`<<secrets.CRED ?? \"dev-4f1a\">>`, true},
				{`<<\"dev-4f1a\" ?? secrets.CRED>>`, true},
				{`<<secrets.CRED ?? secrets.OLD_CRED>>`, true},
				{`<<secrets.CRED>>`, false},
			} {
				name := typ + "." + key + "=" + tc.value
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					dir := t.TempDir()
					path := filepath.Join(dir, "gw.toml")
					config := "[[providers]]\nname = \"p\"\ntype = \"" + typ + "\"\n[providers.config]\n" + key + " = \"" + tc.value + "\"\n" + chainUsing("p", "")
					if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
						t.Fatal(err)
					}
					_, err := gateway.LoadConfig([]string{path})
					var got string
					if err != nil {
						got = diagnostics(t, err, dir)
					}
					want := "gw.toml:5:1: providers[p].config." + key + ": is a credential, so it takes no ?? default"
					if strings.Contains(got, want) != tc.refused {
						t.Errorf("refused %v, want %v:\n%s", !tc.refused, tc.refused, got)
					}
					if strings.Contains(got, "dev-4f1a") {
						t.Errorf("a message shows the default:\n%s", got)
					}
				})
			}
		}
	}
	if found < 8 {
		t.Errorf("found %d credentials in the built-in providers' schemas; the ssh, slack, pagerduty, opsgenie, email and webhook providers have more", found)
	}
}

// TestMissingCredentialSuggestsNoDefault: a missing secret names what to
// set, and suggests a ?? default only where one is accepted.
func TestMissingCredentialSuggestsNoDefault(t *testing.T) {
	t.Parallel()
	runbook, err := gateway.LoadConfig([]string{"../../configs/runbook"})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "gw.toml")
	exe, _ := os.Executable()
	config := `
[[providers]]
name = "slack"
type = "slack"
[providers.config]
token = "<<secrets.T_SLACK>>"
base_url = "<<secrets.T_SLACK_URL>>"

[[providers]]
name = "tickets"
plugin = "` + exe + `"
[providers.config]
project = "<<secrets.T_PROJECT>>"

[[chains]]
name = "c"
[[chains.steps]]
name = "post"
provider = "slack"
action_type = "post_message"
payload_template = { channel = "<<secrets.T_CHANNEL>>", text = "x" }

[[triggers]]
name = "am"
type = "alertmanager"
chain = "c"
token = "<<secrets.T_AM_TOKEN>>"
secret = "<<secrets.T_AM_SECRET>>"
`
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	own, err := gateway.LoadConfig([]string{path})
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, cfg := range []*chain.Config{runbook, own} {
		err := gateway.CheckSecrets(t.Context(), cfg)
		var ce *chain.ConfigError
		if !errors.As(err, &ce) {
			t.Fatalf("CheckSecrets: %v", err)
		}
		for _, d := range ce.Diagnostics {
			lines = append(lines, d.Path+": "+d.Message)
		}
	}
	want := []string{
		"providers[fleet].config.private_key: <<secrets.RUNBOOK_SSH_KEY>>: no secret RUNBOOK_SSH_KEY: set CHAINGATE_SECRET_RUNBOOK_SSH_KEY",
		"providers[slack].config.token: <<secrets.T_SLACK>>: no secret T_SLACK: set CHAINGATE_SECRET_T_SLACK",
		"providers[slack].config.base_url: <<secrets.T_SLACK_URL>>: no secret T_SLACK_URL: set CHAINGATE_SECRET_T_SLACK_URL, or give a default with ??",
		// An external plugin's schema is not known here.
		"providers[tickets].config.project: <<secrets.T_PROJECT>>: no secret T_PROJECT: set CHAINGATE_SECRET_T_PROJECT",
		"chains[c].steps[post].payload_template.channel: <<secrets.T_CHANNEL>>: no secret T_CHANNEL: set CHAINGATE_SECRET_T_CHANNEL, or give a default with ??",
		"triggers[am].token: <<secrets.T_AM_TOKEN>>: no secret T_AM_TOKEN: set CHAINGATE_SECRET_T_AM_TOKEN",
		"triggers[am].secret: <<secrets.T_AM_SECRET>>: no secret T_AM_SECRET: set CHAINGATE_SECRET_T_AM_SECRET",
	}
	for _, w := range want {
		if !slices.Contains(lines, w) {
			t.Errorf("no diagnostic %q", w)
		}
	}
	if t.Failed() {
		t.Logf("diagnostics:\n%s", strings.Join(lines, "\n"))
	}
}

// TestRunStartChecksPluginCredentials: an external plugin's credential with
// a ?? default, which only validate --plugins checks as written, stops
// the first run that would call it.
func TestRunStartChecksPluginCredentials(t *testing.T) {
	t.Parallel()
	plugin := writePlugin(t, t.TempDir(), "ticketing")
	config := `
[[providers]]
name = "tickets"
plugin = "` + plugin + `"
[providers.config]
project = "OPS"
token = "<<secrets.TICKETS_TOKEN ?? \"dev-4f1a\">>"

[[chains]]
name = "c"
[[chains.steps]]
name = "ticket"
provider = "tickets"
action_type = "open"
`
	gw, _, err := openWithSecrets(t, config, "")
	if err != nil {
		t.Fatal(err)
	}
	_, err = gw.Engine.Start(t.Context(), "c", engine.Input{})
	if !errors.Is(err, engine.ErrProviderConfig) || !strings.Contains(err.Error(), "providers[tickets].config.token: is a credential, so it takes no ?? default") || strings.Contains(err.Error(), "dev-4f1a") {
		t.Fatalf("start: %v", err)
	}
}
