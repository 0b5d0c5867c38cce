package loader

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/chaingate/gateway/chain"
)

// fileDecoder reports problems in one file with their positions.
type fileDecoder struct {
	file  string
	pos   chain.Positions
	diags *diagnostics
}

func (d *fileDecoder) source(p chain.KeyPath) chain.Source {
	return chain.SourceAt(d.file, d.pos, p)
}

func (d *fileDecoder) report(sev chain.Severity, p chain.KeyPath, format string, args ...any) {
	line, col := d.pos.At(p)
	d.diags.add(chain.Diagnostic{File: d.file, Line: line, Col: col, Path: p.String(), Message: fmt.Sprintf(format, args...), Severity: sev})
}

func (d *fileDecoder) errorf(p chain.KeyPath, format string, args ...any) {
	d.report(chain.SeverityError, p, format, args...)
}

func (d *fileDecoder) warnf(p chain.KeyPath, format string, args ...any) {
	d.report(chain.SeverityWarning, p, format, args...)
}

// table is a TOML table being decoded field by field; finish reports the
// keys it does not know.
type table struct {
	d    *fileDecoder
	path chain.KeyPath
	m    map[string]any
}

func (d *fileDecoder) table(p chain.KeyPath, v any) (*table, bool) {
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
		t.d.errorf(t.path.Key(k), "must be a string, got %s", describe(v))
		return ""
	}
	return s
}

// boolean reads k as true or false; def when it is missing.
func (t *table) boolean(k string, def bool) bool {
	v, ok := t.value(k)
	if !ok {
		return def
	}
	b, ok := v.(bool)
	if !ok {
		t.d.errorf(t.path.Key(k), "must be true or false, got %s", describe(v))
		return def
	}
	return b
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
		t.d.errorf(t.path.Key(k), "must not be empty")
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
		t.d.errorf(t.path.Key(k), "must be a whole number of %s, got %s", unit, describe(v))
		return 0
	}
	if n < 0 {
		t.d.errorf(t.path.Key(k), "must not be negative, got %d", n)
		return 0
	}
	if n > 1<<31 {
		t.d.errorf(t.path.Key(k), "is too large: %d", n)
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
		t.d.errorf(t.path.Key(k), "must be an array of strings, got %s", describe(v))
		return nil
	}
	out := make([]string, 0, len(arr))
	for i, e := range arr {
		s, ok := e.(string)
		if !ok || s == "" {
			t.d.errorf(t.path.Key(k).Elem(i, ""), "must be a non-empty string, got %s", describe(e))
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
	t.d.errorf(t.path.Key(k), "invalid value %q; want one of %s", s, quoteList(allowed))
	return def
}

func (t *table) sub(k string) (*table, bool) {
	v, ok := t.value(k)
	if !ok {
		return nil, false
	}
	return t.d.table(t.path.Key(k), v)
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
		t.d.errorf(t.path.Key(k), "must be an array of tables ([[%s]]), got %s", k, describe(v))
		return nil, false
	}
	out := make([]*table, 0, len(elems))
	for i, e := range elems {
		name := ""
		if m, ok := e.(map[string]any); ok {
			name, _ = m["name"].(string)
		}
		if tb, ok := t.d.table(t.path.Key(k).Elem(i, name), e); ok {
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
		if s := chain.Suggest(k, known); s != "" {
			t.d.errorf(t.path.Key(k), "unknown key %q (did you mean %q?)", k, s)
		} else if k == "tests" && t.path.String() == "" {
			t.d.errorf(t.path.Key(k), "unknown key %q: this is a test file; run it with gateway test", k)
		} else {
			t.d.errorf(t.path.Key(k), "unknown key %q", k)
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

// diagnostics collects problems while a config is loaded.
type diagnostics struct {
	list []chain.Diagnostic
}

func (ds *diagnostics) add(d chain.Diagnostic) { ds.list = append(ds.list, d) }

// sorted returns the diagnostics ordered by file, then position, so output is
// stable whatever order the checks ran in.
func (ds *diagnostics) sorted() []chain.Diagnostic {
	out := append([]chain.Diagnostic(nil), ds.list...)
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.File != b.File {
			return a.File < b.File
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Col < b.Col
	})
	return out
}
