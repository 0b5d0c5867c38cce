package main

import (
	"bytes"
	"context"
	"encoding/xml"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// gateway test configs/ passes, as a user runs it, and a failing case
// exits 1 with its file:line, in text and in JUnit.
func TestGatewayTestCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"test", "../../configs", "--coverage"}, &out, &errOut); code != exitOK {
		t.Fatalf("gateway test configs/: exit %d\n%s%s", code, out.String(), errOut.String())
	}
	if !strings.Contains(out.String(), "total 100.0%") || !strings.Contains(out.String(), "cases passed") {
		t.Fatalf("output:\n%s", out.String())
	}

	dir := t.TempDir()
	for _, name := range []string{"alert-triage.toml", "providers.toml"} {
		b, err := os.ReadFile(filepath.Join("../../configs", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	src := "[[tests]]\nname = \"wrong status\"\nchain = \"alert-triage\"\npayload = { alert_name = \"x\", severity = \"low\" }\nmocks.rate.body = { severity = \"low\", score = 0 }\nmocks.log-only.body = {}\nmocks.done.body = {}\n[tests.expect]\nstatus = \"failed\"\n"
	if err := os.WriteFile(filepath.Join(dir, "x_test.toml"), []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if code := run(context.Background(), []string{"test", dir}, &out, &errOut); code != exitFailed {
		t.Fatalf("exit %d, want %d\n%s", code, exitFailed, out.String())
	}
	if want := "x_test.toml:9: run status: expected \"failed\", got \"succeeded\""; !strings.Contains(out.String(), want) {
		t.Fatalf("output lacks %q:\n%s", want, out.String())
	}
	out.Reset()
	if code := run(context.Background(), []string{"test", dir, "--output", "junit"}, &out, &errOut); code != exitFailed {
		t.Fatalf("junit: exit %d", code)
	}
	var suites struct {
		Tests    int `xml:"tests,attr"`
		Failures int `xml:"failures,attr"`
		Suites   []struct {
			Cases []struct {
				Name     string `xml:"name,attr"`
				Failures []struct {
					Message string `xml:"message,attr"`
				} `xml:"failure"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(out.Bytes(), &suites); err != nil {
		t.Fatalf("junit output: %v\n%s", err, out.String())
	}
	if suites.Tests != 1 || suites.Failures != 1 || suites.Suites[0].Cases[0].Name != "wrong status" || len(suites.Suites[0].Cases[0].Failures) != 1 {
		t.Fatalf("junit: %+v", suites)
	}
	out.Reset()
	if code := run(context.Background(), []string{"test", dir, "--run", "^nothing$"}, &out, &errOut); code != exitOK {
		t.Fatalf("--run selecting nothing: exit %d", code)
	}
	if err := os.WriteFile(filepath.Join(dir, "x_test.toml"), []byte("[[tests]]\nchian = \"x\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	errOut.Reset()
	if code := run(context.Background(), []string{"test", dir}, &out, &errOut); code != exitUsage || !strings.Contains(errOut.String(), "x_test.toml:2:1: tests[0].chian: unknown key") {
		t.Fatalf("a broken test file: exit %d, stderr %s", code, errOut.String())
	}
}

// gateway run --dry-run calls nothing, stores nothing, and shows what each
// step would be sent, under the mocks given or {} for the rest.
func TestRunDryRun(t *testing.T) {
	dir := t.TempDir()
	mocks := filepath.Join(dir, "mocks.toml")
	if err := os.WriteFile(mocks, []byte("[mocks.check-severity]\nbody = { severity = \"critical\", host = \"db-1\" }\n[mocks.slack-alert]\nbody = { text = \"posted\" }\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	wd, _ := os.Getwd()
	t.Chdir(dir)
	configs := filepath.Join(wd, "../../configs")
	payload := `{"alert_name": "disk-full", "host": "db-1", "severity": "critical"}`
	code, out, errOut := runCLI(t, "run", "incident-response", "--config", configs, "--dry-run", "--mocks", mocks, "--payload", payload)
	if code != exitOK {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{
		`notify-all/page-oncall  pagerduty   trigger       1        {"severity":"critical","source":"db-1","summary":"disk-full on db-1"}`,
		`resolve                 ticketing   close_ticket  1        {"note":"notified","paged":"succeeded","slack":"posted"}`,
		"run succeeded: path check-severity → notify-all → resolve",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("the dry run left files behind: %v", entries)
	}
	code, out, _ = runCLI(t, "run", "incident-response", "--config", configs, "--dry-run", "--payload", payload)
	if code != exitFailed || !strings.Contains(out, "give the answers later steps read with --mocks FILE") {
		t.Fatalf("without mocks: exit %d\n%s", code, out)
	}
}

// A provider listed in real_providers runs for real, in its plugin
// process: the echo provider answers with what it was sent.
func TestGatewayTestRealProvider(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, name := range []string{"alert-triage.toml", "providers.toml"} {
		b, err := os.ReadFile(filepath.Join("../../configs", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	src := `real_providers = ["monitoring"]

[[tests]]
name = "the monitoring echo rates the alert for real"
chain = "alert-triage"
payload = { alert_name = "x", severity = "critical", score = 10, env = "test" }
mocks.page.body = {}

[tests.expect]
path = ["rate", "page", "done"]
steps.rate.body = { severity = "critical", score = 10 }
steps.done.status = "skipped"
`
	if err := os.WriteFile(filepath.Join(dir, "x_test.toml"), []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := runCLI(t, "test", dir); code != exitOK {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
}
