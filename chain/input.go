package chain

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
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
	// SchemaDoc is the schema as decoded JSON, to follow references into.
	SchemaDoc any
	Source    Source
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
			problems = append(problems, configschema.Problem{Message: "must be a JSON object with the fields " + strings.Join(in.Fields(), ", ")})
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

// Fields lists the declared fields, each once.
func (in *Input) Fields() []string {
	out := slices.Clone(in.Required)
	for _, f := range in.Optional {
		if !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	return out
}
