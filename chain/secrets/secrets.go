// Package secrets loads the values <<secrets.NAME>> reads and keeps them
// out of everything the gateway writes: the store, events, dead-letter
// entries, logs and API answers all pass through a Redactor.
//
// It is the gateway's own package, with no compatibility promise.
package secrets

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
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

// Redactor replaces secret values wherever they appear, however they are
// written: as they are, escaped inside a JSON string (\u002d for -, \/ for
// /, HTML-safe or not), or percent-encoded in a URL. Text is redacted in the
// forms it can be written in; a JSON document is redacted in its decoded
// strings, so an escaping nobody listed cannot carry a value past it. The
// zero value and a nil *Redactor redact nothing.
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
		for _, form := range forms(v) {
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

// forms lists how v is most often written in text: as it is, inside a
// JSON string as json.Marshal and as templates write it, and as a query
// value (a space as +). Other escapings are found by decoding (see text).
func forms(v string) []string {
	return []string{v, jsonForm(v, true), jsonForm(v, false), url.QueryEscape(v)}
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

// String redacts text: an error message, a log line.
func (r *Redactor) String(s string) string {
	if !r.Active() {
		return s
	}
	return r.text(s)
}

// text redacts s in the forms a value is written in, then, if s may spell
// a value in escapes — JSON's (a backslash) or a URL's (a percent sign),
// which can write any character many ways — reads s with them decoded,
// and if a value shows then, returns it redacted in that decoded form.
func (r *Redactor) text(s string) string {
	out := r.r.Replace(s)
	if strings.IndexByte(out, '\\') < 0 && strings.IndexByte(out, '%') < 0 {
		return out
	}
	plain := percentDecode(unescape(out))
	if plain == out {
		return out
	}
	if red := r.r.Replace(plain); red != plain {
		return red
	}
	return out
}

// percentDecode decodes every valid %XX in s and leaves the rest, so that
// text that merely holds a percent sign reads as it is.
func percentDecode(s string) string {
	if strings.IndexByte(s, '%') < 0 {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+3], 16, 8); err == nil {
				b.WriteByte(byte(n))
				i += 2
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Bytes redacts text held in bytes, returning b itself when it holds no
// secret.
func (r *Redactor) Bytes(b []byte) []byte {
	if !r.Active() || len(b) == 0 {
		return b
	}
	s := string(b)
	if out := r.text(s); out != s {
		return []byte(out)
	}
	return b
}

// JSON redacts a JSON document (a step's body, a payload) in its decoded
// strings and keys, returning doc itself when it holds no secret. A
// document without escapes reads the same decoded, so it is redacted as
// text, without decoding; one that is not JSON is redacted as text.
func (r *Redactor) JSON(doc []byte) []byte {
	if !r.Active() || len(doc) == 0 {
		return doc
	}
	if bytes.IndexByte(doc, '\\') < 0 && bytes.IndexByte(doc, '%') < 0 {
		return r.Bytes(doc)
	}
	// Decoding the whole text at once shows every value a decoded string
	// could hold: most documents hold none, and are spared the decoding.
	if plain := percentDecode(unescape(string(doc))); r.r.Replace(plain) == plain {
		return doc
	}
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil || dec.More() {
		return r.Bytes(doc)
	}
	v, changed := r.value(v)
	if !changed {
		return doc
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return r.Bytes(doc)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

func (r *Redactor) value(v any) (any, bool) {
	switch x := v.(type) {
	case string:
		out := r.text(x)
		return out, out != x
	case []any:
		changed := false
		for i, e := range x {
			var c bool
			if x[i], c = r.value(e); c {
				changed = true
			}
		}
		return x, changed
	case map[string]any:
		changed := false
		out := make(map[string]any, len(x))
		for k, e := range x {
			e, c := r.value(e)
			rk := r.text(k)
			if c || rk != k {
				changed = true
			}
			out[rk] = e
		}
		return out, changed
	}
	return v, false
}

// unescape decodes the JSON string escapes in s (\uXXXX with surrogate
// pairs, \/, \n and the rest), leaving anything else as it is.
func unescape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' || i+1 >= len(s) {
			b.WriteByte(c)
			continue
		}
		switch e := s[i+1]; e {
		case '"', '\\', '/':
			b.WriteByte(e)
			i++
		case 'b', 'f', 'n', 'r', 't':
			b.WriteByte(map[byte]byte{'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}[e])
			i++
		case 'u':
			r, n := unicodeEscape(s[i:])
			if n == 0 {
				b.WriteByte(c)
				continue
			}
			b.WriteRune(r)
			i += n - 1
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// unicodeEscape reads \uXXXX, or a surrogate pair of them, at the start of
// s, and returns the rune and how many bytes it took; 0 if there is none.
func unicodeEscape(s string) (rune, int) {
	hex := func(s string) (rune, bool) {
		if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
			return 0, false
		}
		n, err := strconv.ParseUint(s[2:6], 16, 16)
		return rune(n), err == nil
	}
	r1, ok := hex(s)
	if !ok {
		return 0, 0
	}
	if utf16.IsSurrogate(r1) {
		if r2, ok := hex(s[6:]); ok {
			if r := utf16.DecodeRune(r1, r2); r != utf8.RuneError {
				return r, 12
			}
		}
	}
	return r1, 6
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
