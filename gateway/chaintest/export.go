package chaintest

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/internal/textx"
	"github.com/chaingate/gateway/internal/tomlx"
)

// Export writes a test case of a run that ended, read through ops (a
// gateway's API or a store): its payload; every call's recorded result as
// a mock (the failed attempts of a step that succeeded as retryable
// errors), every approval's answer; and its status, path, error, steps'
// outcomes and dead-letter entries as expectations. Run against the config
// the run ran, the case passes; against a changed one, it fails where the
// change leads elsewhere.
func Export(ctx context.Context, ops api.Ops, id string) ([]byte, error) {
	x := &exporter{ops: ops, mocks: map[string]string{}, approvals: map[string]string{}}
	rv, err := ops.Run(ctx, id, true)
	if err != nil {
		return nil, fmt.Errorf("exporting run %s: %w", id, err)
	}
	switch {
	case rv.ParentRun != "":
		return nil, fmt.Errorf("exporting run %s: it is the run of a sub-chain of run %s; export that run", id, rv.ParentRun)
	case !rv.Final():
		return nil, fmt.Errorf("exporting run %s: it has not ended (%s)", id, rv.Status)
	}
	var expect []string
	if err := x.run(ctx, rv, &expect); err != nil {
		return nil, fmt.Errorf("exporting run %s: %w", id, err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Run %s of chain %q, %s, started %s by %s, as a test case:\n", rv.ID, rv.Chain, rv.Status, rv.CreatedAt.UTC().Format(time.RFC3339), orUnknown(rv.StartedBy))
	b.WriteString("# its payload, what each call answered, and what the run did. Run it with gateway test.\n")
	for _, note := range x.notes {
		b.WriteString("# " + note + "\n")
	}
	b.WriteString("\n[[tests]]\n")
	fmt.Fprintf(&b, "name = %s\n", tomlx.String(fmt.Sprintf("run %s (%s)", rv.ID, rv.Status)))
	fmt.Fprintf(&b, "chain = %s\n", tomlx.String(rv.Chain))
	if len(rv.Origin.Payload) > 0 {
		fmt.Fprintf(&b, "payload = %s\n", tomlJSON(rv.Origin.Payload))
	}
	for _, name := range sortedKeys(x.mocks) {
		fmt.Fprintf(&b, "\n[tests.mocks.%s]\n%s", tomlKey(name), x.mocks[name])
	}
	for _, name := range sortedKeys(x.approvals) {
		fmt.Fprintf(&b, "\n[tests.approvals.%s]\n%s", tomlKey(name), x.approvals[name])
	}
	b.WriteString("\n[tests.expect]\n")
	fmt.Fprintf(&b, "status = %s\n", tomlx.String(rv.Status))
	fmt.Fprintf(&b, "path = %s\n", tomlx.Strings(rv.Path))
	if rv.Error != nil {
		// The entry's id is the run's own: another run's differs.
		fmt.Fprintf(&b, "error = %s\n", tomlx.String(deadLetterID.ReplaceAllString(rv.Error.Message, "")))
	}
	for _, line := range expect {
		b.WriteString(line + "\n")
	}
	entries, err := ops.ListDLQ(ctx, store.DLQFilter{Chain: rv.Chain})
	if err != nil {
		return nil, fmt.Errorf("exporting run %s: listing its dead-letter entries: %w", id, err)
	}
	for _, e := range entries {
		if e.RunID != rv.ID {
			continue
		}
		fmt.Fprintf(&b, "\n[[tests.expect.dead_letters]]\nstep = %s\nerror = %s\n", tomlx.String(e.Step), tomlx.String(e.Error.Message))
	}
	return []byte(b.String()), nil
}

// deadLetterID is the end of a run's error that names its entry.
var deadLetterID = regexp.MustCompile(` \(dead-letter entry [0-9a-z]+\)$`)

type exporter struct {
	ops       api.Ops
	mocks     map[string]string // step name → the mock's TOML lines
	approvals map[string]string
	notes     []string
}

// run adds the mocks and expectations of one run, and of its sub-chains'.
func (x *exporter) run(ctx context.Context, rv *api.RunView, expect *[]string) error {
	dag, err := x.ops.DAG(ctx, rv.ID)
	if err != nil {
		return err
	}
	x.nodes(ctx, rv, dag.Nodes, "", expect)
	return nil
}

func (x *exporter) nodes(ctx context.Context, rv *api.RunView, nodes []*api.DAGNode, prefix string, expect *[]string) {
	for _, n := range nodes {
		key := prefix + n.Name
		rec := rv.Steps[key]
		if rec == nil || rec.Status == string(store.StepPending) {
			continue
		}
		if _, taken := x.mocks[n.Name]; taken {
			x.notes = append(x.notes, fmt.Sprintf("step %s of run %s has the name of another step: its answers are not in this case", key, rv.ID))
			continue
		}
		*expect = append(*expect, fmt.Sprintf("steps.%s = { status = %s, attempts = %d }", tomlKey(n.Name), tomlx.String(rec.Status), rec.Attempts))
		switch n.Kind {
		case "parallel":
			x.nodes(ctx, rv, n.Children, key+"/", expect)
		case "split":
			x.split(rv, n, rec, key)
		case "sub_chain":
			if rec.Child == "" {
				continue
			}
			child, err := x.ops.Run(ctx, rec.Child, true)
			if err != nil {
				x.notes = append(x.notes, fmt.Sprintf("the sub-chain run %s of step %s could not be read (%v): mock its steps by hand", rec.Child, key, err))
				continue
			}
			var ignored []string
			if err := x.run(ctx, child, &ignored); err != nil {
				x.notes = append(x.notes, fmt.Sprintf("the sub-chain run %s of step %s could not be read (%v): mock its steps by hand", rec.Child, key, err))
			}
		case "approval":
			x.approval(n.Name, rec)
		default:
			if m := mockLines(rec.Status, rec.Attempts, rec.Body, rec.Error); m != "" {
				x.mocks[n.Name] = m
			}
		}
	}
}

// mockLines is the mock that answers a step as its record says it ended.
func mockLines(status string, attempts int, body json.RawMessage, info *api.ErrorInfo) string {
	msg := ""
	if info != nil {
		msg = info.Message
	}
	switch store.StepStatus(status) {
	case store.StepSucceeded:
		if attempts <= 1 {
			return "body = " + tomlJSON(body) + "\n"
		}
		var b strings.Builder
		b.WriteString("attempts = [\n")
		for i := 1; i < attempts; i++ {
			fmt.Fprintf(&b, "  { error = %s, retryable = true },\n", tomlx.String(fmt.Sprintf("attempt %d failed (its error is not recorded)", i)))
		}
		fmt.Fprintf(&b, "  { body = %s },\n]\n", tomlJSON(body))
		return b.String()
	case store.StepFailed:
		if info != nil && info.Code != "" && strings.HasPrefix(msg, info.Code+": ") {
			// A provider's error says its code first; the mock gives it as
			// code, which a catch entry may name, and says it again so.
			return fmt.Sprintf("error = %s\nretryable = %t\ncode = %s\n", tomlx.String(strings.TrimPrefix(msg, info.Code+": ")), attempts > 1, tomlx.String(info.Code))
		}
		return fmt.Sprintf("error = %s\nretryable = %t\n", tomlx.String(msg), attempts > 1)
	case store.StepTimedOut, store.StepCancelled:
		// Still in flight when its timeout, or the cancel, came.
		return "delay = \"24h\"\nbody = {}\n"
	case store.StepSkipped:
		if attempts > 0 {
			// A failure on_failure = "skip" passed over.
			return fmt.Sprintf("error = %s\n", tomlx.String(orUnknown(msg)))
		}
	}
	return ""
}

func (x *exporter) approval(name string, rec *api.Step) {
	var d struct {
		Decision string `json:"decision"`
		By       string `json:"by"`
		Comment  string `json:"comment"`
		TimedOut bool   `json:"timed_out"`
	}
	_ = json.Unmarshal(rec.Body, &d)
	switch {
	case d.TimedOut || rec.Status == string(store.StepTimedOut):
		x.approvals[name] = "decision = \"timeout\"\n"
	case d.Decision != "":
		after := ""
		if !rec.StartedAt.IsZero() && !rec.FinishedAt.IsZero() {
			after = fmt.Sprintf("after = %s\n", tomlx.String(rec.FinishedAt.Sub(rec.StartedAt).Round(time.Second).String()))
		}
		x.approvals[name] = fmt.Sprintf("decision = %s\nby = %s\ncomment = %s\n%s", tomlx.String(d.Decision), tomlx.String(d.By), tomlx.String(d.Comment), after)
	}
}

// split mocks a split's items from their records when its items have one
// step: an item's record holds the result of its last step only.
func (x *exporter) split(rv *api.RunView, n *api.DAGNode, rec *api.Step, key string) {
	if len(n.Children) != 1 || n.Children[0].Kind != "provider" {
		x.notes = append(x.notes, fmt.Sprintf("the items of split %s run %s, and only their last step's result is recorded: mock %s by hand", key, textx.Count(len(n.Children), "step", "steps"), stepList(n.Children)))
		return
	}
	var items []string
	for _, k := range sortedKeys(rv.Steps) {
		_, i, ok := itemOf(k)
		if !ok || !strings.HasPrefix(k, key+"[") {
			continue
		}
		it := rv.Steps[k]
		m := mockLines(it.Status, it.Attempts, it.Body, it.Error)
		if m == "" {
			m = "body = {}\n"
		}
		items = append(items, "  { index = "+strconv.Itoa(i)+", "+strings.ReplaceAll(strings.TrimSpace(m), "\n", ", ")+" },")
	}
	if len(items) == 0 {
		return
	}
	x.mocks[n.Children[0].Name] = "body = {}\nitems = [\n" + strings.Join(items, "\n") + "\n]\n"
}

func stepList(nodes []*api.DAGNode) string {
	names := make([]string, len(nodes))
	for i, n := range nodes {
		names[i] = n.Name
	}
	return strings.Join(names, ", ")
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// tomlJSON writes a JSON value as a TOML value; TOML has no null, so an
// object's null member is left out and an array's null is written "null".
func tomlJSON(raw json.RawMessage) string {
	if len(raw) == 0 {
		return "{}"
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return tomlx.String(string(raw))
	}
	if v == nil {
		return "{}"
	}
	return tomlValue(v)
}

func tomlValue(v any) string {
	switch v := v.(type) {
	case map[string]any:
		keys := sortedKeys(v)
		parts := make([]string, 0, len(keys))
		for _, k := range keys {
			if v[k] == nil {
				continue
			}
			parts = append(parts, tomlKey(k)+" = "+tomlValue(v[k]))
		}
		if len(parts) == 0 {
			return "{}"
		}
		return "{ " + strings.Join(parts, ", ") + " }"
	case []any:
		parts := make([]string, len(v))
		for i, e := range v {
			if e == nil {
				parts[i] = `"null"`
				continue
			}
			parts[i] = tomlValue(e)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case string:
		return tomlx.String(v)
	case float64:
		if v == float64(int64(v)) && v < 1e15 && v > -1e15 {
			return strconv.FormatInt(int64(v), 10)
		}
		return strconv.FormatFloat(v, 'g', -1, 64)
	case bool:
		return strconv.FormatBool(v)
	}
	return tomlx.String(fmt.Sprint(v))
}

// tomlKey is a key as TOML writes it: bare when it can be.
func tomlKey(k string) string {
	if k != "" && !slices.ContainsFunc([]rune(k), func(r rune) bool {
		return r != '_' && r != '-' && (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') && (r < '0' || r > '9')
	}) {
		return k
	}
	return tomlx.String(k)
}
