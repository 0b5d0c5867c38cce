package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/loader"
	"github.com/chaingate/gateway/chain/store"
)

const approvalChains = `
[[chains]]
name = "restart"
[[chains.steps]]
name = "ask"
timeout_seconds = TIMEOUT
approval = { message = "Restart <<origin.payload.host>>?", on_timeout = "ON_TIMEOUT", on_reject = "ON_REJECT" }
branches = [{ when = 'result.body.decision == "reject"', target = "told" }]
[[chains.steps]]
name = "do-it"
provider = "echo"
payload_template = { restarted = "<<origin.payload.host>>", by = "<<steps.ask.body.by>>", why = "<<steps.ask.body.comment ?? \"\">>" }
default_next = "end"
[[chains.steps]]
name = "told"
provider = "echo"
payload_template = { kept = "<<origin.payload.host>>", by = "<<steps.ask.body.by>>" }

[[chains]]
name = "plain"
[[chains.steps]]
name = "call"
provider = "faulty"
payload_template = { sleep_ms = 3000 }
[[chains.steps]]
name = "ask"
approval = {}
`

func approvalHarness(t *testing.T, timeout, onTimeout, onReject string, opts ...harnessOption) *harness {
	cfg := strings.NewReplacer("TIMEOUT", timeout, "ON_TIMEOUT", onTimeout, "ON_REJECT", onReject).Replace(approvalChains)
	return newHarness(t, cfg, opts...)
}

// waitWaiting waits for the run's approval step to wait for its answer,
// and returns its record.
func waitWaiting(t *testing.T, h *harness, id string) *store.StepRecord {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		recs, _ := h.store.Steps(context.Background(), id, "")
		for _, rec := range recs {
			if rec.Key == "ask" && rec.Status == store.StepRunning {
				return rec
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s never waited at its approval step", id)
		}
	}
}

func stepBody(t *testing.T, h *harness, id, key string) map[string]any {
	t.Helper()
	recs, _ := h.store.Steps(context.Background(), id, "")
	for _, rec := range recs {
		if rec.Key == key {
			var m map[string]any
			_ = json.Unmarshal(rec.Body, &m)
			return m
		}
	}
	t.Fatalf("run %s has no step %s", id, key)
	return nil
}

func TestApprovalDecisions(t *testing.T) {
	for _, tc := range []struct {
		name              string
		onReject, decide  string
		status            store.RunStatus
		last              string
		lastBody, message string
	}{
		{name: "approved", onReject: "fail", decide: "approve", status: store.RunSucceeded, last: "do-it",
			lastBody: `"by":"alice (API)"`, message: "approved by alice (API): disk is safe"},
		{name: "rejected fails the step", onReject: "fail", decide: "reject", status: store.RunFailed, last: "ask",
			message: "rejected by alice (API): disk is safe"},
		{name: "rejected and continued branches", onReject: "continue", decide: "reject", status: store.RunSucceeded, last: "told",
			lastBody: `"kept":"db-1"`, message: "rejected by alice (API): disk is safe"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := approvalHarness(t, "0", "fail", tc.onReject)
			ctx := context.Background()
			run, err := h.eng.Start(ctx, "restart", engine.Input{Payload: json.RawMessage(`{"host":"db-1"}`)})
			if err != nil {
				t.Fatal(err)
			}
			waitWaiting(t, h, run.ID)
			if body := stepBody(t, h, run.ID, "ask"); body["message"] != "Restart db-1?" {
				t.Errorf("the waiting step's body: %v", body)
			}
			d, err := h.eng.Signal(engine.WithActor(ctx, "alice (API)"), run.ID, "ask", tc.decide, "disk is safe")
			if err != nil || d.By != "alice (API)" {
				t.Fatalf("signal: %+v %v", d, err)
			}
			// The second answer is refused, naming the first.
			_, err = h.eng.Signal(engine.WithActor(ctx, "bob (console)"), run.ID, "ask", "approve", "")
			var answered *engine.AnsweredError
			if !errors.As(err, &answered) || answered.First.By != "alice (API)" || !strings.Contains(err.Error(), "already answered: "+tc.decide+" by alice (API)") {
				t.Errorf("a second answer: %v", err)
			}
			final, err := h.eng.Wait(ctx, run.ID)
			if err != nil || final.Status != tc.status {
				t.Fatalf("run ended %v %v, want %s", final, err, tc.status)
			}
			if got := final.Path[len(final.Path)-1]; got != tc.last {
				t.Errorf("the run's last step is %s, want %s", got, tc.last)
			}
			if tc.lastBody != "" {
				if b, _ := json.Marshal(stepBody(t, h, run.ID, tc.last)); !strings.Contains(string(b), tc.lastBody) {
					t.Errorf("%s's body %s, want %s in it", tc.last, b, tc.lastBody)
				}
			}
			body := stepBody(t, h, run.ID, "ask")
			if body["decision"] != tc.decide || body["by"] != "alice (API)" || body["comment"] != "disk is safe" || body["message"] != "Restart db-1?" {
				t.Errorf("the approval's body: %v", body)
			}
			if events := strings.Join(h.eventMessages(run.ID), "\n"); !strings.Contains(events, tc.message) || !strings.Contains(events, "waiting for approval: Restart db-1?") {
				t.Errorf("the run's events:\n%s", events)
			}
		})
	}
}

func TestApprovalTimeout(t *testing.T) {
	for _, tc := range []struct {
		onTimeout string
		status    store.RunStatus
		stepSays  string
	}{
		{"approve", store.RunSucceeded, "approved: no answer within the step's timeout"},
		{"reject", store.RunFailed, "rejected: no answer within the step's timeout"},
		{"fail", store.RunFailed, `no answer to step "ask" within 1s`},
	} {
		t.Run(tc.onTimeout, func(t *testing.T) {
			h := approvalHarness(t, "1", tc.onTimeout, "fail")
			ctx := context.Background()
			run, err := h.eng.Start(ctx, "restart", engine.Input{Payload: json.RawMessage(`{"host":"db-1"}`)})
			if err != nil {
				t.Fatal(err)
			}
			final, err := h.eng.Wait(ctx, run.ID)
			if err != nil || final.Status != tc.status {
				t.Fatalf("run ended %v %v, want %s", final, err, tc.status)
			}
			if events := strings.Join(h.eventMessages(run.ID), "\n"); !strings.Contains(events, tc.stepSays) {
				t.Errorf("the run's events:\n%s", events)
			}
		})
	}
}

func TestApprovalRefusals(t *testing.T) {
	h := approvalHarness(t, "0", "fail", "fail")
	ctx := context.Background()
	run, err := h.eng.Start(ctx, "plain", engine.Input{Payload: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		step, decision string
		want           error
		says           string
	}{
		{"ask", "approve", engine.ErrNotWaiting, "it is not reached yet"},
		{"call", "approve", engine.ErrNotWaiting, "it is a provider step, not an approval step"},
		{"nope", "approve", store.ErrNotFound, `chain "plain" has no step "nope"`},
		{"ask", "maybe", engine.ErrNotWaiting, `decision "maybe" is not approve or reject`},
	} {
		if _, err := h.eng.Signal(ctx, run.ID, tc.step, tc.decision, ""); !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("signal %s %s: %v, want %v saying %q", tc.step, tc.decision, err, tc.want, tc.says)
		}
	}
	if _, err := h.eng.Signal(ctx, "01nosuchrun", "ask", "approve", ""); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("an unknown run: %v", err)
	}
}

// TestApprovalAcrossRestart answers a run whose gateway stopped while it
// waited, before any gateway resumed it: the next one finds the answer.
func TestApprovalAcrossRestart(t *testing.T) {
	db := filepath.Join(t.TempDir(), "gw.db")
	h := approvalHarness(t, "0", "fail", "fail", atStore(db))
	ctx := context.Background()
	run, err := h.eng.Start(ctx, "restart", engine.Input{Payload: json.RawMessage(`{"host":"db-2"}`)})
	if err != nil {
		t.Fatal(err)
	}
	waitWaiting(t, h, run.ID)
	h.close()
	// The same store, no engine advancing the run: the answer is durable.
	h2 := approvalHarness(t, "0", "fail", "fail", atStore(db))
	if _, err := h2.eng.Signal(engine.WithActor(ctx, "carol (API)"), run.ID, "ask", "approve", "after hours"); err != nil {
		t.Fatal(err)
	}
	if _, err := h2.eng.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	final, err := h2.eng.Wait(ctx, run.ID)
	if err != nil || final.Status != store.RunSucceeded {
		t.Fatalf("after the restart: %v %v", final, err)
	}
	if body := stepBody(t, h2, run.ID, "do-it"); body["by"] != "carol (API)" || body["restarted"] != "db-2" {
		t.Errorf("the step after the approval: %v", body)
	}
}

// eventMessages lists a run's persisted events as "type step: message".
func (h *harness) eventMessages(runID string) []string {
	h.t.Helper()
	evs, err := h.store.Events(context.Background(), runID, 0, 0)
	if err != nil {
		h.t.Fatal(err)
	}
	var out []string
	for _, ev := range evs {
		out = append(out, string(ev.Type)+" "+ev.Step+": "+ev.Message)
	}
	return out
}

// TestApprovalCancelAndReplay cancels a run waiting for an answer, then
// replays it: the replay waits for an answer of its own, and the first
// wait's answer is not reused.
func TestApprovalCancelAndReplay(t *testing.T) {
	h := approvalHarness(t, "0", "fail", "fail")
	ctx := engine.WithActor(context.Background(), "alice (API)")
	run, err := h.eng.Start(ctx, "restart", engine.Input{Payload: json.RawMessage(`{"host":"db-3"}`)})
	if err != nil {
		t.Fatal(err)
	}
	waitWaiting(t, h, run.ID)
	if err := h.eng.Cancel(ctx, run.ID); err != nil {
		t.Fatal(err)
	}
	final, err := h.eng.Wait(ctx, run.ID)
	if err != nil || final.Status != store.RunCancelled {
		t.Fatalf("cancelled: %v %v", final, err)
	}
	if _, err := h.eng.Signal(ctx, run.ID, "ask", "approve", ""); !errors.Is(err, engine.ErrFinished) {
		t.Errorf("an answer to a cancelled run: %v", err)
	}
	if _, err := h.eng.ReplayRun(ctx, run.ID, engine.ReplayOptions{Mode: engine.ReplayResume}); err != nil {
		t.Fatal(err)
	}
	waitWaiting(t, h, run.ID)
	if _, err := h.eng.Signal(ctx, run.ID, "ask", "reject", "not now"); err != nil {
		t.Fatalf("the replay's own answer: %v", err)
	}
	final, err = h.eng.Wait(ctx, run.ID)
	if err != nil || final.Status != store.RunFailed {
		t.Fatalf("after the replay's answer: %v %v", final, err)
	}
}

// at is a clock stopped at t.
func at(t time.Time) func() time.Time { return func() time.Time { return t } }

// TestApprovalDeadline answers a waiting step just before its recorded
// deadline, at it and after it, through the gateway advancing the run and
// through another one sharing its store, with each gateway's clock set
// rather than waited for: an answer before the deadline stands, one at or
// after it is refused and the run goes on as on_timeout says. Once a late
// answer is refused, no gateway can answer any more, even one whose clock
// is behind.
func TestApprovalDeadline(t *testing.T) {
	for _, tc := range []struct {
		name, onTimeout, decide string
		other                   bool // answered through the other gateway
		offset                  time.Duration
		late                    bool
		status                  store.RunStatus
		stepSays                string
	}{
		{name: "approved just before", onTimeout: "reject", decide: "approve", offset: -time.Millisecond,
			status: store.RunSucceeded, stepSays: "approved by alice (API)"},
		{name: "approved at the deadline", onTimeout: "reject", decide: "approve", late: true,
			status: store.RunFailed, stepSays: "rejected: no answer within the step's timeout"},
		{name: "approved late through another gateway", onTimeout: "reject", decide: "approve", other: true, offset: 800 * time.Millisecond, late: true,
			status: store.RunFailed, stepSays: "rejected: no answer within the step's timeout"},
		{name: "rejected late with on_timeout approve", onTimeout: "approve", decide: "reject", other: true, offset: 6500 * time.Millisecond, late: true,
			status: store.RunSucceeded, stepSays: "approved: no answer within the step's timeout"},
		{name: "approved late with on_timeout fail", onTimeout: "fail", decide: "approve", offset: time.Second, late: true,
			status: store.RunFailed, stepSays: `no answer to step "ask" within 600s`},
		{name: "rejected before through another gateway", onTimeout: "approve", decide: "reject", other: true, offset: -time.Minute,
			status: store.RunFailed, stepSays: "rejected by alice (API)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := approvalHarness(t, "600", tc.onTimeout, "fail")
			other := approvalHarness(t, "600", tc.onTimeout, "fail", sharing(h.store))
			ctx := engine.WithActor(context.Background(), "alice (API)")
			run, err := h.eng.Start(ctx, "restart", engine.Input{Payload: json.RawMessage(`{"host":"db-1"}`)})
			if err != nil {
				t.Fatal(err)
			}
			deadline := waitWaiting(t, h, run.ID).Deadline
			if deadline.IsZero() {
				t.Fatal("the waiting step has no deadline")
			}
			answering, behind := h, other
			if tc.other {
				answering, behind = other, h
			}
			answering.eng.SetClock(at(deadline.Add(tc.offset)))
			behind.eng.SetClock(at(deadline.Add(-time.Hour)))

			d, err := answering.eng.Signal(ctx, run.ID, "ask", tc.decide, "")
			var late *engine.LateError
			switch {
			case tc.late && (!errors.As(err, &late) || !late.Deadline.Equal(deadline) || late.OnTimeout != tc.onTimeout):
				t.Fatalf("a late answer: %+v %v, want it refused as late", d, err)
			case tc.late && !strings.Contains(err.Error(), "the step's deadline was "+deadline.UTC().Format("2006-01-02T15:04:05.000Z")):
				t.Errorf("the refusal does not name the deadline: %v", err)
			case !tc.late && (err != nil || !d.At.Before(deadline)):
				t.Fatalf("an answer in time: %+v %v", d, err)
			}
			// A gateway whose clock is behind answers next: the first
			// answer stands, the timeout's included.
			_, err = behind.eng.Signal(engine.WithActor(ctx, "bob (API)"), run.ID, "ask", "approve", "")
			var answered *engine.AnsweredError
			if tc.late && (!errors.As(err, &late) || !strings.Contains(err.Error(), "was reached first")) || !tc.late && !errors.As(err, &answered) {
				t.Errorf("a later answer through a gateway whose clock is behind: %v", err)
			}

			final, err := h.eng.Wait(ctx, run.ID)
			if err != nil || final.Status != tc.status {
				t.Fatalf("run ended %+v %v, want %s", final, err, tc.status)
			}
			if events := strings.Join(h.eventMessages(run.ID), "\n"); !strings.Contains(events, tc.stepSays) {
				t.Errorf("the run's events:\n%s", events)
			}
			if tc.onTimeout != "fail" {
				if body := stepBody(t, h, run.ID, "ask"); (body["timed_out"] == true) != tc.late {
					t.Errorf("the approval's body: %v", body)
				}
			}
		})
	}
}

// TestApprovalAnswersRacingTheDeadline answers one waiting step many times
// at once through two gateways, one whose clock reads just before the
// deadline and one just after: one answer stands, whichever it is, every
// other is refused naming it, and the run goes on as it says.
func TestApprovalAnswersRacingTheDeadline(t *testing.T) {
	h := approvalHarness(t, "600", "reject", "fail")
	other := approvalHarness(t, "600", "reject", "fail", sharing(h.store))
	ctx := context.Background()
	run, err := h.eng.Start(ctx, "restart", engine.Input{Payload: json.RawMessage(`{"host":"db-1"}`)})
	if err != nil {
		t.Fatal(err)
	}
	deadline := waitWaiting(t, h, run.ID).Deadline
	h.eng.SetClock(at(deadline.Add(-time.Millisecond)))
	other.eng.SetClock(at(deadline.Add(time.Millisecond)))
	const n = 16
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		eng := h.eng
		if i%2 == 1 {
			eng = other.eng
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = eng.Signal(engine.WithActor(ctx, fmt.Sprintf("user%d (API)", i)), run.ID, "ask", "approve", "")
		}()
	}
	wg.Wait()
	winner := -1
	for i, err := range errs {
		if err == nil {
			if winner >= 0 {
				t.Fatalf("answers %d and %d both stand", winner, i)
			}
			winner = i
		}
	}
	want := store.RunFailed
	for i, err := range errs {
		var late *engine.LateError
		var answered *engine.AnsweredError
		switch {
		case i == winner:
		case winner < 0 && !errors.As(err, &late):
			t.Errorf("answer %d, after the timeout stood: %v", i, err)
		case winner >= 0 && (!errors.As(err, &answered) || answered.First.By != fmt.Sprintf("user%d (API)", winner)):
			t.Errorf("answer %d, after answer %d stood: %v", i, winner, err)
		}
	}
	if winner >= 0 {
		if winner%2 == 1 {
			t.Errorf("answer %d stands, given after the deadline", winner)
		}
		want = store.RunSucceeded
	}
	if final, err := h.eng.Wait(ctx, run.ID); err != nil || final.Status != want {
		t.Fatalf("run ended %+v %v, want %s (answer %d stood)", final, err, want, winner)
	}
}

// TestApprovalStatsAndLogs follows one approval answered in time and one
// answered late through the engine's statistics and its log: a line when
// the step starts waiting, when it is answered (by whom, how), when a late
// answer is refused, and when it times out.
func TestApprovalStatsAndLogs(t *testing.T) {
	var logs logLines
	h := approvalHarness(t, "600", "reject", "fail", withLogger(logs.logger()))
	ctx := engine.WithActor(context.Background(), "alice (API)")
	var before engine.ApprovalStats
	for _, late := range []bool{false, true} {
		run, err := h.eng.Start(ctx, "restart", engine.Input{Payload: json.RawMessage(`{"host":"db-1"}`)})
		if err != nil {
			t.Fatal(err)
		}
		deadline := waitWaiting(t, h, run.ID).Deadline
		if st := h.eng.Approvals(); st.Waiting != 1 {
			t.Errorf("waiting: %+v", st)
		}
		h.eng.SetClock(at(deadline.Add(-time.Second)))
		if late {
			h.eng.SetClock(at(deadline.Add(time.Second)))
		}
		if _, err := h.eng.Signal(ctx, run.ID, "ask", "approve", ""); (err != nil) != late {
			t.Fatalf("answer (late %v): %v", late, err)
		}
		if _, err := h.eng.Wait(ctx, run.ID); err != nil {
			t.Fatal(err)
		}
		want := engine.ApprovalStats{Approved: before.Approved + 1, TimedOut: before.TimedOut}
		if late {
			want = engine.ApprovalStats{Approved: before.Approved, TimedOut: before.TimedOut + 1}
		}
		if st := h.eng.Approvals(); st != want {
			t.Errorf("after the answer (late %v): %+v, want %+v", late, st, want)
		}
		before = want
	}
	var got []string
	for _, rec := range logs.records(t) {
		if msg, _ := rec["msg"].(string); strings.HasPrefix(msg, "approval") {
			line := fmt.Sprintf("%s %s step=%v", rec["level"], msg, rec["step"])
			for _, k := range []string{"decision", "by", "on_timeout"} {
				if v, ok := rec[k]; ok {
					line += fmt.Sprintf(" %s=%v", k, v)
				}
			}
			if _, ok := rec["deadline"]; ok {
				line += " with deadline"
			}
			got = append(got, line)
		}
	}
	want := []string{
		"INFO approval waiting step=ask with deadline",
		"INFO approval answered step=ask decision=approve by=alice (API)",
		"INFO approval waiting step=ask with deadline",
		"INFO approval answer refused: the step's deadline had passed step=ask decision=approve by=alice (API) with deadline",
		"INFO approval timed out step=ask on_timeout=reject with deadline",
	}
	if !slices.Equal(got, want) {
		t.Errorf("the approval log lines:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestDecisionIsWhatTheLoaderChecks: an approval step's body is a
// Decision, and the loader checks what conditions and templates read of it
// against loader.ApprovalFields (strings, but timed_out a boolean), so a
// field added here must be added there.
func TestDecisionIsWhatTheLoaderChecks(t *testing.T) {
	d := engine.Decision{Decision: "approve", By: "alice", Comment: "ok", At: time.Now(), TimedOut: true, Message: "restart?"}
	raw, _ := json.Marshal(d)
	var body map[string]any
	if err := json.Unmarshal(raw, &body); err != nil {
		t.Fatal(err)
	}
	if len(body) != len(loader.ApprovalFields) {
		t.Errorf("a decision holds %v, the loader checks %v", body, loader.ApprovalFields)
	}
	for _, name := range loader.ApprovalFields {
		v, ok := body[name]
		_, isBool := v.(bool)
		_, isString := v.(string)
		switch {
		case !ok:
			t.Errorf("the loader checks field %q, which a decision does not hold: %s", name, raw)
		case name == "timed_out" && !isBool, name != "timed_out" && !isString:
			t.Errorf("field %q is %T", name, v)
		}
	}
}

// TestWaitingIsAState: a run waiting on a person is stored as waiting, is
// listed by that status and is not finished; answered, it runs again.
func TestWaitingIsAState(t *testing.T) {
	h := approvalHarness(t, "600", "fail", "fail")
	ctx := context.Background()
	run, err := h.eng.Start(ctx, "restart", engine.Input{Payload: json.RawMessage(`{"host":"db-1"}`)})
	if err != nil {
		t.Fatal(err)
	}
	waitWaiting(t, h, run.ID)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		stored, err := h.store.RunHeader(ctx, run.ID)
		if err != nil {
			t.Fatal(err)
		}
		if stored.Status == store.RunWaiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("run is %s while its approval step waits, want waiting", stored.Status)
		}
	}
	if store.RunWaiting.Final() {
		t.Error("waiting counts as final")
	}
	page, err := h.store.ListRuns(ctx, store.RunFilter{Status: store.RunWaiting})
	if err != nil || len(page.Runs) != 1 || page.Runs[0].ID != run.ID {
		t.Fatalf("runs listed as waiting: %v %+v", err, page.Runs)
	}
	if ids, _ := h.store.UnfinishedRuns(ctx); len(ids) != 1 {
		t.Errorf("unfinished runs: %v", ids)
	}
	if _, err := h.eng.Signal(engine.WithActor(ctx, "alice"), run.ID, "ask", "approve", ""); err != nil {
		t.Fatal(err)
	}
	final, err := h.eng.Wait(ctx, run.ID)
	if err != nil || final.Status != store.RunSucceeded {
		t.Fatalf("after the answer: %v %+v", err, final)
	}
	var statuses []string
	events, _ := h.store.Events(ctx, run.ID, 0, 0)
	for _, ev := range events {
		statuses = append(statuses, string(ev.Type))
	}
	if page, _ := h.store.ListRuns(ctx, store.RunFilter{Status: store.RunWaiting}); len(page.Runs) != 0 {
		t.Errorf("still listed as waiting after it ended: %+v (events %v)", page.Runs, statuses)
	}
}
