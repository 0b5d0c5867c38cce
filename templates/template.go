// Package templates implements the <<...>> payload templates of chain steps (DESIGN.md §4).
//
// A placeholder is `<<` expr `>>` where expr is one or more operands separated by `??`;
// an operand is a path such as steps.slack-alert.body.items[0] or a JSON literal. The
// first operand that yields a non-null value wins; null counts as absent for `??`, so
// `<<steps.x.body.owner ?? "ops">>` also covers an owner that is present but null. A
// string that is exactly one placeholder keeps the value's JSON type; inside longer
// text, values read as text (objects and arrays as compact JSON). Substituted values
// are never scanned again, and `<<"<<">>` writes a literal `<<`.
//
// Templates are compiled once and are safe for concurrent use.
//
// It is the gateway's own package, with no compatibility promise.
package templates

import (
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Scope resolves the top-level names a template refers to.
type Scope interface {
	Lookup(root string) (any, bool)
}

// Lazy is a value worked out only when a template reads it, such as a large
// result kept as raw JSON until something looks inside.
type Lazy interface {
	Value() any
}

// LazyObject is a Lazy whose fields can be read one at a time, so a path
// into a large object works out only what it passes through.
type LazyObject interface {
	Lazy
	Field(name string) (any, bool)
}

// MapScope is a Scope backed by a map from root name to value.
type MapScope map[string]any

// Lookup implements Scope.
func (m MapScope) Lookup(root string) (any, bool) {
	v, ok := m[root]
	return v, ok
}

// Ref is one path a template reads.
type Ref struct {
	Root string   // "steps", "origin", ...
	Path []string // segments after the root as written, indexes as decimal strings; nil for a bare root
	Text string   // the path as written, e.g. "steps.a-b.body.x[0]"
	// HasDefault is true when a `??` alternative follows this path.
	HasDefault bool
	// Key is where the string holding the path sits in the compiled value,
	// as CompileError.Key writes it; empty for a bare string.
	Key string
}

// MissingError is returned when a placeholder does not resolve and has no default.
type MissingError struct {
	Path string // the placeholder's expression as written
}

func (e *MissingError) Error() string { return "missing value for <<" + e.Path + ">>" }

// CompileError is a syntax error in a template string.
type CompileError struct {
	Key    string // where the string sits in the compiled value, e.g. "blocks[0].text"; empty for CompileString
	Offset int    // byte offset of the problem within the string
	Msg    string
}

func (e *CompileError) Error() string {
	msg := e.Msg + " at offset " + strconv.Itoa(e.Offset)
	if e.Key == "" {
		return msg
	}
	return e.Key + ": " + msg
}

// Template is a compiled payload template.
type Template struct {
	root *node
	// prog is root flattened for AppendJSON: static parts are pre-encoded, so only
	// placeholders do work at render time.
	prog []jsonOp
	refs []Ref
	// defaulted is true when a placeholder holds a ?? alternative.
	defaulted bool
}

type jsonOp struct {
	lit []byte // emitted before n
	n   *node  // kExpr or kText; nil for the trailing literal
}

type nodeKind uint8

const (
	kStatic nodeKind = iota
	kObject
	kArray
	kExpr // a string that is exactly one placeholder
	kText // a string mixing text and placeholders
)

type node struct {
	kind  nodeKind
	val   any      // kStatic: a scalar, so Render can share it
	keys  []string // kObject, sorted
	elems []*node  // kObject values parallel to keys; kArray elements
	expr  *expr    // kExpr
	parts []part   // kText
}

type part struct {
	lit     string
	litJSON []byte // lit escaped for a JSON string
	e       *expr  // nil for the trailing text
}

// Compile compiles a TOML-decoded value tree. Only string values are scanned for
// placeholders; map keys are taken literally.
func Compile(v any) (*Template, error) { return CompileRoots(v, nil) }

// CompileRoots compiles a template whose paths start at one of roots
// rather than a chain step's: what a trigger maps from a request reads
// that request.
func CompileRoots(v any, roots []string) (*Template, error) {
	c := compiler{roots: roots}
	root, err := c.value(v, "")
	if err != nil {
		c.errs = append(c.errs, err)
	}
	if len(c.errs) > 0 {
		// Every broken string is reported, not only the first.
		return nil, errors.Join(c.errs...)
	}
	var b progBuilder
	if err := b.add(root); err != nil {
		return nil, err
	}
	b.ops = append(b.ops, jsonOp{lit: b.lit})
	return &Template{root: root, prog: b.ops, refs: c.refs, defaulted: c.defaulted}, nil
}

// CompileString compiles a single string.
func CompileString(s string) (*Template, error) { return Compile(s) }

// Render returns the value with placeholders substituted, built from map[string]any,
// []any, string, int64, float64, bool, nil and json.Number (uint64 beyond int64 stays uint64).
// Values taken from the scope are shared, not copied; treat the result as read-only.
func (t *Template) Render(s Scope) (any, error) { return t.root.render(s) }

// AppendJSON renders the value as JSON appended to buf. Object keys are sorted. On error
// buf is returned with its original length.
func (t *Template) AppendJSON(buf []byte, s Scope) ([]byte, error) {
	start := len(buf)
	for i := range t.prog {
		op := &t.prog[i]
		buf = append(buf, op.lit...)
		if op.n == nil {
			continue
		}
		var err error
		if buf, err = op.n.appendJSON(buf, s); err != nil {
			return buf[:start], err
		}
	}
	return buf, nil
}

// Refs lists every path the template reads, in order of appearance (object members in
// sorted key order). Callers must not modify the Path slices.
func (t *Template) Refs() []Ref { return slices.Clone(t.refs) }

// Defaulted reports whether any placeholder holds a ?? alternative, one
// that starts with a literal included (`<<"dev" ?? secrets.TOKEN>>`, whose
// path is never read): a value the config must not hold, a credential, may
// have none.
func (t *Template) Defaulted() bool { return t.defaulted }

// SinglePath reports whether the template is exactly one placeholder holding one path
// with no ?? alternative, and returns that path: a caller that can read the value at a
// path more cheaply than rendering would (a slice of raw JSON, say) may do so instead.
func (t *Template) SinglePath() (Ref, bool) {
	if t.root.kind != kExpr || len(t.root.expr.ops) != 1 || t.root.expr.ops[0].path == nil || len(t.refs) != 1 {
		return Ref{}, false
	}
	return t.refs[0], true
}

// Static reports whether rendering ignores the scope: the template reads no paths.
func (t *Template) Static() bool { return len(t.refs) == 0 }

func (n *node) render(s Scope) (any, error) {
	switch n.kind {
	case kObject:
		m := make(map[string]any, len(n.keys))
		for i, k := range n.keys {
			v, err := n.elems[i].render(s)
			if err != nil {
				return nil, err
			}
			m[k] = v
		}
		return m, nil
	case kArray:
		a := make([]any, len(n.elems))
		for i, e := range n.elems {
			v, err := e.render(s)
			if err != nil {
				return nil, err
			}
			a[i] = v
		}
		return a, nil
	case kExpr:
		v, err := n.expr.eval(s)
		if err != nil {
			return nil, err
		}
		if v, err = normalizeValue(v); err != nil {
			return nil, n.expr.wrap(err)
		}
		return v, nil
	case kText:
		var arr [256]byte
		b := arr[:0]
		for _, p := range n.parts {
			b = append(b, p.lit...)
			if p.e == nil {
				break
			}
			v, err := p.e.eval(s)
			if err != nil {
				return nil, err
			}
			if b, err = appendText(b, v); err != nil {
				return nil, p.e.wrap(err)
			}
		}
		return string(b), nil
	}
	return n.val, nil
}

func (n *node) appendJSON(buf []byte, s Scope) ([]byte, error) {
	if n.kind == kExpr {
		v, err := n.expr.eval(s)
		if err != nil {
			return buf, err
		}
		if buf, err = appendJSON(buf, v, 0); err != nil {
			return buf, n.expr.wrap(err)
		}
		return buf, nil
	}
	buf = append(buf, '"')
	for _, p := range n.parts {
		buf = append(buf, p.litJSON...)
		if p.e == nil {
			break
		}
		v, err := p.e.eval(s)
		if err != nil {
			return buf, err
		}
		if buf, err = appendTextJSON(buf, v); err != nil {
			return buf, p.e.wrap(err)
		}
	}
	return append(buf, '"'), nil
}

// eval returns the first operand with a non-null value; null if the only values found
// were null; a *MissingError if nothing resolved.
func (e *expr) eval(s Scope) (any, error) {
	sawNull := false
	for i := range e.ops {
		op := &e.ops[i]
		v, ok := op.lit, true
		if op.path != nil {
			v, ok = op.path.resolve(s)
		}
		if ok {
			if v != nil {
				return v, nil
			}
			sawNull = true
		}
	}
	if sawNull {
		return nil, nil
	}
	return nil, &MissingError{Path: e.text}
}

func (e *expr) wrap(err error) error { return fmt.Errorf("<<%s>>: %w", e.text, err) }

type compiler struct {
	roots     []string
	refs      []Ref
	defaulted bool
	errs      []error // errors in members of objects and arrays
	depth     int
}

func (c *compiler) value(v any, key string) (*node, error) {
	if c.depth++; c.depth > maxDepth {
		return nil, fmt.Errorf("%s: %w", key, errTooDeep)
	}
	defer func() { c.depth-- }()
	switch x := v.(type) {
	case string:
		return c.str(x, key)
	case map[string]any:
		return compileMap(c, x, key)
	case map[string]string:
		return compileMap(c, x, key)
	case []any:
		return compileSlice(c, x, key)
	case []map[string]any:
		return compileSlice(c, x, key)
	case []string:
		return compileSlice(c, x, key)
	}
	s, err := scalar(v)
	if err != nil {
		if key == "" {
			return nil, err
		}
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	return &node{kind: kStatic, val: s}, nil
}

func compileMap[V any](c *compiler, m map[string]V, key string) (*node, error) {
	if m == nil {
		return &node{kind: kStatic}, nil
	}
	n := &node{kind: kObject, keys: sortedKeys(m, nil)}
	for _, k := range n.keys {
		e, err := c.value(m[k], joinKey(key, k))
		if err != nil {
			c.errs = append(c.errs, err)
			continue
		}
		n.elems = append(n.elems, e)
	}
	return n, nil
}

func compileSlice[V any](c *compiler, a []V, key string) (*node, error) {
	if a == nil {
		return &node{kind: kStatic}, nil
	}
	n := &node{kind: kArray, elems: make([]*node, 0, len(a))}
	for i, v := range a {
		e, err := c.value(v, key+"["+strconv.Itoa(i)+"]")
		if err != nil {
			c.errs = append(c.errs, err)
			continue
		}
		n.elems = append(n.elems, e)
	}
	return n, nil
}

func joinKey(key, k string) string {
	simple := k != ""
	for i := 0; i < len(k); i++ {
		simple = simple && isNameByte(k[i])
	}
	switch {
	case !simple:
		return key + "[" + strconv.Quote(k) + "]"
	case key == "":
		return k
	}
	return key + "." + k
}

// scalar converts a non-container TOML value to the form Render returns.
func scalar(v any) (any, error) {
	switch x := v.(type) {
	case time.Time:
		return tomlTime(x), nil
	case nil, bool, int64, float64, json.Number, float32,
		int, int8, int16, int32, uint, uint8, uint16, uint32, uint64:
		return normalizeValue(v)
	case encoding.TextMarshaler:
		b, err := x.MarshalText()
		return string(b), err
	case fmt.Stringer:
		return x.String(), nil
	}
	return nil, unsupported(v)
}

// tomlTime formats a decoded TOML datetime the way it was written; BurntSushi/toml marks
// local dates and times with these zone names.
func tomlTime(t time.Time) string {
	switch t.Location().String() {
	case "datetime-local":
		return t.Format("2006-01-02T15:04:05.999999999")
	case "date-local":
		return t.Format(time.DateOnly)
	case "time-local":
		return t.Format("15:04:05.999999999")
	}
	return t.Format(time.RFC3339Nano)
}

func (c *compiler) str(s, key string) (*node, error) {
	pieces, serr := scan(s, c.roots)
	if serr != nil {
		return nil, &CompileError{Key: key, Offset: serr.off, Msg: serr.msg}
	}
	for _, pc := range pieces {
		if pc.e != nil {
			c.addRefs(pc.e, key)
			c.defaulted = c.defaulted || len(pc.e.ops) > 1
		}
	}
	if len(pieces) == 2 && pieces[0].lit == "" && pieces[1].lit == "" {
		e := pieces[0].e
		if !e.hasPaths() {
			v, _ := e.eval(nil) // literals always resolve
			return &node{kind: kStatic, val: v}, nil
		}
		return &node{kind: kExpr, expr: e}, nil
	}
	// Literal-only placeholders (the `<<"<<">>` escape) fold into the surrounding text.
	var parts []part
	var lit []byte
	for _, pc := range pieces {
		lit = append(lit, pc.lit...)
		if pc.e == nil {
			break
		}
		if !pc.e.hasPaths() {
			v, _ := pc.e.eval(nil)
			lit, _ = appendText(lit, v) // a literal is a finite scalar
			continue
		}
		parts = append(parts, part{lit: string(lit), e: pc.e})
		lit = lit[:0]
	}
	if len(parts) == 0 {
		return &node{kind: kStatic, val: string(lit)}, nil
	}
	parts = append(parts, part{lit: string(lit)})
	for i := range parts {
		parts[i].litJSON = appendStringBody(nil, parts[i].lit)
	}
	return &node{kind: kText, parts: parts}, nil
}

func (c *compiler) addRefs(e *expr, key string) {
	for i, op := range e.ops {
		if op.path == nil {
			continue
		}
		var segs []string
		for _, sg := range op.path.segs {
			segs = append(segs, sg.key)
		}
		c.refs = append(c.refs, Ref{
			Root:       op.path.root,
			Path:       segs,
			Text:       op.path.text,
			HasDefault: i < len(e.ops)-1,
			Key:        key,
		})
	}
}

type progBuilder struct {
	lit []byte
	ops []jsonOp
}

func (b *progBuilder) add(n *node) error {
	switch n.kind {
	case kStatic:
		var err error
		b.lit, err = appendJSON(b.lit, n.val, 0)
		return err
	case kObject:
		b.lit = append(b.lit, '{')
		for i, k := range n.keys {
			if i > 0 {
				b.lit = append(b.lit, ',')
			}
			b.lit = appendString(b.lit, k)
			b.lit = append(b.lit, ':')
			if err := b.add(n.elems[i]); err != nil {
				return err
			}
		}
		b.lit = append(b.lit, '}')
	case kArray:
		b.lit = append(b.lit, '[')
		for i, e := range n.elems {
			if i > 0 {
				b.lit = append(b.lit, ',')
			}
			if err := b.add(e); err != nil {
				return err
			}
		}
		b.lit = append(b.lit, ']')
	default:
		b.ops = append(b.ops, jsonOp{lit: b.lit, n: n})
		b.lit = nil
	}
	return nil
}

// Written returns the value as the config writes it, for a check made
// before anything is rendered: every value a placeholder fills is nil
// (which TOML cannot write, so a nil here always means "filled at run
// time"), and holes maps the JSON Pointer of each such value ("/args/0",
// "" for the whole) to its text as written.
func (t *Template) Written() (v any, holes map[string]string) {
	holes = map[string]string{}
	return t.root.written("", holes), holes
}

func (n *node) written(ptr string, holes map[string]string) any {
	switch n.kind {
	case kObject:
		m := make(map[string]any, len(n.keys))
		for i, k := range n.keys {
			m[k] = n.elems[i].written(ptr+"/"+pointerToken(k), holes)
		}
		return m
	case kArray:
		a := make([]any, len(n.elems))
		for i, e := range n.elems {
			a[i] = e.written(ptr+"/"+strconv.Itoa(i), holes)
		}
		return a
	case kExpr:
		holes[ptr] = "<<" + n.expr.text + ">>"
		return nil
	case kText:
		var b strings.Builder
		for _, p := range n.parts {
			b.WriteString(p.lit)
			if p.e != nil {
				b.WriteString("<<" + p.e.text + ">>")
			}
		}
		holes[ptr] = b.String()
		return nil
	}
	return n.val
}

// pointerToken escapes a key for a JSON Pointer (RFC 6901).
func pointerToken(k string) string {
	return strings.ReplaceAll(strings.ReplaceAll(k, "~", "~0"), "/", "~1")
}
