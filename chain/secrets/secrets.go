// Package secrets loads the values <<secrets.NAME>> reads and keeps them
// out of everything the gateway writes: the store, events, dead-letter
// entries, logs and API answers all pass through a Redactor.
//
// It is the gateway's own package, with no compatibility promise.
package secrets

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"slices"
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

// minEncoded is the shortest piece of a base64 encoding that is looked for
// on its own: a shorter one would turn up in unrelated encoded data.
const minEncoded = 6

// Redactor replaces secret values wherever they appear, however they are
// written: as they are; escaped inside a JSON string in any way (\u002d
// for -, \/ for /, HTML-safe or not); percent-encoded in a URL in any way;
// base64 in the standard or URL alphabet, padded or not, alone or inside a
// longer encoding (a Basic credential, an encoded document); hex, in lower
// or upper case. The zero value and a nil *Redactor redact nothing.
//
// Every form of every value is looked for in one pass over the text, so
// what redaction costs grows with the text, not with the number of
// secrets or forms.
type Redactor struct {
	m *matcher
}

// NewRedactor returns a Redactor for the values of secrets.
func NewRedactor(secrets map[string]string) *Redactor {
	var pats []string
	seen := map[string]bool{}
	for _, v := range secrets {
		if len(v) < minLen {
			continue
		}
		for _, form := range forms(v) {
			if !seen[form] {
				seen[form] = true
				pats = append(pats, form)
			}
		}
	}
	if len(pats) == 0 {
		return &Redactor{}
	}
	return &Redactor{m: newMatcher(pats, denseCells)}
}

// forms lists how v is written in text: as it is; inside a JSON string as
// json.Marshal and as templates write it; as a query value (a space as +,
// percent-encoded or not); base64 and hex. Other JSON and URL escapings are
// found by reading the text decoded (see scan).
func forms(v string) []string {
	out := []string{v, jsonForm(v, true), jsonForm(v, false), url.QueryEscape(v), strings.ReplaceAll(v, " ", "+")}
	b := []byte(v)
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
		raw := enc.WithPadding(base64.NoPadding)
		out = append(out, enc.EncodeToString(b), raw.EncodeToString(b))
		// Inside a longer encoding v starts at one of three places in a
		// group of three bytes; at each, the characters that v's bytes
		// alone decide are the same whatever surrounds it.
		for k := range 3 {
			text := raw.EncodeToString(append(make([]byte, k), b...))
			lo, hi := (8*k+5)/6, 8*(k+len(b))/6
			if hi-lo >= minEncoded {
				out = append(out, text[lo:hi])
			}
		}
	}
	h := hex.EncodeToString(b)
	return append(out, h, strings.ToUpper(h))
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
func (r *Redactor) Active() bool { return r != nil && r.m != nil }

// String redacts text: an error message, a log line.
func (r *Redactor) String(s string) string {
	if !r.Active() {
		return s
	}
	esc := firstEscape(strings.IndexByte(s, '\\'), strings.IndexByte(s, '%'), len(s))
	spans := scan(r.m, s, esc)
	if spans == nil {
		return s
	}
	return string(replace(s, spans))
}

// JSON redacts a JSON document (a step's body, a payload), or any text
// held in bytes, returning b itself when it holds no secret. A value is
// replaced inside its string, escapes and all, so the document stays JSON
// and keeps its escapes elsewhere.
func (r *Redactor) JSON(b []byte) []byte {
	if !r.Active() || len(b) == 0 {
		return b
	}
	esc := firstEscape(bytes.IndexByte(b, '\\'), bytes.IndexByte(b, '%'), len(b))
	spans := scan(r.m, b, esc)
	if spans == nil {
		return b
	}
	return replace(b, spans)
}

// firstEscape is where the first backslash or percent sign is, given
// where each is (-1 for none), or n if there is neither.
func firstEscape(backslash, percent, n int) int {
	switch {
	case backslash < 0 && percent < 0:
		return n
	case backslash < 0:
		return percent
	case percent < 0:
		return backslash
	}
	return min(backslash, percent)
}

// scan returns the spans of s that spell a secret, nil if none does: as s
// is written, and as it reads with its JSON escapes and percent-encodings
// decoded, which can write any character many ways. esc is where the first
// backslash or percent sign is (len(s) if none): up to there s reads the
// same decoded, and is read once.
func scan[T string | []byte](m *matcher, s T, esc int) []span {
	st, spans := feed(m, 0, s, 0, esc, 0, nil)
	if esc == len(s) {
		return spans
	}
	dst := st
	_, spans = feed(m, st, s, esc, len(s), 0, spans)
	// Decoded, from where the first escape is: runs without one read as
	// they are, shifted to where they are in the decoded text (d).
	var dspans []span
	for i, d := esc, esc; i < len(s); {
		if s[i] != '\\' && s[i] != '%' {
			j := i + 1
			for j < len(s) && s[j] != '\\' && s[j] != '%' {
				j++
			}
			dst, dspans = feed(m, dst, s, i, j, d-i, dspans)
			d += j - i
			i = j
			continue
		}
		dec, k, n := decodeUnit(s[i:])
		dst, dspans = feed(m, dst, dec[:k], 0, k, d, dspans)
		d += k
		i += n
	}
	if dspans == nil {
		return spans
	}
	return union(spans, placeDecoded(s, dspans))
}

// feed reads s[i:j] from state st, adding to spans where a form ends,
// shifted by shift, and returns the state it ends in.
func feed[T string | []byte](m *matcher, st int32, s T, i, j, shift int, spans []span) (int32, []span) {
	for i < j {
		st, i = run(m, st, s, i, j)
		if l := int(m.long[st]); l > 0 {
			spans = addSpan(spans, i+shift-l, i+shift)
		}
	}
	return st, spans
}

// run reads s[i:j] from state st up to where a form ends, or to j, and
// returns the state it is in and where it stopped. Each byte of every
// text redacted passes through this loop, which is kept to a table load.
func run[T string | []byte](m *matcher, st int32, s T, i, j int) (int32, int) {
	delta, class, long, dense, classes := m.delta, &m.class, m.long, m.dense, m.classes
	for i < j {
		c := s[i]
		i++
		if st < dense {
			st = delta[int(st)*classes+int(class[c])]
		} else {
			st = m.step(st, c)
		}
		if long[st] > 0 {
			break
		}
	}
	return st, i
}

// decodeUnit reads one character at the start of s, which is not empty, as
// decoding reads it: a JSON escape (\uXXXX with surrogate pairs, \/, \n and
// the rest) or a percent-encoded byte as the bytes it stands for, anything
// else as itself. It returns the bytes, how many (k) and how many bytes of
// s they were read from (n).
func decodeUnit[T string | []byte](s T) (dec [4]byte, k, n int) {
	switch s[0] {
	case '\\':
		if len(s) < 2 {
			break
		}
		switch e := s[1]; e {
		case '"', '\\', '/':
			dec[0] = e
			return dec, 1, 2
		case 'b', 'f', 'n', 'r', 't':
			dec[0] = "\b\f\n\r\t"[strings.IndexByte("bfnrt", e)]
			return dec, 1, 2
		case 'u':
			if r, n := unicodeEscape(s); n > 0 {
				k := utf8.EncodeRune(dec[:], r)
				return dec, k, n
			}
		}
	case '%':
		if len(s) >= 3 {
			if hi, ok := unhex(s[1]); ok {
				if lo, ok := unhex(s[2]); ok {
					dec[0] = hi<<4 | lo
					return dec, 1, 3
				}
			}
		}
	}
	dec[0] = s[0]
	return dec, 1, 1
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// unicodeEscape reads \uXXXX, or a surrogate pair of them, at the start of
// s, and returns the rune and how many bytes it took; 0 if there is none.
func unicodeEscape[T string | []byte](s T) (rune, int) {
	quad := func(s T) (rune, bool) {
		if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
			return 0, false
		}
		var r rune
		for i := 2; i < 6; i++ {
			v, ok := unhex(s[i])
			if !ok {
				return 0, false
			}
			r = r<<4 | rune(v)
		}
		return r, true
	}
	r1, ok := quad(s)
	if !ok {
		return 0, 0
	}
	if utf16.IsSurrogate(r1) {
		if r2, ok := quad(s[6:]); ok {
			if r := utf16.DecodeRune(r1, r2); r != utf8.RuneError {
				return r, 12
			}
		}
	}
	return r1, 6
}

// placeDecoded turns spans of s's decoded bytes into spans of s, each
// widened to whole escapes, so that no part of one is left behind.
func placeDecoded[T string | []byte](s T, dspans []span) []span {
	out := make([]span, 0, len(dspans))
	// The character being read: s[i:i+n], decoded bytes [d, d+k).
	i, n, d, k := 0, 0, 0, 0
	at := func(pos int) span {
		for d+k <= pos {
			i, d = i+n, d+k
			_, k, n = decodeUnit(s[i:])
		}
		return span{i, i + n}
	}
	for _, sp := range dspans {
		start := at(sp.start).start
		out = append(out, span{start, at(sp.end - 1).end})
	}
	return out
}

// union merges two lists of sorted spans into one whose overlapping spans
// are joined.
func union(a, b []span) []span {
	all := append(slices.Clone(a), b...)
	slices.SortFunc(all, func(x, y span) int { return x.start - y.start })
	out := all[:0]
	for _, sp := range all {
		if len(out) > 0 && sp.start < out[len(out)-1].end {
			out[len(out)-1].end = max(out[len(out)-1].end, sp.end)
			continue
		}
		out = append(out, sp)
	}
	return out
}

// replace returns s with each of spans, sorted and apart, replaced by the
// placeholder.
func replace[T string | []byte](s T, spans []span) []byte {
	out := make([]byte, 0, len(s))
	at := 0
	for _, sp := range spans {
		out = append(out, s[at:sp.start]...)
		out = append(out, Placeholder...)
		at = sp.end
	}
	return append(out, s[at:]...)
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
