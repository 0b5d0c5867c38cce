package tomlx

import (
	"testing"

	"github.com/BurntSushi/toml"
)

func TestStringRoundTrips(t *testing.T) {
	for _, s := range []string{"", "plain", `a"b\c`, "line\nnext\ttab\rret", "\x00\x1b[2J\x7f", "é ✓ <<x>>", "'''"} {
		var v struct{ V string }
		if _, err := toml.Decode("V = "+String(s), &v); err != nil || v.V != s {
			t.Errorf("%q: wrote %s, read back %q (%v)", s, String(s), v.V, err)
		}
	}
	var v struct{ V []string }
	if _, err := toml.Decode("V = "+Strings([]string{"a", `"b"`}), &v); err != nil || len(v.V) != 2 || v.V[1] != `"b"` {
		t.Errorf("read back %q (%v)", v.V, err)
	}
}
