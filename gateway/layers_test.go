package gateway_test

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// layers are the packages of gateway/ by layer, as docs/architecture.md
// draws them: a package imports only packages of lower layers.
var layers = map[string]int{
	"gateway": 0, "gateway/api": 0, "gateway/authz": 0, "gateway/signin": 0,
	"gateway/door": 1, "gateway/upkeep": 1, "gateway/metrics": 1, "gateway/events": 1, "gateway/audit": 1,
	"gateway/ops": 2, "gateway/schedules": 2, "gateway/approvals": 2, "gateway/local": 2,
	"gateway/server":  3,
	"gateway/console": 4, "gateway/chaintest": 4,
}

const module = "github.com/chaingate/gateway/"

// TestImportsPointDown reads the imports of every package under gateway/
// and refuses one that runs sideways or back up between the layers, and a
// package the table does not place.
func TestImportsPointDown(t *testing.T) {
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() || path == "testdata" || strings.Contains(path, "testdata") || strings.Contains(path, "/ui") {
			return err
		}
		files, _ := filepath.Glob(filepath.Join(path, "*.go"))
		pkg := filepath.ToSlash(filepath.Join("gateway", path))
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			layer, known := layers[pkg]
			if !known && !strings.Contains(pkg, "/internal") {
				t.Errorf("%s is not placed in a layer", pkg)
				return nil
			}
			af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
			if err != nil {
				return err
			}
			for _, imp := range af.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				dep, ok := strings.CutPrefix(p, module)
				if !ok || (dep != "gateway" && !strings.HasPrefix(dep, "gateway/")) {
					continue
				}
				if l, placed := layers[dep]; placed && known && l >= layer {
					t.Errorf("%s (layer %d) imports %s (layer %d): imports point down only", f, layer, dep, l)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
