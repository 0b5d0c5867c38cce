package textx

import "testing"

func TestShort(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"disk-full", 20, "disk-full"},
		{"disk-full", 9, "disk-full"},
		{"disk-full", 5, "disk…"},
		{"héhéhé", 6, "héhéhé"}, // 9 bytes, 6 runes: kept whole
		{"héhéhé", 4, "héh…"},
	} {
		if got := Short(c.in, c.n); got != c.want {
			t.Errorf("Short(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
}

func TestCount(t *testing.T) {
	for _, c := range []struct {
		n    int
		want string
	}{{0, "0 entries"}, {1, "1 entry"}, {2, "2 entries"}, {-1, "-1 entries"}} {
		if got := Count(c.n, "entry", "entries"); got != c.want {
			t.Errorf("Count(%d) = %q, want %q", c.n, got, c.want)
		}
	}
}
