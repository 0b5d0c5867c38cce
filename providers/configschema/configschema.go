// Package configschema checks a provider's [providers.config] table against
// the JSON Schema the provider declares in Describe, so that a config the
// provider would refuse fails when it is loaded rather than on a step's
// first call.
//
// Beyond JSON Schema, a property with "x-secret": true marks a credential:
// the gateway requires its value to come from <<secrets.NAME>>, never to be
// written into a config file.
//
// It is the gateway's own package, with no compatibility promise.
package configschema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// SecretKeyword marks a property whose value is a credential.
const SecretKeyword = "x-secret"

// Schema is a compiled config schema.
type Schema struct {
	compiled *jsonschema.Schema
	doc      any // the schema as decoded JSON, for x-secret and key hints
}

// Problem is one way a config breaks its schema.
type Problem struct {
	// Path is where, relative to the config table, written as template
	// errors write keys ("base_url", "headers.Authorization", "hosts[0]");
	// empty for the table itself.
	Path    string
	Message string
}

// resourceURL names the schema while it compiles; a provider's schema is
// self-contained, so nothing else is ever loaded.
const resourceURL = "mem:///config-schema.json"

// Compile compiles a provider's schema.
func Compile(raw json.RawMessage) (*Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("decoding the config schema: %w", err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource(resourceURL, doc); err != nil {
		return nil, fmt.Errorf("compiling the config schema: %w", err)
	}
	compiled, err := c.Compile(resourceURL)
	if err != nil {
		return nil, fmt.Errorf("compiling the config schema: %w", err)
	}
	return &Schema{compiled: compiled, doc: doc}, nil
}

var printer = message.NewPrinter(language.English)

// Validate checks a config, given as JSON (an absent table is {}), and
// returns every problem, ordered by path.
func (s *Schema) Validate(config json.RawMessage) []Problem {
	if len(bytes.TrimSpace(config)) == 0 {
		config = json.RawMessage("{}")
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(config))
	if err != nil {
		return []Problem{{Message: fmt.Sprintf("decoding the config: %v", err)}}
	}
	err = s.compiled.Validate(inst)
	if err == nil {
		return nil
	}
	ve, ok := err.(*jsonschema.ValidationError)
	if !ok {
		return []Problem{{Message: err.Error()}}
	}
	var out []Problem
	s.collect(ve, inst, &out)
	slices.SortStableFunc(out, func(a, b Problem) int { return strings.Compare(a.Path, b.Path) })
	return slices.Compact(out)
}

// collect appends the leaves of a validation error tree: the causes say
// what is wrong, the nodes above them only that something below is.
func (s *Schema) collect(ve *jsonschema.ValidationError, inst any, out *[]Problem) {
	if len(ve.Causes) > 0 {
		for _, c := range ve.Causes {
			s.collect(c, inst, out)
		}
		return
	}
	path := keyPath(inst, ve.InstanceLocation)
	if ap, ok := ve.ErrorKind.(*kind.AdditionalProperties); ok {
		// Pointed at the key itself, with the keys the provider knows.
		hint := ""
		if known := propertyNames(subschema(s.doc, inst, ve.InstanceLocation)); len(known) > 0 {
			hint = "; it knows " + strings.Join(known, ", ")
		}
		for _, p := range ap.Properties {
			*out = append(*out, Problem{Path: joinKey(path, p), Message: "unknown key: the provider's config schema does not allow it" + hint})
		}
		return
	}
	*out = append(*out, Problem{Path: path, Message: ve.ErrorKind.LocalizedString(printer)})
}

// Value is one value of a config.
type Value struct {
	// Path is where, relative to the config table, as in Problem.
	Path  string
	Value any
}

// Secrets returns the values in config (JSON) that the schema marks with
// SecretKeyword, ordered by path.
func (s *Schema) Secrets(config json.RawMessage) []Value {
	var inst any
	if err := json.Unmarshal(config, &inst); err != nil {
		return nil
	}
	var out []Value
	walkSecrets(s.doc, inst, "", &out)
	return out
}

func walkSecrets(sch, v any, path string, out *[]Value) {
	m, ok := sch.(map[string]any)
	if !ok {
		return
	}
	if secret, _ := m[SecretKeyword].(bool); secret && v != nil {
		*out = append(*out, Value{Path: path, Value: v})
		return
	}
	switch x := v.(type) {
	case map[string]any:
		for _, k := range sortedKeys(x) {
			walkSecrets(propertySchema(m, k), x[k], joinKey(path, k), out)
		}
	case []any:
		for i, e := range x {
			walkSecrets(m["items"], e, path+"["+strconv.Itoa(i)+"]", out)
		}
	}
}

// propertySchema is the schema that applies to key k of an object.
func propertySchema(m map[string]any, k string) any {
	if props, ok := m["properties"].(map[string]any); ok {
		if p, ok := props[k]; ok {
			return p
		}
	}
	return m["additionalProperties"]
}

// subschema follows an instance location down the schema through
// properties, additionalProperties and items; nil where it cannot.
func subschema(sch, inst any, loc []string) any {
	for _, tok := range loc {
		m, ok := sch.(map[string]any)
		if !ok {
			return nil
		}
		switch x := inst.(type) {
		case map[string]any:
			sch, inst = propertySchema(m, tok), x[tok]
		case []any:
			i, _ := strconv.Atoi(tok)
			sch = m["items"]
			if i >= 0 && i < len(x) {
				inst = x[i]
			}
		default:
			return nil
		}
	}
	return sch
}

func propertyNames(sch any) []string {
	m, _ := sch.(map[string]any)
	props, _ := m["properties"].(map[string]any)
	return sortedKeys(props)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// keyPath writes an instance location as template errors write keys, with
// array indexes in brackets and unusual keys quoted.
func keyPath(inst any, loc []string) string {
	path := ""
	for _, tok := range loc {
		switch x := inst.(type) {
		case []any:
			path += "[" + tok + "]"
			if i, err := strconv.Atoi(tok); err == nil && i >= 0 && i < len(x) {
				inst = x[i]
			}
		case map[string]any:
			path = joinKey(path, tok)
			inst = x[tok]
		default:
			path = joinKey(path, tok)
		}
	}
	return path
}

func joinKey(path, k string) string {
	simple := k != ""
	for i := 0; i < len(k); i++ {
		c := k[i]
		simple = simple && ('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '_' || c == '-')
	}
	switch {
	case !simple:
		return path + "[" + strconv.Quote(k) + "]"
	case path == "":
		return k
	}
	return path + "." + k
}
