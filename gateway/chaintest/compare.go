package chaintest

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/chaingate/gateway/internal/jsonx"
)

// contains reports whether got holds want: every key want's tables name,
// with a value that holds want's, lists element by element, and other
// values equal. A test so names only what it cares about.
func contains(got, want any) bool { return len(differences("", got, want)) == 0 }

// differences lists, one line each, where got does not hold want.
func differences(path string, got, want any) []string {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return []string{mismatch(path, want, got)}
		}
		var out []string
		for _, k := range sortedKeys(w) {
			gv, ok := g[k]
			if !ok {
				out = append(out, fmt.Sprintf("%s: expected %s, got no such key", join(path, k), show(w[k])))
				continue
			}
			out = append(out, differences(join(path, k), gv, w[k])...)
		}
		return out
	case []any:
		g, ok := got.([]any)
		if !ok {
			return []string{mismatch(path, want, got)}
		}
		if len(g) != len(w) {
			return []string{fmt.Sprintf("%s: expected %d elements, got %d: %s", orValue(path), len(w), len(g), show(got))}
		}
		var out []string
		for i := range w {
			out = append(out, differences(fmt.Sprintf("%s[%d]", path, i), g[i], w[i])...)
		}
		return out
	}
	if !equal(got, want) {
		return []string{mismatch(path, want, got)}
	}
	return nil
}

func equal(got, want any) bool {
	if gi, ok := got.(int); ok {
		got = float64(gi)
	}
	if wi, ok := want.(int); ok {
		want = float64(wi)
	}
	return got == want
}

func mismatch(path string, want, got any) string {
	return fmt.Sprintf("%s: expected %s, got %s", orValue(path), show(want), show(got))
}

func orValue(path string) string {
	if path == "" {
		return "value"
	}
	return path
}

func join(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

// show writes a value as compact JSON, cut short when long.
func show(v any) string {
	b, err := jsonx.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	s := string(b)
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// decode reads JSON into the values expectations compare with; nil for
// none.
func decode(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return string(b)
	}
	return v
}

// diffLines shows two lists of lines as a diff: "- " for what was expected
// and not got, "+ " for what was got and not expected.
func diffLines(want, got []string) string {
	in := func(list []string, s string) bool {
		for _, e := range list {
			if e == s {
				return true
			}
		}
		return false
	}
	var b strings.Builder
	for _, w := range want {
		if !in(got, w) {
			fmt.Fprintf(&b, "\n      - %s", w)
		}
	}
	for _, g := range got {
		if !in(want, g) {
			fmt.Fprintf(&b, "\n      + %s", g)
		}
	}
	if b.Len() == 0 {
		// The same elements in another order.
		fmt.Fprintf(&b, "\n      - %s\n      + %s", strings.Join(want, " → "), strings.Join(got, " → "))
	}
	return b.String()
}

func sortedCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s = %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}
