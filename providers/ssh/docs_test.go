package ssh_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/chaingate/gateway/internal/testutil/sshdtest"
	"github.com/chaingate/gateway/providers/internal/command/commandtest"
	"github.com/chaingate/gateway/providers/ssh"
)

// TestDocsExamplesTakeHostileValues runs every command that
// docs/providers/ssh.md declares, on a real sshd, with hostile values in
// each of its arguments: each is refused before anything is dialled, or
// runs with the value as the literal text it is, creating nothing.
func TestDocsExamplesTakeHostileValues(t *testing.T) {
	srv := sshdtest.Start(t)
	cmds := commandtest.DocsCommands(t, "../../docs/providers/ssh.md", "ssh")
	marker := filepath.Join(t.TempDir(), "pwned")
	p := ssh.New()
	ran := 0
	for i, c := range commandtest.Calls(cmds, marker) {
		_, err := executeStep(t, context.Background(), p, call{srv.Addr, cmds[c.Command], c.Args}, config(srv, nil), "docs"+string(rune('a'+i%26)))
		if code, _ := code(err); code != "bad_argument" {
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
