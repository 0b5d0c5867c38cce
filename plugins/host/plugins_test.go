package host_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/chaingate/gateway/internal/testutil"
	"github.com/chaingate/gateway/plugins/host"
	"github.com/chaingate/gateway/plugins/proto/providerv1"
	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/builtin"
)

func TestMain(m *testing.M) {
	host.ServeBuiltinIfRequested(builtin.New)
	runHostModeIfRequested()
	testutil.QuickRaceExit()
	os.Exit(m.Run())
}

// newManager returns a Manager that re-executes this test binary for
// built-ins, logs as JSON into the returned buffer (shown if the test fails),
// and is closed when the test ends.
func newManager(t testing.TB, opts host.Options) (*host.Manager, *testutil.Buffer) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	opts.Executable = exe
	logs := &testutil.Buffer{}
	opts.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("manager log:\n%s", logs)
		}
	})
	m := host.NewManager(opts)
	if unaryTransport {
		host.UnaryOnly(m)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("closing the manager: %v", err)
		}
	})
	return m, logs
}

func call(t testing.TB, p providers.Provider, payload string) (json.RawMessage, error) {
	t.Helper()
	resp, err := p.Execute(context.Background(), providers.Request{ActionType: "test", Payload: json.RawMessage(payload), DedupKey: "run-1/step", Attempt: 1})
	return resp.Body, err
}

func mustCall(t testing.TB, p providers.Provider, payload string) json.RawMessage {
	t.Helper()
	body, err := call(t, p, payload)
	if err != nil {
		t.Fatalf("Execute(%s): %v", payload, err)
	}
	return body
}

func assertJSON(t testing.TB, got json.RawMessage, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("body %q is not JSON: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	if gs, ws := fmt.Sprint(g), fmt.Sprint(w); gs != ws {
		t.Errorf("body = %s, want %s", got, want)
	}
}

func providerError(t testing.TB, err error) *providers.Error {
	t.Helper()
	var pe *providers.Error
	if !errors.As(err, &pe) {
		t.Fatalf("error %v (%T) is not a *providers.Error", err, err)
	}
	return pe
}

func TestEchoRoundTrip(t *testing.T) {
	m, _ := newManager(t, host.Options{})
	p := m.Provider(host.Spec{Name: "my-echo", Builtin: "echo"})
	if p != m.Provider(host.Spec{Name: "my-echo", Builtin: "echo"}) {
		t.Error("the same name gave two handles")
	}

	info, err := p.Describe(context.Background())
	if err != nil || info.Name != "echo" {
		t.Fatalf("Describe = %+v, %v", info, err)
	}
	for _, payload := range []string{`{"a":1,"b":["x",null,{"c":true}]}`, `"text"`, `[1,2]`, `null`} {
		assertJSON(t, mustCall(t, p, payload), payload)
	}
	if body := mustCall(t, p, ""); string(body) != "null" {
		t.Errorf("empty payload gave body %q, want null", body)
	}
	if m.Restarts("my-echo") != 0 {
		t.Errorf("Restarts = %d, want 0", m.Restarts("my-echo"))
	}
}

// TestInBandErrors checks that a provider error crosses the wire with its
// class, code and message, exactly as the provider returned it in-process.
func TestInBandErrors(t *testing.T) {
	m, _ := newManager(t, host.Options{})
	remote := m.Provider(host.Spec{Name: "faulty", Builtin: "faulty"})
	local, _ := builtin.New("faulty")

	for _, tc := range []struct {
		name, payload string
		retryable     bool
	}{
		{"permanent", `{"fail":"boom: the widget is gone"}`, false},
		{"retryable", `{"fail_retryable":"try later"}`, true},
		{"fail_times", `{"fail_times":2}`, true},
		{"retry after", `{"fail_retryable":"slow down","retry_after_ms":1500}`, true},
		{"bad controls", `{"sleep_ms":"soon"}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, lerr := call(t, local, tc.payload)
			_, rerr := call(t, remote, tc.payload)
			want, got := providerError(t, lerr), providerError(t, rerr)
			if got.Retryable != tc.retryable || got.Retryable != want.Retryable || got.Code != want.Code || got.Message != want.Message || got.RetryAfter != want.RetryAfter {
				t.Errorf("over the wire: %+v, in-process: %+v (want retryable %v)", got, want, tc.retryable)
			}
			if providers.IsRetryable(rerr) != tc.retryable {
				t.Errorf("IsRetryable = %v", !tc.retryable)
			}
		})
	}
	if m.Restarts("faulty") != 0 {
		t.Errorf("errors restarted the plugin %d times", m.Restarts("faulty"))
	}
}

func TestFailTimes(t *testing.T) {
	m, _ := newManager(t, host.Options{})
	p := m.Provider(host.Spec{Name: "faulty", Builtin: "faulty"})
	for attempt := 1; attempt <= 4; attempt++ {
		resp, err := p.Execute(context.Background(), providers.Request{Payload: json.RawMessage(`{"fail_times":2,"x":"y"}`), Attempt: attempt})
		if attempt <= 2 {
			if pe := providerError(t, err); !pe.Retryable {
				t.Errorf("attempt %d: error %v is not retryable", attempt, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("attempt %d: %v", attempt, err)
		}
		assertJSON(t, resp.Body, fmt.Sprintf(`{"fail_times":2,"x":"y","attempt":%d}`, attempt))
	}
}

func TestCancellation(t *testing.T) {
	m, _ := newManager(t, host.Options{})
	p := m.Provider(host.Spec{Name: "faulty", Builtin: "faulty"})
	mustCall(t, p, `{}`) // start the process, so that only the call is timed
	// Unanswered, the calls would hang or sleep two minutes; ending well
	// before that shows the cancellation and deadlines got through, with
	// room for a loaded machine.
	const promptly = 30 * time.Second

	t.Run("hang cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(100*time.Millisecond, cancel)
		start := time.Now()
		_, err := p.Execute(ctx, providers.Request{Payload: json.RawMessage(`{"hang":true}`)})
		if !errors.Is(err, context.Canceled) {
			t.Errorf("error %v is not context.Canceled", err)
		}
		if d := time.Since(start); d > promptly {
			t.Errorf("returned after %v", d)
		}
	})
	t.Run("sleep past deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := p.Execute(ctx, providers.Request{Payload: json.RawMessage(`{"sleep_ms":120000}`)})
		if !errors.Is(err, context.DeadlineExceeded) || !providers.IsRetryable(err) {
			t.Errorf("error %v is not a retryable context.DeadlineExceeded", err)
		}
		if d := time.Since(start); d > promptly {
			t.Errorf("returned after %v", d)
		}
	})
	t.Run("request deadline shorter than ctx", func(t *testing.T) {
		req := providers.Request{Payload: json.RawMessage(`{"sleep_ms":120000}`), Deadline: time.Now().Add(150 * time.Millisecond)}
		start := time.Now()
		_, err := p.Execute(context.Background(), req)
		if !errors.Is(err, context.DeadlineExceeded) || !providers.IsRetryable(err) {
			t.Errorf("error %v is not a retryable context.DeadlineExceeded", err)
		}
		if d := time.Since(start); d > promptly {
			t.Errorf("returned after %v", d)
		}
	})
	// The plugin is still healthy: cancelled calls do not cost a process.
	mustCall(t, p, `{}`)
	if m.Restarts("faulty") != 0 {
		t.Errorf("Restarts = %d, want 0", m.Restarts("faulty"))
	}
}

func TestCrashRelaunches(t *testing.T) {
	m, logs := newManager(t, host.Options{})
	p := m.Provider(host.Spec{Name: "faulty", Builtin: "faulty"})
	mustCall(t, p, `{}`)
	firstPID := host.PID(p)

	_, err := call(t, p, `{"crash":true}`)
	pe := providerError(t, err)
	want := `provider "faulty": plugin process exited during the call: exit status 3`
	if !pe.Retryable || pe.Code != "plugin_crashed" || pe.Message != want {
		t.Errorf("crash gave %+v, want a retryable plugin_crashed error with message %q", pe, want)
	}

	assertJSON(t, mustCall(t, p, `{"after":"crash"}`), `{"after":"crash","attempt":1}`)
	if got := m.Restarts("faulty"); got != 1 {
		t.Errorf("Restarts = %d, want 1", got)
	}
	if pid := host.PID(p); pid == firstPID || pid == 0 {
		t.Errorf("pid after relaunch = %d, before = %d", pid, firstPID)
	}
	wantLog := fmt.Sprintf(`"level":"ERROR","msg":"plugin process crashed; the next call relaunches it","provider":"faulty","pid":%d,"status":"exit status 3"`, firstPID)
	// The line comes from the goroutine that reaps the process.
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), wantLog) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(logs.String(), wantLog) {
		t.Errorf("the crash was not logged as %s:\n%s", wantLog, logs)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), "plugin process crashed"); n != 1 {
		t.Errorf("%d crashes logged, want 1: a process the gateway stops is not a crash\n%s", n, logs)
	}
}

func TestRelaunchAfterKillBetweenCalls(t *testing.T) {
	m, _ := newManager(t, host.Options{})
	p := m.Provider(host.Spec{Name: "echo", Builtin: "echo"})
	mustCall(t, p, `1`)
	proc, err := os.FindProcess(host.PID(p))
	if err != nil {
		t.Fatal(err)
	}
	if err := proc.Kill(); err != nil {
		t.Fatal(err)
	}
	waitGone(t, proc.Pid, 2*time.Second)

	// The next call may race the reaping of the old process; either it finds
	// the process gone and relaunches, or it fails retryably and the one
	// after relaunches.
	if _, err := call(t, p, `2`); err != nil && !providers.IsRetryable(err) {
		t.Fatalf("call after kill: %v", err)
	}
	assertJSON(t, mustCall(t, p, `3`), `3`)
	if got := m.Restarts("echo"); got != 1 {
		t.Errorf("Restarts = %d, want 1", got)
	}
}

func TestConcurrentCalls(t *testing.T) {
	m, _ := newManager(t, host.Options{})
	p := m.Provider(host.Spec{Name: "faulty", Builtin: "faulty"})
	const n = 200
	start := time.Now()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			body, err := call(t, p, fmt.Sprintf(`{"i":%d,"sleep_ms":200}`, i))
			if err != nil {
				t.Errorf("call %d: %v", i, err)
				return
			}
			assertJSON(t, body, fmt.Sprintf(`{"i":%d,"sleep_ms":200,"attempt":1}`, i))
		})
	}
	wg.Wait()
	// One start, then 200 overlapping 200 ms calls: serialised they would
	// take 40 s.
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("%d concurrent calls took %v; are they serialised?", n, d)
	}
	if got := m.Restarts("faulty"); got != 0 {
		t.Errorf("Restarts = %d, want 0 (concurrent first calls must share one start)", got)
	}
}

func TestCloseKillsPlugins(t *testing.T) {
	m, _ := newManager(t, host.Options{})
	var pids []int
	var handles []providers.Provider
	for _, typ := range []string{"echo", "faulty", "http"} {
		p := m.Provider(host.Spec{Name: typ, Builtin: typ})
		if _, err := p.Describe(context.Background()); err != nil {
			t.Fatal(err)
		}
		pids = append(pids, host.PID(p))
		handles = append(handles, p)
	}
	// A call in flight during Close fails instead of hanging.
	inFlight := make(chan error, 1)
	go func() {
		_, err := call(t, handles[1], `{"hang":true}`)
		inFlight <- err
	}()
	time.Sleep(100 * time.Millisecond)

	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		if !processGone(pid) {
			t.Errorf("plugin pid %d still running after Close", pid)
		}
	}
	select {
	case err := <-inFlight:
		if err == nil {
			t.Error("call in flight during Close succeeded")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("call in flight during Close did not return")
	}
	for _, p := range handles {
		if _, err := call(t, p, `{}`); !errors.Is(err, host.ErrClosed) {
			t.Errorf("call after Close: error %v is not ErrClosed", err)
		}
	}
	if _, err := m.Provider(host.Spec{Name: "new", Builtin: "echo"}).Describe(context.Background()); !errors.Is(err, host.ErrClosed) {
		t.Errorf("new handle after Close: error %v is not ErrClosed", err)
	}
	if err := m.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestStartFailures checks that a plugin that cannot start says why, and
// that these failures, which recur on every launch, are permanent.
func TestStartFailures(t *testing.T) {
	m, _ := newManager(t, host.Options{StartTimeout: 5 * time.Second})
	for _, tc := range []struct {
		spec host.Spec
		want []string
	}{
		{host.Spec{Name: "bogus", Builtin: "nope"}, []string{`starting plugin "bogus"`, `unknown built-in provider type`}},
		{host.Spec{Name: "both", Builtin: "echo", Path: "/bin/true"}, []string{`starting plugin "both"`, "not both"}},
		{host.Spec{Name: "neither"}, []string{`starting plugin "neither"`, "neither a built-in type nor a plugin path"}},
		{host.Spec{Name: "missing", Path: "/nonexistent/plugin"}, []string{`starting plugin "missing"`, "/nonexistent/plugin"}},
		{host.Spec{Name: "not-a-plugin", Path: "/bin/true"}, []string{`starting plugin "not-a-plugin"`}},
	} {
		t.Run(tc.spec.Name, func(t *testing.T) {
			_, err := call(t, m.Provider(tc.spec), `{}`)
			if err == nil {
				t.Fatal("call succeeded")
			}
			if pe := providerError(t, err); pe.Retryable || pe.Code != "plugin_start" {
				t.Errorf("error %+v, want a permanent plugin_start error", pe)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// TestCrashLoopBacksOff has the plugin crash on every call: the first
// relaunch is immediate, later ones wait longer each time.
func TestCrashLoopBacksOff(t *testing.T) {
	m, logs := newManager(t, host.Options{})
	p := m.Provider(host.Spec{Name: "faulty", Builtin: "faulty"})
	mustCall(t, p, `{}`)
	start := time.Now()
	for i := range 4 {
		_, err := call(t, p, `{"crash":true}`)
		if pe := providerError(t, err); !pe.Retryable || pe.Code != "plugin_crashed" {
			t.Fatalf("crash %d gave %+v", i, pe)
		}
	}
	mustCall(t, p, `{}`)
	// Four crashes in a row: relaunches after 0, 50, 100 and 200 ms.
	if took := time.Since(start); took < 350*time.Millisecond {
		t.Errorf("four crashes and five launches took %v, want at least 350ms of backoff", took)
	}
	var waits []string
	for line := range strings.Lines(logs.String()) {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == "plugin keeps failing; waiting before launching it again" {
			waits = append(waits, fmt.Sprint(rec["wait"]))
		}
	}
	if len(waits) != 3 {
		t.Errorf("backoff waits logged: %v, want 3", waits)
	}
	if got := m.Restarts("faulty"); got != 4 {
		t.Errorf("Restarts = %d, want 4", got)
	}
}

func TestStartFailureIsRetried(t *testing.T) {
	m, _ := newManager(t, host.Options{})
	path := filepath.Join(t.TempDir(), "late-plugin")
	p := m.Provider(host.Spec{Name: "late", Path: path})
	if _, err := call(t, p, `{}`); err == nil {
		t.Fatal("call to a missing plugin binary succeeded")
	}
	bin, err := os.ReadFile(buildExtPlugin(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	info, err := p.Describe(context.Background())
	if err != nil || info.Name != "ext" {
		t.Fatalf("Describe after the binary appeared = %+v, %v", info, err)
	}
}

const testMaxBytes = 64 << 10

// wireSize is the size gRPC checks against the limit: the session's
// wrapper around the call, or the call itself when unary.
func wireSize(id uint64, req *providerv1.ExecuteRequest, resp *providerv1.ExecuteResponse) int {
	switch {
	case unaryTransport && req != nil:
		return proto.Size(req)
	case unaryTransport:
		return proto.Size(resp)
	case req != nil:
		return proto.Size(&providerv1.SessionRequest{Id: id, Execute: req})
	default:
		return proto.Size(&providerv1.SessionResponse{Id: id, Result: resp})
	}
}

// sizedString returns a JSON string whose message, as size measures it,
// is exactly want bytes.
func sizedString(t testing.TB, want int, size func(body []byte) int) string {
	t.Helper()
	for n := want - 32; n <= want; n++ {
		body := []byte(`"` + strings.Repeat("x", n) + `"`)
		if size(body) == want {
			return string(body)
		}
	}
	t.Fatalf("no string gives a message of %d bytes", want)
	return ""
}

// TestMaxMessageBytes sends calls and answers right at the limit and just
// over it: the one over fails alone, permanently, and the plugin serves on.
func TestMaxMessageBytes(t *testing.T) {
	m, _ := newManager(t, host.Options{MaxMessageBytes: testMaxBytes})
	p := m.Provider(host.Spec{Name: "echo", Builtin: "echo"})
	mustCall(t, p, `1`)
	// Call ids stay below 128 here, so they take one byte as 100 does.
	const id = 100
	request := func(body []byte) int {
		return wireSize(id, &providerv1.ExecuteRequest{ActionType: "test", Payload: body, DedupKey: "run-1/step", Attempt: 1}, nil)
	}
	innerAtLimit := sizedString(t, testMaxBytes, func(body []byte) int {
		return proto.Size(&providerv1.ExecuteRequest{ActionType: "test", Payload: body, DedupKey: "run-1/step", Attempt: 1})
	})
	for _, tc := range []struct {
		name    string
		payload string
		fits    bool
	}{
		{"at the limit", sizedString(t, testMaxBytes, request), true},
		{"one byte over", sizedString(t, testMaxBytes+1, request), false},
		{"call at the limit, wrapper over", innerAtLimit, unaryTransport},
		{"far over", `"` + strings.Repeat("x", 100<<10) + `"`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body, err := call(t, p, tc.payload)
			if tc.fits {
				if err != nil {
					t.Fatalf("call of %d bytes: %v", request([]byte(tc.payload)), err)
				}
				assertJSON(t, body, tc.payload)
				return
			}
			if pe := providerError(t, err); pe.Retryable || pe.Code != "message_too_large" {
				t.Errorf("call of %d bytes gave %+v, want permanent message_too_large", request([]byte(tc.payload)), pe)
			}
			assertJSON(t, mustCall(t, p, `{"after":"oversized"}`), `{"after":"oversized"}`)
		})
	}
	if m.Restarts("echo") != 0 {
		t.Errorf("an oversized message restarted the plugin")
	}
}

// TestMaxMessageBytesAnswer does the same for the plugin's answers.
func TestMaxMessageBytesAnswer(t *testing.T) {
	bin := buildTestPlugin(t, "extplugin")
	m, _ := newManager(t, host.Options{MaxMessageBytes: testMaxBytes})
	p := m.Provider(host.Spec{Name: "ext", Path: bin})
	answer := func(body []byte) int { return wireSize(100, nil, &providerv1.ExecuteResponse{Body: body}) }
	innerAtLimit := sizedString(t, testMaxBytes, func(body []byte) int { return proto.Size(&providerv1.ExecuteResponse{Body: body}) })
	for _, tc := range []struct {
		name string
		body string
		fits bool
	}{
		{"at the limit", sizedString(t, testMaxBytes, answer), true},
		{"one byte over", sizedString(t, testMaxBytes+1, answer), false},
		{"answer at the limit, wrapper over", innerAtLimit, unaryTransport},
	} {
		t.Run(tc.name, func(t *testing.T) {
			payload := fmt.Sprintf(`{"size":%d}`, len(tc.body))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, err := p.Execute(ctx, providers.Request{ActionType: "sized", Payload: json.RawMessage(payload)})
			if tc.fits {
				if err != nil || string(resp.Body) != tc.body {
					t.Fatalf("answer of %d bytes: %v", answer([]byte(tc.body)), err)
				}
				return
			}
			if pe := providerError(t, err); pe.Retryable || pe.Code != "message_too_large" {
				t.Errorf("answer of %d bytes gave %+v, want permanent message_too_large", answer([]byte(tc.body)), pe)
			}
			if _, err := p.Execute(ctx, providers.Request{ActionType: "sized", Payload: json.RawMessage(`{"size":10}`)}); err != nil {
				t.Errorf("call after an oversized answer: %v", err)
			}
		})
	}
	if m.Restarts("ext") != 0 {
		t.Errorf("an oversized message restarted the plugin")
	}
}

// TestBrokenSessionIsReplaced has a plugin break its session by sending
// more than the gateway takes: the call fails retryably, and the next one
// gets a new process instead of the broken session.
func TestBrokenSessionIsReplaced(t *testing.T) {
	bin := buildTestPlugin(t, "badplugin")
	m, _ := newManager(t, host.Options{MaxMessageBytes: testMaxBytes})
	p := m.Provider(host.Spec{Name: "bad", Path: bin})
	exec := func(action string) (json.RawMessage, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := p.Execute(ctx, providers.Request{ActionType: action, Payload: json.RawMessage(`{"n":1}`)})
		return resp.Body, err
	}
	if _, err := exec("echo"); err != nil {
		t.Fatal(err)
	}
	_, err := exec("oversized")
	if pe := providerError(t, err); !pe.Retryable || pe.Code != "plugin_unavailable" {
		t.Errorf("a broken session gave %+v, want retryable plugin_unavailable", pe)
	}
	for i := range 3 {
		if body, err := exec("echo"); err != nil || string(body) != `{"n":1}` {
			t.Fatalf("call %d after the session broke: %s, %v", i, body, err)
		}
	}
	if got := m.Restarts("bad"); got != 1 {
		t.Errorf("Restarts = %d, want 1", got)
	}
}

// TestAnswerWithoutResult checks that a plugin answering a call with no
// result fails that call, not the gateway or the other calls.
func TestAnswerWithoutResult(t *testing.T) {
	bin := buildTestPlugin(t, "badplugin")
	m, _ := newManager(t, host.Options{})
	p := m.Provider(host.Spec{Name: "bad", Path: bin})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := p.Execute(ctx, providers.Request{ActionType: "no_result"})
	if pe := providerError(t, err); pe.Retryable || pe.Code != "plugin_protocol" || !strings.Contains(pe.Message, "without a result") {
		t.Errorf("an answer without a result gave %+v, want permanent plugin_protocol", pe)
	}
	if resp, err := p.Execute(ctx, providers.Request{ActionType: "echo", Payload: json.RawMessage(`2`)}); err != nil || string(resp.Body) != "2" {
		t.Errorf("next call: %s, %v", resp.Body, err)
	}
	if got := m.Restarts("bad"); got != 0 {
		t.Errorf("Restarts = %d, want 0", got)
	}
}

// buildExtPlugin builds testdata/extplugin, a plugin with its own main.
func buildExtPlugin(t testing.TB) string {
	t.Helper()
	return buildTestPlugin(t, "extplugin")
}

// buildTestPlugin builds the plugin in testdata/name.
func buildTestPlugin(t testing.TB, name string) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("SKIPPING: no go toolchain on PATH to build the test plugin %s: %v", name, err)
	}
	out := filepath.Join(t.TempDir(), name)
	cmd := exec.Command(goBin, "build", "-o", out, "./testdata/"+name)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building testdata/%s: %v\n%s", name, err, b)
	}
	return out
}

func TestExternalPlugin(t *testing.T) {
	bin := buildExtPlugin(t)
	m, logs := newManager(t, host.Options{})
	p := m.Provider(host.Spec{Name: "team-ext", Path: bin, Args: []string{"--flag", "v"}})

	info, err := p.Describe(context.Background())
	if err != nil || info.Name != "ext" || info.Version != "test" || len(info.ActionTypes) != 4 {
		t.Fatalf("Describe = %+v, %v", info, err)
	}

	deadline := time.Now().Add(time.Minute).Truncate(time.Nanosecond)
	resp, err := p.Execute(context.Background(), providers.Request{
		ActionType: "inspect",
		Payload:    json.RawMessage(`{"p":1}`),
		Config:     json.RawMessage(`{"c":2}`),
		DedupKey:   "run-9/notify",
		Attempt:    3,
		Deadline:   deadline,
		RunID:      "run-9",
		Step:       "notify",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`{"action_type":"inspect","payload":{"p":1},"config":{"c":2},"dedup_key":"run-9/notify",
		"attempt":3,"deadline":%d,"ctx_deadline":%d,"run_id":"run-9","step":"notify","args":["--flag","v"]}`,
		deadline.UnixNano(), deadline.UnixNano())
	assertJSON(t, resp.Body, want)

	_, err = p.Execute(context.Background(), providers.Request{ActionType: "nope"})
	if pe := providerError(t, err); pe.Code != "unknown_action" || pe.Message != `unknown action type "nope"` {
		t.Errorf("unknown action gave %+v", pe)
	}

	// A panic fails that call alone; the process serves on.
	pid := host.PID(p)
	_, err = p.Execute(context.Background(), providers.Request{ActionType: "panic"})
	if pe := providerError(t, err); pe.Retryable || pe.Code != "provider_panic" || pe.Message != "provider panicked: provider bug" {
		t.Errorf("panic gave %+v", pe)
	}
	if _, err := p.Describe(context.Background()); err != nil || host.PID(p) != pid || m.Restarts("team-ext") != 0 {
		t.Errorf("after a panic: Describe error %v, pid %d (was %d), %d restarts", err, host.PID(p), pid, m.Restarts("team-ext"))
	}

	// The plugin's log records and its plain stderr line reach the gateway's
	// slog, tagged with the provider's configured name.
	for _, want := range []struct {
		msg, level string
	}{{"inspecting", "WARN"}, {"plain stderr line", "INFO"}, {"provider panicked", "ERROR"}} {
		waitFor(t, 30*time.Second, func() bool {
			for line := range strings.Lines(logs.String()) {
				var rec map[string]any
				if json.Unmarshal([]byte(line), &rec) == nil &&
					rec["msg"] == want.msg && rec["level"] == want.level && rec["provider"] == "team-ext" {
					return true
				}
			}
			return false
		}, "log record %q at %s with provider=team-ext", want.msg, want.level)
	}
}

// TestCancellationReachesPlugin checks the plugin's own ctx, not just that
// the host stopped waiting.
func TestCancellationReachesPlugin(t *testing.T) {
	bin := buildExtPlugin(t)
	m, _ := newManager(t, host.Options{})
	p := m.Provider(host.Spec{Name: "ext", Path: bin})
	if _, err := p.Describe(context.Background()); err != nil {
		t.Fatal(err)
	}
	wait := func(ctx context.Context, marker string) error {
		payload, _ := json.Marshal(map[string]string{"marker": marker})
		_, err := p.Execute(ctx, providers.Request{ActionType: "wait", Payload: payload})
		return err
	}
	markerSays := func(marker, want string) {
		t.Helper()
		var got []byte
		waitFor(t, 30*time.Second, func() bool {
			got, _ = os.ReadFile(marker)
			return string(got) == want
		}, "the plugin's ctx to end with %q (marker: %q)", want, &got)
	}

	t.Run("cancel", func(t *testing.T) {
		marker := filepath.Join(t.TempDir(), "marker")
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		errc := make(chan error, 1)
		go func() { errc <- wait(ctx, marker) }()
		// Cancel only once the call is inside the plugin.
		waitFor(t, 30*time.Second, func() bool { _, err := os.Stat(marker + ".started"); return err == nil }, "the call to reach the plugin")
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Errorf("error %v is not context.Canceled", err)
		}
		markerSays(marker, "context canceled")
	})
	t.Run("deadline", func(t *testing.T) {
		marker := filepath.Join(t.TempDir(), "marker")
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := wait(ctx, marker); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("error %v is not context.DeadlineExceeded", err)
		}
		markerSays(marker, "context deadline exceeded")
	})
}

func TestSHA256Pin(t *testing.T) {
	bin := buildExtPlugin(t)
	m, _ := newManager(t, host.Options{})
	actual := sha256File(t, bin)
	wrong := strings.Repeat("ab", 32)

	_, err := m.Provider(host.Spec{Name: "pinned", Path: bin, SHA256: wrong}).Describe(context.Background())
	var ce *host.ChecksumError
	if !errors.As(err, &ce) {
		t.Fatalf("error %v is not a *ChecksumError", err)
	}
	for _, w := range []string{`starting plugin "pinned"`, bin, wrong, actual} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}

	ok := m.Provider(host.Spec{Name: "pinned-ok", Path: bin, SHA256: strings.ToUpper(actual)})
	if _, err := ok.Describe(context.Background()); err != nil {
		t.Errorf("matching pin: %v", err)
	}
}

func sha256File(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func waitFor(t testing.TB, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	for end := time.Now().Add(timeout); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out after %v waiting for "+format, append([]any{timeout}, args...)...)
		}
	}
}

func waitGone(t testing.TB, pid int, timeout time.Duration) {
	t.Helper()
	waitFor(t, timeout, func() bool { return processGone(pid) }, "pid %d to exit", pid)
}

func BenchmarkExecuteEcho(b *testing.B) {
	m, _ := newManager(b, host.Options{})
	p := m.Provider(host.Spec{Name: "echo", Builtin: "echo"})
	req := providers.Request{ActionType: "post", Payload: json.RawMessage(`{"text":"hello","n":1}`), DedupKey: "run/step", Attempt: 1}
	ctx := context.Background()
	if _, err := p.Execute(ctx, req); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Execute(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkExecuteEchoParallel(b *testing.B) {
	m, _ := newManager(b, host.Options{})
	p := m.Provider(host.Spec{Name: "echo", Builtin: "echo"})
	req := providers.Request{ActionType: "post", Payload: json.RawMessage(`{"text":"hello","n":1}`), DedupKey: "run/step", Attempt: 1}
	if _, err := p.Execute(context.Background(), req); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := p.Execute(context.Background(), req); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkSleepingCalls is the transport's share of the engine's
// 10,000-sub-step benchmark: 10,000 calls of faulty sleeping 10 ms, 100 at a
// time, with no engine or store. Ideally 1.0 s; what it takes beyond that is
// the plugin round trip and timer slack.
func BenchmarkSleepingCalls(b *testing.B) {
	const calls, conc = 10000, 100
	m, _ := newManager(b, host.Options{})
	p := m.Provider(host.Spec{Name: "faulty", Builtin: "faulty"})
	req := providers.Request{Payload: json.RawMessage(`{"sleep_ms":10}`), DedupKey: "run/step", Attempt: 1}
	ctx := context.Background()
	if _, err := p.Execute(ctx, req); err != nil {
		b.Fatal(err)
	}
	var total time.Duration
	selfStart, childStart := testutil.CPUTimes()
	for b.Loop() {
		start := time.Now()
		var wg sync.WaitGroup
		for range conc {
			wg.Go(func() {
				for range calls / conc {
					if _, err := p.Execute(ctx, req); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		total += time.Since(start)
	}
	// The plugin's CPU time is known once it has exited.
	if err := m.Close(); err != nil {
		b.Fatal(err)
	}
	self, child := testutil.CPUTimes()
	n := float64(calls * b.N)
	b.ReportMetric(float64((self-selfStart).Microseconds())/n, "gateway-cpu-µs/call")
	b.ReportMetric(float64((child-childStart).Microseconds())/n, "plugin-cpu-µs/call")
	b.ReportMetric(total.Seconds()/float64(b.N)/1.0, "x-ideal")
}

// unaryTransport makes newManager call plugins without sessions.
var unaryTransport bool

// TestUnaryTransport runs the core tests again over one gRPC call per
// Execute, the path taken for plugins that do not serve Session.
func TestUnaryTransport(t *testing.T) {
	unaryTransport = true
	defer func() { unaryTransport = false }()
	for name, fn := range map[string]func(*testing.T){
		"EchoRoundTrip":         TestEchoRoundTrip,
		"InBandErrors":          TestInBandErrors,
		"Cancellation":          TestCancellation,
		"CrashRelaunches":       TestCrashRelaunches,
		"ConcurrentCalls":       TestConcurrentCalls,
		"MaxMessageBytes":       TestMaxMessageBytes,
		"MaxMessageBytesAnswer": TestMaxMessageBytesAnswer,
	} {
		t.Run(name, fn)
	}
}

// starter is what the engine calls a plugin's provider through.
type starter interface {
	Start(ctx context.Context, req providers.Request, done func(providers.Response, error))
}

// TestStartEndsAsExecute makes the same calls through Start and Execute:
// each ends the same way, and Start's done is called once, when the call
// ends, not before.
func TestStartEndsAsExecute(t *testing.T) {
	m, _ := newManager(t, host.Options{})
	p := m.Provider(host.Spec{Name: "faulty", Builtin: "faulty"})
	mustCall(t, p, `{}`)
	type ending struct {
		body      string
		code      string
		retryable bool
		ctxErr    error
	}
	endingOf := func(resp providers.Response, err error) ending {
		e := ending{body: string(resp.Body), retryable: err != nil && providers.IsRetryable(err)}
		var pe *providers.Error
		if errors.As(err, &pe) {
			e.code = pe.Code
		}
		for _, ce := range []error{context.Canceled, context.DeadlineExceeded} {
			if errors.Is(err, ce) {
				e.ctxErr = ce
			}
		}
		if err != nil && e.code == "" && e.ctxErr == nil {
			e.code = "other: " + err.Error()
		}
		if e.ctxErr == context.DeadlineExceeded {
			// The plugin's own timeout answer and the gateway's timer race;
			// whichever comes first, the call ended at its deadline.
			e.code = ""
		}
		return e
	}
	for _, tc := range []struct {
		name    string
		payload string
		ctx     func() (context.Context, context.CancelFunc)
		want    ending
	}{
		{"answer", `{"a":1}`, nil, ending{body: `{"a":1,"attempt":1}`}},
		{"permanent", `{"fail":"no"}`, nil, ending{code: "faulty"}},
		{"retryable", `{"fail_retryable":"later"}`, nil, ending{code: "faulty", retryable: true}},
		{"cancelled", `{"hang":true}`, func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(100*time.Millisecond, cancel)
			return ctx, cancel
		}, ending{ctxErr: context.Canceled}},
		{"deadline", `{"sleep_ms":120000}`, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 150*time.Millisecond)
		}, ending{retryable: true, ctxErr: context.DeadlineExceeded}},
		{"crash", `{"crash":true}`, nil, ending{code: "plugin_crashed", retryable: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := providers.Request{Payload: json.RawMessage(tc.payload), Attempt: 1}
			newCtx := tc.ctx
			if newCtx == nil {
				newCtx = func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }
			}
			ctx, cancel := newCtx()
			executed := endingOf(p.Execute(ctx, req))
			cancel()
			mustCall(t, p, `{}`) // a crashed plugin is back
			ctx, cancel = newCtx()
			defer cancel()
			var calls atomic.Int32
			ended := make(chan ending, 2)
			p.(starter).Start(ctx, req, func(resp providers.Response, err error) {
				calls.Add(1)
				ended <- endingOf(resp, err)
			})
			started := <-ended
			cancel()
			if executed != tc.want || started != tc.want {
				t.Errorf("Execute ended %+v, Start %+v; want %+v", executed, started, tc.want)
			}
			mustCall(t, p, `{}`)
			if n := calls.Load(); n != 1 {
				t.Errorf("done was called %d times", n)
			}
		})
	}
}

// TestStartDoesNotWait: Start hands the call to the plugin and returns; the
// call ends later, on its own.
func TestStartDoesNotWait(t *testing.T) {
	m, _ := newManager(t, host.Options{})
	p := m.Provider(host.Spec{Name: "faulty", Builtin: "faulty"})
	mustCall(t, p, `{}`)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ended := make(chan error, 1)
	p.(starter).Start(ctx, providers.Request{Payload: json.RawMessage(`{"hang":true}`)}, func(_ providers.Response, err error) { ended <- err })
	select {
	case err := <-ended:
		t.Fatalf("a hanging call ended before it was cancelled: %v", err)
	default:
	}
	cancel()
	if err := <-ended; !errors.Is(err, context.Canceled) {
		t.Errorf("error %v is not context.Canceled", err)
	}
}
