package chaintest

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const failureRunbook = `
[[providers]]
name = "ops"
type = "echo"

[[chains]]
name = "runbook"
[[chains.steps]]
name = "verify"
provider = "ops"
catch = [
  { errors = ["code:DISK_FULL"], target = "page" },
  { errors = ["exhausted"], target = "recheck", recover = true },
]
[[chains.steps]]
name = "post"
provider = "ops"
default_next = "end"
[[chains.steps]]
name = "recheck"
provider = "ops"
default_next = "end"
[[chains.steps]]
name = "page"
provider = "ops"
payload_template = { summary = "<<failure.step>>: <<failure.message>>" }
[[chains.on_failure]]
name = "tell"
provider = "ops"
[[chains.finally]]
name = "unlock"
provider = "ops"
`

const failureCases = `
config = ["runbook.toml"]

[[tests]]
name = "a full disk pages, and the run ends failed"
chain = "runbook"
mocks.verify = { error = "disk still full", code = "DISK_FULL" }
mocks.page.body = { ok = true }
mocks.tell.body = {}
mocks.unlock.body = {}
[tests.expect]
status = "failed"
path = ["verify", "page", "tell", "unlock"]
failure = { step = "verify", class = "permanent", code = "DISK_FULL", route = "page", recovered = false, handlers = ["on_failure:tell", "finally:unlock"] }
steps.page.request = { summary = "verify: DISK_FULL: disk still full" }

[[tests]]
name = "a wrong expectation of the route"
chain = "runbook"
mocks.verify = { error = "disk still full", code = "DISK_FULL" }
mocks.page.body = {}
mocks.tell.body = {}
mocks.unlock.body = {}
[tests.expect]
failure = { route = "recheck", handlers = ["finally:unlock"] }
`

// A case mocks a failure with its error code, and checks the route it
// took and the handlers that ran; coverage counts the failure route no
// case took.
func TestFailureRoutesInCases(t *testing.T) {
	dir := t.TempDir()
	for name, src := range map[string]string{"runbook.toml": failureRunbook, "runbook_test.toml": failureCases} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s, err := Load([]string{filepath.Join(dir, "runbook_test.toml")})
	if err != nil {
		t.Fatal(err)
	}
	results := s.Run(context.Background(), Options{})
	if len(results) != 2 {
		t.Fatalf("%d results", len(results))
	}
	if results[0].Failed() {
		t.Errorf("%s: %v", results[0].Case, results[0].Failures)
	}
	var msgs []string
	for _, f := range results[1].Failures {
		msgs = append(msgs, f.Message)
	}
	want := []string{`run failure route: expected "recheck", got "page"`, `handlers that ran: expected [finally:unlock], got [on_failure:tell finally:unlock]`}
	if !slices.Equal(msgs, want) {
		t.Errorf("failures of the wrong case:\n got %q\nwant %q", msgs, want)
	}
	cov := Cover(s, results[:1])
	missed := strings.Join(cov.Chains[0].Missed, "\n")
	for _, w := range []string{"step verify: failure route (exhausted) to recheck never taken", "step recheck never ran", "step post never ran"} {
		if !strings.Contains(missed, w) {
			t.Errorf("coverage does not say %q:\n%s", w, missed)
		}
	}
	for _, w := range []string{"DISK_FULL) to page", "step tell never ran", "step unlock never ran"} {
		if strings.Contains(missed, w) {
			t.Errorf("coverage says %q although the case covers it:\n%s", w, missed)
		}
	}
}
