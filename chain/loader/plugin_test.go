package loader_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chaingate/gateway/chain/loader"
)

// TestPluginPinCheckedWhenLoading checks that a sha256 pin that does not
// match the binary is a config error at the pin, not a failure of the first
// run that reaches the provider.
func TestPluginPinCheckedWhenLoading(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "ticketing-plugin")
	content := []byte("#!/bin/sh\nexit 0\n")
	if err := os.WriteFile(bin, content, 0o755); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(content)
	good := hex.EncodeToString(sum[:])
	bad := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		name, pin, want string
	}{
		{"matching pin", good, ""},
		{"matching pin in capitals", strings.ToUpper(good), ""},
		{"stale pin", bad, fmt.Sprintf("c.toml:4:3: providers[ticketing].sha256: plugin binary %s has sha256 %s, not the pinned %s", bin, good, bad)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfgPath := filepath.Join(dir, "c.toml")
			src := fmt.Sprintf("[[providers]]\n  name = \"ticketing\"\n  plugin = %q\n  sha256 = %q\n", bin, tc.pin)
			if err := os.WriteFile(cfgPath, []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := loader.Load([]string{cfgPath}, loader.Options{})
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Load: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Load: %v\nwant an error containing %q", err, tc.want)
			}
		})
	}
}
