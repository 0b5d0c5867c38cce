package configschema_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/chaingate/gateway/providers/builtin"
	"github.com/chaingate/gateway/providers/configschema"
)

const schema = `{
  "type": "object",
  "additionalProperties": false,
  "required": ["url"],
  "properties": {
    "url": {"type": "string"},
    "token": {"type": "string", "x-secret": true},
    "retries": {"type": "integer", "minimum": 0},
    "headers": {"type": "object", "additionalProperties": {"type": "string", "x-secret": true}},
    "hosts": {"type": "array", "items": {"type": "object", "additionalProperties": false, "properties": {"name": {"type": "string"}}}}
  }
}`

func TestValidate(t *testing.T) {
	s, err := configschema.Compile(json.RawMessage(schema))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, config string
		want         []string
	}{
		{"valid", `{"url": "https://x", "retries": 2, "hosts": [{"name": "a"}]}`, nil},
		{"templates are strings", `{"url": "<<secrets.URL>>", "token": "<<secrets.T>>"}`, nil},
		{"missing required", `{}`, []string{`: missing property 'url'`}},
		{"absent table", ``, []string{`: missing property 'url'`}},
		{"wrong type", `{"url": "u", "retries": "3"}`, []string{`retries: got string, want integer`}},
		{"below minimum", `{"url": "u", "retries": -1}`, []string{`retries: minimum: got -1, want 0`}},
		{"unknown key", `{"url": "u", "tokn": "x"}`, []string{`tokn: unknown key: the provider's config schema does not allow it; it knows headers, hosts, retries, token, url`}},
		{"nested unknown key", `{"url": "u", "hosts": [{"name": "a"}, {"nme": "b"}]}`, []string{`hosts[1].nme: unknown key: the provider's config schema does not allow it; it knows name`}},
		{"quoted key", `{"url": "u", "headers": {"X Trace": 1}}`, []string{`headers["X Trace"]: got number, want string`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, p := range s.Validate(json.RawMessage(tc.config)) {
				got = append(got, p.Path+": "+p.Message)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("problems\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestSecrets(t *testing.T) {
	s, err := configschema.Compile(json.RawMessage(schema))
	if err != nil {
		t.Fatal(err)
	}
	got := s.Secrets(json.RawMessage(`{"url": "u", "token": "t", "headers": {"Authorization": "a", "X-Key": 1}, "hosts": [{"name": "n"}]}`))
	want := []configschema.Value{{"headers.Authorization", "a"}, {"headers.X-Key", 1.0}, {"token", "t"}}
	if !slices.Equal(got, want) {
		t.Errorf("Secrets = %v, want %v", got, want)
	}
}

func TestCompileErrors(t *testing.T) {
	for _, tc := range []struct{ schema, want string }{
		{`{"type": `, "decoding the config schema"},
		{`{"type": "objekt"}`, "compiling the config schema"},
	} {
		if _, err := configschema.Compile(json.RawMessage(tc.schema)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Compile(%s) = %v, want an error containing %q", tc.schema, err, tc.want)
		}
	}
}

// TestBuiltinSchemasCompile guards every built-in provider's schema, which
// validate and the loader compile for every config that uses it.
func TestBuiltinSchemasCompile(t *testing.T) {
	for _, typ := range builtin.Types() {
		p, _ := builtin.New(typ)
		info, err := p.Describe(t.Context())
		if err != nil {
			t.Fatalf("%s: Describe: %v", typ, err)
		}
		if len(info.ConfigSchema) == 0 {
			continue
		}
		if _, err := configschema.Compile(info.ConfigSchema); err != nil {
			t.Errorf("%s: %v", typ, err)
		}
	}
}
