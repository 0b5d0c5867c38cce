package chaintest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain"
)

// The example configs ship with tests: every case passes, and together
// they cover every step, branch and condition.
func TestExampleConfigs(t *testing.T) {
	s, err := Load([]string{"../../configs"})
	if err != nil {
		t.Fatal(err)
	}
	results := s.Run(context.Background(), Options{})
	if len(results) < 10 {
		t.Fatalf("ran %d cases, want the example configs' (at least 10)", len(results))
	}
	for _, r := range results {
		for _, f := range r.Failures {
			t.Errorf("%s: %s: %s:%d: %s", r.File, r.Case, f.Src.File, f.Src.Line, f.Message)
		}
	}
	cov := Cover(s, results)
	// configs/ and configs/live/ each define an incident-response chain:
	// each is covered by its own cases.
	n := 0
	for _, c := range cov.Chains {
		if strings.HasPrefix(c.Chain, "incident-response (") {
			n++
		}
	}
	if n != 2 {
		t.Errorf("coverage shows %d incident-response chains, want configs/'s and configs/live/'s: %+v", n, cov.Chains)
	}
	if cov.Percent != 100 {
		for _, c := range cov.Chains {
			for _, m := range c.Missed {
				t.Errorf("not covered: %s", m)
			}
		}
	}
}

// copyConfigs copies configs/ (files only) to a temporary directory.
func copyConfigs(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	entries, err := os.ReadDir("../../configs")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("../../configs", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// Changing one branch's target fails exactly the cases that take that
// branch, each at the line of the expectation it breaks.
func TestChangedBranchFailsTheCasesCoveringIt(t *testing.T) {
	dir := copyConfigs(t)
	file := filepath.Join(dir, "alert-triage.toml")
	b, _ := os.ReadFile(file)
	changed := strings.Replace(string(b), "value = \"critical\"\ntarget = \"page\"", "value = \"critical\"\ntarget = \"log-only\"", 1)
	if changed == string(b) {
		t.Fatal("alert-triage.toml no longer has the critical branch this test changes")
	}
	if err := os.WriteFile(file, []byte(changed), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Load([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	var failed []string
	for _, r := range s.Run(context.Background(), Options{}) {
		if !r.Failed() {
			continue
		}
		failed = append(failed, r.Case)
		for _, f := range r.Failures {
			if !strings.HasSuffix(f.Src.File, "alert-triage_test.toml") || f.Src.Line == 0 {
				t.Errorf("failure placed at %s:%d, want a line of alert-triage_test.toml: %s", f.Src.File, f.Src.Line, f.Message)
			}
		}
		var path bool
		for _, f := range r.Failures {
			path = path || strings.Contains(f.Message, "run path: expected rate → page → done, got rate → log-only")
		}
		if !path {
			t.Errorf("no failure names the changed path: %v", r.Failures)
		}
	}
	if len(failed) != 1 || failed[0] != "a critical alert pages" {
		t.Fatalf("failed cases: %q, want only the one taking the critical branch", failed)
	}
}

// A test file's mistakes are refused at their line, with the key.
func TestFileProblemsAtTheirLine(t *testing.T) {
	cases := []struct{ name, src, want string }{
		{"unknown key", "[[tests]]\nchain = \"c\"\n[tests.expect]\nstatuss = \"succeeded\"\n", `:4:1: tests[0].expect.statuss: unknown key (did you mean "status"?)`},
		{"two starts", "[[tests]]\nchain = \"c\"\ntrigger = \"t\"\nrequest = {}\n", "name exactly one of chain, trigger and schedule"},
		{"bad decision", "[[tests]]\nchain = \"c\"\napprovals.ask.decision = \"maybe\"\n", `:3:1: tests[0].approvals.ask.decision: must be "approve", "reject" or "timeout"`},
		{"body and error", "[[tests]]\nchain = \"c\"\nmocks.s = { body = {}, error = \"x\" }\n", "an answer has a body or an error, not both"},
		{"no cases", "config = [\"x.toml\"]\n", "no [[tests]]"},
		{"payload of a trigger case", "[[tests]]\ntrigger = \"t\"\nrequest = {}\npayload = {}\n", ":4:1: tests[0].payload: a trigger case's payload is what the trigger maps"},
		{"request of a chain case", "[[tests]]\nchain = \"c\"\nrequest = {}\n", ":3:1: tests[0].request: only a trigger case takes request"},
		{"broken toml", "[[tests]\n", "x_test.toml:2:8: expected end of table array name"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "x_test.toml")
			if err := os.WriteFile(path, []byte(tc.src), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := LoadFile(path)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// Time is virtual and deterministic: an approval nobody answers times out
// at its deadline exactly, and a retried call waits its backoff, in no
// real time.
func TestVirtualTime(t *testing.T) {
	s, err := Load([]string{"../../configs/db-restart_test.toml"})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		for _, r := range s.Run(context.Background(), Options{}) {
			if r.Failed() {
				t.Fatalf("%s: %v", r.Case, r.Failures)
			}
			switch r.Case {
			case "nobody answers: the timeout rejects":
				if r.Ended != 30*time.Minute {
					t.Errorf("%s: ended after %s on the clock, want the approval's 30m", r.Case, r.Ended)
				}
			case "approved: restart and verify":
				// One retry after 1s, then the answer 5 minutes after asking.
				if r.Ended != 5*time.Minute+time.Second {
					t.Errorf("%s: ended after %s on the clock, want 5m1s", r.Case, r.Ended)
				}
			}
		}
	}
}

// A call with no mock fails the case and says how to mock it.
func TestUnmockedCall(t *testing.T) {
	dir := copyConfigs(t)
	src := "[[tests]]\nname = \"unmocked\"\nchain = \"alert-triage\"\npayload = { alert_name = \"x\", severity = \"critical\" }\n"
	if err := os.WriteFile(filepath.Join(dir, "u_test.toml"), []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Load([]string{filepath.Join(dir, "u_test.toml")})
	if err != nil {
		t.Fatal(err)
	}
	r := s.Run(context.Background(), Options{})[0]
	want := `step "rate" called provider "monitoring" with no mock: add [tests.mocks.rate]`
	if !r.Failed() || !strings.Contains(r.Failures[0].Message, want) {
		t.Fatalf("failures %v, want one containing %q", r.Failures, want)
	}
}

// A config problem a case names is found before anything runs.
func TestUnknownNames(t *testing.T) {
	dir := copyConfigs(t)
	src := "[[tests]]\nchain = \"alert-triag\"\nmocks.rat.body = {}\napprovals.rate.decision = \"approve\"\n"
	if err := os.WriteFile(filepath.Join(dir, "u_test.toml"), []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load([]string{filepath.Join(dir, "u_test.toml")})
	var ce *chain.ConfigError
	if err == nil || !strings.Contains(err.Error(), `no chain "alert-triag" in the config (did you mean "alert-triage"?)`) || !strings.Contains(err.Error(), `no step "rat"`) ||
		!strings.Contains(err.Error(), `step "rate" is a provider step, not an approval step`) {
		t.Fatalf("got %v (%T, config error: %v)", err, err, ce)
	}
}
