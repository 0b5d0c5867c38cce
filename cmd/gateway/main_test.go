package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/store/bolt"
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/internal/testutil"
	"github.com/chaingate/gateway/internal/testutil/proctest"
	"github.com/chaingate/gateway/plugins/conformance"
	"github.com/chaingate/gateway/plugins/host"
	"github.com/chaingate/gateway/providers/builtin"
)

// mainEnv makes the test binary act as the gateway command itself, so the
// process-level tests need no separate build.
const mainEnv = "GATEWAY_TEST_MAIN"

func TestMain(m *testing.M) {
	host.ServeBuiltinIfRequested(builtin.New)
	conformance.ServeOrphanHostIfRequested()
	if os.Getenv(mainEnv) == "1" {
		main()
	}
	testutil.QuickRaceExit()
	flag.Parse()
	parallelAtLeast(minParallel)
	os.Exit(m.Run())
}

// minParallel is how many tests of this package run at once unless
// -parallel says otherwise. Its tests mostly wait on the gateway, worker
// and plugin processes they start (for a lease to lapse, a retry to come
// due, a kill to land), so the default, one test per CPU, leaves the CPUs
// idle on a small machine.
const minParallel = 8

// parallelAtLeast raises -test.parallel to n when it was not given.
func parallelAtLeast(n int) {
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given && runtime.GOMAXPROCS(0) < n {
		_ = flag.Set("test.parallel", strconv.Itoa(n))
	}
}

func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// TestExampleConfigsValidate checks every file in configs/, alone with the
// shared providers and all together.
func TestExampleConfigsValidate(t *testing.T) {
	files, err := filepath.Glob("../../configs/*.toml")
	if err != nil || len(files) < 3 {
		t.Fatalf("example configs: %v %v", files, err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.toml") {
			continue // gateway test's, run by TestGatewayTestCommand
		}
		paths := []string{f}
		if filepath.Base(f) != "providers.toml" {
			paths = append(paths, "../../configs/providers.toml")
		}
		cfg, err := gateway.LoadConfig(paths)
		if err != nil {
			t.Errorf("%s:\n%v", f, err)
			continue
		}
		if len(cfg.Warnings) > 0 {
			t.Errorf("%s: warnings %v", f, cfg.Warnings)
		}
	}
	for _, dir := range []string{"../../configs", "../../configs/distributed"} {
		code, out, _ := runCLI(t, "validate", dir)
		if code != exitOK || !strings.HasPrefix(out, "ok: ") {
			t.Errorf("validate %s: exit %d, %q", dir, code, out)
		}
	}
	// The runbook reaches hosts of its own: its key is a secret, and
	// gateway/runbook_test.go runs it against a real sshd.
	if code, out, _ := runCLI(t, "validate", "--skip-secrets", "../../configs/runbook"); code != exitOK || !strings.HasPrefix(out, "ok: ") {
		t.Errorf("validate configs/runbook: exit %d, %q", code, out)
	}
}

func TestValidateReportsEveryError(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.toml")
	writeFile(t, bad, `
[[providers]]
name = "p"
type = "echo"
timeout_seconds = "10"

[[chains]]
name = "c"
[[chains.steps]]
name = "a"
provider = "nope"
on_failure = "explode"
`)
	code, out, _ := runCLI(t, "validate", bad)
	if code != exitFailed {
		t.Fatalf("exit %d, want %d", code, exitFailed)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 {
		t.Fatalf("got %d lines, want 3:\n%s", len(lines), out)
	}
	format := regexp.MustCompile(`^` + regexp.QuoteMeta(bad) + `:\d+:\d+: [a-z_\[\]\-.]+: .+$`)
	for _, l := range lines {
		if !format.MatchString(l) {
			t.Errorf("line not FILE:LINE:COL: KEY.PATH: message: %q", l)
		}
	}
	if code, _, _ := runCLI(t, "validate"); code != exitUsage {
		t.Errorf("validate without paths: exit %d", code)
	}
	if code, out, _ := runCLI(t, "validate", filepath.Join(dir, "missing.toml")); code != exitFailed || !strings.Contains(out, "no such file") {
		t.Errorf("missing file: exit %d %q", code, out)
	}
}

// TestReadmeTOMLValidates checks that every TOML block in the README is a
// config that validates as written, without warnings, once the secrets it
// reads are set.
func TestReadmeTOMLValidates(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`<<secrets\.([A-Za-z0-9_]+)>>`).FindAllStringSubmatch(string(readme), -1) {
		t.Setenv("CHAINGATE_SECRET_"+m[1], "a-value-for-"+m[1])
	}
	blocks := regexp.MustCompile("(?ms)^```toml\n(.*?)^```").FindAllStringSubmatch(string(readme), -1)
	if len(blocks) == 0 {
		t.Fatal("README.md has no TOML block")
	}
	dir := t.TempDir()
	for i, b := range blocks {
		f := filepath.Join(dir, fmt.Sprintf("readme-%d.toml", i+1))
		writeFile(t, f, b[1])
		code, out, errOut := runCLI(t, "validate", f)
		if code != exitOK || !strings.HasPrefix(out, "ok: ") || strings.Count(out, "\n") != 1 {
			t.Errorf("README.md's TOML block %d: exit %d\n%s%s", i+1, code, out, errOut)
		}
	}
}

func TestRunExampleChain(t *testing.T) {
	t.Parallel()
	state := filepath.Join(t.TempDir(), "gw.db")
	code, out, errOut := runCLI(t, "run", "incident-response", "--config", "../../configs",
		"--payload", `{"alert_name":"disk-full","host":"db-1","severity":"critical"}`, "--state", state)
	if code != exitOK {
		t.Fatalf("exit %d\nstderr:\n%s", code, errOut)
	}
	var res struct {
		ID     string   `json:"id"`
		Chain  string   `json:"chain"`
		Status string   `json:"status"`
		Path   []string `json:"path"`
		Steps  map[string]struct {
			Status   string          `json:"status"`
			Body     json.RawMessage `json:"body"`
			Error    any             `json:"error"`
			Attempts int             `json:"attempts"`
		} `json:"steps"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("stdout is not the run as JSON: %v\n%s", err, out)
	}
	// A step may retry on a machine loaded enough to run out a call's
	// timeout (a plugin starting takes seconds there): the chain's retry
	// policy is what makes the run succeed anyway, and each retry adds a
	// line saying so and one starting the next attempt.
	retries := strings.Count(errOut, " retrying: ")
	pageRetries := len(regexp.MustCompile(`notify-all/page-oncall +retrying: `).FindAllString(errOut, -1))
	if res.Status != "succeeded" || res.Chain != "incident-response" || len(res.Path) != 3 || res.Steps["notify-all/page-oncall"].Attempts != 1+pageRetries {
		t.Errorf("result: %+v", res)
	}
	if !strings.Contains(string(res.Steps["notify-all/slack-alert"].Body), "disk-full on db-1 (critical)") {
		t.Errorf("slack-alert body: %s", res.Steps["notify-all/slack-alert"].Body)
	}
	// One progress line per event: run started, 2 steps × (started,
	// succeeded), the group and its 3 sub-steps likewise, run succeeded.
	if n := strings.Count(strings.TrimSpace(errOut), "\n") + 1; n != 14+2*retries || strings.Count(errOut, " retrying: ") != strings.Count(errOut, " timed out after ") {
		t.Errorf("%d progress lines with %d retries, want %d, every retry after a timeout:\n%s", n, retries, 14+2*retries, errOut)
	}
	// The README shows this run; its sample must not drift from it.
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	path, _ := json.Marshal(res.Path)
	if want := `"path": ` + strings.ReplaceAll(string(path), ",", ", "); !strings.Contains(string(readme), want) {
		t.Errorf("README's quickstart sample lacks %s", want)
	}
}

func TestRunPrintsHTMLCharactersAsThemselves(t *testing.T) {
	t.Parallel()
	state := filepath.Join(t.TempDir(), "gw.db")
	code, out, errOut := runCLI(t, "run", "incident-response", "--config", "../../configs",
		"--payload", `{"alert_name":"<disk> & <full>","host":"db-1"}`, "--state", state)
	if code != exitOK {
		t.Fatalf("exit %d\nstderr:\n%s", code, errOut)
	}
	if !strings.Contains(out, "<disk> & <full>") || strings.Contains(out, `\u003c`) || strings.Contains(out, `\u0026`) {
		t.Errorf("stdout escapes HTML characters:\n%s", out)
	}
}

func TestRunExitCodes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.toml")
	writeFile(t, cfg, `
[[providers]]
name = "faulty"
type = "faulty"
[[chains]]
name = "fails"
[[chains.steps]]
name = "boom"
provider = "faulty"
payload_template = "<<origin.payload>>"
`)
	payload := filepath.Join(dir, "payload.json")
	writeFile(t, payload, `{"fail": "nope"}`)
	state := filepath.Join(dir, "gw.db")

	code, out, _ := runCLI(t, "run", "fails", "--config", cfg, "--payload", "@"+payload, "--state", state)
	if code != exitFailed || !strings.Contains(out, `"status": "failed"`) || !strings.Contains(out, "faulty: nope") {
		t.Errorf("failing run: exit %d\n%s", code, out)
	}
	code, _, _ = runCLI(t, "run", "fails", "--config", cfg, "--payload", `{"x":1}`, "--state", state)
	if code != exitOK {
		t.Errorf("succeeding run: exit %d", code)
	}
	usage := [][]string{
		{"run", "--config", cfg},
		{"run", "fails"},
		{"run", "nope", "--config", cfg, "--state", state},
		{"run", "fails", "--config", cfg, "--payload", "{bad", "--state", state},
		{"run", "fails", "--config", filepath.Join(dir, "missing.toml")},
		{"frobnicate"},
	}
	for _, args := range usage {
		if code, _, _ := runCLI(t, args...); code != exitUsage {
			t.Errorf("%v: exit %d, want %d", args, code, exitUsage)
		}
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// startGateway runs the gateway command as a real process on a chain whose
// step hangs, and returns once the provider's plugin process is up.
func startGateway(t *testing.T) (*exec.Cmd, []int) {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.toml")
	rec := filepath.Join(dir, "record.jsonl")
	writeFile(t, cfg, fmt.Sprintf(`
[[providers]]
name = "faulty"
type = "faulty"
[[providers]]
name = "echo"
type = "echo"
[[chains]]
name = "hang"
[[chains.steps]]
name = "warm-up"
provider = "echo"
[[chains.steps]]
name = "stuck"
provider = "faulty"
payload_template = { hang = true, record = %q }
`, rec))
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "run", "hang", "--config", cfg, "--state", filepath.Join(dir, "gw.db"))
	cmd.Env = append(os.Environ(), mainEnv+"=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_, _ = cmd.Process.Wait()
	})
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if data, _ := os.ReadFile(rec); len(data) > 0 {
			children := childPIDs(cmd.Process.Pid)
			if len(children) == 2 {
				return cmd, children
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("plugins did not start; stderr:\n%s", stderr.String())
	return nil, nil
}

// childPIDs lists the processes whose parent is pid.
func childPIDs(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, ok := parentPID(child); ok && ppid == pid {
			out = append(out, child)
		}
	}
	return out
}

func parentPID(pid int) (int, bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// The command name may hold spaces; fields resume after its ')'.
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(fields[1])
	return ppid, err == nil
}

func TestSIGTERMStopsPlugins(t *testing.T) {
	t.Parallel()
	cmd, plugins := startGateway(t)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != exitInterrupt {
			t.Errorf("gateway exit: %v, want status %d", err, exitInterrupt)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("gateway did not exit on SIGTERM")
	}
	proctest.WaitGone(t, 15*time.Second, proctest.Seen(plugins...))
}

func TestKill9StopsPlugins(t *testing.T) {
	t.Parallel()
	cmd, plugins := startGateway(t)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, _ = cmd.Process.Wait()
	proctest.WaitGone(t, 15*time.Second, proctest.Seen(plugins...))
}

// TestProgressLines checks the one-line-per-event stderr format.
func TestProgressLines(t *testing.T) {
	t.Parallel()
	state := filepath.Join(t.TempDir(), "gw.db")
	_, _, errOut := runCLI(t, "run", "alert-triage", "--config", "../../configs", "--state", state,
		"--payload", `{"alert_name":"cpu","severity":"info","score":10,"env":"test"}`)
	sc := bufio.NewScanner(strings.NewReader(errOut))
	line := regexp.MustCompile(`^\d\d:\d\d:\d\d\.\d{3}  (run \S+|\S+)\s+(started|succeeded|skipped|failed)`)
	n := 0
	for sc.Scan() {
		n++
		if !line.MatchString(sc.Text()) {
			t.Errorf("progress line %q", sc.Text())
		}
	}
	if n == 0 || !strings.Contains(errOut, "done                     skipped: when condition is false") {
		t.Errorf("progress:\n%s", errOut)
	}
}

// TestInspectionNeedsAStore checks that commands which read or cancel runs
// refuse a store that is not there, naming it, instead of creating an
// empty one behind a mistyped path.
func TestInspectionNeedsAStore(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	missing := filepath.Join(dir, "nowhere", "x.db")
	tests := []struct {
		args []string
		path string // named in the error, and not created
	}{
		{[]string{"runs", "list", "--state", missing}, missing},
		{[]string{"runs", "show", "01x", "--state", "bolt://" + missing}, missing},
		{[]string{"dlq", "list", "--state", missing}, missing},
		{[]string{"dlq", "purge", "--all", "--state", missing}, missing},
		{[]string{"cancel", "01x", "--state", missing}, missing},
		{[]string{"cancel", "01x"}, "data/gateway.db"},
	}
	for _, tc := range tests {
		code, out, errOut := runCLI(t, tc.args...)
		if code == exitOK || !strings.Contains(errOut, tc.path) {
			t.Errorf("%v: exit %d\n%s%s", tc.args, code, out, errOut)
		}
		if _, err := os.Stat(filepath.Dir(tc.path)); err == nil {
			t.Errorf("%v created %s", tc.args, filepath.Dir(tc.path))
		}
	}
}

// TestOperatorFlagChecks checks flags against the bounds the API enforces,
// so working on a store refuses what a server would.
func TestOperatorFlagChecks(t *testing.T) {
	state := filepath.Join(t.TempDir(), "gw.db")
	st, err := bolt.Open(state, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_ = st.Close()
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"runs", "list", "--status", "bogus"}, `status "bogus"`},
		{[]string{"runs", "list", "--limit", "-3"}, "limit must be a number from 1 to 1000"},
		{[]string{"runs", "list", "--limit", "1001"}, "limit must be a number from 1 to 1000"},
		{[]string{"runs", "list", "--started-by", "door"}, `--started-by "door" is not one of trigger, schedule, api, cli, replay, sub_chain`},
		{[]string{"runs", "list", "--started-by", "cli:me"}, "only trigger and schedule take a name"},
		{[]string{"runs", "list", "--hide-chain", "slow,breaks"}, "repeat --hide-chain for each chain to hide"},
		{[]string{"dlq", "list", "--limit", "0"}, "limit must be a number from 1 to 1000"},
		{[]string{"dlq", "purge", "--all", "--limit", "-1"}, "limit must be a number from 1 to 100000"},
		{[]string{"dlq", "replay", "--all", "--concurrency", "0"}, "concurrency must be a number from 1 to 64"},
		{[]string{"dlq", "replay", "--all", "--concurrency", "65"}, "concurrency must be a number from 1 to 64"},
		{[]string{"dlq", "purge"}, "refusing to purge every entry without being told: give --chain, --step or --since to select entries, or --all"},
		{[]string{"dlq", "replay"}, "refusing to replay every entry without being told"},
		{[]string{"dlq", "replay", "01x", "--chain", "c"}, "give an entry id or a filter"},
		{[]string{"dlq", "replay", "01x", "--definition", "latest"}, `unknown definition "latest" (want current or pinned)`},
		{[]string{"dlq", "replay", "01x", "--mode", "restart", "--definition", "pinned"}, "a restart is a new run and always runs the current definition"},
	}
	for _, tc := range tests {
		code, out, errOut := runCLI(t, append(tc.args, "--state", state)...)
		if code != exitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d\n%s%s", tc.args, code, out, errOut)
		}
	}
	for _, args := range [][]string{{"runs", "list", "--status", "failed", "--limit", "1000"}, {"runs", "list", "--started-by", "trigger:am", "--hide-chain", "a", "--hide-chain", "b"}, {"dlq", "list", "--limit", "5"}, {"dlq", "purge", "--all", "--limit", "0"}} {
		if code, out, errOut := runCLI(t, append(args, "--state", state)...); code != exitOK {
			t.Errorf("%v: exit %d\n%s%s", args, code, out, errOut)
		}
	}
}

// TestHelpAndVersion checks that every command's help is there on asking,
// on stdout with exit 0, and that the version names the Go toolchain.
func TestHelpAndVersion(t *testing.T) {
	commands := []string{"validate", "run", "resume", "cancel", "serve", "worker", "runs", "dlq", "graph", "plugin", "version", "backup", "restore", "compact"}
	for _, c := range commands {
		for _, args := range [][]string{{"help", c}, {c, "-h"}, {c, "--help"}} {
			code, out, errOut := runCLI(t, args...)
			if code != exitOK || !strings.Contains(out, "Usage") || errOut != "" {
				t.Errorf("%v: exit %d\nstdout: %s\nstderr: %s", args, code, out, errOut)
			}
		}
	}
	// The overview names every runs sub-command, so none is found only by chance.
	_, out, _ := runCLI(t, "help")
	var named []string
	for _, l := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(l), "gateway runs "); ok {
			named = append(named, strings.Split(strings.Fields(rest)[0], "|")...)
		}
	}
	for _, c := range runsCommands {
		if !slices.Contains(named, c) {
			t.Errorf("gateway help does not name gateway runs %s:\n%s", c, out)
		}
	}
	if _, out, _ := runCLI(t, "serve", "-h"); !strings.Contains(out, "redis://") {
		t.Errorf("serve -h does not mention redis:// state:\n%s", out)
	}
	for _, args := range [][]string{{"runs", "list", "-h"}, {"dlq", "replay", "-h"}, {"plugin", "check", "-h"}} {
		if code, out, _ := runCLI(t, args...); code != exitOK || !strings.Contains(out, "Usage") {
			t.Errorf("%v: exit %d\n%s", args, code, out)
		}
	}
	// A bad flag is still a usage error, with the help on stderr.
	if code, out, errOut := runCLI(t, "run", "--bogus"); code != exitUsage || out != "" || !strings.Contains(errOut, "flag provided but not defined: -bogus") || !strings.Contains(errOut, "Usage") {
		t.Errorf("run --bogus: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, out, _ := runCLI(t, args...)
		if code != exitOK || !strings.HasPrefix(out, "gateway ") || !strings.Contains(out, runtime.Version()) {
			t.Errorf("%v: exit %d: %s", args, code, out)
		}
	}
	code, out, _ := runCLI(t, "version", "--output", "json")
	var v struct {
		Version   string `json:"version"`
		GoVersion string `json:"go_version"`
	}
	if err := json.Unmarshal([]byte(out), &v); code != exitOK || err != nil || v.GoVersion != runtime.Version() || v.Version == "" {
		t.Errorf("version --output json: exit %d %v: %s", code, err, out)
	}
}

// TestRunChecksDeclaredInput: gateway run refuses a payload that does not
// match the chain's declared input as a usage error, before any run exists.
func TestRunChecksDeclaredInput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.toml")
	writeFile(t, cfg, `
[[providers]]
name = "echo"
type = "echo"

[[chains]]
name = "page"
[chains.input]
required = ["alert_name", "host"]
optional = ["severity"]
[[chains.steps]]
name = "p"
provider = "echo"
payload_template = { a = "<<origin.payload.alert_name>> on <<origin.payload.host>>" }
`)
	state := filepath.Join(dir, "gw.db")
	code, out, errOut := runCLI(t, "run", "page", "--config", cfg, "--state", state, "--payload", `{"alert_name":"disk-full","host":null}`)
	if code != exitUsage || out != "" || !strings.Contains(errOut, `--payload: the payload does not match the input chain "page" declares: host: required field is missing`) {
		t.Fatalf("run with a missing field: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runCLI(t, "run", "page", "--config", cfg, "--state", state, "--payload", `{"alert_name":"disk-full","host":"db-1"}`)
	if code != exitOK || !strings.Contains(out, "disk-full on db-1") {
		t.Fatalf("run with the fields: exit %d\n%s%s", code, out, errOut)
	}
}

// TestValidateJSON checks validate --output json: one document, the same
// diagnostics as the text lines, and the same exit status.
func TestValidateJSON(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.toml")
	writeFile(t, bad, `
[[providers]]
name = "echo"
type = "echo"
[[chains]]
name = "c"
[[chains.steps]]
name = "page"
provider = "echo"
on_failure = "skip"
payload_template = { text = "<b><<origin.paylaod.alert_name>></b>" }
`)
	code, out, _ := runCLI(t, "validate", bad, "--output", "json")
	var rep struct {
		OK     bool `json:"ok"`
		Errors []struct {
			File    string `json:"file"`
			Line    int    `json:"line"`
			Col     int    `json:"col"`
			Path    string `json:"path"`
			Message string `json:"message"`
		} `json:"errors"`
	}
	if err := json.Unmarshal([]byte(out), &rep); code != exitFailed || err != nil || rep.OK || len(rep.Errors) != 1 {
		t.Fatalf("exit %d %v\n%s", code, err, out)
	}
	e := rep.Errors[0]
	if e.File != bad || e.Line != 11 || e.Col != 22 || e.Path != "chains[c].steps[page].payload_template.text" ||
		e.Message != `<<origin.paylaod.alert_name>>: origin has no field "paylaod" (did you mean "payload"?)` {
		t.Errorf("diagnostic: %+v", e)
	}
	if strings.Contains(out, `\u003c`) {
		t.Errorf("the JSON escapes < and >:\n%s", out)
	}
	code, out, _ = runCLI(t, "validate", "../../configs/", "--output", "json")
	if err := json.Unmarshal([]byte(out), &rep); code != exitOK || err != nil || !rep.OK || len(rep.Errors) != 0 {
		t.Fatalf("configs/: exit %d %v\n%s", code, err, out)
	}
}

// TestRunRefusesUnstorablePayload: a payload nested 9,999 deep, which a
// store could write but not read back, is a usage error, and the store
// stays readable.
func TestRunRefusesUnstorablePayload(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "gw.db")
	payload := filepath.Join(dir, "deep.json")
	writeFile(t, payload, strings.Repeat("[", 9999)+strings.Repeat("]", 9999))
	code, out, errOut := runCLI(t, "run", "incident-response", "--config", "../../configs/", "--state", state, "--payload", "@"+payload)
	if code != exitUsage || out != "" || !strings.Contains(errOut, "the payload nests 9999 levels deep; at most 1000 are kept") {
		t.Fatalf("run: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := runCLI(t, "runs", "list", "--state", state); code != exitOK {
		t.Errorf("runs list: exit %d\n%s%s", code, out, errOut)
	}
}

// TestRunLeavesNoControlSocket: the control socket beside the store file
// goes with the command that opened it, however the command ends; a run of
// a chain the config lacks opens nothing, and leaves no store file.
func TestRunLeavesNoControlSocket(t *testing.T) {
	const config = `
[[providers]]
name = "faulty"
type = "faulty"
[[chains]]
name = "ok"
[[chains.steps]]
name = "call"
provider = "faulty"
[[chains]]
name = "fails"
[[chains.steps]]
name = "call"
provider = "faulty"
payload_template = { fail = "refused" }
[[chains]]
name = "slow"
[[chains.steps]]
name = "call"
provider = "faulty"
payload_template = { record = "DIR/calls.jsonl", sleep_ms = 60000 }
`
	tests := []struct {
		name      string
		args      []string
		interrupt bool // cancel the command once its call is out
		want      int
		// noStore: refused before anything is opened, so no store file
		// is made for a name mistyped.
		noStore bool
	}{
		{name: "succeeded", args: []string{"run", "ok"}, want: exitOK},
		{name: "failed", args: []string{"run", "fails"}, want: exitFailed},
		{name: "unknown chain", args: []string{"run", "nope"}, want: exitUsage, noStore: true},
		{name: "interrupted", args: []string{"run", "slow"}, interrupt: true, want: exitInterrupt},
		{name: "resume", args: []string{"resume"}, want: exitOK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := newCrashEnv(t, config)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			if tc.interrupt {
				go func() {
					for ctx.Err() == nil {
						if data, _ := os.ReadFile(env.path("calls.jsonl")); bytes.Contains(data, []byte("\n")) {
							break
						}
						time.Sleep(5 * time.Millisecond)
					}
					cancel()
				}()
			}
			var stdout, stderr bytes.Buffer
			code := run(ctx, append(tc.args, "--config", env.config, "--state", env.state), &stdout, &stderr)
			if code != tc.want {
				t.Fatalf("exit %d, want %d\n%s%s", code, tc.want, stdout.String(), stderr.String())
			}
			if _, err := os.Stat(env.state); tc.noStore != os.IsNotExist(err) {
				t.Fatalf("the store file, with noStore %v: %v", tc.noStore, err)
			}
			if _, err := os.Lstat(gateway.ControlPath(env.state)); !os.IsNotExist(err) {
				t.Errorf("%s is left behind (%v)", gateway.ControlPath(env.state), err)
			}
		})
	}
}

// TestTablesPrintTimesWithTheirZone: every time the CLI prints in a table
// names its zone, so a table copied to another machine keeps its meaning.
func TestTablesPrintTimesWithTheirZone(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.toml")
	writeFile(t, cfg, `
[[providers]]
name = "faulty"
type = "faulty"
[[chains]]
name = "fails"
[[chains.steps]]
name = "call"
provider = "faulty"
payload_template = { fail = "refused" }
on_failure = "dlq"
[[schedules]]
name = "nightly"
chain = "fails"
cron = "30 2 * * *"
timezone = "Europe/Paris"
`)
	state := filepath.Join(dir, "gw.db")
	code, out, errOut := runCLI(t, "run", "fails", "--config", cfg, "--state", state)
	if code != exitFailed {
		t.Fatalf("run: exit %d\n%s%s", code, out, errOut)
	}
	var res struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	zoned := regexp.MustCompile(`\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ([A-Z]{2,5}|[+-]\d\d(\d\d)?)\b`)
	for _, args := range [][]string{
		{"runs", "list", "--state", state},
		{"runs", "show", res.ID, "--state", state},
		{"dlq", "list", "--state", state},
		{"schedules", "list", "--config", cfg},
	} {
		code, out, errOut := runCLI(t, args...)
		if code != exitOK || !zoned.MatchString(out) {
			t.Errorf("%v: exit %d, no time with its zone:\n%s%s", args, code, out, errOut)
		}
	}
}
