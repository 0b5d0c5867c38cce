package chain

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/chaingate/gateway/providers/configschema"
)

// Input is what a chain declares its origin payload holds: a list of
// top-level fields, or a JSON Schema. A start whose payload does not match
// is refused before the run exists, and templates reading
// origin.payload.FIELD are checked against it when the config loads.
type Input struct {
	// Required fields must be present and not null; Optional ones may be.
	// Both are top-level keys of a JSON object.
	Required []string
	Optional []string
	// Schema, when set, is the JSON Schema the payload must match.
	Schema *configschema.Schema
	// doc is the schema as decoded JSON, to follow references into it.
	doc    any
	Source Source
}

// InputError is a payload that does not match the input its chain
// declares; every problem names the field.
type InputError struct {
	Chain    string
	Problems []configschema.Problem
}

func (e *InputError) Error() string {
	parts := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		field := p.Path
		if field == "" {
			field = "payload"
		}
		parts[i] = field + ": " + p.Message
	}
	return fmt.Sprintf("the payload does not match the input chain %q declares: %s", e.Chain, strings.Join(parts, "; "))
}

// Check returns an *InputError if payload does not match. A nil Input
// takes any payload.
func (in *Input) Check(chainName string, payload json.RawMessage) error {
	if in == nil {
		return nil
	}
	var problems []configschema.Problem
	if in.Schema != nil {
		problems = in.Schema.Validate(payload)
	} else {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(payload, &obj); err != nil || obj == nil {
			problems = append(problems, configschema.Problem{Message: "must be a JSON object with the fields " + strings.Join(in.fields(), ", ")})
		} else {
			for _, f := range in.Required {
				if v, ok := obj[f]; !ok || string(bytes.TrimSpace(v)) == "null" {
					problems = append(problems, configschema.Problem{Path: f, Message: "required field is missing"})
				}
			}
		}
	}
	if len(problems) == 0 {
		return nil
	}
	return &InputError{Chain: chainName, Problems: problems}
}

// fields lists the declared fields, each once.
func (in *Input) fields() []string {
	out := slices.Clone(in.Required)
	for _, f := range in.Optional {
		if !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	return out
}

// checkPath reports what is wrong with reading origin.payload.PATH, given
// what the input declares; "" when nothing is, or when the declaration
// cannot tell (a schema without properties at that level, or one combining
// others).
func (in *Input) checkPath(path []string) string {
	if len(path) == 0 {
		return ""
	}
	if in.Schema == nil {
		if slices.Contains(in.fields(), path[0]) {
			return ""
		}
		return undeclared(path[0], "", in.fields())
	}
	node := in.doc
	at := ""
	for _, seg := range path {
		m, ok := node.(map[string]any)
		if !ok {
			return ""
		}
		if _, err := strconv.Atoi(seg); err == nil {
			items, ok := m["items"]
			if !ok {
				return ""
			}
			node, at = items, at+"["+seg+"]"
			continue
		}
		props, ok := m["properties"].(map[string]any)
		if !ok {
			return ""
		}
		p, ok := props[seg]
		if !ok {
			if _, open := m["patternProperties"]; open {
				return ""
			}
			names := make([]string, 0, len(props))
			for n := range props {
				names = append(names, n)
			}
			slices.Sort(names)
			return undeclared(seg, at, names)
		}
		node = p
		if at == "" {
			at = seg
		} else {
			at += "." + seg
		}
	}
	return ""
}

func undeclared(name, under string, declared []string) string {
	where := "the chain's input"
	if under != "" {
		where = "origin.payload." + under + " in the chain's input"
	}
	msg := fmt.Sprintf("field %q is not declared in %s", name, where)
	if s := suggest(name, declared); s != "" {
		msg += fmt.Sprintf(" (did you mean %q?)", s)
	} else if len(declared) > 0 {
		msg += "; it declares " + strings.Join(declared, ", ")
	}
	return msg + "; declare every field the chain reads"
}

// checkCall checks the input a sub_chain step gives this chain, when it is
// written as a table whose keys are known at load: every required field is
// set, and every field set is declared.
func (in *Input) checkCall(d *fileDecoder, at keyPath, chainName string, v any) {
	m, ok := v.(map[string]any)
	if !ok {
		return
	}
	required, declared := in.Required, in.fields()
	if in.Schema != nil {
		root, _ := in.doc.(map[string]any)
		required = asStrings(root["required"])
		declared = nil
		if props, ok := root["properties"].(map[string]any); ok && root["patternProperties"] == nil {
			for k := range props {
				declared = append(declared, k)
			}
			slices.Sort(declared)
		}
	}
	for _, f := range required {
		if _, ok := m[f]; !ok {
			d.errorf(at, "chain %q requires the input field %q, which this input does not set", chainName, f)
		}
	}
	if declared == nil && in.Schema != nil {
		return
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if !slices.Contains(declared, k) {
			d.errorf(at.key(k), "chain %q does not declare the input field %q%s", chainName, k, didYouMean(k, declared, "fields"))
		}
	}
}

func asStrings(v any) []string {
	arr, _ := v.([]any)
	out := make([]string, 0, len(arr))
	for _, e := range arr {
		if s, ok := e.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

var inputKeys = []string{"required", "optional", "schema", "schema_file"}

// decodeInput reads [chains.input].
func decodeInput(t *table) *Input {
	defer t.finish(inputKeys)
	in := &Input{Source: t.d.source(t.path)}
	in.Required = t.strings("required")
	in.Optional = t.strings("optional")
	seen := map[string]bool{}
	for i, f := range append(slices.Clone(in.Required), in.Optional...) {
		if seen[f] {
			k, j := "required", i
			if i >= len(in.Required) {
				k, j = "optional", i-len(in.Required)
			}
			t.d.errorf(t.path.key(k).elem(j, ""), "field %q is listed twice", f)
		}
		seen[f] = true
	}
	hasLists := t.has("required") || t.has("optional")
	switch {
	case t.has("schema") && t.has("schema_file"):
		t.d.errorf(t.path, "give the input as schema or schema_file, not both")
		return nil
	case (t.has("schema") || t.has("schema_file")) && hasLists:
		t.d.errorf(t.path, "give the input as required/optional fields or as a JSON Schema (schema, schema_file), not both; a schema lists required fields itself")
		return nil
	case t.has("schema"):
		v, _ := t.value("schema")
		if _, ok := v.(map[string]any); !ok {
			t.d.errorf(t.path.key("schema"), "must be a table holding a JSON Schema, got %s", describe(v))
			return nil
		}
		raw, err := json.Marshal(v)
		if err != nil {
			t.d.errorf(t.path.key("schema"), "encoding the schema as JSON: %v", err)
			return nil
		}
		return in.compile(t, "schema", raw)
	case t.has("schema_file"):
		name := t.nonEmpty("schema_file")
		if name == "" {
			return nil
		}
		if !filepath.IsAbs(name) {
			name = filepath.Join(filepath.Dir(t.d.file), name)
		}
		raw, err := os.ReadFile(name)
		if err != nil {
			t.d.errorf(t.path.key("schema_file"), "reading the input schema: %v", err)
			return nil
		}
		return in.compile(t, "schema_file", raw)
	case !hasLists:
		t.d.errorf(t.path, "an input declares required and optional fields, or a JSON Schema (schema or schema_file)")
		return nil
	}
	return in
}

func (in *Input) compile(t *table, key string, raw []byte) *Input {
	s, err := configschema.Compile(raw)
	if err != nil {
		if inner := errors.Unwrap(err); inner != nil {
			err = inner
		}
		// The validator's report is an indented tree; one line reads better
		// beside a key path.
		var lines []string
		for _, l := range strings.Split(err.Error(), "\n") {
			if l = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), "- ")); l != "" && !strings.Contains(l, "metaschema") {
				lines = append(lines, l)
			}
		}
		t.d.errorf(t.path.key(key), "the input schema is not a valid JSON Schema: %s", strings.Join(lines, "; "))
		return nil
	}
	var doc any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.d.errorf(t.path.key(key), "decoding the input schema: %v", err)
		return nil
	}
	in.Schema, in.doc = s, doc
	return in
}
