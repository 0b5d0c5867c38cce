package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/gateway/events"
	"github.com/chaingate/gateway/gateway/metrics"
	"github.com/chaingate/gateway/gateway/schedules"
	"github.com/chaingate/gateway/gateway/server"
	"github.com/chaingate/gateway/internal/testutil/redistest"
)

const scheduleConfig = `
[[schedules]]
name = "every-5m"
chain = "tick"
every = "5m"
payload = { at = "<<schedule.tick>>", by = "<<schedule.name>>" }

[[schedules]]
name = "nightly"
chain = "tick"
cron = "0 3 * * *"
timezone = "Europe/Paris"
catch_up = true

[[chains]]
name = "tick"
[[chains.steps]]
name = "call"
provider = "echo"
payload_template = "<<origin.payload>>"

`

func at(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// fired sums up a check's ticks as "schedule tick action".
func fired(fs []schedules.ScheduleFire) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Schedule+" "+f.Tick.UTC().Format(time.RFC3339)+" "+f.Action)
	}
	return out
}

func sameList(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestScheduleTicks drives the scheduler with chosen times: a schedule
// seen for the first time owes its latest tick only when it catches up; a
// tick starts once however often it is checked; ticks that passed while
// nothing checked start only the latest; a cron reads its time zone.
func TestScheduleTicks(t *testing.T) {
	t.Parallel()
	env := newAPI(t, scheduleConfig)
	sc := env.srv.Scheduler()
	ctx := context.Background()
	steps := []struct {
		now  string
		want []string
	}{
		// Start-up: nightly catches up 03:00 Paris (02:00 UTC) of the 25th;
		// every-5m does not catch up.
		{"2026-11-25T09:02:10Z", []string{"nightly 2026-11-25T02:00:00Z started"}},
		{"2026-11-25T09:04:59Z", nil},
		{"2026-11-25T09:05:00Z", []string{"every-5m 2026-11-25T09:05:00Z started"}},
		{"2026-11-25T09:05:00Z", nil},
		{"2026-11-25T09:07:00Z", nil},
		// Half an hour without a check: the latest tick only.
		{"2026-11-25T09:38:00Z", []string{"every-5m 2026-11-25T09:35:00Z started"}},
		{"2026-11-26T02:00:00Z", []string{"every-5m 2026-11-26T02:00:00Z started", "nightly 2026-11-26T02:00:00Z started"}},
	}
	var runs []string
	for i, step := range steps {
		got := sc.Due(ctx, at(t, step.now))
		if !sameList(fired(got), step.want) {
			t.Fatalf("step %d at %s: %v, want %v", i, step.now, fired(got), step.want)
		}
		for _, f := range got {
			runs = append(runs, f.Run)
		}
	}
	v := waitRunEnd(t, env, runs[1])
	var payload map[string]string
	_ = json.Unmarshal(v.Origin.Payload, &payload)
	if payload["at"] != "2026-11-25T09:05:00Z" || payload["by"] != "every-5m" {
		t.Errorf("the tick's payload: %s", v.Origin.Payload)
	}
	v = waitRunEnd(t, env, runs[0])
	var meta map[string]string
	_ = json.Unmarshal(v.Origin.Metadata, &meta)
	if meta["schedule"] != "nightly" || meta["tick"] != "2026-11-25T03:00:00+01:00" {
		t.Errorf("the nightly run's metadata: %s", v.Origin.Metadata)
	}
	for _, id := range runs {
		if v := waitRunEnd(t, env, id); v.Status != "succeeded" {
			t.Errorf("run %s is %s", id, v.Status)
		}
	}
	// A tick's claim, and so its run's key, lasts until a minute past the
	// next tick: no longer, or a 1-second schedule would hold a week of
	// claims.
	for i, want := range map[int]time.Duration{0: 24*time.Hour + time.Minute, 1: 6 * time.Minute} {
		v := waitRunEnd(t, env, runs[i])
		if held := v.KeyUntil.Sub(v.CreatedAt); held < want-10*time.Second || held > want+10*time.Second {
			t.Errorf("run %d's key holds %s after it started, want about %s", i, held, want)
		}
	}

	// A gateway restarting after the nightly tick ran starts it no more.
	restarted := server.NewServer(env.gw, events.NewHub(), metrics.NewMetrics(), nil)
	if got := restarted.Scheduler().Due(ctx, at(t, "2026-11-26T02:30:00Z")); len(got) != 1 || got[0].Action != "replayed" || got[0].Run != runs[len(runs)-1] {
		t.Errorf("a restart after the tick: %+v", got)
	}
}

// TestScheduleClaimedTickStarts: a gateway that claimed a tick and died
// before starting its run leaves the start to the next gateway to look,
// even for a schedule that does not catch up.
func TestScheduleClaimedTickStarts(t *testing.T) {
	t.Parallel()
	env := newAPI(t, scheduleConfig)
	ctx := context.Background()
	if _, err := env.gw.Store.ClaimKey(ctx, "schedule/every-5m/2026-11-25T09:05:00Z", "01deadgatewayclaim0000000", time.Hour); err != nil {
		t.Fatal(err)
	}
	got := env.srv.Scheduler().Due(ctx, at(t, "2026-11-25T09:06:00Z"))
	var started []schedules.ScheduleFire
	for _, f := range got {
		if f.Schedule == "every-5m" {
			started = append(started, f)
		}
	}
	if len(started) != 1 || started[0].Action != "started" || started[0].Run != "01deadgatewayclaim0000000" {
		t.Fatalf("the claimed tick: %+v", got)
	}
	waitRunEnd(t, env, started[0].Run)
}

// TestScheduleOnceAcrossGateways has two gateways on one Redis check the
// same tick at once: one run between them.
func TestScheduleOnceAcrossGateways(t *testing.T) {
	t.Parallel()
	state := redistest.Open(t)
	a, b := newAPIOn(t, scheduleConfig, state), newAPIOn(t, scheduleConfig, state)
	ctx := context.Background()
	for _, env := range []*apiEnv{a, b} {
		env.srv.Scheduler().Due(ctx, at(t, "2026-11-25T09:02:00Z"))
	}
	for i, tick := range []string{"2026-11-25T09:05:00Z", "2026-11-25T09:10:00Z", "2026-11-25T09:15:00Z"} {
		var wg sync.WaitGroup
		results := make([][]schedules.ScheduleFire, 2)
		for j, env := range []*apiEnv{a, b} {
			wg.Go(func() { results[j] = env.srv.Scheduler().Due(ctx, at(t, tick)) })
		}
		wg.Wait()
		actions := map[string]int{}
		runs := map[string]bool{}
		for _, r := range results {
			for _, f := range r {
				actions[f.Action]++
				runs[f.Run] = true
			}
		}
		if actions["started"] != 1 || actions["replayed"] != 1 || len(runs) != 1 {
			t.Errorf("tick %d: %v", i, results)
		}
		for id := range runs {
			waitRunEnd(t, a, id)
		}
	}
}

func TestSchedulesList(t *testing.T) {
	t.Parallel()
	env := newAPI(t, scheduleConfig)
	env.srv.Scheduler().Due(context.Background(), time.Now())
	var out struct {
		Schedules []api.ScheduleInfo `json:"schedules"`
	}
	if code, _, body := env.call("GET", "/v1/schedules", "", nil, &out); code != http.StatusOK || len(out.Schedules) != 2 {
		t.Fatalf("%d %s", code, body)
	}
	nightly := out.Schedules[1]
	if nightly.Name != "nightly" || nightly.Cron != "0 3 * * *" || nightly.Timezone != "Europe/Paris" || len(nightly.Next) != 3 || !nightly.CatchUp {
		t.Errorf("nightly: %+v", nightly)
	}
	for _, n := range nightly.Next {
		if n.In(nightly.Next[0].Location()).Hour() != 3 {
			t.Errorf("nightly's next tick %s is not at 03:00 Paris time", n)
		}
	}
	if nightly.LastRun == "" {
		t.Errorf("nightly caught up its last tick, and the list does not show its run: %+v", nightly)
	} else if _, err := env.gw.Store.Run(context.Background(), nightly.LastRun); err != nil {
		t.Errorf("nightly's last run: %v", err)
	}
	if every := out.Schedules[0]; every.Every != "5m0s" || every.Next[1].Sub(every.Next[0]) != 5*time.Minute {
		t.Errorf("every-5m: %+v", every)
	}
}

// TestChainPageSaysWhatStartsIt shows a chain's triggers and schedules on
// its console page.
func TestChainPageSaysWhatStartsIt(t *testing.T) {
	t.Parallel()
	env := newAPI(t, scheduleConfig+`
[[triggers]]
name = "hook"
type = "webhook"
chain = "tick"
`)
	_, _, body := newBrowser(t, env).get("/ui/chains/tick")
	for _, want := range []string{"trigger hook (webhook): POST /v1/triggers/hook", "schedule every-5m: every 5m0s, next at", "schedule nightly: cron 0 3 * * * Europe/Paris, next at"} {
		if !strings.Contains(body, want) {
			t.Errorf("the chain's page does not say %q", want)
		}
	}
}
