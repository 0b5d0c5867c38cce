package loader_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/chaingate/gateway/chain/loader"
)

// TestSlackConfig checks [gateway.slack]: its signing secret is read from
// a secret, and its users map Slack user IDs to names.
func TestSlackConfig(t *testing.T) {
	cfg, err := loader.LoadBytes("gw.toml", []byte(`[gateway.slack]
signing_secret = "<<secrets.SLACK_SIGNING_SECRET>>"
users = { U0ALICE1 = "alice", W0BOB = " bob " }
`), loadOpts)
	if err != nil {
		t.Fatal(err)
	}
	sl := cfg.Gateway.Slack
	if sl == nil || sl.SigningSecret != "SLACK_SIGNING_SECRET" || len(sl.Users) != 2 || sl.Users["U0ALICE1"] != "alice" || sl.Users["W0BOB"] != "bob" {
		t.Errorf("[gateway.slack] = %+v", sl)
	}
	if sl.Source.File != "gw.toml" || sl.Source.Line != 1 {
		t.Errorf("source: %+v", sl.Source)
	}
	if sl.ResponseURLHosts != nil {
		t.Errorf("response URL hosts unset: %q, want nil for Slack's own", sl.ResponseURLHosts)
	}
	cfg, err = loader.LoadBytes("gw.toml", []byte(`[gateway.slack]
signing_secret = "<<secrets.SLACK_SIGNING_SECRET>>"
users = { U0ALICE1 = "alice" }
response_url_hosts = ["hooks.slack.com", "Hooks.Slack-Gov.com"]
`), loadOpts)
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Gateway.Slack.ResponseURLHosts; !slices.Equal(got, []string{"hooks.slack.com", "hooks.slack-gov.com"}) {
		t.Errorf("response URL hosts: %q", got)
	}

	for _, tc := range []struct {
		name, src string
		want      []string
	}{
		{"nothing", ``, []string{
			`gw.toml:1:1: gateway.slack: missing required key "signing_secret": the Slack app's signing secret, read from a secret, e.g. signing_secret = "<<secrets.SLACK_SIGNING_SECRET>>"`,
			`gw.toml:1:1: gateway.slack: missing required key "users": the Slack users who may answer, by user ID, e.g. users = { U0123ABCD = "alice" }`,
		}},
		{"secret written out", "signing_secret = \"8f742231b10e8888abcd99yyyzzz85a5\"\nusers = { U1 = \"a\" }", []string{
			`gw.toml:2:1: gateway.slack.signing_secret: must read a secret, not hold the credential itself: want "<<secrets.NAME>>" alone, so the config names the secret and does not hold it`,
			`gw.toml:3:11: gateway.slack.users.U1: "U1" is not a Slack user ID: want the member ID from the user's Slack profile (U0123ABCD), mapped to who they are`,
		}},
		{"secret with a default", "signing_secret = '<<secrets.S ?? \"x\">>'\nusers = { U0ALICE1 = \"alice\" }", []string{
			`gw.toml:2:1: gateway.slack.signing_secret: want "<<secrets.NAME>>" alone, so the config names the secret and does not hold it`,
		}},
		{"secret with text", "signing_secret = 'v0<<secrets.S>>'\nusers = { U0ALICE1 = \"alice\" }", []string{
			`gw.toml:2:1: gateway.slack.signing_secret: want "<<secrets.NAME>>" alone, so the config names the secret and does not hold it`,
		}},
		{"users backwards", "signing_secret = \"<<secrets.S>>\"\nusers = { alice = \"U0ALICE1\", U0BOB = 3, U0CAROL = \"\" }", []string{
			`gw.toml:3:11: gateway.slack.users.alice: "alice" is not a Slack user ID: want the member ID from the user's Slack profile (U0123ABCD), mapped to who they are`,
			`gw.toml:3:31: gateway.slack.users.U0BOB: must be the name the user's answers are recorded under, got integer 3`,
			`gw.toml:3:42: gateway.slack.users.U0CAROL: must be a name to record the user's answers under, without control characters, got ""`,
		}},
		{"no users", "signing_secret = \"<<secrets.S>>\"\nusers = {}\nchannel = \"#ops\"", []string{
			`gw.toml:3:1: gateway.slack.users: names no Slack user, so no one could answer from Slack: map user IDs to names, e.g. { U0123ABCD = "alice" }`,
			`gw.toml:4:1: gateway.slack.channel: unknown key "channel"`,
		}},
		{"response URL hosts", "signing_secret = \"<<secrets.S>>\"\nusers = { U0ALICE1 = \"alice\" }\nresponse_url_hosts = [\"hooks.slack-gov.com\", \"https://hooks.slack.com\", \"hooks.slack.com:443\", \"10.0.0.1\", \"localhost\", 3]", []string{
			`gw.toml:4:46: gateway.slack.response_url_hosts[1]: "https://hooks.slack.com" is not a host name: want the host of the response URLs Slack sends, alone, e.g. "hooks.slack-gov.com"`,
			`gw.toml:4:73: gateway.slack.response_url_hosts[2]: "hooks.slack.com:443" is not a host name: want the host of the response URLs Slack sends, alone, e.g. "hooks.slack-gov.com"`,
			`gw.toml:4:96: gateway.slack.response_url_hosts[3]: "10.0.0.1" is not a host name: want the host of the response URLs Slack sends, alone, e.g. "hooks.slack-gov.com"`,
			`gw.toml:4:108: gateway.slack.response_url_hosts[4]: "localhost" is not a host name: want the host of the response URLs Slack sends, alone, e.g. "hooks.slack-gov.com"`,
			`gw.toml:4:121: gateway.slack.response_url_hosts[5]: must be a non-empty string, got integer 3`,
		}},
		{"no response URL host", "signing_secret = \"<<secrets.S>>\"\nusers = { U0ALICE1 = \"alice\" }\nresponse_url_hosts = []", []string{
			`gw.toml:4:1: gateway.slack.response_url_hosts: names no host, so no answer from Slack would be told what came of it: leave it out for Slack's own, "hooks.slack.com"`,
		}},
		{"users not a table", "signing_secret = \"<<secrets.S>>\"\nusers = [\"U0ALICE1\"]", []string{
			`gw.toml:3:1: gateway.slack.users: must be a table of Slack user IDs to names, e.g. { U0123ABCD = "alice" }, got an array`,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := loader.LoadBytes("gw.toml", []byte("[gateway.slack]\n"+tc.src+"\n"), loadOpts)
			got := render(cfg, err)
			if want := strings.Join(tc.want, "\n") + "\n"; got != want {
				t.Errorf("got\n%swant\n%s", got, want)
			}
		})
	}
}
