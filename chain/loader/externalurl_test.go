package loader_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chaingate/gateway/chain/loader"
)

// TestExternalURL checks what [gateway] external_url takes, and that a
// bad one is an error at its key with file and line.
func TestExternalURL(t *testing.T) {
	for _, tc := range []struct {
		url, want, stored string
	}{
		{url: "https://gw.example.com", stored: "https://gw.example.com"},
		{url: "https://gw.example.com/", stored: "https://gw.example.com"},
		{url: "http://10.0.0.5:8080/ops/gateway/", stored: "http://10.0.0.5:8080/ops/gateway"},
		{url: "gw.example.com", want: `"gw.example.com" is not an http or https URL`},
		{url: "/ui", want: `"/ui" is not an http or https URL`},
		{url: "ftp://gw.example.com", want: `"ftp://gw.example.com" is not an http or https URL`},
		{url: "https:gw.example.com", want: `"https:gw.example.com" has no host`},
		{url: "https://", want: `"https://" has no host`},
		{url: "https://gw.example.com/?a=1", want: `"https://gw.example.com/?a=1" has a query`},
		{url: "https://gw.example.com/?", want: "has a query"},
		{url: "https://gw.example.com/#top", want: `"https://gw.example.com/#top" has a fragment`},
		{url: "https://ops:pw@gw.example.com", want: `"https://ops:xxxxx@gw.example.com" holds a user name or password`},
		{url: "https://gw.example.com/a b", want: "holds white space"},
		{url: "https://gw.exa mple.com", want: "holds white space"},
		{url: "https://[::1", want: "is not a URL (missing ']' in host)"},
		{url: "", want: "must not be empty"},
	} {
		t.Run(tc.url, func(t *testing.T) {
			src := "[gateway]\nexternal_url = \"" + tc.url + "\"\n"
			cfg, err := loader.LoadBytes("gw.toml", []byte(src), loadOpts)
			got := render(cfg, err)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("got %s", got)
				}
				if cfg.Gateway.ExternalURL != tc.stored {
					t.Errorf("external_url = %q, want %q", cfg.Gateway.ExternalURL, tc.stored)
				}
				return
			}
			if !strings.HasPrefix(got, "gw.toml:2:1: gateway.external_url: ") || !strings.Contains(got, tc.want) || strings.Count(got, "\n") != 1 {
				t.Errorf("got %s, want gw.toml:2:1: gateway.external_url: …%s…", got, tc.want)
			}
			if strings.Contains(got, ":pw@") {
				t.Errorf("the message shows the password: %s", got)
			}
		})
	}
}

const runURLChain = `
[[providers]]
name = "echo"
type = "echo"

[[chains]]
name = "c"
[[chains.steps]]
name = "post"
provider = "echo"
payload_template = { text = "Approve: <<run.url>>/steps/ask", link = "<<run.url>>" }
[[chains.steps]]
name = "ask"
approval = { message = "See <<run.url>>" }
`

// TestRunURLNeedsExternalURL checks that reading run.url is an error at
// each read without [gateway] external_url, or with the console off,
// wherever the [gateway] table is, and that a stored definition, whose
// run reads the gateway's, skips the check.
func TestRunURLNeedsExternalURL(t *testing.T) {
	const unset = `run.url is the run's console page at [gateway] external_url, which is not set: set it to the address people reach the gateway at, e.g. external_url = "https://gw.example.com"`
	const noUI = `run.url is the run's console page, and [gateway.ui] enabled = false turns the console off`
	withURL := "[gateway]\nexternal_url = \"https://gw.example.com\"\n"
	for _, tc := range []struct {
		name  string
		files []string
		opts  loader.Options
		want  string
	}{
		{"external_url first", []string{withURL, runURLChain}, loadOpts, "ok\n"},
		{"external_url second", []string{runURLChain, withURL}, loadOpts, "ok\n"},
		{"no external_url", []string{runURLChain}, loadOpts, "f0.toml:11:22: chains[c].steps[post].payload_template.text: <<run.url>>: " + unset + "\n" +
			"f0.toml:11:63: chains[c].steps[post].payload_template.link: <<run.url>>: " + unset + "\n" +
			"f0.toml:14:14: chains[c].steps[ask].approval.message: <<run.url>>: " + unset + "\n"},
		{"console off", []string{withURL + "[gateway.ui]\nenabled = false\n", runURLChain}, loadOpts,
			"f1.toml:11:22: chains[c].steps[post].payload_template.text: <<run.url>>: " + noUI + "\n" +
				"f1.toml:11:63: chains[c].steps[post].payload_template.link: <<run.url>>: " + noUI + "\n" +
				"f1.toml:14:14: chains[c].steps[ask].approval.message: <<run.url>>: " + noUI + "\n"},
		{"stored", []string{runURLChain}, storedOpts, "ok\n"},
		{"a field of run.url", []string{withURL, strings.Replace(runURLChain, "<<run.url>>/steps/ask", "<<run.url.host>>", 1)}, loadOpts,
			"f1.toml:11:22: chains[c].steps[post].payload_template.text: <<run.url.host>>: run.url is a string; it has no field \"host\"\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for i, src := range tc.files {
				name := filepath.Join(dir, "f"+string(rune('0'+i))+".toml")
				if err := os.WriteFile(name, []byte(src), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			cfg, err := loader.Load([]string{dir}, tc.opts)
			if got := strings.ReplaceAll(render(cfg, err), dir+string(filepath.Separator), ""); got != tc.want {
				t.Errorf("got\n%swant\n%s", got, tc.want)
			}
		})
	}
}
