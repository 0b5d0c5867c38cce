package server_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestMetricsDocumented: the metrics tables of operations.md and api.md
// name every metric the gateway registers, and no other.
func TestMetricsDocumented(t *testing.T) {
	registered := registeredMetrics(t)
	if len(registered) < 20 {
		t.Fatalf("found %d metrics in the gateway's code: %v", len(registered), registered)
	}
	for _, doc := range []struct{ file, section string }{
		{"../../docs/operations.md", "## Metrics"},
		{"../../docs/api.md", "### GET /metrics"},
	} {
		documented := documentedMetrics(t, doc.file, doc.section)
		for _, name := range registered {
			if !slices.Contains(documented, name) {
				t.Errorf("%s: the table under %q lacks %s", doc.file, doc.section, name)
			}
		}
		for _, name := range documented {
			if !slices.Contains(registered, name) {
				t.Errorf("%s: the table under %q names %s, which the gateway does not register", doc.file, doc.section, name)
			}
		}
	}
}

// registeredMetrics reads the names of the metrics the gateway's code
// registers: a prometheus options literal's Name, and the first argument
// of Metrics.gauge, which registers one read when scraped.
func registeredMetrics(t *testing.T) []string {
	t.Helper()
	fset := token.NewFileSet()
	var files []*ast.File
	// Every package of the gateway's service side, wherever a metric is
	// registered.
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		files = append(files, f)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	add := func(e ast.Expr) {
		if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.STRING {
			if s, err := strconv.Unquote(lit.Value); err == nil && strings.HasPrefix(s, "chaingate_") {
				names[s] = true
			}
		}
	}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.KeyValueExpr:
				if id, ok := x.Key.(*ast.Ident); ok && id.Name == "Name" {
					add(x.Value)
				}
			case *ast.CallExpr:
				if sel, ok := x.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "gauge" && len(x.Args) > 0 {
					add(x.Args[0])
				}
			}
			return true
		})
	}
	return slices.Sorted(maps.Keys(names))
}

var metricCell = regexp.MustCompile("`(chaingate_[a-z_]+)`")

// documentedMetrics reads the metrics a markdown table names in its first
// column, in the section that starts with the heading line.
func documentedMetrics(t *testing.T, file, heading string) []string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	level := strings.Index(heading, " ")
	_, section, ok := strings.Cut(string(data), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("%s has no heading %q", file, heading)
	}
	var out []string
	for line := range strings.Lines(section) {
		if hashes := len(line) - len(strings.TrimLeft(line, "#")); hashes > 0 && hashes <= level && strings.HasPrefix(line[hashes:], " ") {
			break // the next section at this level or above
		}
		if !strings.HasPrefix(line, "| `chaingate_") {
			continue
		}
		first, _, _ := strings.Cut(strings.TrimPrefix(line, "|"), "|")
		for _, m := range metricCell.FindAllStringSubmatch(first, -1) {
			out = append(out, m[1])
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s: no metrics table under %q", file, heading)
	}
	return out
}
