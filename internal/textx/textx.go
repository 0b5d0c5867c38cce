// Package textx writes text for people to read: a label in a message or
// a name in a box of a drawing cut short, a count with its noun.
package textx

import "strconv"

// Short is s cut to at most n runes, the last of them "…" when it is cut.
func Short(s string, n int) string {
	if len(s) <= n {
		return s // no more runes than bytes
	}
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// Count is n with the noun it counts, one or many as n calls for:
// Count(1, "run", "runs") is "1 run", Count(0, "run", "runs") "0 runs".
func Count(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}
