// Package secrets loads the values <<secrets.NAME>> reads and keeps them
// out of everything the gateway writes: the store, events, dead-letter
// entries, logs and API answers all pass through a Redactor.
package secrets

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
)

// EnvPrefix marks environment variables that hold secrets:
// CHAINGATE_SECRET_PD_ROUTING_KEY is <<secrets.PD_ROUTING_KEY>>.
const EnvPrefix = "CHAINGATE_SECRET_"

// Load collects secrets from the environment and, if path is set, from a
// file of NAME=VALUE lines (blank lines and # comments ignored). The file
// wins over the environment.
func Load(path string) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range os.Environ() {
		if name, ok := strings.CutPrefix(kv, EnvPrefix); ok {
			k, v, _ := strings.Cut(name, "=")
			if k != "" {
				out[k] = v
			}
		}
	}
	if path == "" {
		return out, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading secrets file: %w", err)
	}
	// Split in memory rather than with a bufio.Scanner, whose line limit
	// would stop the file at a long value (a certificate, a JSON key).
	n := 0
	for line := range strings.Lines(string(data)) {
		n++
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("reading secrets file %s:%d: want NAME=VALUE", path, n)
		}
		out[k] = strings.TrimSpace(v)
	}
	return out, nil
}

// Placeholder replaces every secret value in what is written.
const Placeholder = "[REDACTED]"

// minLen keeps very short values, which would match ordinary text, from
// being redacted everywhere; they are still never logged by name.
const minLen = 4

// Redactor replaces secret values, as they are and as they appear inside
// JSON strings. The zero value and a nil *Redactor redact nothing.
type Redactor struct {
	r *strings.Replacer
}

// NewRedactor returns a Redactor for the values of secrets.
func NewRedactor(secrets map[string]string) *Redactor {
	var vals []string
	seen := map[string]bool{}
	for _, v := range secrets {
		if len(v) < minLen {
			continue
		}
		for _, form := range []string{v, jsonForm(v, true), jsonForm(v, false)} {
			if !seen[form] {
				seen[form] = true
				vals = append(vals, form)
			}
		}
	}
	if len(vals) == 0 {
		return &Redactor{}
	}
	// Longest first, so a secret containing another is replaced whole.
	sort.Slice(vals, func(i, j int) bool { return len(vals[i]) > len(vals[j]) })
	pairs := make([]string, 0, 2*len(vals))
	for _, v := range vals {
		pairs = append(pairs, v, Placeholder)
	}
	return &Redactor{r: strings.NewReplacer(pairs...)}
}

// jsonForm is how v reads inside a JSON string: with <, > and & escaped as
// json.Marshal writes them, or as they are, as templates write them.
func jsonForm(v string, escapeHTML bool) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(escapeHTML)
	_ = enc.Encode(v)
	out := bytes.TrimSuffix(b.Bytes(), []byte("\n"))
	return string(out[1 : len(out)-1])
}

// Active reports whether there is anything to redact.
func (r *Redactor) Active() bool { return r != nil && r.r != nil }

// String redacts s.
func (r *Redactor) String(s string) string {
	if !r.Active() {
		return s
	}
	return r.r.Replace(s)
}

// Bytes redacts b, returning b itself when it holds no secret.
func (r *Redactor) Bytes(b []byte) []byte {
	if !r.Active() || len(b) == 0 {
		return b
	}
	s := string(b)
	if out := r.r.Replace(s); out != s {
		return []byte(out)
	}
	return b
}

// Handler wraps a slog.Handler so that no secret value reaches the log.
func (r *Redactor) Handler(h slog.Handler) slog.Handler {
	if !r.Active() {
		return h
	}
	return &handler{h: h, r: r}
}

type handler struct {
	h slog.Handler
	r *Redactor
}

func (h *handler) Enabled(ctx context.Context, l slog.Level) bool { return h.h.Enabled(ctx, l) }

func (h *handler) Handle(ctx context.Context, rec slog.Record) error {
	out := slog.NewRecord(rec.Time, rec.Level, h.r.String(rec.Message), rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(h.attr(a))
		return true
	})
	return h.h.Handle(ctx, out)
}

func (h *handler) attr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, h.r.String(v.String()))
	case slog.KindGroup:
		attrs := v.Group()
		out := make([]any, len(attrs))
		for i, g := range attrs {
			out[i] = h.attr(g)
		}
		return slog.Group(a.Key, out...)
	case slog.KindAny:
		return slog.String(a.Key, h.r.String(fmt.Sprint(v.Any())))
	}
	return a
}

func (h *handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	out := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		out[i] = h.attr(a)
	}
	return &handler{h: h.h.WithAttrs(out), r: h.r}
}

func (h *handler) WithGroup(name string) slog.Handler {
	return &handler{h: h.h.WithGroup(name), r: h.r}
}
