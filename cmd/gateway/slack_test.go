package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestExternalURLAndSlackValidate checks what validate says of a bad
// external_url, a run.url read without it, and a [gateway.slack] whose
// secret is missing: each at its file, line and key.
func TestExternalURLAndSlackValidate(t *testing.T) {
	dir := t.TempDir()
	gw, chains := filepath.Join(dir, "a-gateway.toml"), filepath.Join(dir, "b-chains.toml")
	gwTable := `[gateway]
external_url = "gw.example.com/ops?x=1"

[gateway.slack]
signing_secret = "<<secrets.SLACK_SIGNING_SECRET_FOR_VALIDATE>>"
users = { U0ALICE1 = "alice" }
`
	writeFile(t, gw, gwTable)
	writeFile(t, chains, `[[providers]]
name = "echo"
type = "echo"

[[chains]]
name = "c"
[[chains.steps]]
name = "post"
provider = "echo"
payload_template = { text = "Approve: <<run.url>>/steps/ask" }
[[chains.steps]]
name = "ask"
approval = { message = "ok?" }
`)
	code, out, _ := runCLI(t, "validate", dir)
	want := gw + `:2:1: gateway.external_url: "gw.example.com/ops?x=1" is not an http or https URL: want the absolute address people reach the gateway at, e.g. "https://gw.example.com"` + "\n" +
		chains + `:10:22: chains[c].steps[post].payload_template.text: <<run.url>>: run.url is the run's console page at [gateway] external_url, which is not set: set it to the address people reach the gateway at, e.g. external_url = "https://gw.example.com"` + "\n"
	if code != exitFailed || out != want {
		t.Errorf("validate with a bad external_url: exit %d\n%s\nwant\n%s", code, out, want)
	}

	writeFile(t, gw, strings.Replace(gwTable, "gw.example.com/ops?x=1", "https://gw.example.com/ops/", 1))
	code, out, _ = runCLI(t, "validate", dir)
	want = gw + ":5:1: gateway.slack.signing_secret: <<secrets.SLACK_SIGNING_SECRET_FOR_VALIDATE>>: no secret SLACK_SIGNING_SECRET_FOR_VALIDATE for the Slack app's signing secret: set CHAINGATE_SECRET_SLACK_SIGNING_SECRET_FOR_VALIDATE\n"
	if code != exitFailed || out != want {
		t.Errorf("validate without the signing secret: exit %d\n%s\nwant\n%s", code, out, want)
	}

	t.Setenv("CHAINGATE_SECRET_SLACK_SIGNING_SECRET_FOR_VALIDATE", "s3cret")
	if code, out, _ = runCLI(t, "validate", dir); code != exitOK || !strings.HasPrefix(out, "ok: ") {
		t.Errorf("validate with the secret set: exit %d\n%s", code, out)
	}
}
