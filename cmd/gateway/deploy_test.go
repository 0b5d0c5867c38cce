package main

import (
	"bufio"
	"context"
	"debug/elf"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/gateway/authz"
	"go.yaml.in/yaml/v3"
)

// The deployment files live at the repository's root and in configs/; the
// tests read them from here.
const repoRoot = "../.."

// exampleEnv reads configs/systemd/chaingate.env.example as the
// environment the gateway would get from it.
func exampleEnv(t *testing.T) map[string]string {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot, "configs/systemd/chaingate.env.example"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("chaingate.env.example: %q is not NAME=VALUE", line)
		}
		env[k] = v
	}
	return env
}

// TestSystemdUnitVerifies checks the unit file with systemd-analyze, the
// binary it starts standing in for the installed one.
func TestSystemdUnitVerifies(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("SKIP: systemd-analyze not found; the unit file is not verified here")
	}
	unit, err := os.ReadFile(filepath.Join(repoRoot, "configs/systemd/chaingate.service"))
	if err != nil {
		t.Fatal(err)
	}
	exe, _ := os.Executable()
	path := filepath.Join(t.TempDir(), "chaingate.service")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(string(unit), "/usr/local/bin/gateway", exe)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", path).CombinedOutput()
	// An unknown key is only a warning to systemd: any output is a finding.
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	for _, want := range []string{"DynamicUser=yes", "NoNewPrivileges=yes", "ProtectSystem=strict", "EnvironmentFile=/etc/chaingate/chaingate.env", "ExecReload=/bin/kill -HUP $MAINPID"} {
		if !strings.Contains(string(unit), want) {
			t.Errorf("the unit has no %s", want)
		}
	}
}

type composeFile struct {
	Services map[string]struct {
		Image       string         `yaml:"image"`
		Build       any            `yaml:"build"`
		Command     []string       `yaml:"command"`
		Ports       []string       `yaml:"ports"`
		EnvFile     any            `yaml:"env_file"`
		DependsOn   map[string]any `yaml:"depends_on"`
		Healthcheck *struct {
			Test []string `yaml:"test"`
		} `yaml:"healthcheck"`
		Deploy struct {
			Replicas int `yaml:"replicas"`
		} `yaml:"deploy"`
	} `yaml:"services"`
}

// TestComposeFile checks compose.yaml without Docker: every service has a
// health check, the gateway and its two workers wait for healthy Redis and
// RabbitMQ, Redis keeps what it is given, and the configs the commands
// name load with the example environment.
func TestComposeFile(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot, "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	if err := yaml.Unmarshal(raw, &c); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	for _, name := range []string{"gateway", "worker", "redis", "rabbitmq"} {
		s, ok := c.Services[name]
		if !ok {
			t.Fatalf("compose.yaml has no %s service", name)
		}
		if s.Healthcheck == nil || len(s.Healthcheck.Test) == 0 {
			t.Errorf("service %s has no health check", name)
		}
	}
	if n := c.Services["worker"].Deploy.Replicas; n != 2 {
		t.Errorf("workers: %d replicas, want 2", n)
	}
	if cmd := strings.Join(c.Services["redis"].Command, " "); !strings.Contains(cmd, "--appendonly yes") {
		t.Errorf("redis runs without an append-only file, which the gateway refuses: %s", cmd)
	}
	env := exampleEnv(t)
	for _, name := range []string{"gateway", "worker"} {
		s := c.Services[name]
		for _, dep := range []string{"redis", "rabbitmq"} {
			d, _ := s.DependsOn[dep].(map[string]any)
			if d["condition"] != "service_healthy" {
				t.Errorf("%s does not wait for %s to be healthy: %v", name, dep, s.DependsOn[dep])
			}
		}
		if s.Image != "chaingate/gateway:local" || s.EnvFile != "chaingate.env" {
			t.Errorf("%s: image %q, env_file %v", name, s.Image, s.EnvFile)
		}
		// The image holds configs/ at /etc/chaingate.
		args := []string{"validate"}
		for i, a := range s.Command {
			if a == "--config" && i+1 < len(s.Command) {
				args = append(args, filepath.Join(repoRoot, "configs", strings.TrimPrefix(s.Command[i+1], "/etc/chaingate/")))
			}
		}
		if len(args) < 2 {
			t.Fatalf("%s's command names no config: %v", name, s.Command)
		}
		for k, v := range env {
			t.Setenv(k, v)
		}
		if code, out, errOut := runCLI(t, args...); code != exitOK {
			t.Errorf("the %s's configs do not validate: %v\n%s%s", name, args, out, errOut)
		}
	}
	if c.Services["gateway"].Build == nil {
		t.Error("the gateway service does not build the image")
	}
	// The file's comment and docs/deployment.md say so.
	for _, p := range c.Services["gateway"].Ports {
		if !strings.HasPrefix(p, "127.0.0.1:") {
			t.Errorf("the gateway is published on %s, not on the host's loopback only", p)
		}
	}
}

// TestImageRefusesToStartWithoutTokens runs the image's default command,
// with the image's paths mapped to the checkout's: it listens on every
// address, so without API tokens it must refuse to start, before it
// creates a store, as the Dockerfile says.
func TestImageRefusesToStartWithoutTokens(t *testing.T) {
	df, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^CMD (\[.*\])$`).FindSubmatch(df)
	if m == nil {
		t.Fatal("the Dockerfile has no CMD [...]")
	}
	var args []string
	if err := json.Unmarshal(m[1], &args); err != nil {
		t.Fatalf("the Dockerfile's CMD: %v", err)
	}
	dir := t.TempDir()
	for i, a := range args {
		a = strings.Replace(a, "/etc/chaingate", filepath.Join(repoRoot, "configs"), 1)
		args[i] = strings.Replace(a, "/var/lib/chaingate", dir, 1)
	}
	t.Setenv(authz.EnvTokens, "")
	t.Setenv(authz.EnvReadTokens, "")
	// Were it to start, it would serve until this ends.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var stdout, stderr strings.Builder
	code := run(ctx, args, &stdout, &stderr)
	if code != exitUsage || !strings.Contains(stderr.String(), "without API tokens") {
		t.Errorf("%v: exit %d\n%s%s", args, code, stdout.String(), stderr.String())
	}
	if entries, _ := os.ReadDir(dir); len(entries) > 0 {
		t.Errorf("a refused start left %v in the state directory", entries)
	}
}

// TestDockerfileBuild builds the binary as the Dockerfile's build stage
// does and checks what the final stage relies on: it is static, knows its
// version, and validates the configs the image carries. Docker itself is
// not run here.
func TestDockerfileBuild(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("SKIP: -short: the static build takes a minute")
	}
	df, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(df)
	build := regexp.MustCompile(`RUN (CGO_ENABLED=0 go build [^\n\\]*)`).FindStringSubmatch(text)
	if build == nil {
		t.Fatal("the Dockerfile's build stage has no CGO_ENABLED=0 go build")
	}
	for _, want := range []string{"USER nonroot:nonroot", "FROM gcr.io/distroless/static", "HEALTHCHECK", `"health"`} {
		if !strings.Contains(text, want) {
			t.Errorf("the Dockerfile has no %s", want)
		}
	}
	fields := strings.Fields(build[1])
	out := filepath.Join(t.TempDir(), "gateway")
	args := slices.Clone(fields[1:]) // go build ...
	for i, a := range args {
		switch {
		case a == "/out/gateway":
			args[i] = out
		case a == "./cmd/gateway":
			args[i] = "."
		case strings.HasPrefix(a, `-ldflags="`):
			args[i] = "-ldflags=" + strings.Trim(strings.TrimPrefix(a, "-ldflags="), `"`) + " " + strings.Trim(args[i+1], `"`)
			args[i+1] = ""
		}
	}
	args = slices.DeleteFunc(args, func(a string) bool { return a == "" })
	cmd := exec.Command("go", args[1:]...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %v: %v\n%s", args[1:], err, b)
	}
	f, err := elf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary has a dynamic loader: it would not start in a static image")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("the binary needs %v", libs)
	}
	if b, err := exec.Command(out, "version", "--output", "json").Output(); err != nil || !json.Valid(b) {
		t.Errorf("version: %v %s", err, b)
	}
	if b, err := exec.Command(out, "validate", filepath.Join(repoRoot, "configs")).CombinedOutput(); err != nil {
		t.Errorf("the image's configs do not validate: %v\n%s", err, b)
	}
}

// TestDeployedAlertmanagerTrigger is docs/deployment.md's end: a gateway
// with configs/deploy/alerts.toml and the example chains takes
// Alertmanager's webhook with its token, runs the incident response for the
// critical alert, and announces its resolution.
func TestDeployedAlertmanagerTrigger(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"deploy/alerts.toml", "providers.toml", "incident-response.toml"} {
		b, err := os.ReadFile(filepath.Join(repoRoot, "configs", f))
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, filepath.Base(f)), string(b))
	}
	t.Setenv("CHAINGATE_SECRET_ALERTMANAGER_TOKEN", "am-token")
	gw := startServe(t, dir, filepath.Join(dir, "gw.db"))
	post := func(fixture, token string) (int, map[string]any) {
		t.Helper()
		body, err := os.Open(filepath.Join(repoRoot, "gateway/server/testdata/triggers", fixture))
		if err != nil {
			t.Fatal(err)
		}
		defer body.Close()
		req, _ := http.NewRequest("POST", gw.url+"/v1/triggers/alertmanager", body)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	if code, _ := post("alertmanager-firing.json", "wrong"); code != http.StatusUnauthorized {
		t.Errorf("a wrong token: %d", code)
	}
	code, out := post("alertmanager-firing.json", "am-token")
	results, _ := out["results"].([]any)
	if code != http.StatusAccepted || len(results) != 2 {
		t.Fatalf("firing: %d %v", code, out)
	}
	firing, _ := results[0].(map[string]any)["run"].(string)
	waitRunStatus(t, gw.url, firing, "succeeded")
	code, out = post("alertmanager-resolved.json", "am-token")
	results, _ = out["results"].([]any)
	if code != http.StatusAccepted || len(results) != 1 {
		t.Fatalf("resolved: %d %v", code, out)
	}
	res := results[0].(map[string]any)
	if res["chain"] != "incident-resolved" || res["firing_run"] != firing {
		t.Fatalf("resolved: %v", res)
	}
	waitRunStatus(t, gw.url, res["run"].(string), "succeeded")
}

// waitRunStatus polls a run through the API until it has status want.
func waitRunStatus(t *testing.T, url, id, want string) {
	t.Helper()
	var last string
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get(url + "/v1/runs/" + id)
		if err != nil {
			t.Fatal(err)
		}
		var run struct {
			Status string `json:"status"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&run)
		resp.Body.Close()
		if last = run.Status; last == want {
			return
		}
	}
	t.Fatalf("run %s is %s, want %s", id, last, want)
}
