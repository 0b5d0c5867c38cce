package show

import (
	"errors"
	"fmt"
	"io"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/internal/textx"
)

// Validation is what validate --output json prints.
type Validation struct {
	OK        bool         `json:"ok"`
	Chains    int          `json:"chains"`
	Steps     int          `json:"steps"`
	Providers int          `json:"providers"`
	Triggers  int          `json:"triggers"`
	Schedules int          `json:"schedules"`
	Errors    []Diagnostic `json:"errors"`
	Warnings  []Diagnostic `json:"warnings"`
	Notes     []string     `json:"notes"`
}

// Diagnostic is one problem, as validate --output json prints it.
type Diagnostic struct {
	File     string `json:"file,omitempty"`
	Line     int    `json:"line,omitempty"`
	Col      int    `json:"col,omitempty"`
	Path     string `json:"path,omitempty"`
	Message  string `json:"message"`
	Severity string `json:"severity"`
}

func (v *Validation) Add(d chain.Diagnostic) {
	j := Diagnostic{File: d.File, Line: d.Line, Col: d.Col, Path: d.Path, Message: d.Message, Severity: "error"}
	if d.Severity == chain.SeverityWarning {
		j.Severity = "warning"
		v.Warnings = append(v.Warnings, j)
		return
	}
	v.Errors = append(v.Errors, j)
}

// CountSteps counts steps, those inside parallel groups and splits too.
func CountSteps(steps []*chain.Step) int {
	n := len(steps)
	for _, s := range steps {
		if s.Parallel != nil {
			n += CountSteps(s.Parallel.Steps)
		}
		if s.Split != nil {
			n += CountSteps(s.Split.Steps)
		}
	}
	return n
}

// ConfigError prints a config error one FILE:LINE:COL: KEY.PATH: message
// line per problem.
func ConfigError(w io.Writer, err error) {
	if err == nil {
		return
	}
	var ce *chain.ConfigError
	if errors.As(err, &ce) {
		for _, d := range ce.Diagnostics {
			fmt.Fprintln(w, d.String())
		}
		return
	}
	fmt.Fprintln(w, err)
}

// Text prints the report for people: each problem as a FILE:LINE:COL line
// when err is set, else cfg's warnings, a count of what it defines and the
// notes on what was not checked.
func (v *Validation) Text(w io.Writer, err error, cfg *chain.Config) {
	ConfigError(w, err)
	if err != nil {
		return
	}
	for _, d := range cfg.Warnings {
		fmt.Fprintln(w, d.String())
	}
	summary := "ok: " + textx.Count(v.Chains, "chain", "chains") + ", " + textx.Count(v.Steps, "step", "steps") + ", " + textx.Count(v.Providers, "provider", "providers")
	if v.Triggers > 0 || v.Schedules > 0 {
		summary += ", " + textx.Count(v.Triggers, "trigger", "triggers") + ", " + textx.Count(v.Schedules, "schedule", "schedules")
	}
	fmt.Fprintln(w, summary)
	for _, n := range v.Notes {
		fmt.Fprintln(w, "note:", n)
	}
}
