package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/store"
	redisstore "github.com/chaingate/gateway/chain/store/redis"
	"github.com/chaingate/gateway/internal/testutil/redistest"
)

// These tests hold a host with a chain's concurrency key across two
// gateways on one Redis. The provider's own record says what happened:
// the exec provider runs a declared script that appends a line, with the
// time, when it starts working on a host and when it is done.

func concurrencyConfig(dir string) string {
	record := filepath.Join(dir, "hosts.log")
	return fmt.Sprintf(`
[gateway]
lease_ttl_seconds = %d
shutdown_grace_seconds = 2

[[providers]]
name = "local"
type = "exec"
[providers.config.commands.hold]
script = '''
echo "start $CHAINGATE_ARG_HOST $CHAINGATE_ARG_RUN $(date +%%s.%%N)" >> %[2]s
sleep "$CHAINGATE_ARG_SECONDS"
echo "end $CHAINGATE_ARG_HOST $CHAINGATE_ARG_RUN $(date +%%s.%%N)" >> %[2]s
'''
timeout_seconds = 60
args.host = { type = "hostname" }
args.run = { type = "string", pattern = "[0-9a-z]{26}" }
args.seconds = { type = "string", enum = ["0.2", "6"] }

[[chains]]
name = "remediate"
concurrency = { key = "<<origin.payload.host>>" }
[[chains.steps]]
name = "work"
provider = "local"
action_type = "hold"
payload_template = { args = { host = "<<origin.payload.host>>", run = "<<run.id>>", seconds = "<<origin.payload.seconds ?? \"0.2\">>" } }
`, clusterLeaseTTL, record)
}

// hostCall is one call of the hold command, as the script recorded it.
type hostCall struct {
	host, run  string
	start, end float64 // seconds since the epoch; end 0 while unfinished
}

// readHostCalls reads the script's record: calls in the order they started.
func readHostCalls(t *testing.T, path string) []hostCall {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var calls []hostCall
	open := map[string]int{} // host+run → index of its call still open
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) != 4 {
			continue
		}
		at, err := strconv.ParseFloat(f[3], 64)
		if err != nil {
			t.Fatalf("record line %q: %v", l, err)
		}
		k := f[1] + " " + f[2]
		switch f[0] {
		case "start":
			open[k] = len(calls)
			calls = append(calls, hostCall{host: f[1], run: f[2], start: at})
		case "end":
			if i, ok := open[k]; ok {
				calls[i].end = at
				delete(open, k)
			}
		}
	}
	return calls
}

// checkNoOverlap fails when two runs worked on one host at once. A run
// may have two calls (its gateway died under one; the one that took it
// over called again): those of one run are not checked against each
// other. A call with no end recorded ended at killed, when the gateway
// making it (and its plugin, and the script) was killed; with killed
// zero, it counts as never ending.
func checkNoOverlap(t *testing.T, calls []hostCall, killed float64) {
	t.Helper()
	by := map[string][]hostCall{}
	for _, c := range calls {
		by[c.host] = append(by[c.host], c)
	}
	for host, cs := range by {
		for i, a := range cs {
			for _, b := range cs[i+1:] {
				if a.run == b.run {
					continue
				}
				never := killed
				if never == 0 {
					never = 1e18
				}
				aEnd, bEnd := a.end, b.end
				if aEnd == 0 {
					aEnd = never
				}
				if bEnd == 0 {
					bEnd = never
				}
				if a.start < bEnd && b.start < aEnd {
					t.Errorf("host %s: runs %s (%.6f–%.6f) and %s (%.6f–%.6f) worked on it at once", host, a.run, a.start, a.end, b.run, b.start, b.end)
				}
			}
		}
	}
}

// waitAllEnded waits for the runs to end and returns them.
func waitAllEnded(t *testing.T, st store.Store, ids []string) map[string]*store.Run {
	t.Helper()
	ctx := context.Background()
	out := map[string]*store.Run{}
	deadline := time.Now().Add(180 * time.Second)
	for _, id := range ids {
		for {
			run, err := st.RunHeader(ctx, id)
			if err == nil && run.Status.Final() {
				out[id] = run
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("run %s never ended: %+v, %v", id, run, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return out
}

// TestOneRunPerHostAcrossGateways delivers 20 alerts naming 3 hosts to two
// gateways on one Redis at once: the hosts' alerts arrive side by side,
// each host's one after another (each POST answered before the host's
// next is sent, alternately to either gateway), which is what gives a
// host's alerts an order of arrival. With limit = 1 per host, no two runs
// work on a host at once, every run completes, and each host's runs work
// in the order their alerts arrived.
func TestOneRunPerHostAcrossGateways(t *testing.T) {
	t.Parallel()
	url := redistest.Open(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gateway.toml")
	writeFile(t, cfg, concurrencyConfig(dir))
	gws := []*gatewayProc{startServe(t, cfg, url), startServe(t, cfg, url)}

	const alerts = 20
	hosts := []string{"db-1.example.com", "db-2.example.com", "web-1.example.com"}
	arrived := map[string][]string{} // host → run ids in the order their alerts arrived
	var mu sync.Mutex
	var wg sync.WaitGroup
	for h, host := range hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := h; i < alerts; i += len(hosts) {
				id, err := postRun(gws[i%2].url, "remediate", fmt.Sprintf(`{"host": %q}`, host))
				if err != nil {
					t.Errorf("alert %d: %v", i, err)
					return
				}
				mu.Lock()
				arrived[host] = append(arrived[host], id)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	st, err := redisstore.OpenURL(context.Background(), url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var ids []string
	for _, host := range hosts {
		ids = append(ids, arrived[host]...)
	}
	if len(ids) != alerts {
		t.Fatalf("%d runs started, want %d", len(ids), alerts)
	}
	runs := waitAllEnded(t, st, ids)
	queued := 0
	for id, run := range runs {
		if run.Status != store.RunSucceeded {
			t.Errorf("run %s ended %s: %+v", id, run.Status, run.Error)
		}
		evs, err := st.Events(context.Background(), id, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			if ev.Type == store.EventRunQueued {
				queued++
			}
		}
	}
	if queued == 0 {
		t.Errorf("no run ever waited for its host: the test did not test the queue")
	}

	calls := readHostCalls(t, filepath.Join(dir, "hosts.log"))
	checkNoOverlap(t, calls, 0)
	worked := map[string][]string{}
	for _, c := range calls {
		if !slices.Contains(worked[c.host], c.run) {
			worked[c.host] = append(worked[c.host], c.run)
		}
	}
	for _, host := range hosts {
		if !slices.Equal(worked[host], arrived[host]) {
			t.Errorf("host %s: runs worked in the order\n%v\nwhile their alerts arrived in the order\n%v", host, worked[host], arrived[host])
		}
	}
	if slots, err := st.ListSlots(context.Background()); err != nil || len(slots) != 0 {
		t.Errorf("slots once every run ended: %+v, %v", slots, err)
	}
}

// TestHostOrderAndTakeover kills, with SIGKILL, the gateway whose run holds
// a host while the host's next run waits on the other gateway: the host
// passes on only after the surviving gateway has taken the holder over and
// finished it, never when the dead gateway's lease lapses.
func TestHostOrderAndTakeover(t *testing.T) {
	t.Parallel()
	url := redistest.Open(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gateway.toml")
	writeFile(t, cfg, concurrencyConfig(dir))
	a, b := startServe(t, cfg, url), startServe(t, cfg, url)
	record := filepath.Join(dir, "hosts.log")
	const host = "db-9.example.com"

	holder, err := postRun(a.url, "remediate", fmt.Sprintf(`{"host": %q, "seconds": "6"}`, host))
	if err != nil {
		t.Fatal(err)
	}
	// The holder is working on the host on gateway a.
	for deadline := time.Now().Add(60 * time.Second); len(readHostCalls(t, record)) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the holder never started:\n%s", a.logs)
		}
	}
	next, err := postRun(b.url, "remediate", fmt.Sprintf(`{"host": %q}`, host))
	if err != nil {
		t.Fatal(err)
	}
	st, err := redisstore.OpenURL(context.Background(), url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		run, err := st.RunHeader(ctx, next)
		if err == nil && run.Status == store.RunQueued && run.Queue != nil && slices.Equal(run.Queue.WaitingFor, []string{holder}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the next run never waited for the holder: %+v, %v", run, err)
		}
	}

	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, _ = a.cmd.Process.Wait()
	killed := float64(time.Now().UnixNano()) / 1e9

	runs := waitAllEnded(t, st, []string{holder, next})
	for id, run := range runs {
		if run.Status != store.RunSucceeded {
			t.Errorf("run %s ended %s: %+v", id, run.Status, run.Error)
		}
	}
	calls := readHostCalls(t, record)
	checkNoOverlap(t, calls, killed)
	var holderCalls, nextCalls []hostCall
	for _, c := range calls {
		switch c.run {
		case holder:
			holderCalls = append(holderCalls, c)
		case next:
			nextCalls = append(nextCalls, c)
		}
	}
	// The holder's call on the dead gateway, cut short by the kill (a
	// script that outlived it would have recorded its end before the
	// taker's call did), then the one its taker made.
	if len(holderCalls) != 2 || len(nextCalls) != 1 {
		t.Fatalf("calls of the holder %+v and of the next run %+v; want the holder's twice (before and after the takeover), the next run's once", holderCalls, nextCalls)
	}
	sort.Slice(holderCalls, func(i, j int) bool { return holderCalls[i].start < holderCalls[j].start })
	if cut := holderCalls[0]; cut.end != 0 && cut.end > killed {
		t.Errorf("the dead gateway's call worked on the host until %.6f, after the kill at %.6f", cut.end, killed)
	}
	if taken := holderCalls[1]; taken.end == 0 || nextCalls[0].start < taken.end {
		t.Errorf("the next run started on the host at %.6f, before the holder's taker was done with it at %.6f", nextCalls[0].start, taken.end)
	}
	// The holder was taken over (run_resumed) before the next run took the
	// host (run_dequeued), in the store's own logs.
	resumed, dequeued := eventTime(t, st, holder, store.EventRunResumed), eventTime(t, st, next, store.EventRunDequeued)
	if resumed.IsZero() || dequeued.IsZero() || dequeued.Before(resumed) || dequeued.Before(runs[holder].FinishedAt) {
		t.Errorf("the holder was resumed at %v and ended at %v; the next run took the host at %v", resumed, runs[holder].FinishedAt, dequeued)
	}
}

func eventTime(t *testing.T, st store.Store, id string, typ store.EventType) time.Time {
	t.Helper()
	evs, err := st.Events(context.Background(), id, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		if ev.Type == typ {
			return ev.Time
		}
	}
	return time.Time{}
}
