package loader

import (
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	"github.com/chaingate/gateway/chain"
)

func TestScanPositions(t *testing.T) {
	src := `# comment
[gateway]
listen = "x"   # trailing

[[chains]]
name = "a"
"quoted key" = 1
dotted.key = { inner = [1, { deep = "v" }], 'lit' = """
multi
line""" }

[[chains.steps]]
name = "s1"
payload_template = { text = "a\"b", n = 1979-05-27 07:32:00Z }

[[chains.steps]]
name = "s2"
[chains.steps.parallel]
join = "all"
[[chains.steps.parallel.steps]]
name = "p1"

[[chains]]
name = "b"
[[chains.steps]]
name = "t1"
payload_template = { "é" = "ü", "\u00e9x" = ["ä", "ö"], z = 1 }
`
	pos := scanPositionsStrict(src)
	tests := map[string]chain.Position{
		"gateway":                                {Line: 2, Col: 1},
		"gateway.listen":                         {Line: 3, Col: 1},
		"chains.0":                               {Line: 5, Col: 1},
		"chains.0.name":                          {Line: 6, Col: 1},
		"chains.0.quoted key":                    {Line: 7, Col: 1},
		"chains.0.dotted.key.inner":              {Line: 8, Col: 16},
		"chains.0.dotted.key.inner.1.deep":       {Line: 8, Col: 30},
		"chains.0.dotted.key.lit":                {Line: 8, Col: 45},
		"chains.0.steps.0.name":                  {Line: 13, Col: 1},
		"chains.0.steps.0.payload_template.n":    {Line: 14, Col: 37},
		"chains.0.steps.1.parallel.join":         {Line: 19, Col: 1},
		"chains.0.steps.1.parallel.steps.0.name": {Line: 21, Col: 1},
		"chains.1.name":                          {Line: 24, Col: 1},
		"chains.1.steps.0":                       {Line: 25, Col: 1},
		"chains.1.steps.0.name":                  {Line: 26, Col: 1},
		// Columns count characters, not bytes.
		"chains.1.steps.0.payload_template.é":    {Line: 27, Col: 22},
		"chains.1.steps.0.payload_template.éx.1": {Line: 27, Col: 51},
		"chains.1.steps.0.payload_template.z":    {Line: 27, Col: 57},
	}
	for path, want := range tests {
		got, ok := pos[chain.PosKey(strings.Split(path, "."))]
		if strings.Contains(path, "quoted key") {
			got, ok = pos[chain.PosKey([]string{"chains", "0", "quoted key"})]
		}
		if !ok || got != want {
			t.Errorf("%s: got %v (found %v), want %v", path, got, ok, want)
		}
	}
}

// TestScanPositionsImplicitTable: a table defined only by its sub-table's
// header is placed at that header.
func TestScanPositionsImplicitTable(t *testing.T) {
	pos := scanPositionsStrict("# auth only\n[gateway.auth]\ntokens = []\n")
	if got := pos[chain.PosKey([]string{"gateway"})]; got != (chain.Position{Line: 2, Col: 1}) {
		t.Errorf("gateway at %v, want 2:1", got)
	}
}

// FuzzScanPositions runs the scanner without its safety net on every input
// the TOML decoder accepts.
func FuzzScanPositions(f *testing.F) {
	f.Add("a = 1\n[b]\nc = 'x'\n[[d]]\ne = [1, {f = 2}]\n")
	f.Add("k = \"\"\"\n\\\"\"\"\"\n")
	f.Add("[a.'b c'.\"d\"]\nx = '''y'''")
	f.Fuzz(func(t *testing.T, src string) {
		var v map[string]any
		if _, err := toml.Decode(src, &v); err != nil {
			return
		}
		lines := strings.Count(src, "\n") + 1
		for k, p := range scanPositionsStrict(src) {
			if p.Line < 1 || p.Line > lines || p.Col < 1 {
				t.Fatalf("%q at %v, outside the input", k, p)
			}
		}
	})
}
