package loader

import (
	"maps"
	"regexp"
	"slices"
	"strings"
	"unicode"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/templates"
)

// slackUserRE is a Slack user ID: U… in a workspace, W… in an Enterprise
// Grid organisation.
var slackUserRE = regexp.MustCompile(`^[UW][A-Z0-9]{2,}$`)

// decodeSlack decodes [gateway.slack].
func decodeSlack(t *table) *chain.Slack {
	s := &chain.Slack{Source: t.d.source(t.path), Users: map[string]string{}}
	if !t.has("signing_secret") {
		t.d.errorf(t.path, `missing required key "signing_secret": the Slack app's signing secret, read from a secret, e.g. signing_secret = "<<secrets.SLACK_SIGNING_SECRET>>"`)
	} else if v := t.nonEmpty("signing_secret"); v != "" {
		s.SigningSecret = t.d.secretName(t.path.Key("signing_secret"), v)
	}
	switch v, ok := t.value("users"); {
	case !ok:
		t.d.errorf(t.path, `missing required key "users": the Slack users who may answer, by user ID, e.g. users = { U0123ABCD = "alice" }`)
	default:
		m, isTable := v.(map[string]any)
		if !isTable {
			t.d.errorf(t.path.Key("users"), `must be a table of Slack user IDs to names, e.g. { U0123ABCD = "alice" }, got %s`, describe(v))
			break
		}
		if len(m) == 0 {
			t.d.errorf(t.path.Key("users"), `names no Slack user, so no one could answer from Slack: map user IDs to names, e.g. { U0123ABCD = "alice" }`)
		}
		for _, id := range slices.Sorted(maps.Keys(m)) {
			at := t.path.Key("users").Key(id)
			name, isStr := m[id].(string)
			switch {
			case !slackUserRE.MatchString(id):
				t.d.errorf(at, "%q is not a Slack user ID: want the member ID from the user's Slack profile (U0123ABCD), mapped to who they are", id)
			case !isStr:
				t.d.errorf(at, "must be the name the user's answers are recorded under, got %s", describe(m[id]))
			case strings.TrimSpace(name) == "" || strings.ContainsFunc(name, unicode.IsControl):
				t.d.errorf(at, "must be a name to record the user's answers under, without control characters, got %q", name)
			default:
				s.Users[id] = strings.TrimSpace(name)
			}
		}
	}
	if v, ok := t.value("response_url_hosts"); ok {
		if arr, isArr := v.([]any); isArr && len(arr) == 0 {
			t.d.errorf(t.path.Key("response_url_hosts"), `names no host, so no answer from Slack would be told what came of it: leave it out for Slack's own, "hooks.slack.com"`)
		}
	}
	for i, h := range t.strings("response_url_hosts") {
		if !hostnameRE.MatchString(h) {
			t.d.errorf(t.path.Key("response_url_hosts").Elem(i, ""), `%q is not a host name: want the host of the response URLs Slack sends, alone, e.g. "hooks.slack-gov.com"`, h)
			continue
		}
		s.ResponseURLHosts = append(s.ResponseURLHosts, strings.ToLower(h))
	}
	t.finish([]string{"signing_secret", "users", "response_url_hosts"})
	return s
}

// hostnameRE is a DNS host name of two labels or more: no scheme, port,
// path or IP address, which a response URL's host must match exactly.
var hostnameRE = regexp.MustCompile(`(?i)^(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?$`)

// secretName reads a value written "<<secrets.NAME>>" alone, and returns
// NAME: a credential the config names but does not hold.
func (d *fileDecoder) secretName(p chain.KeyPath, s string) string {
	const want = `want "<<secrets.NAME>>" alone, so the config names the secret and does not hold it`
	if !strings.Contains(s, "<<") {
		d.errorf(p, "must read a secret, not hold the credential itself: %s", want)
		return ""
	}
	tpl, err := templates.CompileString(s)
	if err != nil {
		d.errorf(p, "is not a valid template (%v): %s", err, want)
		return ""
	}
	if r, ok := tpl.SinglePath(); ok && r.Root == "secrets" && len(r.Path) == 1 && !r.HasDefault {
		return r.Path[0]
	}
	d.errorf(p, "%s", want)
	return ""
}
