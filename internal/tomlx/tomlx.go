// Package tomlx writes TOML values for what the gateway shows people as
// config to paste: a test case exported from a run, the form that
// replaces a call written the old way.
package tomlx

import (
	"fmt"
	"strings"
)

// String is s as a TOML basic string.
func String(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\u%04X`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// Strings is list as a TOML array of basic strings.
func Strings(list []string) string {
	parts := make([]string, len(list))
	for i, s := range list {
		parts[i] = String(s)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}
