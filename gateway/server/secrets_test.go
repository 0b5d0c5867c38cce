package server_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/gateway/authz"
	"github.com/chaingate/gateway/gateway/server"
)

// TestCheckServe: what validate reports beyond the config itself is what
// serve would refuse, each at the key that needs it, naming what to set.
func TestCheckServe(t *testing.T) {
	const chains = `
[[providers]]
name = "mail"
type = "email"
[providers.config]
host = "smtp.example.com"
from = "<<secrets.EMAIL_FROM>>"

[[providers]]
name = "echo"
type = "echo"

[[chains]]
name = "c"
[[chains.steps]]
name = "ask"
approval = { message = "Page <<secrets.ONCALL ?? \"the on-call\">>? <<secrets.RUNBOOK>>" }
[[chains.steps]]
name = "mail"
provider = "mail"
action_type = "send"
payload_template = { to = "<<origin.payload.to ?? secrets.ONCALL_EMAIL>>", subject = "x", text = "y" }

[[triggers]]
name = "am"
type = "alertmanager"
chain = "c"
token = "<<secrets.AM_TOKEN>>"
`
	all := map[string]string{
		"CHAINGATE_SECRET_EMAIL_FROM":   "Alerts <alerts@example.com>",
		"CHAINGATE_SECRET_RUNBOOK":      "https://runbooks.example.com",
		"CHAINGATE_SECRET_ONCALL_EMAIL": "oncall@example.com",
		"CHAINGATE_SECRET_AM_TOKEN":     "am-token-0f3a",
	}
	without := func(name string) map[string]string {
		env := map[string]string{}
		for k, v := range all {
			if k != name {
				env[k] = v
			}
		}
		return env
	}
	with := func(name, value string) map[string]string {
		env := without(name)
		env[name] = value
		return env
	}
	tests := []struct {
		name    string
		gateway string // the [gateway] table
		env     map[string]string
		file    string // the secrets file, written when gateway names it
		// want holds a part of each diagnostic, in order.
		want []string
	}{
		{name: "every secret set", env: all},
		{name: "provider config", env: without("CHAINGATE_SECRET_EMAIL_FROM"),
			want: []string{`gw.toml:8:1: providers[mail].config.from: <<secrets.EMAIL_FROM>>: no secret EMAIL_FROM: set CHAINGATE_SECRET_EMAIL_FROM, or give a default with ??`}},
		{name: "approval message", env: without("CHAINGATE_SECRET_RUNBOOK"),
			want: []string{`gw.toml:18:14: chains[c].steps[ask].approval.message: <<secrets.RUNBOOK>>: no secret RUNBOOK: set CHAINGATE_SECRET_RUNBOOK`}},
		{name: "step payload", env: without("CHAINGATE_SECRET_ONCALL_EMAIL"),
			want: []string{`gw.toml:23:22: chains[c].steps[mail].payload_template.to: <<secrets.ONCALL_EMAIL>>: no secret ONCALL_EMAIL: set CHAINGATE_SECRET_ONCALL_EMAIL`}},
		{name: "trigger token", env: without("CHAINGATE_SECRET_AM_TOKEN"),
			want: []string{`gw.toml:29:1: triggers[am].token: <<secrets.AM_TOKEN>>: no secret AM_TOKEN: set CHAINGATE_SECRET_AM_TOKEN`}},
		{name: "secrets file", gateway: "[gateway]\nsecrets_file = \"secrets.env\"\n", file: "RUNBOOK=https://runbooks.example.com\n", env: without("CHAINGATE_SECRET_AM_TOKEN"),
			want: []string{`triggers[am].token: <<secrets.AM_TOKEN>>: no secret AM_TOKEN: add AM_TOKEN=VALUE to secrets.env or set CHAINGATE_SECRET_AM_TOKEN`}},
		{name: "secrets file missing", gateway: "[gateway]\nsecrets_file = \"gone.env\"\n", env: all,
			want: []string{`gw.toml:2:1: gateway.secrets_file: reading secrets file`}},
		{name: "config unusable with its secret", env: with("CHAINGATE_SECRET_EMAIL_FROM", "oncall at example.com"),
			want: []string{`gw.toml:6:1: providers[mail].config: the email provider cannot use this config with its secrets filled in: from: parsing "[REDACTED]"`}},
		{name: "public listen without tokens", gateway: "[gateway]\nlisten = \"0.0.0.0:8080\"\n", env: all,
			want: []string{`gw.toml:2:1: gateway.listen: serve: refusing to serve 0.0.0.0:8080 without API tokens; set [gateway.auth] tokens or CHAINGATE_API_TOKENS, or listen on a loopback address`}},
		{name: "public listen with a token from the environment", gateway: "[gateway]\nlisten = \"0.0.0.0:8080\"\n", env: with("CHAINGATE_API_TOKENS", "tok-7c1d")},
		{name: "public listen with a token in the config", gateway: "[gateway]\nlisten = \"0.0.0.0:8080\"\n[gateway.auth]\ntokens = [\"tok-7c1d\"]\n", env: all},
		{name: "loopback listen without tokens", gateway: "[gateway]\nlisten = \"localhost:9090\"\n", env: all},
		{name: "everything at once", gateway: "[gateway]\nlisten = \"[::]:8080\"\n", env: without("CHAINGATE_SECRET_AM_TOKEN"),
			want: []string{`gateway.listen: serve: refusing to serve [::]:8080 without API tokens`, `triggers[am].token: <<secrets.AM_TOKEN>>: no secret AM_TOKEN`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range []string{authz.EnvTokens, authz.EnvReadTokens} {
				t.Setenv(k, "")
			}
			for _, kv := range os.Environ() {
				if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "CHAINGATE_SECRET_") {
					t.Setenv(k, "") // restored after the test
					_ = os.Unsetenv(k)
				}
			}
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			dir := t.TempDir()
			if tc.file != "" {
				if err := os.WriteFile(filepath.Join(dir, "secrets.env"), []byte(tc.file), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			// Every case has a [gateway] line or a blank one, so the
			// chains sit at the same lines.
			head := tc.gateway
			if head == "" {
				head = "\n\n"
			}
			path := filepath.Join(dir, "gw.toml")
			if err := os.WriteFile(path, []byte(strings.TrimSuffix(head, "\n")+chains), 0o644); err != nil {
				t.Fatal(err)
			}
			cfg, err := gateway.LoadConfig([]string{path})
			if err != nil {
				t.Fatalf("the config as written is fine, so it should load: %v", err)
			}
			err = server.CheckServe(t.Context(), cfg)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("CheckServe: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("CheckServe found nothing, want %q", tc.want)
			}
			got := diagnostics(t, err, dir)
			if lines := strings.Count(got, "\n") + 1; lines != len(tc.want) {
				t.Errorf("%d diagnostics, want %d:\n%s", lines, len(tc.want), got)
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("diagnostics\n--- got\n%s\n--- want them to hold\n%s", got, w)
				}
			}
			for _, v := range all {
				if strings.Contains(got, v) {
					t.Errorf("the diagnostics show a secret's value: %s", got)
				}
			}
		})
	}
}
