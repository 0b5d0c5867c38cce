package show

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
)

// TestWriteResultBigBody writes a result whose step body is above bigBody:
// the output is one JSON document holding that body as it was.
func TestWriteResultBigBody(t *testing.T) {
	big := `{"results":[` + strings.Repeat(`{"name":"host","ok":true},`, bigBody/20) + `1]}`
	res := &engine.Result{ID: "r1", Chain: "c", Status: store.RunSucceeded, Path: []string{"loop", "after"}, Steps: map[string]engine.StepResult{
		"loop":  {Status: store.StepSucceeded, Body: json.RawMessage(big), Attempts: 1},
		"after": {Status: store.StepSucceeded, Body: json.RawMessage(`{"n": 1}`), Attempts: 1},
	}}
	var out bytes.Buffer
	if err := Result(&out, res, true); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Steps map[string]struct {
			Body json.RawMessage `json:"body"`
		} `json:"steps"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("the output is not JSON: %v", err)
	}
	if string(got.Steps["loop"].Body) != big {
		t.Error("the big body was not written as it was")
	}
	if !strings.Contains(out.String(), "\"after\": {\n      \"status\": \"succeeded\",\n      \"body\": {\n        \"n\": 1\n      }") {
		t.Errorf("small bodies are no longer indented:\n%.400s", out.String())
	}
}
