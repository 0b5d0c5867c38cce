package chain

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// keyPath is where a value sits, in two spellings: the display path used in
// messages (chains[incident-response].steps[notify]) and the data path used
// to look up source positions (chains, 0, steps, 2).
type keyPath struct {
	disp  string
	canon []string
}

func (p keyPath) key(k string) keyPath {
	var d string
	switch {
	case !isBareKey(k):
		// Quoted, as templates write such keys, so a '.' inside the key
		// cannot be read as a step into a table.
		d = p.disp + "[" + strconv.Quote(k) + "]"
	case p.disp == "":
		d = k
	default:
		d = p.disp + "." + k
	}
	return keyPath{disp: d, canon: appendPath(p.canon, k)}
}

func isBareKey(k string) bool {
	for i := 0; i < len(k); i++ {
		if !isBareKeyByte(k[i]) {
			return false
		}
	}
	return k != ""
}

// elem is the i-th element of an array; name, when known, reads better
// than the index in messages.
func (p keyPath) elem(i int, name string) keyPath {
	label := strconv.Itoa(i)
	if name != "" {
		label = name
	}
	return keyPath{disp: p.disp + "[" + label + "]", canon: appendPath(p.canon, strconv.Itoa(i))}
}

// sub extends p by a path written like `blocks[0].text` or `a["b.c"]`, as
// templates report where in a value a problem sits. On text it does not
// understand it stops, keeping the part it read.
func (p keyPath) sub(rel string) keyPath {
	for rel != "" {
		switch {
		case rel[0] == '.':
			rel = rel[1:]
		case strings.HasPrefix(rel, `["`):
			q, err := strconv.QuotedPrefix(rel[1:])
			if err != nil {
				return p
			}
			k, _ := strconv.Unquote(q)
			p = p.key(k)
			rel = strings.TrimPrefix(rel[1+len(q):], "]")
		case rel[0] == '[':
			idx, after, _ := strings.Cut(rel[1:], "]")
			i, err := strconv.Atoi(idx)
			if err != nil {
				return p
			}
			p = p.elem(i, "")
			rel = after
		default:
			end := strings.IndexAny(rel, ".[")
			if end < 0 {
				end = len(rel)
			}
			p = p.key(rel[:end])
			rel = rel[end:]
		}
	}
	return p
}

func appendPath(p []string, k string) []string {
	out := make([]string, len(p), len(p)+1)
	copy(out, p)
	return append(out, k)
}

// fileDecoder reports problems in one file with their positions.
type fileDecoder struct {
	file  string
	pos   positions
	diags *diagnostics
}

func (d *fileDecoder) at(p keyPath) (int, int) {
	for n := len(p.canon); n > 0; n-- {
		if ps, ok := d.pos[strings.Join(p.canon[:n], pathSep)]; ok {
			return ps.line, ps.col
		}
	}
	return 0, 0
}

func (d *fileDecoder) source(p keyPath) Source {
	line, col := d.at(p)
	return Source{File: d.file, Line: line, Col: col, Path: p.disp, d: d, kp: p}
}

func (d *fileDecoder) report(sev Severity, p keyPath, format string, args ...any) {
	line, col := d.at(p)
	d.diags.add(Diagnostic{File: d.file, Line: line, Col: col, Path: p.disp, Message: fmt.Sprintf(format, args...), Severity: sev})
}

func (d *fileDecoder) errorf(p keyPath, format string, args ...any) {
	d.report(SeverityError, p, format, args...)
}

func (d *fileDecoder) warnf(p keyPath, format string, args ...any) {
	d.report(SeverityWarning, p, format, args...)
}

// table is a TOML table being decoded field by field; finish reports the
// keys it does not know.
type table struct {
	d    *fileDecoder
	path keyPath
	m    map[string]any
}

func (d *fileDecoder) table(p keyPath, v any) (*table, bool) {
	m, ok := v.(map[string]any)
	if !ok {
		d.errorf(p, "must be a table, got %s", describe(v))
		return nil, false
	}
	return &table{d: d, path: p, m: m}, true
}

func (t *table) has(k string) bool {
	_, ok := t.m[k]
	return ok
}

func (t *table) value(k string) (any, bool) {
	v, ok := t.m[k]
	return v, ok
}

func (t *table) str(k string) string {
	v, ok := t.value(k)
	if !ok {
		return ""
	}
	s, ok := v.(string)
	if !ok {
		t.d.errorf(t.path.key(k), "must be a string, got %s", describe(v))
		return ""
	}
	return s
}

func (t *table) requiredStr(k string) string {
	if !t.has(k) {
		t.d.errorf(t.path, "missing required key %q", k)
		return ""
	}
	return t.nonEmpty(k)
}

// nonEmpty reads a string that, when written at all, must say something:
// an empty name or condition would leave the step half configured.
func (t *table) nonEmpty(k string) string {
	s := t.str(k)
	if s == "" && t.isString(k) {
		t.d.errorf(t.path.key(k), "must not be empty")
	}
	return s
}

func (t *table) isString(k string) bool {
	_, ok := t.m[k].(string)
	return ok
}

// count reads a non-negative integer; unit names what it counts, so that
// "30s" or 1.5 get an error saying how to write it.
func (t *table) count(k, unit string) int {
	v, ok := t.value(k)
	if !ok {
		return 0
	}
	n, ok := v.(int64)
	if !ok {
		t.d.errorf(t.path.key(k), "must be a whole number of %s, got %s", unit, describe(v))
		return 0
	}
	if n < 0 {
		t.d.errorf(t.path.key(k), "must not be negative, got %d", n)
		return 0
	}
	if n > 1<<31 {
		t.d.errorf(t.path.key(k), "is too large: %d", n)
		return 0
	}
	return int(n)
}

// strings reads an array of strings.
func (t *table) strings(k string) []string {
	v, ok := t.value(k)
	if !ok {
		return nil
	}
	arr, ok := v.([]any)
	if !ok {
		t.d.errorf(t.path.key(k), "must be an array of strings, got %s", describe(v))
		return nil
	}
	out := make([]string, 0, len(arr))
	for i, e := range arr {
		s, ok := e.(string)
		if !ok || s == "" {
			t.d.errorf(t.path.key(k).elem(i, ""), "must be a non-empty string, got %s", describe(e))
			continue
		}
		out = append(out, s)
	}
	return out
}

func (t *table) enum(k string, allowed []string, def string) string {
	if !t.has(k) {
		return def
	}
	s := t.str(k)
	if s == "" && !t.isString(k) {
		return def
	}
	for _, a := range allowed {
		if s == a {
			return s
		}
	}
	t.d.errorf(t.path.key(k), "invalid value %q; want one of %s", s, quoteList(allowed))
	return def
}

func (t *table) sub(k string) (*table, bool) {
	v, ok := t.value(k)
	if !ok {
		return nil, false
	}
	return t.d.table(t.path.key(k), v)
}

// tables reads an array of tables, whether written [[k]] or k = [{...}].
func (t *table) tables(k string) ([]*table, bool) {
	v, ok := t.value(k)
	if !ok {
		return nil, false
	}
	var elems []any
	switch a := v.(type) {
	case []map[string]any:
		for _, m := range a {
			elems = append(elems, m)
		}
	case []any:
		elems = a
	default:
		t.d.errorf(t.path.key(k), "must be an array of tables ([[%s]]), got %s", k, describe(v))
		return nil, false
	}
	out := make([]*table, 0, len(elems))
	for i, e := range elems {
		name := ""
		if m, ok := e.(map[string]any); ok {
			name, _ = m["name"].(string)
		}
		if tb, ok := t.d.table(t.path.key(k).elem(i, name), e); ok {
			out = append(out, tb)
		}
	}
	return out, true
}

// finish reports every key that is not one of known, with a suggestion when
// it looks like a typo of a known one.
func (t *table) finish(known []string) {
	keys := make([]string, 0, len(t.m))
	for k := range t.m {
		if !contains(known, k) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		if s := suggest(k, known); s != "" {
			t.d.errorf(t.path.key(k), "unknown key %q (did you mean %q?)", k, s)
		} else {
			t.d.errorf(t.path.key(k), "unknown key %q", k)
		}
	}
}

func quoteList(s []string) string {
	q := make([]string, len(s))
	for i, v := range s {
		q[i] = strconv.Quote(v)
	}
	return strings.Join(q, ", ")
}

// describe names a decoded TOML value's type for error messages.
func describe(v any) string {
	switch t := v.(type) {
	case string:
		return fmt.Sprintf("string %q", t)
	case int64:
		return fmt.Sprintf("integer %d", t)
	case float64:
		return fmt.Sprintf("float %v", t)
	case bool:
		return fmt.Sprintf("boolean %v", t)
	case map[string]any:
		return "a table"
	case []map[string]any, []any:
		return "an array"
	case time.Time:
		return "a datetime"
	case nil:
		return "nothing"
	}
	return fmt.Sprintf("a %T", v)
}

// suggest returns the known key closest to k, if it is close enough to be
// a likely typo: two edits, or one in three for longer names
// (max_retry → max_retries).
func suggest(k string, known []string) string {
	best, bestDist := "", max(2, len(k)/3)+1
	for _, c := range known {
		if d := editDistance(k, c); d < bestDist {
			best, bestDist = c, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
