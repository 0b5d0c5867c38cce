// Package textx cuts text for people to read: a label in a message, a
// name in a box of a drawing.
package textx

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
