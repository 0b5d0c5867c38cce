// Package condition compiles and evaluates the conditions chains branch on:
// expr-lang expressions (`when`) and Acteon's field/operator/value form.
package condition

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/parser"
	"github.com/expr-lang/expr/vm"
)

// Env holds the names a condition can read: origin, steps, prev, run, chain,
// and, where they apply, result, item and item_index.
type Env map[string]any

// Condition is a compiled condition.
type Condition interface {
	Eval(env Env) (bool, error)
	// StepRefs lists the step names the condition reads through steps.NAME.
	StepRefs() []string
	String() string
}

// maxNodes bounds expression size so a pasted blob cannot blow up compile time.
const maxNodes = 2000

// Expr is a compiled expr-lang condition.
type Expr struct {
	src   string
	prog  *vm.Program
	steps []string
	paths []Path
}

// Path is a member chain a condition reads from one of its names, such as
// origin.payload.env: Root "origin", Segments ["payload", "env"]. It stops
// at the first segment that is not a constant name or index.
type Path struct {
	Root     string
	Segments []string
}

// String writes the path as a template would.
func (p Path) String() string {
	var b strings.Builder
	b.WriteString(p.Root)
	for _, s := range p.Segments {
		if _, err := strconv.Atoi(s); err == nil {
			b.WriteString("[" + s + "]")
		} else {
			b.WriteString("." + s)
		}
	}
	return b.String()
}

// CompileExpr compiles an expr-lang condition that may read the given
// top-level names. Step names with hyphens work in member chains
// (steps.slack-alert.body.ok); write subtraction with spaces (a - b).
func CompileExpr(src string, roots []string) (*Expr, error) {
	if strings.TrimSpace(src) == "" {
		return nil, errors.New("condition is empty")
	}
	rewritten := rewriteHyphens(src)
	tree, err := parser.Parse(rewritten)
	if err != nil {
		return nil, fmt.Errorf("parsing condition %q: %s", src, firstLine(err))
	}
	env := make(map[string]any, len(roots))
	for _, r := range roots {
		env[r] = map[string]any{}
	}
	if _, ok := env["item_index"]; ok {
		env["item_index"] = 0
	}
	prog, err := expr.Compile(rewritten, expr.Env(env), expr.AsBool(), expr.MaxNodes(maxNodes))
	if err != nil {
		return nil, fmt.Errorf("compiling condition %q: %s", src, firstLine(err))
	}
	v := &refVisitor{}
	ast.Walk(&tree.Node, v)
	return &Expr{src: src, prog: prog, steps: v.steps, paths: v.longest()}, nil
}

// Eval runs the condition. A condition that cannot be evaluated (for
// example comparing a missing value with a number) is an error, never a
// silent false, so a chain does not take a branch nobody meant.
func (e *Expr) Eval(env Env) (bool, error) {
	out, err := expr.Run(e.prog, map[string]any(env))
	if err != nil {
		return false, fmt.Errorf("evaluating condition %q: %s", e.src, firstLine(err))
	}
	b, ok := out.(bool)
	if !ok {
		return false, fmt.Errorf("evaluating condition %q: got %T, want a boolean", e.src, out)
	}
	return b, nil
}

func (e *Expr) StepRefs() []string { return e.steps }

// Paths lists the member chains the condition reads, longest first where
// one extends another, each once.
func (e *Expr) Paths() []Path  { return e.paths }
func (e *Expr) String() string { return e.src }

// firstLine drops expr's multi-line source excerpt; callers add their own
// position.
func firstLine(err error) string {
	msg := err.Error()
	if i := strings.IndexByte(msg, '\n'); i >= 0 {
		msg = msg[:i]
	}
	return msg
}

type refVisitor struct {
	steps []string
	paths []Path
}

func (v *refVisitor) Visit(node *ast.Node) {
	m, ok := (*node).(*ast.MemberNode)
	if !ok {
		return
	}
	if p, ok := memberPath(m); ok {
		v.paths = append(v.paths, p)
	}
	id, ok := m.Node.(*ast.IdentifierNode)
	if !ok || id.Value != "steps" {
		return
	}
	if s, ok := m.Property.(*ast.StringNode); ok {
		v.steps = append(v.steps, s.Value)
	}
}

// memberPath reads a member chain down to the identifier it starts from,
// keeping the constant names and indexes from the start.
func memberPath(m *ast.MemberNode) (Path, bool) {
	var segs []string
	var n ast.Node = m
	for {
		switch x := n.(type) {
		case *ast.MemberNode:
			switch p := x.Property.(type) {
			case *ast.StringNode:
				segs = append(segs, p.Value)
			case *ast.IntegerNode:
				segs = append(segs, strconv.Itoa(p.Value))
			default:
				// A computed key: what follows cannot be checked.
				segs = segs[:0]
			}
			n = x.Node
		case *ast.ChainNode:
			n = x.Node
		case *ast.IdentifierNode:
			slices.Reverse(segs)
			return Path{Root: x.Value, Segments: segs}, true
		default:
			return Path{}, false
		}
	}
}

// longest drops the paths that are the start of another, so a wrong name
// is reported once, and repeats.
func (v *refVisitor) longest() []Path {
	var out []Path
	for i, p := range v.paths {
		covered := false
		for j, q := range v.paths {
			if i != j && q.Root == p.Root && len(q.Segments) >= len(p.Segments) && slices.Equal(q.Segments[:len(p.Segments)], p.Segments) &&
				(len(q.Segments) > len(p.Segments) || j < i) {
				covered = true
				break
			}
		}
		if !covered {
			out = append(out, p)
		}
	}
	return out
}

// rewriteHyphens turns `.slack-alert` member segments into `["slack-alert"]`
// so names with hyphens read as keys, not subtraction. A segment is taken
// as hyphenated only when every hyphen sits between identifier characters
// and is followed by a letter, so `x.count-1` and `a - b` keep their meaning.
func rewriteHyphens(src string) string {
	var b strings.Builder
	changed := false
	for i := 0; i < len(src); {
		c := src[i]
		if c == '"' || c == '\'' || c == '`' {
			j := skipString(src, i)
			b.WriteString(src[i:j])
			i = j
			continue
		}
		if c == '.' && i+1 < len(src) && isIdentStart(src[i+1]) {
			j := i + 1
			for j < len(src) && isIdentByte(src[j]) {
				j++
			}
			end := j
			for end+1 < len(src) && src[end] == '-' && isLetter(src[end+1]) {
				k := end + 1
				for k < len(src) && isIdentByte(src[k]) {
					k++
				}
				end = k
			}
			if end > j {
				changed = true
				if i > 0 && src[i-1] == '?' {
					b.WriteByte('.') // optional chaining: a?.["b-c"]
				}
				b.WriteString(`["`)
				b.WriteString(src[i+1 : end])
				b.WriteString(`"]`)
				i = end
				continue
			}
			b.WriteString(src[i:j])
			i = j
			continue
		}
		b.WriteByte(c)
		i++
	}
	if !changed {
		return src
	}
	return b.String()
}

func skipString(src string, i int) int {
	q := src[i]
	for j := i + 1; j < len(src); j++ {
		switch src[j] {
		case '\\':
			if q != '`' {
				j++
			}
		case q:
			return j + 1
		}
	}
	return len(src)
}

func isLetter(c byte) bool     { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') }
func isIdentStart(c byte) bool { return isLetter(c) || c == '_' }
func isIdentByte(c byte) bool  { return isIdentStart(c) || (c >= '0' && c <= '9') }
