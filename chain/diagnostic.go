package chain

import (
	"fmt"
	"strings"
)

// Severity says whether a diagnostic stops the config from loading.
type Severity int

const (
	SeverityError Severity = iota
	SeverityWarning
)

// Diagnostic is one problem found in a config file, with where it is.
type Diagnostic struct {
	File     string
	Line     int // 0 when unknown
	Col      int // 0 when unknown
	Path     string
	Message  string
	Severity Severity
}

// Errorf is an error diagnostic placed at s.
func (s Source) Errorf(format string, args ...any) Diagnostic {
	return Diagnostic{File: s.File, Line: s.Line, Col: s.Col, Path: s.Path, Message: fmt.Sprintf(format, args...)}
}

// String formats the diagnostic as FILE:LINE:COL: KEY.PATH: message,
// leaving out the parts that are unknown.
func (d Diagnostic) String() string {
	var b strings.Builder
	if d.File != "" {
		b.WriteString(d.File)
		if d.Line > 0 {
			fmt.Fprintf(&b, ":%d", d.Line)
			if d.Col > 0 {
				fmt.Fprintf(&b, ":%d", d.Col)
			}
		}
		b.WriteString(": ")
	}
	if d.Path != "" {
		b.WriteString(d.Path)
		b.WriteString(": ")
	}
	if d.Severity == SeverityWarning {
		b.WriteString("warning: ")
	}
	b.WriteString(d.Message)
	return b.String()
}

// ConfigError holds every error found while loading a config, so that an
// operator can fix them all in one pass.
type ConfigError struct {
	Diagnostics []Diagnostic
}

func (e *ConfigError) Error() string {
	lines := make([]string, len(e.Diagnostics))
	for i, d := range e.Diagnostics {
		lines[i] = d.String()
	}
	return strings.Join(lines, "\n")
}
