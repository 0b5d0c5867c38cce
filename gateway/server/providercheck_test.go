package server_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/gateway"
)

// openWithSecrets loads config from a directory with a secrets file and
// opens a gateway on it.
func openWithSecrets(t *testing.T, config, secretsFile string) (*gateway.Gateway, string, error) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "secrets.env"), []byte(secretsFile), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "gw.toml")
	if err := os.WriteFile(path, []byte("[gateway]\nsecrets_file = \"secrets.env\"\n"+config), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := gateway.LoadConfig([]string{path})
	if err != nil {
		t.Fatalf("the config as written is fine, so it should load: %v", err)
	}
	exe, _ := os.Executable()
	gw, err := gateway.Open(context.Background(), gateway.Options{Config: cfg, State: filepath.Join(dir, "gw.db"), Executable: exe})
	if err == nil {
		t.Cleanup(func() { _ = gw.Close() })
	}
	return gw, dir, err
}

// TestOpenChecksFilledInConfig: a built-in provider's config that its
// secrets make unusable stops the gateway from opening, naming the key,
// without showing the secret.
func TestOpenChecksFilledInConfig(t *testing.T) {
	t.Parallel()
	const config = `
[[providers]]
name = "mail"
type = "email"
[providers.config]
host = "smtp.example.com"
from = "<<secrets.EMAIL_FROM>>"
` + `
[[chains]]
name = "c"
[[chains.steps]]
name = "s"
provider = "mail"
action_type = "send"
`
	tests := []struct {
		name, secret, want string
	}{
		{"empty", "", `gw.toml:9:1: providers[mail].config.from: with its secrets filled in: minLength: got 0, want 1`},
		{"not an address", "oncall-9f2e at example.com", `gw.toml:7:1: providers[mail].config: the email provider cannot use this config with its secrets filled in: from: parsing "[REDACTED]"`},
		{"fine", "Alerts <alerts@example.com>", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, dir, err := openWithSecrets(t, config, "EMAIL_FROM="+tc.secret+"\n")
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			got := diagnostics(t, err, dir)
			if !strings.HasPrefix(got, tc.want) {
				t.Errorf("diagnostics\n--- got\n%s\n--- want prefix\n%s", got, tc.want)
			}
			if tc.secret != "" && strings.Contains(got, tc.secret) {
				t.Errorf("the diagnostics show the secret: %s", got)
			}
		})
	}
}

// TestRunStartChecksPluginConfig: an external plugin's config that its
// secrets make unusable refuses the runs that would call it, before they
// exist, instead of failing them after earlier steps acted.
func TestRunStartChecksPluginConfig(t *testing.T) {
	t.Parallel()
	pluginDir := t.TempDir()
	plugin := writePlugin(t, pluginDir, "ticketing")
	config := `
[[providers]]
name = "echo"
type = "echo"
[[providers]]
name = "tickets"
plugin = "` + plugin + `"
[providers.config]
project = "<<secrets.PROJECT>>"

[[chains]]
name = "c"
[[chains.steps]]
name = "page"
provider = "echo"
[[chains.steps]]
name = "ticket"
provider = "tickets"
action_type = "open"

[[chains]]
name = "other"
[[chains.steps]]
name = "page"
provider = "echo"
`
	gw, _, err := openWithSecrets(t, config, "PROJECT=\n")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	_, err = gw.Engine.Start(ctx, "c", engine.Input{})
	if !errors.Is(err, engine.ErrProviderConfig) || !strings.Contains(err.Error(), `provider "tickets"`) || !strings.Contains(err.Error(), "providers[tickets].config.project: with its secrets filled in: minLength: got 0, want 1") {
		t.Fatalf("start: %v", err)
	}
	if n, _ := gw.Store.UnfinishedRuns(ctx); len(n) != 0 {
		t.Errorf("a refused start left runs: %v", n)
	}
	// A chain that does not call the plugin runs.
	run, err := gw.Engine.Start(ctx, "other", engine.Input{})
	if err != nil {
		t.Fatal(err)
	}
	if final, err := gw.Engine.Wait(ctx, run.ID); err != nil || final.Status != "succeeded" {
		t.Errorf("other: %v %v", final, err)
	}
}
