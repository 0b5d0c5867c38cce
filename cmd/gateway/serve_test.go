package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/bolt"
	"github.com/chaingate/gateway/gateway/authz"
	"github.com/chaingate/gateway/internal/testutil/proctest"
	"github.com/chaingate/gateway/internal/testutil/redistest"
)

const serveConfig = `
[gateway]
shutdown_grace_seconds = 10

[[providers]]
name = "faulty"
type = "faulty"

[[chains]]
name = "slow"
[[chains.steps]]
name = "first"
provider = "faulty"
payload_template = { record = "DIR/calls.jsonl", sleep_ms = 1500 }
[[chains.steps]]
name = "second"
provider = "faulty"
payload_template = { record = "DIR/calls.jsonl" }

[[chains]]
name = "breaks"
[[chains.steps]]
name = "call"
provider = "faulty"
payload_template = { fail = "remote refused" }
on_failure = "dlq"
`

// TestServeSIGTERMDrains sends SIGTERM while a call is in flight: the call
// finishes and is recorded, the gateway exits 0 without starting the next
// step, its plugins are gone, and a resume carries the run on.
func TestServeSIGTERMDrains(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gateway.toml")
	writeFile(t, cfg, strings.ReplaceAll(serveConfig, "DIR", dir))
	state := filepath.Join(dir, "gw.db")
	gw := startServe(t, cfg, state)
	id, err := postRun(gw.url, "slow", `{}`)
	if err != nil {
		t.Fatal(err)
	}
	env := &crashEnv{t: t, dir: dir, config: cfg, state: state}
	env.waitFor("the first call", func() bool { return env.lines("calls.jsonl") == 1 })
	children := childPIDs(gw.cmd.Process.Pid)
	if err := gw.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	state2, err := gw.cmd.Process.Wait()
	if err != nil || state2.ExitCode() != 0 {
		t.Fatalf("gateway exit: %v %v\n%s", state2, err, gw.logs)
	}
	proctest.WaitGone(t, 15*time.Second, proctest.Seen(children...))
	if _, err := os.Lstat(state + ".sock"); !os.IsNotExist(err) {
		t.Errorf("the control socket is left behind (%v)", err)
	}
	st, err := bolt.Open(state, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	steps, _ := st.Steps(t.Context(), id, "")
	run, _ := st.Run(t.Context(), id)
	_ = st.Close()
	if len(steps) != 1 || steps[0].Status != store.StepSucceeded || run.Status != store.RunRunning {
		t.Fatalf("after SIGTERM: run %s, steps %+v", run.Status, steps)
	}
	out := env.resume()
	if !strings.Contains(out, `"status":"succeeded"`) {
		t.Errorf("resume: %s", out)
	}
	if n := env.lines("calls.jsonl"); n != 2 {
		t.Errorf("%d calls, want 2: the drained call must not run again", n)
	}
}

// TestServeSIGHUPReloads changes the config under a running gateway.
func TestServeSIGHUPReloads(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gateway.toml")
	writeFile(t, cfg, strings.ReplaceAll(serveConfig, "DIR", dir))
	gw := startServe(t, cfg, filepath.Join(dir, "gw.db"))
	writeFile(t, cfg, "this is not toml")
	_ = gw.cmd.Process.Signal(syscall.SIGHUP)
	gw.waitLog(t, "config reload refused")
	if _, err := postRun(gw.url, "breaks", `{}`); err != nil {
		t.Fatalf("the old config stopped serving after a refused reload: %v", err)
	}
	writeFile(t, cfg, strings.ReplaceAll(serveConfig, "DIR", dir)+`
[[chains]]
name = "added"
[[chains.steps]]
name = "x"
provider = "faulty"
`)
	_ = gw.cmd.Process.Signal(syscall.SIGHUP)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := postRun(gw.url, "added", `{}`); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the new chain never appeared: %v\n%s", err, gw.logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestServeServesTheConsole finds the web console that serve mounts on
// its API, showing the config's chains, and none where [gateway.ui] turns
// it off.
func TestServeServesTheConsole(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, ui string
		status   int
	}{{"on", "", http.StatusOK}, {"off", "[gateway.ui]\nenabled = false\n", http.StatusNotFound}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			cfg := filepath.Join(dir, "gateway.toml")
			writeFile(t, cfg, strings.Replace(strings.ReplaceAll(serveConfig, "DIR", dir), "[[providers]]", tc.ui+"\n[[providers]]", 1))
			gw := startServe(t, cfg, filepath.Join(dir, "gw.db"))
			resp, err := http.Get(gw.url + "/ui/chains")
			if err != nil {
				t.Fatal(err)
			}
			page, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status || (tc.status == http.StatusOK && !strings.Contains(string(page), `href="/ui/chains/slow"`)) {
				t.Errorf("GET /ui/chains: %d\n%s", resp.StatusCode, page)
			}
		})
	}
}

// TestOperatorCommands drives runs and dlq commands against a server and
// straight on a store.
func TestOperatorCommands(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gateway.toml")
	writeFile(t, cfg, strings.ReplaceAll(serveConfig, "DIR", dir))
	state := filepath.Join(dir, "gw.db")
	gw := startServe(t, cfg, state)
	var failed []string
	for range 2 {
		resp, err := http.Post(gw.url+"/v1/chains/breaks/runs?wait=20s", "application/json", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		var out struct {
			ID string `json:"id"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		failed = append(failed, out.ID)
	}
	server := []string{"--server", gw.url}
	// At serve's default level, each failure is a log line an alert can match.
	for _, id := range failed {
		gw.waitLog(t, `"level":"ERROR","msg":"run failed","component":"engine","run":"`+id+`","chain":"breaks","step":"call","err":"step \"call\" failed: faulty: remote refused`)
		gw.waitLog(t, `"level":"WARN","msg":"failure parked in the dead-letter queue","component":"engine","run":"`+id+`","chain":"breaks","step":"call","entry":"`)
	}

	code, out, errOut := runCLI(t, append([]string{"runs", "list", "--status", "failed"}, server...)...)
	if code != exitOK || strings.Count(out, "breaks") != 2 || !strings.Contains(out, "remote refused") {
		t.Errorf("runs list: %d\n%s%s", code, out, errOut)
	}
	code, out, _ = runCLI(t, append([]string{"runs", "show", failed[0], "--output", "json"}, server...)...)
	if code != exitOK || !strings.Contains(out, `"status": "failed"`) {
		t.Errorf("runs show: %d\n%s", code, out)
	}
	code, out, _ = runCLI(t, append([]string{"runs", "events", failed[0]}, server...)...)
	if code != exitOK || !strings.Contains(out, "dead lettered") || !strings.Contains(out, "run "+failed[0]+" failed") {
		t.Errorf("runs events: %d\n%s", code, out)
	}
	code, out, _ = runCLI(t, append([]string{"dlq", "list"}, server...)...)
	if code != exitOK || strings.Count(out, "remote refused") != 2 {
		t.Errorf("dlq list: %d\n%s", code, out)
	}
	var entries []string
	for _, l := range strings.Split(out, "\n")[1:] {
		if f := strings.Fields(l); len(f) > 0 {
			entries = append(entries, f[0])
		}
	}
	code, out, _ = runCLI(t, append([]string{"dlq", "replay", entries[0], "--mode", "restart"}, server...)...)
	if code != exitOK || !strings.Contains(out, "replaying entry "+entries[0]) {
		t.Errorf("dlq replay: %d\n%s", code, out)
	}
	if code, _, _ := runCLI(t, append([]string{"dlq", "purge"}, server...)...); code != exitUsage {
		t.Errorf("purge without a filter: exit %d", code)
	}
	// The restarted run fails again and parks an entry: follow it to its end.
	if _, restarted, ok := strings.Cut(strings.TrimSpace(out), " as run "); !ok {
		t.Fatalf("dlq replay named no run: %s", out)
	} else if code, evs, _ := runCLI(t, append([]string{"runs", "events", restarted, "--follow"}, server...)...); code != exitOK || !strings.Contains(evs, "run "+restarted+" failed") {
		t.Fatalf("the restarted run: %d\n%s", code, evs)
	}
	// The restart is the one run a replay started; the API started the rest.
	code, out, errOut = runCLI(t, append([]string{"runs", "list", "--started-by", "replay"}, server...)...)
	if lines := strings.Split(strings.TrimSpace(out), "\n"); code != exitOK || len(lines) != 2 || !strings.Contains(lines[0], "STARTED BY") || !strings.Contains(lines[1], " replay ") {
		t.Errorf("runs list --started-by replay: %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runCLI(t, append([]string{"runs", "list", "--started-by", "api", "--hide-chain", "slow", "--hide-chain", "breaks"}, server...)...)
	if code != exitOK || strings.Count(strings.TrimSpace(out), "\n") != 0 {
		t.Errorf("runs list without breaks: %d\n%s%s", code, out, errOut)
	}
	code, out, _ = runCLI(t, append([]string{"runs", "show", failed[0]}, server...)...)
	if code != exitOK || !strings.Contains(out, " by api\n") {
		t.Errorf("runs show: %d\n%s", code, out)
	}
	code, out, _ = runCLI(t, append([]string{"dlq", "purge", "--all"}, server...)...)
	if code != exitOK || !strings.Contains(out, "purged 2 entries") {
		t.Errorf("dlq purge: %d\n%s", code, out)
	}
	// A run whose entry is gone is replayed by its id: it resumes at the
	// step it stopped at, fails there again and parks a new entry.
	code, out, _ = runCLI(t, append([]string{"runs", "replay", failed[0]}, server...)...)
	if code != exitOK || !strings.Contains(out, "replaying run "+failed[0]+" as run "+failed[0]) {
		t.Errorf("runs replay: %d\n%s", code, out)
	}
	gw.waitLog(t, `"msg":"run failed","component":"engine","run":"`+failed[0]+`"`)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		_, out, _ = runCLI(t, append([]string{"runs", "events", failed[0]}, server...)...)
		if strings.Count(out, "run "+failed[0]+" failed") == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replayed run did not fail again:\n%s", out)
		}
	}
	if !strings.Contains(out, `replaying from step "call"`) {
		t.Errorf("the replayed run's events:\n%s", out)
	}
	code, _, errOut = runCLI(t, append([]string{"runs", "replay", failed[0], "--mode", "again"}, server...)...)
	if code != exitUsage || !strings.Contains(errOut, `unknown mode "again"`) {
		t.Errorf("runs replay --mode again: %d %s", code, errOut)
	}
	code, out, _ = runCLI(t, "graph", "slow", "--config", cfg)
	if code != exitOK || !strings.HasPrefix(out, "flowchart TD") {
		t.Errorf("graph: %d\n%s", code, out)
	}

	// Straight on the store once the gateway is gone.
	_ = gw.cmd.Process.Signal(syscall.SIGTERM)
	_, _ = gw.cmd.Process.Wait()
	code, out, errOut = runCLI(t, "runs", "list", "--state", state, "--output", "json")
	if code != exitOK || strings.Count(out, `"chain": "breaks"`) != 3 {
		t.Errorf("runs list on the store: %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runCLI(t, "runs", "list", "--state", state, "--output", "json", "--started-by", "api", "--hide-chain", "slow")
	if code != exitOK || strings.Count(out, `"chain": "breaks"`) != 2 || strings.Count(out, `"started_by": "api"`) != 2 {
		t.Errorf("runs list on the store by how they started: %d\n%s%s", code, out, errOut)
	}
	code, out, _ = runCLI(t, "runs", "dag", failed[1], "--state", state)
	if code != exitOK || !strings.Contains(out, "call [provider] failed") {
		t.Errorf("runs dag: %d\n%s", code, out)
	}
	code, out, errOut = runCLI(t, "runs", "replay", failed[1], "--state", state, "--config", cfg)
	if code != exitOK || !strings.Contains(out, "run "+failed[1]+" failed") {
		t.Errorf("runs replay on the store: %d\n%s%s", code, out, errOut)
	}

	// Pruning and deleting on the store: each failed run has an entry of
	// the queue (the purged one's replay parked a new one), so a prune
	// keeps them until they are deleted with their entries.
	time.Sleep(1100 * time.Millisecond)
	code, out, errOut = runCLI(t, "runs", "prune", "--older-than", "1s", "--status", "failed", "--dry-run", "--state", state)
	if code != exitOK || !strings.Contains(out, "would prune 1 run (1 failed)") || !strings.Contains(out, "kept 2 with a dead-letter entry") {
		t.Errorf("runs prune --dry-run: %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runCLI(t, "runs", "delete", failed[0], failed[1], "--state", state)
	if code != exitOK || strings.Count(out, "deleted run ") != 2 || !strings.Contains(out, "1 dead-letter entry") {
		t.Errorf("runs delete: %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runCLI(t, "runs", "prune", "--older-than", "1s", "--state", state)
	if code != exitOK || !strings.Contains(out, "pruned 1 run (1 failed)") {
		t.Errorf("runs prune: %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runCLI(t, "runs", "list", "--state", state, "--status", "failed", "--output", "json")
	if code != exitOK || !strings.Contains(out, `"runs": []`) {
		t.Errorf("runs list after the prune: %d\n%s%s", code, out, errOut)
	}
	if code, _, errOut := runCLI(t, "runs", "prune", "--state", state); code != exitUsage || !strings.Contains(errOut, "--older-than") {
		t.Errorf("runs prune without --older-than: %d %s", code, errOut)
	}
}

// TestOperatorCommandsSayHowToPassAToken: a gateway with tokens answers an
// operator command without one, or with a wrong one, 401; the command says
// how to give one.
func TestOperatorCommandsSayHowToPassAToken(t *testing.T) {
	t.Setenv("CHAINGATE_TOKEN", "")
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gateway.toml")
	writeFile(t, cfg, strings.ReplaceAll(serveConfig, "[gateway]", "[gateway]\nauth = { tokens = [\"s3cret\"] }"))
	gw := startServe(t, cfg, filepath.Join(dir, "gw.db"))
	for _, args := range [][]string{
		{"runs", "list", "--server", gw.url},
		{"dlq", "list", "--server", gw.url, "--token", "wrong"},
		{"schedules", "list", "--server", gw.url},
		{"graph", "slow", "--server", gw.url},
	} {
		code, out, errOut := runCLI(t, args...)
		if code != exitFailed || !strings.Contains(errOut, "unauthorized") || !strings.Contains(errOut, "--token T or CHAINGATE_TOKEN") {
			t.Errorf("%v: exit %d\n%s%s", args, code, out, errOut)
		}
	}
	if code, out, errOut := runCLI(t, "runs", "list", "--server", gw.url, "--token", "s3cret"); code != exitOK || errOut != "" {
		t.Errorf("with the token: exit %d\n%s%s", code, out, errOut)
	}
}

// TestServeSecondSignalEndsTheDrain sends SIGTERM while a long call is in
// flight, then SIGTERM again: the second one stops the wait at once, the
// gateway exits non-zero, and the run stays persisted for a resume.
func TestServeSecondSignalEndsTheDrain(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gateway.toml")
	writeFile(t, cfg, strings.ReplaceAll(`
[gateway]
shutdown_grace_seconds = 60
[[providers]]
name = "faulty"
type = "faulty"
[[chains]]
name = "stuck"
[[chains.steps]]
name = "call"
provider = "faulty"
payload_template = { record = "DIR/calls.jsonl", sleep_ms = 60000 }
`, "DIR", dir))
	state := filepath.Join(dir, "gw.db")
	gw := startServe(t, cfg, state)
	id, err := postRun(gw.url, "stuck", `{}`)
	if err != nil {
		t.Fatal(err)
	}
	env := &crashEnv{t: t, dir: dir, config: cfg, state: state}
	env.waitFor("the call", func() bool { return env.lines("calls.jsonl") == 1 })
	_ = gw.cmd.Process.Signal(syscall.SIGTERM)
	gw.waitLog(t, "shutting down")
	_ = gw.cmd.Process.Signal(syscall.SIGTERM)
	exited := make(chan *os.ProcessState, 1)
	go func() { ps, _ := gw.cmd.Process.Wait(); exited <- ps }()
	select {
	case ps := <-exited:
		if ps.ExitCode() != exitInterrupt {
			t.Errorf("exit %v, want %d\n%s", ps, exitInterrupt, gw.logs)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the second SIGTERM did not end the drain:\n%s", gw.logs)
	}
	st, err := bolt.Open(state, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if run, err := st.Run(t.Context(), id); err != nil || run.Status != store.RunRunning {
		t.Errorf("after the second SIGTERM: %+v %v", run, err)
	}
}

// TestServeChecksBeforeOpening checks that serve refuses a bad listen
// address, and an open API on a public one, before it creates a store.
func TestServeChecksBeforeOpening(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gateway.toml")
	writeFile(t, cfg, strings.ReplaceAll(serveConfig, "DIR", dir))
	tests := []struct {
		listen, want string
	}{
		{"garbage", `bad listen address "garbage"`},
		{"127.0.0.1:http-ish", `bad listen address "127.0.0.1:http-ish"`},
		{"0.0.0.0:0", "refusing to serve 0.0.0.0:0 without API tokens"},
	}
	for _, tc := range tests {
		state := filepath.Join(dir, "gw.db")
		code, _, errOut := runCLI(t, "serve", "--config", cfg, "--state", state, "--listen", tc.listen)
		if code != exitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("--listen %s: exit %d\n%s", tc.listen, code, errOut)
		}
		if _, err := os.Stat(state); err == nil {
			t.Errorf("--listen %s created the store", tc.listen)
		}
	}
}

// TestValidateAgreesWithServe: what serve refuses to start with, in this
// environment, validate reports too, in the same words and with the
// variable to set; with it set, both go on.
func TestValidateAgreesWithServe(t *testing.T) {
	t.Setenv(authz.EnvTokens, "")
	t.Setenv(authz.EnvReadTokens, "")
	const chains = `
[[providers]]
name = "echo"
type = "echo"
[providers.config]
level = "<<secrets.ECHO_LEVEL>>"

[[chains]]
name = "c"
[[chains.steps]]
name = "ask"
approval = { message = "Restart? See <<secrets.RUNBOOK_URL>>" }
[[chains.steps]]
name = "do"
provider = "echo"

[[triggers]]
name = "am"
type = "alertmanager"
chain = "c"
token = "<<secrets.AM_TOKEN>>"
`
	secrets := map[string]string{"ECHO_LEVEL": "1", "RUNBOOK_URL": "https://runbooks.example.com", "AM_TOKEN": "am-4e1f"}
	tests := []struct {
		name, listen, unset, want string
	}{
		{"a provider's secret", "", "ECHO_LEVEL", "providers[echo].config.level: <<secrets.ECHO_LEVEL>>: no secret ECHO_LEVEL: set CHAINGATE_SECRET_ECHO_LEVEL"},
		{"an approval message's secret", "", "RUNBOOK_URL", "chains[c].steps[ask].approval.message: <<secrets.RUNBOOK_URL>>: no secret RUNBOOK_URL: set CHAINGATE_SECRET_RUNBOOK_URL"},
		{"a trigger's token", "", "AM_TOKEN", "triggers[am].token: <<secrets.AM_TOKEN>>: no secret AM_TOKEN: set CHAINGATE_SECRET_AM_TOKEN"},
		{"API tokens", "0.0.0.0:0", "", "refusing to serve 0.0.0.0:0 without API tokens; set [gateway.auth] tokens or CHAINGATE_API_TOKENS"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for name, v := range secrets {
				if name != tc.unset {
					t.Setenv("CHAINGATE_SECRET_"+name, v)
				}
			}
			dir := t.TempDir()
			cfg := filepath.Join(dir, "gateway.toml")
			args := []string{"serve", "--config", cfg, "--state", filepath.Join(dir, "gw.db")}
			if tc.listen != "" {
				writeFile(t, cfg, fmt.Sprintf("[gateway]\nlisten = %q\n", tc.listen)+chains)
			} else {
				// Not the default port: should serve start, it would not
				// take another process's.
				writeFile(t, cfg, chains)
				args = append(args, "--listen", "127.0.0.1:0")
			}
			code, out, _ := runCLI(t, "validate", cfg)
			if code != exitFailed || !strings.Contains(out, tc.want) {
				t.Errorf("validate: exit %d, want %d and %q\n%s", code, exitFailed, tc.want, out)
			}
			if code, out, _ := runCLI(t, "validate", "--skip-secrets", cfg); code != exitOK || !strings.Contains(out, "note: the secrets and API tokens serve needs were not checked") {
				t.Errorf("validate --skip-secrets: exit %d\n%s", code, out)
			}
			code, _, errOut := runCLI(t, args...)
			if code != exitUsage || !strings.Contains(errOut, tc.want) {
				t.Errorf("serve: exit %d, want %d and %q\n%s", code, exitUsage, tc.want, errOut)
			}
			if tc.unset != "" {
				t.Setenv("CHAINGATE_SECRET_"+tc.unset, secrets[tc.unset])
			} else {
				t.Setenv(authz.EnvTokens, "tok-5b0e")
			}
			if code, out, _ := runCLI(t, "validate", cfg); code != exitOK {
				t.Errorf("validate with it set: exit %d\n%s", code, out)
			}
		})
	}
}

// TestServeSIGHUPDuringStartup sends SIGHUP while the gateway is still
// opening its store: the process lives on, and reloads once it serves.
func TestServeSIGHUPDuringStartup(t *testing.T) {
	t.Parallel()
	url := redistest.Open(t)
	// Redis answers only once the gate opens, so startup waits there.
	proxy, open := gatedProxy(t, redistest.Addr())
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gateway.toml")
	writeFile(t, cfg, strings.ReplaceAll(serveConfig, "DIR", dir))
	gw := launchServe(t, cfg, strings.Replace(url, redistest.Addr(), proxy, 1))
	// Logged after the signal handlers are set, before the store opens.
	gw.waitLog(t, "no API tokens configured")
	_ = gw.cmd.Process.Signal(syscall.SIGHUP)
	open()
	gw.waitServing(t)
	gw.waitLog(t, "config reloaded")
	if _, err := postRun(gw.url, "breaks", `{}`); err != nil {
		t.Errorf("after a SIGHUP during startup: %v", err)
	}
}

// gatedProxy forwards connections to addr once open is called, holding
// them until then.
func gatedProxy(t *testing.T, addr string) (string, func()) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	gate := make(chan struct{})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				<-gate
				up, err := net.Dial("tcp", addr)
				if err != nil {
					return
				}
				defer up.Close()
				go func() { _, _ = io.Copy(up, c) }()
				_, _ = io.Copy(c, up)
			}()
		}
	}()
	var once sync.Once
	return l.Addr().String(), func() { once.Do(func() { close(gate) }) }
}
