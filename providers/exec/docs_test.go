package exec_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/internal/command/commandtest"
)

// TestDocsExamplesTakeHostileValues runs every command that
// docs/providers/exec.md declares with hostile values in each of its
// arguments: each is refused, or runs with the value as the literal text
// it is, creating nothing.
func TestDocsExamplesTakeHostileValues(t *testing.T) {
	cmds := commandtest.DocsCommands(t, "../../docs/providers/exec.md", "exec")
	dir := t.TempDir()
	marker := filepath.Join(dir, "pwned")
	ran := 0
	for _, c := range commandtest.Calls(cmds, marker) {
		_, err := executeWith(t, context.Background(), map[string]any{"dir": dir, "commands": map[string]any{c.Command: cmds[c.Command]}}, c.Command, map[string]any{"args": c.Args})
		var pe *providers.Error
		if err != nil && !errors.As(err, &pe) {
			t.Errorf("%s %s=%.40q: %v", c.Command, c.Arg, c.Value, err)
		}
		if err == nil || pe.Code != "bad_argument" {
			ran++
		}
		if _, err := os.Stat(marker); err == nil {
			t.Fatalf("%s with %s=%q created the marker", c.Command, c.Arg, c.Value)
		}
	}
	if ran == 0 {
		t.Error("no value passed its rule, so no example ran")
	}
}
