package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/chaingate/gateway/providers/pagerduty/pagerdutytest"
	"github.com/chaingate/gateway/providers/slack/slacktest"
)

// liveSecrets are the secrets configs/live/README.md tells an operator to set.
var liveSecrets = map[string]string{
	"PAGERDUTY_ROUTING_KEY": pagerdutytest.RoutingKey,
	"SLACK_BOT_TOKEN":       slacktest.Token,
	"SMTP_HOST":             "127.0.0.1",
	"SMTP_USERNAME":         "alerts",
	"SMTP_PASSWORD":         "not-a-real-password",
	"EMAIL_FROM":            "Alerts <alerts@example.com>",
	"ONCALL_EMAIL":          "oncall@example.com",
}

// TestLiveConfigNeedsOnlySecrets checks that configs/live starts with
// nothing but the secrets its README lists, refuses to start without one,
// and that its resolve chain talks to PagerDuty and Slack as they document
// (their base URLs pointed at local test servers).
func TestLiveConfigNeedsOnlySecrets(t *testing.T) {
	slackSrv := slacktest.NewServer()
	defer slackSrv.Close()
	pdSrv := pagerdutytest.NewServer()
	defer pdSrv.Close()
	dir := t.TempDir()
	files, _ := filepath.Glob("../../configs/live/*.toml")
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text := strings.NewReplacer("https://slack.com/api", slackSrv.BaseURL(), "https://events.pagerduty.com", pdSrv.URL,
			"bolt://./data/live.db", "bolt://"+filepath.Join(dir, "live.db")).Replace(string(data))
		writeFile(t, filepath.Join(dir, filepath.Base(f)), text)
	}
	if code, out, errOut := runCLI(t, "validate", dir, "--skip-secrets"); code != exitOK {
		t.Fatalf("validate --skip-secrets: exit %d\n%s%s", code, out, errOut)
	}
	// Without its secrets the config does not validate: each is named
	// with the variable that sets it.
	code, out, _ := runCLI(t, "validate", dir)
	if code != exitFailed {
		t.Fatalf("validate without secrets: exit %d\n%s", code, out)
	}
	for name := range liveSecrets {
		if !strings.Contains(out, "no secret "+name+": set CHAINGATE_SECRET_"+name) {
			t.Errorf("validate without secrets does not name %s:\n%s", name, out)
		}
	}
	payload := `{"dedup_key":"01abc/page","channel":"C0123456789","ts":"1700000000.000100"}`

	// Without the Slack token the gateway names the secret and the key reading it.
	for name, v := range liveSecrets {
		if name != "SLACK_BOT_TOKEN" {
			t.Setenv("CHAINGATE_SECRET_"+name, v)
		}
	}
	code, _, errOut := runCLI(t, "run", "resolve-incident", "--config", dir, "--payload", payload)
	if code == exitOK || !strings.Contains(errOut, "providers[slack].config.token: <<secrets.SLACK_BOT_TOKEN>>: no secret SLACK_BOT_TOKEN") {
		t.Fatalf("run without SLACK_BOT_TOKEN: exit %d\n%s", code, errOut)
	}

	t.Setenv("CHAINGATE_SECRET_SLACK_BOT_TOKEN", liveSecrets["SLACK_BOT_TOKEN"])
	if code, out, _ := runCLI(t, "validate", dir); code != exitOK {
		t.Fatalf("validate with every secret: exit %d\n%s", code, out)
	}
	code, out, errOut = runCLI(t, "run", "resolve-incident", "--config", dir, "--payload", payload)
	if code != exitOK {
		t.Fatalf("run: exit %d\n%s", code, errOut)
	}
	var res struct {
		Steps map[string]struct {
			Body json.RawMessage `json:"body"`
		} `json:"steps"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	var resolved struct {
		DedupKey string `json:"dedup_key"`
	}
	if err := json.Unmarshal(res.Steps["resolve"].Body, &resolved); err != nil || resolved.DedupKey != "01abc/page" {
		t.Errorf("resolve body: %s", res.Steps["resolve"].Body)
	}
	msgs := slackSrv.Messages()
	if len(msgs) != 1 || msgs[0].ThreadTS != "1700000000.000100" {
		t.Errorf("slack messages: %+v", msgs)
	}
}

// TestLiveReplayAfterConfigFix is configs/live/README.md's promise: a run
// parked because a provider's config was wrong (here Slack's base URL)
// carries on from the failed step once the config is fixed, without paging
// PagerDuty again.
func TestLiveReplayAfterConfigFix(t *testing.T) {
	slackSrv := slacktest.NewServer()
	defer slackSrv.Close()
	pdSrv := pagerdutytest.NewServer()
	defer pdSrv.Close()
	dir := t.TempDir()
	db := filepath.Join(dir, "live.db")
	// The mail goes to a relay this machine does not have; the chain is
	// the live one without it.
	email := regexp.MustCompile(`(?s)\[\[chains\.steps\.parallel\.steps\]\]\s*name = "email".*?\n\n`)
	writeLive := func(slackURL string) {
		files, _ := filepath.Glob("../../configs/live/*.toml")
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			text := strings.NewReplacer("https://slack.com/api", slackURL, "https://events.pagerduty.com", pdSrv.URL,
				"bolt://./data/live.db", "bolt://"+db).Replace(email.ReplaceAllString(string(data), ""))
			writeFile(t, filepath.Join(dir, filepath.Base(f)), text)
		}
	}
	for name, v := range liveSecrets {
		t.Setenv("CHAINGATE_SECRET_"+name, v)
	}
	writeLive(slackSrv.URL + "/wrong-path")
	payload := `{"alert_name":"disk-full","host":"db-1","severity":"critical"}`
	code, out, errOut := runCLI(t, "run", "incident-response", "--config", dir, "--payload", payload)
	if code != exitFailed {
		t.Fatalf("run with a wrong Slack URL: exit %d\n%s%s", code, out, errOut)
	}
	var entries struct {
		Entries []struct {
			ID   string `json:"id"`
			Step string `json:"step"`
		} `json:"entries"`
	}
	code, out, errOut = runCLI(t, "dlq", "list", "--state", db, "--output", "json")
	if err := json.Unmarshal([]byte(out), &entries); code != exitOK || err != nil || len(entries.Entries) != 1 {
		t.Fatalf("dlq list: exit %d %v\n%s%s", code, err, out, errOut)
	}

	writeLive(slackSrv.BaseURL())
	code, out, errOut = runCLI(t, "dlq", "replay", entries.Entries[0].ID, "--config", dir)
	if code != exitOK || !strings.Contains(out, "succeeded") {
		t.Fatalf("replay after the fix: exit %d\n%s%s", code, out, errOut)
	}
	if alerts := pdSrv.Alerts(); len(alerts) != 1 {
		t.Errorf("PagerDuty got %d events, want the one page from before the fix: %+v", len(alerts), alerts)
	}
	if msgs := slackSrv.Messages(); len(msgs) != 2 {
		t.Errorf("Slack got %d messages, want the post and its thread reply: %+v", len(msgs), msgs)
	}
}
