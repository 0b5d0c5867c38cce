package loader_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/loader"
)

const inputChains = `
[[providers]]
name = "p"
type = "echo"

[[chains]]
name = "fields"
[chains.input]
required = ["alert_name", "host"]
optional = ["severity"]
[[chains.steps]]
name = "s"
provider = "p"

[[chains]]
name = "schema"
[chains.input.schema]
type = "object"
required = ["alert"]
additionalProperties = false
properties = { alert = { type = "string", minLength = 1 }, hosts = { type = "array", items = { type = "string" } } }
[[chains.steps]]
name = "s"
provider = "p"

[[chains]]
name = "file"
[chains.input]
schema_file = "alert.schema.json"
[[chains.steps]]
name = "s"
provider = "p"
payload_template = { n = "<<origin.payload.labels.team>>" }

[[chains]]
name = "open"
[[chains.steps]]
name = "s"
provider = "p"
`

// TestInputCheck checks payloads against each form of declared input; each
// problem names its field.
func TestInputCheck(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "alert.schema.json"), []byte(`{"type": "object", "required": ["labels"], "properties": {"labels": {"type": "object", "properties": {"team": {"type": "string"}}}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "chains.toml")
	if err := os.WriteFile(path, []byte(inputChains), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := loader.Load([]string{path}, loadOpts)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		chain, payload string
		want           []string // "" for no error
	}{
		{"fields", `{"alert_name": "disk-full", "host": "db-1"}`, nil},
		{"fields", `{"alert_name": "disk-full", "host": "db-1", "extra": 1}`, nil},
		{"fields", `{"alert_name": "disk-full"}`, []string{"host: required field is missing"}},
		{"fields", `{"alert_name": null, "host": "db-1"}`, []string{"alert_name: required field is missing"}},
		{"fields", `[1, 2]`, []string{"payload: must be a JSON object with the fields alert_name, host, severity"}},
		{"fields", `null`, []string{"payload: must be a JSON object"}},
		{"schema", `{"alert": "disk-full", "hosts": ["db-1"]}`, nil},
		{"schema", `{"alert": ""}`, []string{"alert: minLength"}},
		{"schema", `{"hosts": [1]}`, []string{"payload: missing property 'alert'", "hosts[0]: got number, want string"}},
		{"schema", `{"alert": "x", "host": "db-1"}`, []string{"host: unknown key"}},
		{"file", `{"labels": {"team": "db"}}`, nil},
		{"file", `{"labels": {"team": 7}}`, []string{"labels.team: got number, want string"}},
		{"open", `"anything"`, nil},
	}
	for _, tc := range tests {
		c := cfg.Chains[tc.chain]
		err := c.Input.Check(c.Name, json.RawMessage(tc.payload))
		if len(tc.want) == 0 {
			if err != nil {
				t.Errorf("%s %s: %v", tc.chain, tc.payload, err)
			}
			continue
		}
		var ie *chain.InputError
		if !errors.As(err, &ie) || ie.Chain != tc.chain {
			t.Errorf("%s %s: error %v is not an InputError of the chain", tc.chain, tc.payload, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s %s: %v\nwant it to say %q", tc.chain, tc.payload, err, w)
			}
		}
	}
}

// TestStoredDefinitionSkipsInput: a run stored its definition when it
// started, input included; loading it back to resume does not read the
// schema file again, which may have moved since.
func TestStoredDefinitionSkipsInput(t *testing.T) {
	cfg, err := loader.LoadBytes("stored", []byte(`
[[providers]]
name = "p"
type = "echo"
[[chains]]
name = "c"
[chains.input]
schema_file = "/nowhere/gone.json"
[[chains.steps]]
name = "s"
provider = "p"
payload_template = { x = "<<origin.payload.anything>>" }
`), storedOpts)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Chains["c"].Input != nil {
		t.Error("a stored definition kept an input to check")
	}
}
