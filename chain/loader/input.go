package loader

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/providers/configschema"
)

// checkPath reports what is wrong with reading origin.payload.PATH, given
// what the input declares; "" when nothing is, or when the declaration
// cannot tell (a schema without properties at that level, or one combining
// others).
func inputPathProblem(in *chain.Input, path []string) string {
	if len(path) == 0 {
		return ""
	}
	if in.Schema == nil {
		if slices.Contains(in.Fields(), path[0]) {
			return ""
		}
		return undeclared(path[0], "", in.Fields())
	}
	node := in.SchemaDoc
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
	if s := chain.Suggest(name, declared); s != "" {
		msg += fmt.Sprintf(" (did you mean %q?)", s)
	} else if len(declared) > 0 {
		msg += "; it declares " + strings.Join(declared, ", ")
	}
	return msg + "; declare every field the chain reads"
}

// checkCall checks the input a sub_chain step gives this chain, when it is
// written as a table whose keys are known at load: every required field is
// set, and every field set is declared.
func checkInputCall(in *chain.Input, d *fileDecoder, at chain.KeyPath, chainName string, v any) {
	m, ok := v.(map[string]any)
	if !ok {
		return
	}
	required, declared := in.Required, in.Fields()
	if in.Schema != nil {
		root, _ := in.SchemaDoc.(map[string]any)
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
			d.errorf(at.Key(k), "chain %q does not declare the input field %q%s", chainName, k, didYouMean(k, declared, "fields"))
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
func decodeInput(t *table) *chain.Input {
	defer t.finish(inputKeys)
	in := &chain.Input{Source: t.d.source(t.path)}
	in.Required = t.strings("required")
	in.Optional = t.strings("optional")
	seen := map[string]bool{}
	for i, f := range append(slices.Clone(in.Required), in.Optional...) {
		if seen[f] {
			k, j := "required", i
			if i >= len(in.Required) {
				k, j = "optional", i-len(in.Required)
			}
			t.d.errorf(t.path.Key(k).Elem(j, ""), "field %q is listed twice", f)
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
			t.d.errorf(t.path.Key("schema"), "must be a table holding a JSON Schema, got %s", describe(v))
			return nil
		}
		raw, err := json.Marshal(v)
		if err != nil {
			t.d.errorf(t.path.Key("schema"), "encoding the schema as JSON: %v", err)
			return nil
		}
		return compileInput(in, t, "schema", raw)
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
			t.d.errorf(t.path.Key("schema_file"), "reading the input schema: %v", err)
			return nil
		}
		return compileInput(in, t, "schema_file", raw)
	case !hasLists:
		t.d.errorf(t.path, "an input declares required and optional fields, or a JSON Schema (schema or schema_file)")
		return nil
	}
	return in
}

func compileInput(in *chain.Input, t *table, key string, raw []byte) *chain.Input {
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
		t.d.errorf(t.path.Key(key), "the input schema is not a valid JSON Schema: %s", strings.Join(lines, "; "))
		return nil
	}
	var doc any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.d.errorf(t.path.Key(key), "decoding the input schema: %v", err)
		return nil
	}
	in.Schema, in.SchemaDoc = s, doc
	return in
}
