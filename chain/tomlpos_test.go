package chain

import (
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
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
	tests := map[string]position{
		"gateway":                                {2, 1},
		"gateway.listen":                         {3, 1},
		"chains.0":                               {5, 1},
		"chains.0.name":                          {6, 1},
		"chains.0.quoted key":                    {7, 1},
		"chains.0.dotted.key.inner":              {8, 16},
		"chains.0.dotted.key.inner.1.deep":       {8, 30},
		"chains.0.dotted.key.lit":                {8, 45},
		"chains.0.steps.0.name":                  {13, 1},
		"chains.0.steps.0.payload_template.n":    {14, 37},
		"chains.0.steps.1.parallel.join":         {19, 1},
		"chains.0.steps.1.parallel.steps.0.name": {21, 1},
		"chains.1.name":                          {24, 1},
		"chains.1.steps.0":                       {25, 1},
		"chains.1.steps.0.name":                  {26, 1},
		// Columns count characters, not bytes.
		"chains.1.steps.0.payload_template.é":    {27, 22},
		"chains.1.steps.0.payload_template.éx.1": {27, 51},
		"chains.1.steps.0.payload_template.z":    {27, 57},
	}
	for path, want := range tests {
		got, ok := pos[strings.ReplaceAll(path, ".", pathSep)]
		if strings.Contains(path, "quoted key") {
			got, ok = pos[strings.Join([]string{"chains", "0", "quoted key"}, pathSep)]
		}
		if !ok || got != want {
			t.Errorf("%s: got %v (found %v), want %v", path, got, ok, want)
		}
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
			if p.line < 1 || p.line > lines || p.col < 1 {
				t.Fatalf("%q at %v, outside the input", k, p)
			}
		}
	})
}
