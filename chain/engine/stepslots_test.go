package engine_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/chaingate/gateway/chain/store"
)

// stepKeyChains restart a fleet: each host once at a time however often
// the list names it, and the whole fleet at most two hosts at once. The
// exec provider's script records, with the time, when it starts and ends
// work on a host.
func stepKeyChains(log string) string {
	return strings.ReplaceAll(`
[[providers]]
name = "sh"
type = "exec"
[providers.config.commands.hold]
script = '''
echo "start $CHAINGATE_ARG_HOST $(date +%s.%N)" >> LOG
sleep 0.1
echo "end $CHAINGATE_ARG_HOST $(date +%s.%N)" >> LOG
'''
args.host = { type = "string", pattern = "[a-z0-9-]+" }

[[chains]]
name = "per-host"
[[chains.steps]]
name = "restart"
[chains.steps.split]
items = "<<origin.payload.hosts>>"
max_concurrency = 8
[[chains.steps.split.steps]]
name = "restart-host"
provider = "sh"
action_type = "hold"
payload_template = { args = { host = "<<item>>" } }
concurrency = { key = "host-<<item>>" }

[[chains]]
name = "two-at-once"
[[chains.steps]]
name = "restart"
[chains.steps.split]
items = "<<origin.payload.hosts>>"
[[chains.steps.split.steps]]
name = "restart-host"
provider = "sh"
action_type = "hold"
payload_template = { args = { host = "<<item>>" } }
concurrency = { key = "fleet", limit = 2 }

[[chains]]
name = "skip-busy"
[[chains.steps]]
name = "restart"
[chains.steps.split]
items = "<<origin.payload.hosts>>"
[[chains.steps.split.steps]]
name = "restart-host"
provider = "sh"
action_type = "hold"
payload_template = { args = { host = "<<item>>" } }
concurrency = { key = "host-<<item>>", on_busy = "skip" }
`, "LOG", log)
}

type span struct {
	host       string
	start, end float64
}

func readSpans(t *testing.T, path string) []span {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []span
	open := map[string][]int{}
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) != 3 {
			continue
		}
		at, _ := strconv.ParseFloat(f[2], 64)
		if f[0] == "start" {
			open[f[1]] = append(open[f[1]], len(out))
			out = append(out, span{host: f[1], start: at})
		} else if idx := open[f[1]]; len(idx) > 0 {
			out[idx[0]].end = at
			open[f[1]] = idx[1:]
		}
	}
	return out
}

// maxOverlap is the most spans under way at once, of those keep selects.
func maxOverlap(spans []span, keep func(span) bool) int {
	type edge struct {
		at float64
		d  int
	}
	var edges []edge
	for _, s := range spans {
		if keep(s) {
			edges = append(edges, edge{s.start, 1}, edge{s.end, -1})
		}
	}
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].at != edges[j].at {
			return edges[i].at < edges[j].at
		}
		return edges[i].d < edges[j].d
	})
	most, n := 0, 0
	for _, e := range edges {
		n += e.d
		most = max(most, n)
	}
	return most
}

func TestStepKeyInSplitItems(t *testing.T) {
	log := filepath.Join(t.TempDir(), "hosts.log")
	h := newHarness(t, stepKeyChains(log))
	res := h.run("per-host", `{"hosts": ["a", "b", "a", "c", "a", "b", "c", "a"]}`)
	if res.Status != store.RunSucceeded {
		t.Fatalf("run %s: %+v", res.Status, res.Error)
	}
	spans := readSpans(t, log)
	if len(spans) != 8 {
		t.Fatalf("%d calls, want 8: %+v", len(spans), spans)
	}
	for _, host := range []string{"a", "b", "c"} {
		if n := maxOverlap(spans, func(s span) bool { return s.host == host }); n != 1 {
			t.Errorf("host %s: %d items worked on it at once", host, n)
		}
	}
	if n := maxOverlap(spans, func(span) bool { return true }); n < 2 {
		t.Errorf("at most %d items at once: different hosts should not wait for each other", n)
	}
}

func TestStepKeyLimitsAFleet(t *testing.T) {
	log := filepath.Join(t.TempDir(), "hosts.log")
	h := newHarness(t, stepKeyChains(log))
	res := h.run("two-at-once", `{"hosts": ["a", "b", "c", "d", "e", "f"]}`)
	if res.Status != store.RunSucceeded {
		t.Fatalf("run %s: %+v", res.Status, res.Error)
	}
	spans := readSpans(t, log)
	if len(spans) != 6 {
		t.Fatalf("%d calls, want 6", len(spans))
	}
	if n := maxOverlap(spans, func(span) bool { return true }); n > 2 {
		t.Errorf("%d hosts restarted at once; the fleet's limit is 2", n)
	}
}

func TestStepKeySkipsBusy(t *testing.T) {
	log := filepath.Join(t.TempDir(), "hosts.log")
	h := newHarness(t, stepKeyChains(log))
	res := h.run("skip-busy", `{"hosts": ["a", "a", "a"]}`)
	if res.Status != store.RunSucceeded {
		t.Fatalf("run %s: %+v", res.Status, res.Error)
	}
	skipped := 0
	for key, st := range res.Steps {
		if strings.HasSuffix(key, "/restart-host") && st.Status == store.StepSkipped {
			if st.Error == nil || st.Error.Code != "concurrency_busy" {
				t.Errorf("step %s skipped with %+v", key, st.Error)
			}
			skipped++
		}
	}
	if spans := readSpans(t, log); len(spans)+skipped != 3 || len(spans) == 0 || skipped == 0 {
		t.Errorf("%d calls and %d skipped of 3 items naming one host", len(spans), skipped)
	}
}

const stepAskChain = `
[[chains]]
name = "step-ask"
[[chains.steps]]
name = "ask"
approval = {}
concurrency = { key = "change-window" }
[[chains.steps]]
name = "done"
provider = "echo"
`

// TestStepKeyAcrossRestart stops the gateway while one run's step holds a
// key and another run's step waits for it: after the restart the waiting
// step still waits, and takes the key once the holder's step has ended.
func TestStepKeyAcrossRestart(t *testing.T) {
	db := filepath.Join(t.TempDir(), "gw.db")
	h1 := newHarness(t, stepAskChain, atStore(db))
	a := startRun(t, h1, "step-ask", `{}`)
	waitWaiting(t, h1, a.ID)
	b := startRun(t, h1, "step-ask", `{}`)
	waitRun(t, h1, b.ID, "running, its step not asking", func(run *store.Run) bool { return run.Status == store.RunRunning })
	h1.close()

	h2 := newHarness(t, stepAskChain, atStore(db))
	if ids, err := h2.eng.Resume(context.Background()); err != nil || len(ids) != 2 {
		t.Fatalf("Resume = %v, %v", ids, err)
	}
	waitEvent(t, h2, b.ID, store.EventRunResumed)
	slots, err := h2.eng.Slots(context.Background())
	if err != nil || len(slots) != 1 || !slices.Equal(slots[0].Holders, []string{a.ID + "/ask"}) || !slices.Equal(slots[0].Queue, []string{b.ID + "/ask"}) {
		t.Fatalf("Slots after the restart = %+v, %v", slots, err)
	}
	if run, _ := h2.store.RunHeader(context.Background(), b.ID); run.Status == store.RunWaiting {
		t.Fatal("the second run's step asked while the first held the key")
	}
	approve(t, h2, a.ID)
	waitStatus(t, h2, a.ID, store.RunSucceeded)
	approve(t, h2, b.ID)
	waitStatus(t, h2, b.ID, store.RunSucceeded)
}
