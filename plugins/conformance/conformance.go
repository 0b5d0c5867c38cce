// Package conformance puts a provider plugin through the gateway's plugin
// contract and reports a checklist: the handshake, Describe, a call per
// action with a payload the author supplies, a bad payload, cancellation
// and deadlines reaching the plugin, the dedup key reaching it, large
// bodies both ways, and the orphan rule. "gateway plugin check" prints it.
//
// Some checks need the plugin's cooperation: plugins.Serve answers the
// reserved action host.ProbeAction itself. A plugin that does not (one
// written in another language) gets those checks skipped, not failed.
//
// The binary that runs Check must call ServeOrphanHostIfRequested early in
// main, as it must call host.ServeBuiltinIfRequested: the orphan check
// re-executes it as the short-lived parent of the plugin.
package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/chaingate/gateway/internal/jsonx"
)

// Target is the plugin to check: an external binary, or a built-in type.
type Target struct {
	Path string   // an external plugin binary; or
	Args []string // its arguments
	// Builtin is a built-in provider type, served by Executable.
	Builtin string
	// Executable is the gateway binary: it serves built-ins and is the
	// orphan check's intermediate parent. Default os.Executable().
	Executable string
}

func (t Target) String() string {
	if t.Builtin != "" {
		return "built-in " + t.Builtin
	}
	return strings.Join(append([]string{t.Path}, t.Args...), " ")
}

// name is what the plugin's log lines are tagged with.
func (t Target) name() string {
	if t.Builtin != "" {
		return t.Builtin
	}
	return filepath.Base(t.Path)
}

// Options says what to send and how long to wait. Zero values select the
// defaults.
type Options struct {
	// Payloads holds a valid payload per action type. Each action with one
	// is called for real, so the config should point at a sandbox.
	Payloads map[string]json.RawMessage
	// Config is the provider's [providers.config] table as JSON.
	Config json.RawMessage
	// AcceptsAnyPayload lets the bad-payload check pass when an action
	// accepts a payload that no ordinary action would, as echo does.
	AcceptsAnyPayload bool
	// Timeout bounds the plugin's start and each ordinary call; default 10 s.
	Timeout time.Duration
	// Grace is how soon after a cancellation or a deadline the plugin must
	// answer; default 2 s.
	Grace time.Duration
	// Logger receives the plugin's own log lines; default discards.
	Logger *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	if o.Grace <= 0 {
		o.Grace = 2 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// Status is a check's verdict.
type Status string

const (
	Pass Status = "PASS"
	Fail Status = "FAIL"
	// Skip means the check could not run; the reason says why.
	Skip Status = "SKIP"
)

// Result is one line of the checklist.
type Result struct {
	// Check names the item, such as "handshake" or "call/open".
	Check  string `json:"check"`
	Status Status `json:"status"`
	// Detail says what was seen, and for a failure how to fix it.
	Detail string `json:"detail"`
}

// Plugin is what the plugin said about itself.
type Plugin struct {
	Name        string   `json:"name"`
	Version     string   `json:"version"`
	ActionTypes []string `json:"action_types"`
	Session     bool     `json:"session"`
}

// Report is the checklist.
type Report struct {
	Target  string   `json:"target"`
	Plugin  *Plugin  `json:"plugin,omitempty"`
	Results []Result `json:"results"`
	Passed  int      `json:"passed"`
	Failed  int      `json:"failed"`
	Skipped int      `json:"skipped"`
	// Interrupted is set when Check's ctx ended before every check ran.
	Interrupted bool `json:"interrupted,omitempty"`
}

// OK reports whether every check ran and none failed.
func (r *Report) OK() bool { return r.Failed == 0 && !r.Interrupted }

// WriteText writes one line per check and a summary.
func (r *Report) WriteText(w io.Writer) error {
	width := 0
	for _, res := range r.Results {
		width = max(width, len(res.Check))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "checking %s\n", r.Target)
	for _, res := range r.Results {
		fmt.Fprintf(&b, "%s  %-*s  %s\n", res.Status, width, res.Check, res.Detail)
	}
	verdict := "conforms"
	switch {
	case r.Interrupted:
		verdict = "was not fully checked: interrupted"
	case !r.OK():
		verdict = "does not conform"
	}
	fmt.Fprintf(&b, "%d passed, %d failed, %d skipped: %s %s\n", r.Passed, r.Failed, r.Skipped, r.Target, verdict)
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSON writes the report as one JSON document.
func (r *Report) WriteJSON(w io.Writer) error {
	data, err := jsonx.Marshal(r)
	if err != nil {
		return fmt.Errorf("encoding the report: %w", err)
	}
	_, err = w.Write(append(data, '\n'))
	return err
}

func (r *Report) add(check string, st Status, detail string) {
	r.Results = append(r.Results, Result{Check: check, Status: st, Detail: detail})
	switch st {
	case Pass:
		r.Passed++
	case Fail:
		r.Failed++
	case Skip:
		r.Skipped++
	}
}

// Check runs the checklist against t. It starts the plugin, twice more for
// the orphan check and after a crash, and stops every process it started
// before it returns.
func Check(ctx context.Context, t Target, opts Options) *Report {
	if t.Executable == "" {
		if exe, err := os.Executable(); err == nil {
			t.Executable = exe
		}
	}
	c := &checker{t: t, opts: opts.withDefaults(), report: &Report{Target: t.String()}, runID: newRunID()}
	c.run(ctx)
	return c.report
}
