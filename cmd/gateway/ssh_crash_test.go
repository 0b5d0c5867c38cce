package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/internal/testutil/proctest"
	"github.com/chaingate/gateway/internal/testutil/sshdtest"
)

// sshConfig is exec's crash chain run on a host over SSH. The second
// command, the first time, records its process ids and those of a child in
// the background, and waits for ever, ignoring TERM for a while as a slow
// cleanup would; the next time, before anything else, it records whether
// any of those processes still runs beside it.
const sshConfig = `
[[providers]]
name = "fleet"
type = "ssh"
[providers.config]
user = "USER"
port = PORT
private_key = "<<secrets.CRASH_SSH_KEY>>"
known_hosts = "KNOWN_HOSTS"
allowed_hosts = ["127.0.0.1"]
kill_grace_seconds = 10
[providers.config.commands.collect]
dir = "DIR"
script = 'echo "$CHAINGATE_DEDUP_KEY" >> collect.calls'
[providers.config.commands.clean]
dir = "DIR"
script = '''
for p in $(cat clean.pids 2>/dev/null); do
  state=$(cut -d' ' -f3 /proc/$p/stat 2>/dev/null) || continue
  [ "$state" = Z ] || echo "$p $state" >> clean.beside
done
echo "$CHAINGATE_DEDUP_KEY" >> clean.calls
[ -e clean.again ] && exit 0
touch clean.again
trap 'sleep 4; exit 143' TERM
sleep 300 & echo $! >> clean.pids
echo $$ >> clean.pids
wait
'''

[[chains]]
name = "remediate"
[[chains.steps]]
name = "collect"
provider = "fleet"
action_type = "collect"
payload_template = { host = "127.0.0.1" }
[[chains.steps]]
name = "clean"
provider = "fleet"
action_type = "clean"
payload_template = { host = "127.0.0.1" }
`

// TestSSHAcrossKill kills the gateway while a command runs on a host, and
// resumes the run at once: the command's whole group there is stopped when
// the connection ends, and the step runs once more, with the same dedup
// key, only once nothing of the first copy, which takes its time to stop,
// is left beside it.
func TestSSHAcrossKill(t *testing.T) {
	srv := sshdtest.Start(t)
	t.Setenv("CHAINGATE_SECRET_CRASH_SSH_KEY", srv.ClientKey)
	config := strings.NewReplacer("USER", srv.User, "PORT", fmt.Sprint(srv.Port()), "KNOWN_HOSTS", srv.KnownHostsFile).Replace(sshConfig)
	env := newCrashEnv(t, config)
	cmd, _ := env.start("run", "remediate")
	env.waitFor("the second command to start", func() bool { return len(proctest.ReadPIDs(env.path("clean.pids"))) == 2 })
	first := proctest.Seen(proctest.ReadPIDs(env.path("clean.pids"))...)
	env.kill(cmd)
	run, persisted := env.snapshot()
	if !persisted["collect"] || persisted["clean"] {
		t.Fatalf("recorded before the kill: %v", persisted)
	}
	// At once, while the first copy's cleanup still runs: the second waits
	// for it.
	env.resume()
	// sshd ended the session's input as the connection went; the watchdog
	// stopped the group, once its trap was done.
	proctest.WaitGone(t, 30*time.Second, first)
	checkCleanRanAgain(t, env, run.ID)
	if beside := lines(t, env.path("clean.beside")); len(beside) > 0 {
		t.Errorf("the second copy ran beside processes of the first: %q", beside)
	}
}
