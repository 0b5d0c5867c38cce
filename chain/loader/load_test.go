package loader_test

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/loader"
)

var update = flag.Bool("update", false, "rewrite golden files")

var loadOpts = loader.Options{ProviderTypes: []string{"echo", "exec", "faulty", "http", "ssh"}}

// storedOpts load a definition a run stored, which has no [gateway] table.
var storedOpts = loader.Options{ProviderTypes: loadOpts.ProviderTypes, Stored: true}

// render formats what loading paths produced, one diagnostic per line.
func render(cfg *chain.Config, err error) string {
	var b strings.Builder
	var ce *chain.ConfigError
	switch {
	case errors.As(err, &ce):
		for _, d := range ce.Diagnostics {
			b.WriteString(d.String())
			b.WriteByte('\n')
		}
	case err != nil:
		b.WriteString("error: " + err.Error() + "\n")
	default:
		for _, w := range cfg.Warnings {
			b.WriteString(w.String())
			b.WriteByte('\n')
		}
		b.WriteString("ok\n")
	}
	return b.String()
}

func checkGolden(t *testing.T, golden, got string) {
	t.Helper()
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("reading golden file (run with -update to create it): %v", err)
	}
	if got != string(want) {
		t.Errorf("diagnostics differ from %s\n--- got\n%s--- want\n%s", golden, got, want)
	}
}

// TestConfigErrors loads every file under testdata/errors and compares the
// diagnostics with its .golden file. Every error class the loader knows has
// a file here.
func TestConfigErrors(t *testing.T) {
	files, err := filepath.Glob("testdata/errors/*.toml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no test files: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".toml"), func(t *testing.T) {
			cfg, err := loader.Load([]string{f}, loadOpts)
			got := render(cfg, err)
			if err == nil {
				t.Errorf("%s loaded without errors", f)
			}
			checkGolden(t, strings.TrimSuffix(f, ".toml")+".golden", got)
		})
	}
}

// TestConfigErrorsAcrossFiles checks that names defined in two files, and a
// [gateway] table split over two, are reported with both places, and that
// references resolve across files.
func TestConfigErrorsAcrossFiles(t *testing.T) {
	cfg, err := loader.Load([]string{"testdata/multi"}, loadOpts)
	checkGolden(t, "testdata/multi.golden", render(cfg, err))
}

func readFile(name string) ([]byte, error) { return os.ReadFile(name) }
