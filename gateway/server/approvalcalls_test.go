package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/gateway/approvals"
)

// fakeClock is a clock that moves only when a test moves it, so a test of
// what happens when says so in the clock's time, whatever the machine's
// load.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers map[*fakeTimer]time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Now().UTC().Truncate(time.Second), timers: map[*fakeTimer]time.Time{}}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTimer() engine.Timer { return &fakeTimer{c: c, ch: make(chan time.Time, 1)} }

// set moves the clock to at, and fires the timers due by then.
func (c *fakeClock) set(at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = at
	for t, due := range c.timers {
		if !due.After(at) {
			delete(c.timers, t)
			t.fire(at)
		}
	}
}

type fakeTimer struct {
	c  *fakeClock
	ch chan time.Time
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Set(at time.Time) {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	t.drain()
	if !at.After(t.c.now) {
		delete(t.c.timers, t)
		t.fire(t.c.now)
		return
	}
	t.c.timers[t] = at
}

func (t *fakeTimer) Stop() {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	delete(t.c.timers, t)
	t.drain()
}

func (t *fakeTimer) fire(at time.Time) {
	select {
	case t.ch <- at:
	default:
	}
}

func (t *fakeTimer) drain() {
	select {
	case <-t.ch:
	default:
	}
}

// runApprovalLoop runs env's approval loop until the test ends, or until
// the function it returns is called.
func runApprovalLoop(t *testing.T, env *apiEnv) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		approvals.New(env.gw).Run(ctx, env.hub)
	}()
	stop = func() {
		cancel()
		<-done
	}
	t.Cleanup(stop)
	return stop
}

// recordedCalls reads the calls a faulty provider recorded in file, each
// its payload with the action type as "action".
func recordedCalls(t *testing.T, file string) []map[string]any {
	t.Helper()
	b, _ := os.ReadFile(file)
	var out []map[string]any
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		if line == "" {
			continue
		}
		var c struct {
			Action  string         `json:"action_type"`
			Payload map[string]any `json:"payload"`
		}
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatalf("a recorded call: %v: %s", err, line)
		}
		c.Payload["action"] = c.Action
		out = append(out, c.Payload)
	}
	return out
}

// waitCalls waits for the faulty provider to have recorded n calls.
func waitCalls(t *testing.T, file string, n int) []map[string]any {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		got := recordedCalls(t, file)
		if len(got) >= n || time.Now().After(deadline) {
			if len(got) != n {
				t.Fatalf("%d calls, want %d: %v", len(got), n, got)
			}
			return got
		}
	}
}

const approvalCallsConfig = `external_url = "https://gw.example.com"

[gateway.auth]
tokens = ["full-tok"]

[[providers]]
name = "pager"
type = "faulty"

[[chains]]
name = "restart"
[[chains.steps]]
name = "ask"
timeout_seconds = 7200
[chains.steps.approval]
message = "Restart <<origin.payload.host>>?"
notify = { provider = "pager", action_type = "post", remind_every = "EVERY", payload_template = { record = "REC", text = "<<approval.message>> <<approval.url>>", reminder = "<<approval.reminder>>", host = "<<origin.payload.host>>" } }
escalate = { provider = "pager", action_type = "page", after = "AFTER", payload_template = { record = "REC", text = "nobody answered: <<approval.message>>" } }
[[chains.steps]]
name = "do-it"
provider = "echo"
payload_template = { ok = true }
`

// TestApprovalCalls: an approval step that waits notifies as it starts
// waiting, with the clock where it was; reminds on the second each
// remind_every comes, the floor of one second included, sending of the
// reminders due only the latest; escalates once, on the second after
// says; and calls nothing more once answered. Time is a fake clock's,
// moved by the test.
func TestApprovalCalls(t *testing.T) {
	t.Parallel()
	type tick struct {
		at time.Duration
		// calls are the calls made by then, each its action and, for a
		// notification, its number.
		calls []string
	}
	for _, tc := range []struct {
		name, every, after string
		// late starts the approval loop only once the step has waited
		// this long, as when every gateway was stopped.
		late  time.Duration
		ticks []tick
	}{
		{"every second", "1s", "3s", 0, []tick{
			{0, []string{"post 0"}},
			{time.Second, []string{"post 0", "post 1"}},
			{2 * time.Second, []string{"post 0", "post 1", "post 2"}},
			{3 * time.Second, []string{"post 0", "post 1", "post 2", "page", "post 3"}},
			{10 * time.Second, []string{"post 0", "post 1", "post 2", "page", "post 3", "post 10"}},
		}},
		{"every ten minutes", "10m", "30m", 0, []tick{
			{0, []string{"post 0"}},
			{10*time.Minute - time.Second, []string{"post 0"}},
			{10 * time.Minute, []string{"post 0", "post 1"}},
			{25 * time.Minute, []string{"post 0", "post 1", "post 2"}},
			{30 * time.Minute, []string{"post 0", "post 1", "post 2", "page", "post 3"}},
		}},
		{"a loop that starts late", "10m", "1h", 25 * time.Minute, []tick{
			{25 * time.Minute, []string{"post 0", "post 2"}},
			{30 * time.Minute, []string{"post 0", "post 2", "post 3"}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rec := filepath.Join(t.TempDir(), "calls.jsonl")
			clock := newFakeClock()
			config := strings.NewReplacer("REC", rec, "EVERY", tc.every, "AFTER", tc.after).Replace(approvalCallsConfig)
			env := newAPIOn(t, config, "", func(o *gateway.Options) { o.Clock = clock })
			env.token = "full-tok"
			if tc.late == 0 {
				runApprovalLoop(t, env)
			}
			ctx := context.Background()
			id := startRun(t, env, "restart", `{"host": "db-1"}`)
			waitAsking(t, env, id, "ask")
			recs, err := env.gw.Store.Steps(ctx, id, "ask")
			if err != nil || len(recs) != 1 {
				t.Fatalf("the step: %v %v", recs, err)
			}
			asked := recs[0].StartedAt
			var got []map[string]any
			for _, tk := range tc.ticks {
				clock.set(asked.Add(tk.at))
				if tc.late != 0 && tk.at == tc.late {
					runApprovalLoop(t, env)
				}
				got = waitCalls(t, rec, len(tk.calls))
				var said []string
				for _, c := range got {
					if c["action"] == "post" {
						said = append(said, fmt.Sprintf("post %v", c["reminder"]))
					} else {
						said = append(said, c["action"].(string))
					}
				}
				// Calls made together may be recorded in either order.
				if !sameCalls(said, tk.calls) {
					t.Fatalf("at +%s: calls %q, want %q", tk.at, said, tk.calls)
				}
			}
			for _, c := range got {
				if c["action"] == "post" && (c["text"] != "Restart db-1? https://gw.example.com/ui/runs/"+id+"/steps/ask" || c["host"] != "db-1") {
					t.Errorf("a notification: %v", c)
				}
			}
			// Each call is noted on the run once made.
			waitNotes(t, env, id, `approval step "ask": `, len(got))
			events, _ := env.gw.Store.Events(ctx, id, 0, 0)
			var notes []string
			for _, ev := range events {
				if ev.Type == store.EventNote {
					notes = append(notes, ev.Message)
				}
			}
			if len(notes) != len(got) || !strings.Contains(strings.Join(notes, "\n"), `approval step "ask": notified through pager`) ||
				!strings.Contains(strings.Join(notes, "\n"), `approval step "ask": reminded (2) through pager`) {
				t.Errorf("notes on the run: %q", notes)
			}

			if _, err := env.gw.Engine.Signal(engine.WithActor(ctx, "alice"), id, "ask", "approve", ""); err != nil {
				t.Fatal(err)
			}
			waitRunEnd(t, env, id)
			clock.set(asked.Add(2 * time.Hour))
			// Nothing to wait for: a call would come within the moment.
			time.Sleep(100 * time.Millisecond)
			if n := len(recordedCalls(t, rec)); n != len(got) {
				t.Errorf("calls after the answer: %d, want still %d", n, len(got))
			}
		})
	}
}

// waitNotes waits for a run's events to hold n notes that start with
// prefix.
func waitNotes(t *testing.T, env *apiEnv, id, prefix string, n int) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		events, err := env.gw.Store.Events(context.Background(), id, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		var notes []string
		for _, ev := range events {
			if ev.Type == store.EventNote && strings.HasPrefix(ev.Message, prefix) {
				notes = append(notes, ev.Message)
			}
		}
		if len(notes) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s has notes %q, want %d starting %q", id, notes, n, prefix)
		}
	}
}

// sameCalls reports whether got and want hold the same calls, in any
// order: calls due together are made together.
func sameCalls(got, want []string) bool {
	if len(got) != len(want) {
		return false
	}
	count := map[string]int{}
	for i := range got {
		count[got[i]]++
		count[want[i]]--
	}
	for _, n := range count {
		if n != 0 {
			return false
		}
	}
	return true
}
