// Package commandtest holds what the exec and ssh providers' tests share:
// the commands their docs declare, and values to attack them with.
package commandtest

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

// Hostile are the values an attacker puts in an alert, each trying to
// create marker.
func Hostile(marker string) []string {
	return []string{
		"$(touch " + marker + ")", "; touch " + marker + " #", "`touch " + marker + "`", "-delete", "--help", "../..",
		"/var/log/../../" + strings.TrimPrefix(marker, "/"), "a\ntouch " + marker, strings.Repeat("x", 100<<10),
		"/var/log/$(touch " + marker + ")", "chaingate-docs-test", "a[$(touch " + marker + ")]",
	}
}

// Harmless is a value an argument's declaration takes, for the arguments
// not under test.
func Harmless(decl any) any {
	d, _ := decl.(map[string]any)
	switch d["type"] {
	case "integer":
		if min, ok := d["min"].(float64); ok {
			return min
		}
		return 1
	case "boolean":
		return false
	case "path":
		roots, _ := d["roots"].([]any)
		return strings.TrimSuffix(roots[0].(string), "/") + "/chaingate-docs-test"
	case "hostname":
		return "localhost"
	}
	if enum, ok := d["enum"].([]any); ok && len(enum) > 0 {
		return enum[0]
	}
	return "chaingate-docs-test"
}

// tomlBlock is a fenced TOML example; its closing fence starts a line.
var tomlBlock = regexp.MustCompile("(?s)```toml\n(.*?\n)```")

// DocsCommands are the commands the TOML examples of a doc declare for
// providers of type typ, as the gateway hands them over (through JSON).
func DocsCommands(t *testing.T, doc, typ string) map[string]map[string]any {
	t.Helper()
	text, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]any{}
	for _, m := range tomlBlock.FindAllStringSubmatch(string(text), -1) {
		var cfg struct {
			Providers []struct {
				Type   string         `toml:"type"`
				Config map[string]any `toml:"config"`
			} `toml:"providers"`
		}
		if _, err := toml.Decode(m[1], &cfg); err != nil {
			t.Fatalf("an example of %s is not TOML: %v\n%s", doc, err, m[1])
		}
		for _, p := range cfg.Providers {
			if p.Type != typ {
				continue
			}
			cmds, _ := p.Config["commands"].(map[string]any)
			for name, c := range cmds {
				raw, _ := json.Marshal(c)
				var cmd map[string]any
				_ = json.Unmarshal(raw, &cmd)
				out[name] = cmd
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s declares no %s command", doc, typ)
	}
	return out
}

// Calls are, for each declared command that takes arguments, a payload's
// args for each argument given each hostile value, the others harmless.
func Calls(cmds map[string]map[string]any, marker string) []Call {
	var out []Call
	for name, cmd := range cmds {
		args, _ := cmd["args"].(map[string]any)
		for arg := range args {
			for _, v := range Hostile(marker) {
				given := map[string]any{arg: v}
				for other, decl := range args {
					if other != arg {
						given[other] = Harmless(decl)
					}
				}
				out = append(out, Call{Command: name, Arg: arg, Value: v, Args: given})
			}
		}
	}
	return out
}

// Call is one call of a documented command with a hostile value.
type Call struct {
	Command, Arg, Value string
	Args                map[string]any
}
