package server_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/internal/testutil/sshdtest"
)

// commandRunConfig has a command run here and the same over SSH, each
// taking any text as v and appending it to out, a file under DIR, and
// reaches them from every kind of call: a step, a split's item, an
// approval's notify and its escalate.
const commandRunConfig = `
[[providers]]
name = "local"
type = "exec"
[providers.config]
dir = "DIR"
[providers.config.commands.record]
script = 'printf "%s|" "$CHAINGATE_ARG_V" >> "$CHAINGATE_ARG_OUT"'
args.v = { type = "string", allow_leading_dash = true, min_length = 0 }
args.out = { type = "path", roots = ["DIR"] }
[providers.config.commands.look]
script = 'ls -d "$CHAINGATE_ARG_DIR" >> "$CHAINGATE_ARG_OUT" 2>&1'
args.dir = { type = "path", roots = ["DIR"] }
args.out = { type = "path", roots = ["DIR"] }

[[providers]]
name = "fleet"
type = "ssh"
[providers.config]
user = "USER"
port = PORT
private_key = "<<secrets.FLEET_KEY>>"
known_hosts = "KNOWN_HOSTS"
allowed_hosts = ["127.0.0.1"]
[providers.config.commands.record]
script = 'printf "%s|" "$CHAINGATE_ARG_V" >> "$CHAINGATE_ARG_OUT"'
args.v = { type = "string", allow_leading_dash = true, min_length = 0 }
args.out = { type = "path", roots = ["DIR"] }

[[chains]]
name = "every-call"

[[chains.steps]]
name = "here"
provider = "local"
action_type = "record"
payload_template = { args = { v = "<<origin.payload.v>>", out = "DIR/here" } }
on_failure = "skip"

[[chains.steps]]
name = "there"
provider = "fleet"
action_type = "record"
payload_template = { host = "127.0.0.1", args = { v = "<<origin.payload.v>>", out = "DIR/there" } }
on_failure = "skip"

[[chains.steps]]
name = "path"
provider = "local"
action_type = "look"
payload_template = { args = { dir = "DIR/<<origin.payload.v>>", out = "DIR/path" } }
on_failure = "skip"

[[chains.steps]]
name = "each"
on_failure = "skip"
[chains.steps.split]
items = "<<origin.payload.items>>"
tolerated_failures = "100%"
[[chains.steps.split.steps]]
name = "item-here"
provider = "local"
action_type = "record"
payload_template = { args = { v = "<<item>>", out = "DIR/item-here" } }
[[chains.steps.split.steps]]
name = "item-there"
provider = "fleet"
action_type = "record"
payload_template = { host = "127.0.0.1", args = { v = "<<item>>", out = "DIR/item-there" } }

[[chains.steps]]
name = "ask"
timeout_seconds = 600
[chains.steps.approval]
message = "go?"
notify = { provider = "local", action_type = "record", payload_template = { args = { v = "<<origin.payload.v>>", out = "DIR/notify" } } }
escalate = { provider = "fleet", action_type = "record", after = "1s", payload_template = { host = "127.0.0.1", args = { v = "<<origin.payload.v>>", out = "DIR/escalate" } } }
`

// TestHostileValuesThroughEveryCall sends hostile values from a run's
// payload to exec and to ssh (a real sshd) through every kind of call. Each
// is refused by the provider, or reaches the command as the literal text it
// is; none runs anything, and none escapes the directory a path argument
// is confined to.
func TestHostileValuesThroughEveryCall(t *testing.T) {
	srv := sshdtest.Start(t)
	dir := t.TempDir()
	marker := filepath.Join(dir, "pwned")
	t.Setenv("CHAINGATE_SECRET_FLEET_KEY", srv.ClientKey)
	cfg := strings.NewReplacer("DIR", dir, "USER", srv.User, "PORT", fmt.Sprint(srv.Port()), "KNOWN_HOSTS", srv.KnownHostsFile).Replace(commandRunConfig)
	clock := newFakeClock()
	env := newAPIOn(t, cfg, "", func(o *gateway.Options) { o.Clock = clock })
	runApprovalLoop(t, env)
	for i, v := range []string{"$(touch " + marker + ")", "; touch " + marker + " #", "`touch " + marker + "`", "-delete", "--help", "../..", "a\ntouch " + marker} {
		t.Run(fmt.Sprintf("value %d", i), func(t *testing.T) {
			for _, f := range []string{"here", "there", "path", "item-here", "item-there", "notify", "escalate"} {
				_ = os.Remove(filepath.Join(dir, f))
			}
			payload, _ := json.Marshal(map[string]any{"v": v, "items": []string{v, v}})
			var run api.StartResponse
			if code, _, raw := env.call("POST", "/v1/chains/every-call/runs", string(payload), nil, &run); code != http.StatusAccepted && code != http.StatusOK {
				t.Fatalf("start: %d %s", code, raw)
			}
			waitStatus(t, env, run.ID, "waiting")
			refused := strings.Contains(v, "\n")
			// The question's notification, and its escalation, due a
			// second after.
			clock.set(clock.Now().Add(time.Minute))
			waitNotes(t, env, run.ID, `approval step "ask": `, 2)
			if code, _, body := env.call("POST", "/v1/runs/"+run.ID+"/signals/ask", `{"decision": "approve"}`, nil, nil); code != http.StatusAccepted {
				t.Fatalf("approve: %d %s", code, body)
			}
			end := waitRunEnd(t, env, run.ID)
			if end.Status != "succeeded" {
				t.Fatalf("run %s: %+v", end.Status, end.Error)
			}
			for _, f := range []struct {
				file, want string
			}{{"here", v + "|"}, {"there", v + "|"}, {"item-here", v + "|" + v + "|"}, {"item-there", v + "|" + v + "|"}, {"notify", v + "|"}, {"escalate", v + "|"}} {
				got, err := os.ReadFile(filepath.Join(dir, f.file))
				switch {
				case refused && err == nil:
					t.Errorf("%s: a value with a newline reached the command: %q", f.file, got)
				case !refused && string(got) != f.want:
					t.Errorf("%s: the command got %q (%v), want %q", f.file, got, err, f.want)
				}
			}
			for _, step := range []string{"here", "there"} {
				if s := end.Steps[step]; refused && (s.Error == nil || s.Error.Code != "bad_argument") {
					t.Errorf("%s: %+v, want it refused", step, s)
				}
			}
			// The path argument is DIR/<value>: the climbing one is refused;
			// the others name a directory that is not there.
			if s := end.Steps["path"]; (v == "../.." || refused) != (s.Error != nil && s.Error.Code == "bad_argument") {
				t.Errorf("path with %q: %+v", v, s)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Fatalf("%q ran a command", v)
			}
		})
	}
}
