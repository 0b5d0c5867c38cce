package conformance_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/plugins/conformance"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// TestChecklist compares the checklist of plugins with known faults, and of
// one without, with testdata/NAME.golden.
func TestChecklist(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		target conformance.Target
		opts   conformance.Options
		ok     bool
	}{
		{
			name:   "conformant",
			target: conformance.Target{Builtin: "conformant"},
			opts: conformance.Options{
				Config:   json.RawMessage(`{"project": "OPS"}`),
				Payloads: map[string]json.RawMessage{"open": json.RawMessage(`{"title": "disk full"}`), "close": json.RawMessage(`{"title": "disk full"}`)},
			},
			ok: true,
		},
		{
			name:   "misbehaving",
			target: conformance.Target{Builtin: "misbehaving"},
			opts: conformance.Options{
				Grace: 2 * time.Second,
				Payloads: map[string]json.RawMessage{
					"slow": json.RawMessage(`{}`), "flaky": json.RawMessage(`{}`), "undeclared": json.RawMessage(`{}`),
				},
			},
		},
		{
			name:   "foreign",
			target: conformance.Target{Path: exe, Args: []string{foreignArg}},
			opts:   conformance.Options{Payloads: map[string]json.RawMessage{"ping": json.RawMessage(`{"host": "db-1"}`)}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := conformance.Check(t.Context(), tc.target, tc.opts)
			var text bytes.Buffer
			if err := r.WriteText(&text); err != nil {
				t.Fatal(err)
			}
			if r.OK() != tc.ok {
				t.Errorf("OK() = %v, want %v", r.OK(), tc.ok)
			}
			checkGolden(t, filepath.Join("testdata", tc.name+".golden"), normalize(text.String(), exe))
		})
	}
}

// normalize takes out what differs between runs: timings and paths.
func normalize(s, exe string) string {
	s = strings.ReplaceAll(s, exe, "TESTBINARY")
	return regexp.MustCompile(`\d+ ms`).ReplaceAllString(s, "N ms")
}

func checkGolden(t *testing.T, path, got string) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading golden file (run with -update to create it): %v", err)
	}
	if got != string(want) {
		t.Errorf("checklist differs from %s\n--- got\n%s--- want\n%s", path, got, want)
	}
}

func TestReportJSON(t *testing.T) {
	r := conformance.Check(t.Context(), conformance.Target{Builtin: "conformant"}, conformance.Options{
		Config:   json.RawMessage(`{"project": "<OPS>"}`),
		Payloads: map[string]json.RawMessage{"open": json.RawMessage(`{"title": "a & b"}`)},
	})
	var buf bytes.Buffer
	if err := r.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var back conformance.Report
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatalf("report is not JSON: %v\n%s", err, buf.String())
	}
	if back.Passed != r.Passed || back.Failed != r.Failed || len(back.Results) != len(r.Results) || back.Plugin == nil || back.Plugin.Name != "conformant" {
		t.Errorf("round trip lost data:\n%s", buf.String())
	}
	if strings.Contains(buf.String(), `\u0026`) {
		t.Errorf("JSON report escapes HTML: %s", buf.String())
	}
}
