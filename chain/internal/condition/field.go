package condition

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
)

// Operator is an Acteon-style comparison.
type Operator string

const (
	OpEq       Operator = "eq"
	OpNeq      Operator = "neq"
	OpContains Operator = "contains"
	OpExists   Operator = "exists"
	OpGt       Operator = "gt"
	OpLt       Operator = "lt"
	OpGte      Operator = "gte"
	OpLte      Operator = "lte"
)

// Operators lists every operator in the order documentation shows them.
var Operators = []Operator{OpEq, OpNeq, OpContains, OpExists, OpGt, OpLt, OpGte, OpLte}

// resultFields are the parts of a step result a field condition may read.
var resultFields = map[string]bool{"body": true, "status": true, "error": true, "attempts": true}

// Field is Acteon's field/operator/value condition on a step's own result,
// e.g. field = "body.severity", operator = "eq", value = "critical".
type Field struct {
	field string
	path  []string
	op    Operator
	value any
}

// FieldError is a field condition that does not compile; Key says which of
// its keys is wrong: "field", "operator" or "value".
type FieldError struct {
	Key string
	Msg string
}

func (e *FieldError) Error() string { return e.Msg }

func fieldError(key, format string, args ...any) error {
	return &FieldError{Key: key, Msg: fmt.Sprintf(format, args...)}
}

// CompileField checks and compiles a field condition. value may be nil only
// for exists, where it defaults to true. Its errors are *FieldError.
func CompileField(field, op string, value any) (*Field, error) {
	path, err := ParsePath(field)
	if err != nil {
		return nil, fieldError("field", "field %q: %v", field, err)
	}
	if !resultFields[path[0]] {
		return nil, fieldError("field", "field %q must start with body, status, error or attempts", field)
	}
	o := Operator(op)
	switch o {
	case OpEq, OpNeq, OpContains, OpGt, OpLt, OpGte, OpLte:
		if value == nil {
			return nil, fieldError("operator", "operator %q needs a value", op)
		}
	case OpExists:
		if value == nil {
			value = true
		}
		if _, ok := value.(bool); !ok {
			return nil, fieldError("value", "operator exists takes value = true or false, not %v", value)
		}
	default:
		return nil, fieldError("operator", "unknown operator %q%s (want one of %s)", op, nearestOp(op), joinOps())
	}
	if o == OpGt || o == OpLt || o == OpGte || o == OpLte {
		if _, ok := toFloat(value); !ok {
			if _, ok := value.(string); !ok {
				return nil, fieldError("value", "operator %q compares numbers or strings, not %T", op, value)
			}
		}
	}
	return &Field{field: field, path: path, op: o, value: value}, nil
}

// opAliases are what other tools and languages call the operators.
var opAliases = map[string]Operator{
	"==": OpEq, "=": OpEq, "equals": OpEq, "equal": OpEq, "is": OpEq,
	"!=": OpNeq, "ne": OpNeq, "not_equals": OpNeq, "not_eq": OpNeq,
	">": OpGt, "<": OpLt, ">=": OpGte, "<=": OpLte, "ge": OpGte, "le": OpLte,
	"in": OpContains, "includes": OpContains, "has": OpContains, "exist": OpExists,
}

// nearestOp suggests the operator a misspelt or foreign one means.
func nearestOp(op string) string {
	if o, ok := opAliases[strings.ToLower(op)]; ok {
		return fmt.Sprintf(" (did you mean %q?)", o)
	}
	for _, o := range Operators {
		if strings.EqualFold(op, string(o)) {
			return fmt.Sprintf(" (did you mean %q?)", o)
		}
	}
	return ""
}

func joinOps() string {
	s := make([]string, len(Operators))
	for i, o := range Operators {
		s[i] = string(o)
	}
	return strings.Join(s, " ")
}

// Eval evaluates the condition against env["result"]. A field that is not
// there makes every operator false except exists = false.
func (f *Field) Eval(env Env) (bool, error) {
	v, found := Lookup(env["result"], f.path)
	if f.op == OpExists {
		return found == f.value.(bool), nil
	}
	if !found {
		return false, nil
	}
	switch f.op {
	case OpEq:
		return Equal(v, f.value), nil
	case OpNeq:
		return !Equal(v, f.value), nil
	case OpContains:
		return contains(v, f.value), nil
	}
	c, err := compare(v, f.value)
	if err != nil {
		return false, fmt.Errorf("evaluating %s %s %v: %w", f.field, f.op, f.value, err)
	}
	switch f.op {
	case OpGt:
		return c > 0, nil
	case OpLt:
		return c < 0, nil
	case OpGte:
		return c >= 0, nil
	default:
		return c <= 0, nil
	}
}

func (f *Field) StepRefs() []string { return nil }
func (f *Field) String() string {
	if f.op == OpExists {
		return fmt.Sprintf("%s exists %v", f.field, f.value)
	}
	return fmt.Sprintf("%s %s %v", f.field, f.op, f.value)
}

// ParsePath splits "body.items[0].name" or "body.items.0.name" into segments.
func ParsePath(p string) ([]string, error) {
	if p == "" {
		return nil, fmt.Errorf("empty path")
	}
	var out []string
	for _, part := range strings.Split(p, ".") {
		name, rest, bracket := strings.Cut(part, "[")
		if name == "" && len(out) == 0 {
			return nil, fmt.Errorf("path starts with an index")
		}
		if name != "" {
			out = append(out, name)
		} else if !bracket {
			return nil, fmt.Errorf("empty segment")
		}
		if bracket && rest == "" {
			return nil, fmt.Errorf("unclosed [")
		}
		for rest != "" {
			idx, after, ok := strings.Cut(rest, "]")
			if !ok {
				return nil, fmt.Errorf("unclosed [")
			}
			if _, err := strconv.Atoi(idx); err != nil {
				return nil, fmt.Errorf("index %q is not a number", idx)
			}
			out = append(out, idx)
			if after == "" {
				break
			}
			if after[0] != '[' {
				return nil, fmt.Errorf("unexpected %q after ]", after)
			}
			rest = after[1:]
		}
	}
	return out, nil
}

// Lookup walks maps by key and arrays by index.
func Lookup(v any, path []string) (any, bool) {
	for _, seg := range path {
		switch t := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = t[seg]; !ok {
				return nil, false
			}
		case []any:
			i, err := strconv.Atoi(seg)
			if err != nil || i < 0 || i >= len(t) {
				return nil, false
			}
			v = t[i]
		default:
			return nil, false
		}
	}
	return v, true
}

// Equal compares JSON-like values, treating numbers of any Go type alike.
func Equal(a, b any) bool {
	if fa, ok := toFloat(a); ok {
		fb, ok := toFloat(b)
		return ok && fa == fb
	}
	return reflect.DeepEqual(normalize(a), normalize(b))
}

// normalize gives TOML-decoded and JSON-decoded values one shape.
func normalize(v any) any {
	switch t := v.(type) {
	case []map[string]any:
		out := make([]any, len(t))
		for i, m := range t {
			out[i] = normalize(m)
		}
		return out
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			out[i] = normalize(e)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			out[k] = normalize(e)
		}
		return out
	}
	if f, ok := toFloat(v); ok {
		return f
	}
	return v
}

func contains(v, want any) bool {
	switch t := v.(type) {
	case string:
		s, ok := want.(string)
		return ok && strings.Contains(t, s)
	case []any:
		for _, e := range t {
			if Equal(e, want) {
				return true
			}
		}
	case map[string]any:
		s, ok := want.(string)
		if ok {
			_, has := t[s]
			return has
		}
	}
	return false
}

func compare(a, b any) (int, error) {
	if fa, ok := toFloat(a); ok {
		fb, ok := toFloat(b)
		if !ok {
			return 0, fmt.Errorf("cannot compare a number with %T", b)
		}
		switch {
		case fa < fb:
			return -1, nil
		case fa > fb:
			return 1, nil
		}
		return 0, nil
	}
	sa, ok := a.(string)
	if !ok {
		return 0, fmt.Errorf("cannot order a value of type %s", typeName(a))
	}
	sb, ok := b.(string)
	if !ok {
		return 0, fmt.Errorf("cannot compare a string with %T", b)
	}
	return strings.Compare(sa, sb), nil
}

func toFloat(v any) (float64, bool) {
	switch n := v.(type) {
	case float64:
		return n, true
	case float32:
		return float64(n), true
	case int:
		return float64(n), true
	case int64:
		return float64(n), true
	case int32:
		return float64(n), true
	case uint64:
		return float64(n), true
	case json.Number:
		f, err := n.Float64()
		return f, err == nil
	}
	return 0, false
}

func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case bool:
		return "boolean"
	}
	return fmt.Sprintf("%T", v)
}
