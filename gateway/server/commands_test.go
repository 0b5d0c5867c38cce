package server_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chaingate/gateway/gateway"
)

// TestCommandCalls loads configs whose steps call the exec and ssh
// providers, and pins what validate says of each call: every kind of call
// (a step, a split's or a group's sub-step, an approval's notify and
// escalate) is checked by the provider's own rules, and a call written for
// the payload that gave a command whole is shown the form that replaces it.
func TestCommandCalls(t *testing.T) {
	t.Parallel()
	dir, err := filepath.Abs(filepath.Join("testdata", "commands"))
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.toml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no test configs: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			_, err := gateway.LoadConfig([]string{file})
			got := "no problems\n"
			if err != nil {
				got = diagnostics(t, err, dir) + "\n"
			}
			golden := strings.TrimSuffix(file, ".toml") + ".golden"
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (go test -run TestCommandCalls -update writes it)", err)
			}
			if got != string(want) {
				t.Errorf("%s\n--- got\n%s\n--- want\n%s", golden, got, want)
			}
		})
	}
}
