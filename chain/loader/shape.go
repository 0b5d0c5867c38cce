package loader

import (
	"fmt"
	"strconv"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/internal/condition"
	"github.com/chaingate/gateway/templates"
)

// Every template and condition in a config is checked by checkRefs against
// the shapes of the names it may read, so a path that can never resolve is
// a config error rather than a run that fails, or quietly does nothing
// (a step with on_failure = "skip", a trigger's when that skips every
// alert), at run time.

type shapeKind uint8

const (
	kindScalar  shapeKind = iota + 1
	kindObject            // known fields
	kindMap               // any key, each value of one shape
	kindArray             // indexed elements of one shape
	kindLookup            // fields found by a function: steps by name
	kindChecked           // the rest of the path checked by a function
	kindUnset             // a name that is not set where it is read
)

// shape is what a value is known to hold. A nil *shape is free-form:
// anything goes below it.
type shape struct {
	kind shapeKind
	// scalar names a value without fields: "a string", "a number".
	scalar string
	// fields are an object's, in the order messages list them.
	fields []field
	// elem is each value of a map, each element of an array.
	elem *shape
	// lookup returns the shape of a field, or why there is none.
	lookup func(name string) (*shape, string)
	// check says what is wrong with the rest of a path, or "".
	check func(path []string) string
	// why a name is not set.
	why string
	// desc names the value in messages where its path would not say
	// enough: `the body of approval step "ask"`.
	desc string
}

type field struct {
	name  string
	shape *shape
}

var (
	aString  = &shape{kind: kindScalar, scalar: "a string"}
	aNumber  = &shape{kind: kindScalar, scalar: "a number"}
	aBoolean = &shape{kind: kindScalar, scalar: "a boolean"}
	// stringMap is labels, annotations, headers: any name, string values.
	stringMap = mapOf(aString)
)

func object(fields ...field) *shape { return &shape{kind: kindObject, fields: fields} }
func mapOf(elem *shape) *shape      { return &shape{kind: kindMap, elem: elem} }
func arrayOf(elem *shape) *shape    { return &shape{kind: kindArray, elem: elem} }
func unset(format string, args ...any) *shape {
	return &shape{kind: kindUnset, why: fmt.Sprintf(format, args...)}
}

func lookupShape(fn func(name string) (*shape, string)) *shape {
	return &shape{kind: kindLookup, lookup: fn}
}

func (s *shape) fieldNames() []string {
	names := make([]string, len(s.fields))
	for i, f := range s.fields {
		names[i] = f.name
	}
	return names
}

// problem says what is wrong with reading path below a value of shape s,
// which messages call what; "" when the path may resolve.
func (s *shape) problem(what string, path []string) string {
	if s != nil && s.kind == kindUnset {
		return s.why
	}
	for i, seg := range path {
		if s == nil {
			return ""
		}
		name := what
		if s.desc != "" {
			name = s.desc
		}
		switch s.kind {
		case kindScalar:
			return fmt.Sprintf("%s is %s; it has no field %q", name, s.scalar, seg)
		case kindObject:
			var next *shape
			found := false
			for _, f := range s.fields {
				if f.name == seg {
					next, found = f.shape, true
					break
				}
			}
			if !found {
				return fmt.Sprintf("%s has no field %q%s", name, seg, didYouMean(seg, s.fieldNames(), "fields"))
			}
			s = next
		case kindMap:
			s = s.elem
		case kindArray:
			if _, err := strconv.Atoi(seg); err != nil {
				return fmt.Sprintf("%s is an array; it has no field %q (read an element as %s[0])", name, seg, what)
			}
			s = s.elem
		case kindLookup:
			next, msg := s.lookup(seg)
			if msg != "" {
				return msg
			}
			s = next
		case kindChecked:
			return s.check(path[i:])
		}
		what = appendSegment(what, seg)
	}
	return ""
}

// appendSegment writes a path one segment longer, indexes as [N].
func appendSegment(what, seg string) string {
	if _, err := strconv.Atoi(seg); err == nil {
		return what + "[" + seg + "]"
	}
	return what + "." + seg
}

// roots are the shapes of the names a template or condition may read.
// A name left out is not checked: compiling refused it already.
type roots map[string]*shape

// ref is one path a template or condition reads.
type ref struct {
	root string
	path []string
	// text is the path as messages show it: <<...>> in a template.
	text string
	// key is where the string holding the path sits below the key the
	// template was written at; empty for a condition.
	key string
}

func templateRefs(tpl *templates.Template) []ref {
	var out []ref
	for _, r := range tpl.Refs() {
		out = append(out, ref{root: r.Root, path: r.Path, text: "<<" + r.Text + ">>", key: r.Key})
	}
	return out
}

func conditionRefs(e *condition.Expr) []ref {
	var out []ref
	for _, p := range e.Paths() {
		out = append(out, ref{root: p.Root, path: p.Segments, text: p.String()})
	}
	return out
}

// checkRefs reports every ref that can never resolve under rs, at the key
// holding it below at.
func (d *fileDecoder) checkRefs(at chain.KeyPath, rs roots, refs []ref) {
	for _, r := range refs {
		s, ok := rs[r.root]
		if !ok {
			continue
		}
		if msg := s.problem(r.root, r.path); msg != "" {
			d.errorf(at.Sub(r.key), "%s: %s", r.text, msg)
		}
	}
}
