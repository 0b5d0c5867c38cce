package scaffold_test

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/internal/testutil"
	"github.com/chaingate/gateway/plugins/conformance"
	"github.com/chaingate/gateway/plugins/scaffold"
)

func TestMain(m *testing.M) {
	// The conformance check re-executes this binary as the plugin's parent.
	conformance.ServeOrphanHostIfRequested()
	testutil.QuickRaceExit()
	os.Exit(m.Run())
}

// TestGeneratedModuleBuildsAndConforms generates a plugin module, builds
// and tests it with the go command, and puts the binary through the
// conformance check, as a plugin author would on a fresh checkout.
func TestGeneratedModuleBuildsAndConforms(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	src, err := scaffold.FindGatewaySrc(".")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "pager-provider")
	files, err := scaffold.Generate(scaffold.Options{Name: "pager", Dir: dir, GatewaySrc: src})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(files)
	want := []string{".gitignore", "README.md", "go.mod", "main.go", "payloads.json", "provider.go", "provider_test.go"}
	if !slices.Equal(files, want) {
		t.Errorf("files = %v, want %v", files, want)
	}
	gomod, _ := os.ReadFile(filepath.Join(dir, "go.mod"))
	if !strings.Contains(string(gomod), "module example.com/pager-provider\n") || !strings.Contains(string(gomod), "replace github.com/chaingate/gateway => "+src+"\n") {
		t.Errorf("go.mod:\n%s", gomod)
	}

	run := func(args ...string) string { return goRun(t, goTool, dir, args...) }
	run("mod", "tidy")
	// The plugin sees the SDK and the contract, and nothing else of the
	// gateway's: the SDK's own wire code is all they bring with them.
	var gateway []string
	for _, dep := range strings.Fields(run("list", "-deps", ".")) {
		if strings.HasPrefix(dep, scaffold.GatewayModule+"/") {
			gateway = append(gateway, strings.TrimPrefix(dep, scaffold.GatewayModule+"/"))
		}
	}
	slices.Sort(gateway)
	if want := []string{"plugins", "plugins/internal/wire", "plugins/proto/providerv1", "providers"}; !slices.Equal(gateway, want) {
		t.Errorf("the plugin depends on the gateway's packages %v, want only %v", gateway, want)
	}
	run("vet", "./...")
	run("build", "-o", "bin/pager", ".")
	run("test", "./...")
	if out, err := exec.Command(filepath.Join(filepath.Dir(goTool), "gofmt"), "-l", dir).CombinedOutput(); err != nil || len(out) > 0 {
		t.Errorf("gofmt -l: %v\n%s", err, out)
	}

	data, err := os.ReadFile(filepath.Join(dir, "payloads.json"))
	if err != nil {
		t.Fatal(err)
	}
	var payloads map[string]json.RawMessage
	if err := json.Unmarshal(data, &payloads); err != nil {
		t.Fatalf("payloads.json: %v", err)
	}
	r := conformance.Check(t.Context(), conformance.Target{Path: filepath.Join(dir, "bin", "pager")}, conformance.Options{Payloads: payloads})
	var text strings.Builder
	_ = r.WriteText(&text)
	if !r.OK() || r.Skipped > 0 {
		t.Errorf("the generated plugin does not pass the check as generated:\n%s", text.String())
	}
}

func TestGenerateRefuses(t *testing.T) {
	src, err := scaffold.FindGatewaySrc(".")
	if err != nil {
		t.Fatal(err)
	}
	used := t.TempDir()
	if err := os.WriteFile(filepath.Join(used, "main.go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	notGateway := t.TempDir()
	if err := os.WriteFile(filepath.Join(notGateway, "go.mod"), []byte("module example.com/other\n\ngo 1.26\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		opts scaffold.Options
		want string
	}{
		{"bad name", scaffold.Options{Name: "My_Provider", GatewaySrc: src}, `provider name "My_Provider"`},
		{"directory in use", scaffold.Options{Name: "pager", Dir: used, GatewaySrc: src}, "exists and is not empty"},
		{"not a gateway checkout", scaffold.Options{Name: "pager", Dir: t.TempDir(), GatewaySrc: notGateway}, "declares module example.com/other"},
		{"no checkout", scaffold.Options{Name: "pager", Dir: t.TempDir(), GatewaySrc: t.TempDir()}, "reading the gateway checkout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := scaffold.Generate(tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Generate = %v, want an error containing %q", err, tc.want)
			}
		})
	}
	if _, err := scaffold.FindGatewaySrc(notGateway); err == nil || !strings.Contains(err.Error(), "--gateway-src") {
		t.Errorf("FindGatewaySrc outside a checkout = %v, want an error naming --gateway-src", err)
	}
}

// goRun runs the go command in dir, as a module of its own.
func goRun(t *testing.T, goTool, dir string, args ...string) string {
	t.Helper()
	start := time.Now()
	cmd := exec.Command(goTool, args...)
	cmd.Dir = dir
	// Only the module's own go.mod counts, whatever surrounds it.
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v\n%s%s", strings.Join(args, " "), err, out, stderrOf(err))
	}
	t.Logf("go %s: %s", strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
	return string(out)
}

// TestReadmePluginBuilds builds the plugin the README shows, as a module of
// its own against this checkout.
func TestReadmePluginBuilds(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	src, err := scaffold.FindGatewaySrc(".")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(src, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), "```go\npackage main\n")
	code, _, closed := strings.Cut(rest, "```")
	if !ok || !closed {
		t.Fatal("README.md shows no plugin: no go block starting with package main")
	}
	dir := t.TempDir()
	gomod := "module example.com/ticketing\n\ngo 1.24\n\nrequire " + scaffold.GatewayModule + " v0.0.0-00010101000000-000000000000\n\nreplace " + scaffold.GatewayModule + " => " + src + "\n"
	for name, data := range map[string]string{"go.mod": gomod, "main.go": "package main\n" + code} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	goRun(t, goTool, dir, "mod", "tidy")
	goRun(t, goTool, dir, "vet", ".")
	goRun(t, goTool, dir, "build", "-o", os.DevNull, ".")
}

func stderrOf(err error) []byte {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.Stderr
	}
	return nil
}
