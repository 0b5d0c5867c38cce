package server_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/internal/testutil/redistest"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/api")

// TestAPIGolden pins every endpoint's answer, on both stores, against one
// set of golden files: a change to what the API says is a visible diff, and
// the stores cannot differ in it. Ids, times and hashes are replaced by
// stable placeholders; everything else is compared as served.
func TestAPIGolden(t *testing.T) {
	t.Parallel()
	stores := []struct{ name, state string }{{"bolt", ""}, {"redis", ""}}
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			state := st.state
			if st.name == "redis" {
				state = redistest.Open(t)
			}
			env := newAPIOn(t, "", state)
			g := &goldenAPI{env: env, ids: map[string]string{}}
			g.walk(t)
		})
	}
}

type goldenAPI struct {
	env *apiEnv
	// ids maps every id the answers carried to its placeholder.
	ids map[string]string
	// vary holds more keys whose values are timing's, for the answers
	// being checked: a split's progress events are coalesced as they come.
	vary map[string]bool
}

func (g *goldenAPI) walk(t *testing.T) {
	g.check(t, "healthz", "GET", "/healthz", "")
	g.check(t, "readyz", "GET", "/readyz", "")
	g.check(t, "chains_list", "GET", "/v1/chains", "")
	g.check(t, "chains_get", "GET", "/v1/chains/typed", "")
	g.check(t, "chains_get_unknown", "GET", "/v1/chains/typo", "")

	start := g.check(t, "runs_start_wait", "POST", "/v1/chains/typed/runs?wait=20s", `{"alert_name": "disk-full", "host": "db-1"}`, "Idempotency-Key", "golden-1")
	id := g.id(t, start, "run", "id")
	g.check(t, "runs_start_replayed", "POST", "/v1/chains/typed/runs", `{"alert_name": "disk-full", "host": "db-1"}`, "Idempotency-Key", "golden-1")
	g.check(t, "runs_start_invalid_payload", "POST", "/v1/chains/typed/runs", `{"host": "db-1"}`)
	g.check(t, "runs_start_bad_json", "POST", "/v1/chains/typed/runs", `{"host": `)
	g.check(t, "runs_get", "GET", "/v1/runs/"+id, "")
	g.check(t, "runs_get_items", "GET", "/v1/runs/"+id+"?items=true", "")
	g.check(t, "runs_get_unknown", "GET", "/v1/runs/no-such-run", "")
	g.check(t, "runs_events", "GET", "/v1/runs/"+id+"/events?follow=false", "")
	g.check(t, "runs_dag", "GET", "/v1/runs/"+id+"/dag", "")
	g.check(t, "runs_step", "GET", "/v1/runs/"+id+"/steps/page", "")
	g.check(t, "runs_step_unknown", "GET", "/v1/runs/"+id+"/steps/nothing", "")
	g.check(t, "runs_cancel_finished", "POST", "/v1/runs/"+id+"/cancel", "")
	g.check(t, "runs_list", "GET", "/v1/runs?chain=typed", "")

	g.vary = map[string]bool{"seq": true}
	split := g.check(t, "runs_start_split", "POST", "/v1/chains/many/runs?wait=20s", `{"hosts": [{"host": "a"}, {"host": "b"}, {"host": "c"}]}`)
	splitID := g.id(t, split, "split run", "id")
	g.check(t, "runs_get_split_items", "GET", "/v1/runs/"+splitID+"?items=true", "")
	g.check(t, "runs_dag_split", "GET", "/v1/runs/"+splitID+"/dag", "")
	g.check(t, "runs_step_item", "GET", "/v1/runs/"+splitID+"/steps/check[1]", "")
	g.vary = nil

	broken := g.check(t, "runs_start_failing", "POST", "/v1/chains/breaks/runs?wait=20s", `{}`)
	g.id(t, broken, "failing run", "id")
	list := g.check(t, "dlq_list", "GET", "/v1/dlq?chain=breaks", "")
	var entries struct {
		Entries []api.DLQEntry `json:"entries"`
	}
	if err := json.Unmarshal(list, &entries); err != nil || len(entries.Entries) != 1 {
		t.Fatalf("dead letters: %v %s", err, list)
	}
	entry := entries.Entries[0].ID
	g.check(t, "dlq_get", "GET", "/v1/dlq/"+entry, "")
	replay := g.check(t, "dlq_replay", "POST", "/v1/dlq/"+entry+"/replay", `{"mode": "resume"}`)
	replayed := g.id(t, replay, "replayed run", "run")
	waitRunEnd(t, g.env, replayed)
	g.check(t, "runs_list_started_by", "GET", "/v1/runs?started_by=api&hide_chain=typed&hide_chain=many", "")
	g.check(t, "runs_list_started_by_unknown", "GET", "/v1/runs?started_by=door", "")
	g.check(t, "dlq_replay_many_no_filter", "POST", "/v1/dlq/replay", `{}`)
	g.check(t, "dlq_delete_unknown", "DELETE", "/v1/dlq/no-such-entry", "")
	g.check(t, "dlq_purge", "POST", "/v1/dlq/purge", `{"chain": "breaks"}`)
	g.check(t, "dlq_list_empty", "GET", "/v1/dlq", "")
	g.check(t, "admin_reload", "POST", "/v1/admin/reload", "")
	g.check(t, "no_route", "GET", "/v1/nothing-here", "")
}

// check makes a request and compares its status and normalised answer with
// testdata/api/NAME.golden; it returns the raw answer.
func (g *goldenAPI) check(t *testing.T, name, method, path, body string, header ...string) []byte {
	t.Helper()
	headers := map[string]string{}
	for i := 0; i+1 < len(header); i += 2 {
		headers[header[i]] = header[i+1]
	}
	code, h, answer := g.env.call(method, path, body, headers, nil)
	var got bytes.Buffer
	fmt.Fprintf(&got, "%s %s\n%d %s\n\n", method, g.placeholders(path), code, strings.Split(h.Get("Content-Type"), ";")[0])
	if strings.HasPrefix(h.Get("Content-Type"), "text/event-stream") {
		g.writeEvents(t, &got, answer)
	} else {
		got.Write(g.normalise(t, []byte(answer)))
	}
	file := filepath.Join("testdata", "api", name+".golden")
	if *update {
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, got.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return []byte(answer)
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("%s: %v (go test ./gateway -run TestAPIGolden -update writes it)", name, err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Errorf("%s: the answer differs from %s (rerun with -update if the change is meant):\n--- got\n%s\n--- want\n%s", name, file, got.Bytes(), want)
	}
	return []byte(answer)
}

// id reads the id at key in an answer and gives it the next placeholder.
func (g *goldenAPI) id(t *testing.T, answer []byte, what, key string) string {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(answer, &m); err != nil {
		t.Fatalf("%s: %v: %s", what, err, answer)
	}
	id, _ := m[key].(string)
	if id == "" {
		t.Fatalf("%s: no %s in %s", what, key, answer)
	}
	return id
}

func (g *goldenAPI) writeEvents(t *testing.T, w *bytes.Buffer, stream string) {
	sc := bufio.NewScanner(strings.NewReader(stream))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			w.WriteString("data: ")
			w.Write(bytes.TrimSpace(g.normalise(t, []byte(data))))
			w.WriteByte('\n')
			continue
		}
		w.WriteString(line + "\n")
	}
}

var (
	timeValue = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$`)
	idValue   = regexp.MustCompile(`\b[0-9a-hjkmnp-tv-z]{26}\b`)
	// Keys whose values change from one gateway or moment to the next.
	volatileKeys = map[string]string{"chain_hash": "<hash>", "owner": "<owner>", "remote_addr": "<addr>", "active_runs": "<n>"}
)

// normalise replaces ids, times and hashes in a JSON answer by stable
// placeholders and indents it; an answer that is not JSON is kept as text.
func (g *goldenAPI) normalise(t *testing.T, data []byte) []byte {
	var v any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return data
	}
	v = g.walkValue("", v)
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

func (g *goldenAPI) walkValue(key string, v any) any {
	if p, ok := volatileKeys[key]; ok && v != nil && v != "" {
		return p
	}
	if g.vary[key] {
		return "<varies>"
	}
	switch x := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		out := make(map[string]any, len(x))
		for _, k := range keys {
			out[g.placeholders(k)] = g.walkValue(k, x[k])
		}
		return out
	case []any:
		for i := range x {
			x[i] = g.walkValue(key, x[i])
		}
		return x
	case string:
		if timeValue.MatchString(x) {
			return "<time>"
		}
		return g.placeholders(x)
	}
	return v
}

// placeholders replaces each id in s by its placeholder, numbered in the
// order the walk met them.
func (g *goldenAPI) placeholders(s string) string {
	return idValue.ReplaceAllStringFunc(s, func(id string) string {
		p, ok := g.ids[id]
		if !ok {
			p = fmt.Sprintf("<id-%d>", len(g.ids)+1)
			g.ids[id] = p
		}
		return p
	})
}
