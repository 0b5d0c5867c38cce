package limits

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chaingate/gateway/providers"
)

// fakeClock stands still until advanced. Its timers fire at once, so a wait
// is measured by what was asked for, not by sleeping, unless block is set:
// then they never fire and only ctx ends a wait.
type fakeClock struct {
	mu    sync.Mutex
	now   time.Time
	block bool
	waits []time.Duration
	// timers hears of every timer set.
	timers chan time.Duration
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC), timers: make(chan time.Duration, 100)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Timer(d time.Duration) (<-chan time.Time, func() bool) {
	c.mu.Lock()
	c.waits = append(c.waits, d)
	block, now := c.block, c.now
	c.mu.Unlock()
	c.timers <- d
	if block {
		return nil, func() bool { return true }
	}
	fire := make(chan time.Time, 1)
	fire <- now.Add(d)
	return fire, func() bool { return false }
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func (c *fakeClock) setBlock(b bool) {
	c.mu.Lock()
	c.block = b
	c.mu.Unlock()
}

// takeWaits returns the waits asked for since the last call.
func (c *fakeClock) takeWaits() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.waits
	c.waits = nil
	for range w {
		<-c.timers
	}
	return w
}

// fakeProvider answers each call with next's answer, counting calls.
type fakeProvider struct {
	calls atomic.Int32
	next  func(ctx context.Context) error
}

func (p *fakeProvider) Describe(context.Context) (providers.Info, error) {
	return providers.Info{Name: "fake"}, nil
}

func (p *fakeProvider) Execute(ctx context.Context, _ providers.Request) (providers.Response, error) {
	p.calls.Add(1)
	if p.next == nil {
		return providers.Response{}, nil
	}
	return providers.Response{}, p.next(ctx)
}

// limitedFake returns a provider "p" with the given limits, its limits and
// the fake behind it.
func limitedFake(t *testing.T, c clock, p Policy) (providers.Provider, *Set, *fakeProvider) {
	t.Helper()
	ls := newSet(c, slog.New(slog.DiscardHandler))
	ls.Configure(map[string]Policy{"p": p})
	fake := &fakeProvider{}
	return ls.Wrap("p", fake), ls, fake
}

func statsOf(ls *Set) Stats { return ls.Stats()[0] }

// eventually waits for cond, failing the test if it never holds. It bounds
// a wait for another goroutine; it asserts nothing about time.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("never happened: %s", what)
		}
	}
}

func providerError(t *testing.T, err error, code string) *providers.Error {
	t.Helper()
	var pe *providers.Error
	if !errors.As(err, &pe) || pe.Code != code || !pe.Retryable {
		t.Fatalf("error %v, want a retryable %s *providers.Error", err, code)
	}
	return pe
}

func TestRateLimitBurstThenPacing(t *testing.T) {
	c := newFakeClock()
	p, ls, fake := limitedFake(t, c, Policy{Rate: &Rate{PerSecond: 5, Burst: 3}})
	ctx := context.Background()
	call := func(deadline time.Time) error {
		_, err := p.Execute(ctx, providers.Request{Deadline: deadline})
		return err
	}
	for i := range 3 {
		if err := call(time.Time{}); err != nil {
			t.Fatalf("call %d of the burst: %v", i+1, err)
		}
	}
	if w := c.takeWaits(); len(w) != 0 {
		t.Fatalf("the burst waited %v", w)
	}
	// Past the burst, calls at the same instant queue one token (200ms at
	// 5/s) apart.
	for range 2 {
		if err := call(time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	if w := c.takeWaits(); fmt.Sprint(w) != "[200ms 400ms]" {
		t.Errorf("waits %v, want [200ms 400ms]", w)
	}
	if s := statsOf(ls); s.RateLimited != 2 || fmt.Sprintf("%.3f", s.WaitSeconds) != "0.600" {
		t.Errorf("rate limited %v, waited %vs; want 2 and 0.6s", s.RateLimited, s.WaitSeconds)
	}

	// A second later the bucket is full again. With it spent, a call whose
	// deadline comes before the next token is refused at once and gives
	// its reservation back.
	c.advance(time.Second)
	for range 3 {
		if err := call(time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	before := fake.calls.Load()
	err := call(c.Now().Add(100 * time.Millisecond))
	pe := providerError(t, err, "rate_limited")
	if pe.RetryAfter != 200*time.Millisecond {
		t.Errorf("RetryAfter %v, want 200ms", pe.RetryAfter)
	}
	if !strings.Contains(pe.Message, "provider p is limited to 5 calls a second") {
		t.Errorf("message %q", pe.Message)
	}
	if fake.calls.Load() != before {
		t.Error("a refused call reached the provider")
	}
	if w := c.takeWaits(); len(w) != 0 {
		t.Errorf("a refused call waited %v", w)
	}
	// Had the refused call kept its token, this one would wait 400ms and
	// miss its deadline too.
	if err := call(c.Now().Add(200 * time.Millisecond)); err != nil {
		t.Fatalf("a call whose deadline allows the wait: %v", err)
	}
	if w := c.takeWaits(); fmt.Sprint(w) != "[200ms]" {
		t.Errorf("waits %v, want [200ms]", w)
	}
	if s := statsOf(ls); s.RefusedRate != 1 || s.RateLimited != 4 {
		t.Errorf("refused %v, rate limited %v; want 1 and 4", s.RefusedRate, s.RateLimited)
	}
}

func TestRateLimitWaitLeavesOnCancel(t *testing.T) {
	c := newFakeClock()
	p, _, fake := limitedFake(t, c, Policy{Rate: &Rate{PerSecond: 1, Burst: 1}})
	if _, err := p.Execute(context.Background(), providers.Request{}); err != nil {
		t.Fatal(err)
	}
	c.setBlock(true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		_, err := p.Execute(ctx, providers.Request{})
		done <- err
	}()
	if d := <-c.timers; d != time.Second {
		t.Errorf("wait %v, want 1s", d)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: %v", err)
	}
	if fake.calls.Load() != 1 {
		t.Error("a cancelled call reached the provider")
	}
	// The cancelled call's token went back: the next waits one second,
	// not two.
	c.setBlock(false)
	c.mu.Lock()
	c.waits = nil
	c.mu.Unlock()
	if _, err := p.Execute(context.Background(), providers.Request{}); err != nil {
		t.Fatal(err)
	}
	if w := c.takeWaits(); fmt.Sprint(w) != "[1s]" {
		t.Errorf("waits %v, want [1s]", w)
	}
}

// gate is a provider call that holds until let go.
type gate struct {
	entered chan struct{}
	release chan struct{}
}

func newGate() *gate { return &gate{entered: make(chan struct{}, 100), release: make(chan struct{})} }

func (g *gate) next(ctx context.Context) error {
	g.entered <- struct{}{}
	select {
	case <-g.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func TestConcurrencyCap(t *testing.T) {
	p, ls, fake := limitedFake(t, newFakeClock(), Policy{MaxConcurrency: 2})
	g := newGate()
	fake.next = g.next
	results := make(chan error, 10)
	start := func(ctx context.Context) {
		go func() {
			_, err := p.Execute(ctx, providers.Request{})
			results <- err
		}()
	}
	start(context.Background())
	start(context.Background())
	<-g.entered
	<-g.entered

	// The third call waits in line, and leaves it as soon as it is
	// cancelled, without reaching the provider.
	ctx, cancel := context.WithCancel(context.Background())
	start(ctx)
	eventually(t, "the third call waits", func() bool { return statsOf(ls).Waiting == 1 })
	if s := statsOf(ls); s.InUse != 2 || s.MaxCalls != 2 {
		t.Errorf("in use %d of %d, want 2 of 2", s.InUse, s.MaxCalls)
	}
	cancel()
	if err := <-results; !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "provider p's 2 call slots") {
		t.Fatalf("cancelled wait: %v", err)
	}
	if s := statsOf(ls); s.Waiting != 0 || s.InUse != 2 {
		t.Errorf("after the cancel: %d waiting, %d in use; want 0 and 2", s.Waiting, s.InUse)
	}

	// A fourth call takes the first slot freed.
	start(context.Background())
	eventually(t, "the fourth call waits", func() bool { return statsOf(ls).Waiting == 1 })
	g.release <- struct{}{}
	<-g.entered
	if err := <-results; err != nil {
		t.Fatal(err)
	}
	close(g.release)
	for range 2 {
		if err := <-results; err != nil {
			t.Fatal(err)
		}
	}
	if n := fake.calls.Load(); n != 3 {
		t.Errorf("%d calls reached the provider, want 3", n)
	}
	if s := statsOf(ls); s.InUse != 0 || s.Waiting != 0 {
		t.Errorf("at rest: %d in use, %d waiting", s.InUse, s.Waiting)
	}
}

func TestCircuitBreaker(t *testing.T) {
	c := newFakeClock()
	p, ls, fake := limitedFake(t, c, Policy{Breaker: &Breaker{Failures: 3, OpenSeconds: 30}})
	var answer error
	fake.next = func(context.Context) error { return answer }
	down := providers.Retryable("http_503", "service unavailable")
	for i, step := range []struct {
		name    string
		advance time.Duration
		answer  error
		// Want: whether the provider is called, the circuit_open
		// RetryAfter when it is not, and the state after.
		called     bool
		retryAfter time.Duration
		failures   int
		state      int
	}{
		{name: "first failure", answer: down, called: true, state: CircuitClosed},
		{name: "a permanent error says nothing", answer: providers.Permanent("bad_payload", "no"), called: true, state: CircuitClosed},
		{name: "second failure", answer: down, called: true, state: CircuitClosed},
		{name: "a timeout is the third failure: opens", answer: fmt.Errorf("calling: %w", context.DeadlineExceeded), called: true, state: CircuitOpen},
		{name: "open: fails fast", retryAfter: 30 * time.Second, failures: 3, state: CircuitOpen},
		{name: "still open later", advance: 10 * time.Second, retryAfter: 20 * time.Second, failures: 3, state: CircuitOpen},
		{name: "half-open trial fails: reopens", advance: 20 * time.Second, answer: down, called: true, state: CircuitOpen},
		{name: "reopened for open_seconds", advance: 29 * time.Second, retryAfter: time.Second, failures: 4, state: CircuitOpen},
		{name: "half-open trial succeeds: closes", advance: time.Second, called: true, state: CircuitClosed},
		{name: "closed again, count reset", answer: down, called: true, state: CircuitClosed},
		{name: "second failure after reset", answer: down, called: true, state: CircuitClosed},
	} {
		c.advance(step.advance)
		answer = step.answer
		before := fake.calls.Load()
		_, err := p.Execute(context.Background(), providers.Request{})
		called := fake.calls.Load() != before
		if called != step.called {
			t.Fatalf("%d %s: called %v, want %v", i, step.name, called, step.called)
		}
		if called && !errors.Is(err, step.answer) {
			t.Errorf("%d %s: error %v, want the provider's %v", i, step.name, err, step.answer)
		}
		if !called {
			pe := providerError(t, err, "circuit_open")
			if pe.RetryAfter != step.retryAfter {
				t.Errorf("%d %s: RetryAfter %v, want %v", i, step.name, pe.RetryAfter, step.retryAfter)
			}
			want := fmt.Sprintf("provider p's circuit is open after %d consecutive failures; next trial in %ds", step.failures, int(step.retryAfter.Seconds()))
			if pe.Message != want {
				t.Errorf("%d %s: message %q, want %q", i, step.name, pe.Message, want)
			}
		}
		if s := statsOf(ls); s.Circuit != step.state {
			t.Errorf("%d %s: state %d, want %d", i, step.name, s.Circuit, step.state)
		}
	}
	if s := statsOf(ls); s.Opened != 2 || s.RefusedOpen != 3 {
		t.Errorf("opened %v, refused %v; want 2 and 3", s.Opened, s.RefusedOpen)
	}
}

func TestCircuitHalfOpenLetsOneTrialThrough(t *testing.T) {
	c := newFakeClock()
	p, ls, fake := limitedFake(t, c, Policy{Breaker: &Breaker{Failures: 1, OpenSeconds: 5}})
	fake.next = func(context.Context) error { return providers.Retryable("down", "down") }
	if _, err := p.Execute(context.Background(), providers.Request{}); err == nil {
		t.Fatal("no failure")
	}
	c.advance(5 * time.Second)
	if s := statsOf(ls); s.Circuit != CircuitHalfOpen {
		t.Fatalf("state %d, want half-open", s.Circuit)
	}
	g := newGate()
	fake.next = g.next
	trial := make(chan error)
	go func() {
		_, err := p.Execute(context.Background(), providers.Request{})
		trial <- err
	}()
	<-g.entered
	// While the trial is under way, other calls fail fast.
	_, err := p.Execute(context.Background(), providers.Request{})
	if pe := providerError(t, err, "circuit_open"); pe.RetryAfter != trialRetryAfter || !strings.Contains(pe.Message, "a trial call is under way") {
		t.Errorf("during the trial: %+v", pe)
	}
	close(g.release)
	if err := <-trial; err != nil {
		t.Fatalf("trial: %v", err)
	}
	if s := statsOf(ls); s.Circuit != CircuitClosed {
		t.Fatalf("state %d after a good trial, want closed", s.Circuit)
	}
	if _, err := p.Execute(context.Background(), providers.Request{}); err != nil {
		t.Fatalf("after closing: %v", err)
	}
	if n := fake.calls.Load(); n != 3 {
		t.Errorf("%d calls reached the provider, want 3", n)
	}
}

// TestCircuitIgnoresCallsFromBefore checks that a call let through before
// the circuit opened cannot close it by succeeding late, and that a trial
// that never reached the provider leaves the circuit half-open for the next.
func TestCircuitIgnoresCallsFromBefore(t *testing.T) {
	c := newFakeClock()
	p, ls, fake := limitedFake(t, c, Policy{Breaker: &Breaker{Failures: 1, OpenSeconds: 5}})
	g := newGate()
	var n atomic.Int32
	fake.next = func(ctx context.Context) error {
		if n.Add(1) == 1 {
			return g.next(ctx)
		}
		return providers.Retryable("down", "down")
	}
	slow := make(chan error)
	go func() {
		_, err := p.Execute(context.Background(), providers.Request{})
		slow <- err
	}()
	<-g.entered
	if _, err := p.Execute(context.Background(), providers.Request{}); err == nil {
		t.Fatal("no failure")
	}
	close(g.release)
	if err := <-slow; err != nil {
		t.Fatal(err)
	}
	if s := statsOf(ls); s.Circuit != CircuitOpen {
		t.Fatalf("a call from before the opening moved the circuit to %d", s.Circuit)
	}

	// A trial that gives up waiting for a slot frees the trial for the
	// next call.
	ls.Configure(map[string]Policy{"p": {Breaker: &Breaker{Failures: 1, OpenSeconds: 5}, MaxConcurrency: 1}})
	l := ls.byName["p"]
	if err := l.acquire(context.Background()); err != nil { // another call holds the only slot
		t.Fatal(err)
	}
	c.advance(5 * time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan error)
	go func() {
		_, err := p.Execute(ctx, providers.Request{})
		gaveUp <- err
	}()
	eventually(t, "the trial waits for a slot", func() bool { return statsOf(ls).Waiting == 1 })
	cancel()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("trial waiting for a slot: %v", err)
	}
	l.release()
	fake.next = nil
	if _, err := p.Execute(context.Background(), providers.Request{}); err != nil {
		t.Fatalf("next trial: %v", err)
	}
	if s := statsOf(ls); s.Circuit != CircuitClosed {
		t.Errorf("state %d, want closed", s.Circuit)
	}
}

// TestCircuitOpenedWhileQueued checks that a call queued for a slot while
// the circuit opened fails fast when its turn comes instead of going out.
func TestCircuitOpenedWhileQueued(t *testing.T) {
	p, ls, fake := limitedFake(t, newFakeClock(), Policy{MaxConcurrency: 1, Breaker: &Breaker{Failures: 1, OpenSeconds: 60}})
	g := newGate()
	fake.next = func(ctx context.Context) error {
		if err := g.next(ctx); err != nil {
			return err
		}
		return providers.Retryable("down", "down")
	}
	first := make(chan error)
	go func() {
		_, err := p.Execute(context.Background(), providers.Request{})
		first <- err
	}()
	<-g.entered
	queued := make(chan error)
	go func() {
		_, err := p.Execute(context.Background(), providers.Request{})
		queued <- err
	}()
	eventually(t, "the second call queues", func() bool { return statsOf(ls).Waiting == 1 })
	close(g.release)
	if err := <-first; err == nil {
		t.Fatal("no failure")
	}
	if pe := providerError(t, <-queued, "circuit_open"); pe.RetryAfter != time.Minute {
		t.Errorf("RetryAfter %v, want 1m", pe.RetryAfter)
	}
	if n := fake.calls.Load(); n != 1 {
		t.Errorf("%d calls reached the provider, want 1", n)
	}
	if s := statsOf(ls); s.InUse != 0 || s.RefusedOpen != 1 {
		t.Errorf("%d in use, %v refused; want 0 and 1", s.InUse, s.RefusedOpen)
	}
}

func TestOutcomeOf(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want outcome
	}{
		{"success", nil, outcomeOK},
		{"retryable", providers.Retryable("http_503", "x"), outcomeFailed},
		{"timeout", fmt.Errorf("calling: %w", context.DeadlineExceeded), outcomeFailed},
		{"plugin crashed", &providers.Error{Retryable: true, Code: "plugin_crashed"}, outcomeFailed},
		{"permanent", providers.Permanent("bad_payload", "x"), outcomeNone},
		{"plain error", errors.New("x"), outcomeNone},
		{"cancelled", fmt.Errorf("calling: %w", context.Canceled), outcomeNone},
	} {
		if got := outcomeOf(tc.err); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestLimitsReconfigure checks that a reload's limits apply to the state
// calls left: a higher cap lets waiting calls in, and a breaker taken away
// closes the circuit.
func TestLimitsReconfigure(t *testing.T) {
	c := newFakeClock()
	prov := Policy{MaxConcurrency: 1, Breaker: &Breaker{Failures: 1, OpenSeconds: 60}}
	p, ls, fake := limitedFake(t, c, prov)
	reload := func(p Policy) { ls.Configure(map[string]Policy{"p": p}) }
	g := newGate()
	fake.next = g.next
	results := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := p.Execute(context.Background(), providers.Request{})
			results <- err
		}()
	}
	<-g.entered
	eventually(t, "the second call waits", func() bool { return statsOf(ls).Waiting == 1 })
	reload(Policy{MaxConcurrency: 2, Breaker: prov.Breaker})
	<-g.entered
	close(g.release)
	for range 2 {
		if err := <-results; err != nil {
			t.Fatal(err)
		}
	}

	fake.next = func(context.Context) error { return providers.Retryable("down", "down") }
	_, _ = p.Execute(context.Background(), providers.Request{})
	if _, err := p.Execute(context.Background(), providers.Request{}); err == nil || statsOf(ls).Circuit != CircuitOpen {
		t.Fatalf("circuit did not open: %v", err)
	}
	reload(Policy{})
	fake.next = nil
	if _, err := p.Execute(context.Background(), providers.Request{}); err != nil {
		t.Fatalf("after the breaker was removed: %v", err)
	}
	if s := statsOf(ls); s.Breaker || s.Capped || s.Circuit != CircuitClosed || s.Opened != 1 {
		t.Errorf("after the reload: %+v", s)
	}
}

// startingFake is a fakeProvider that starts calls, as a plugin's does,
// counting those it was handed that way.
type startingFake struct {
	*fakeProvider
	started atomic.Int32
}

func (p *startingFake) Start(ctx context.Context, req providers.Request, done func(providers.Response, error)) {
	p.started.Add(1)
	go func() { done(p.fakeProvider.Execute(ctx, req)) }()
}

// TestStartKeepsTheLimits: a call the limits let out at once goes to the
// provider's own Start; one that must wait waits in line as Execute's
// does; and both count toward the slots and the circuit.
func TestStartKeepsTheLimits(t *testing.T) {
	ls := newSet(newFakeClock(), slog.New(slog.DiscardHandler))
	ls.Configure(map[string]Policy{"p": {MaxConcurrency: 2, Breaker: &Breaker{Failures: 2, OpenSeconds: 30}}})
	fake := &startingFake{fakeProvider: &fakeProvider{}}
	p := ls.Wrap("p", fake).(interface {
		Start(context.Context, providers.Request, func(providers.Response, error))
	})
	g := newGate()
	fake.next = g.next
	results := make(chan error, 10)
	start := func() {
		p.Start(context.Background(), providers.Request{}, func(_ providers.Response, err error) { results <- err })
	}
	start()
	start()
	<-g.entered
	<-g.entered
	if n := fake.started.Load(); n != 2 {
		t.Errorf("%d calls went to the provider's Start, want 2", n)
	}
	start()
	eventually(t, "the third call waits", func() bool { return statsOf(ls).Waiting == 1 })
	if n := fake.started.Load(); n != 2 {
		t.Errorf("the waiting call went to the provider's Start")
	}
	close(g.release)
	for range 3 {
		if err := <-results; err != nil {
			t.Fatal(err)
		}
	}
	if s := statsOf(ls); s.InUse != 0 || s.Waiting != 0 || fake.calls.Load() != 3 {
		t.Errorf("at rest: %d in use, %d waiting, %d calls; want 0, 0, 3", s.InUse, s.Waiting, fake.calls.Load())
	}

	fake.next = func(context.Context) error { return providers.Retryable("down", "down") }
	start()
	<-results
	start()
	<-results
	start()
	if err := <-results; providerError(t, err, "circuit_open") == nil {
		t.Fatal("the circuit did not open")
	}
	if n := fake.calls.Load(); n != 5 {
		t.Errorf("%d calls reached the provider, want 5: the circuit let one through", n)
	}
}

// TestStartPacedWaits: a paced provider's calls wait for their token on a
// goroutine of their own, never on the caller's.
func TestStartPacedWaits(t *testing.T) {
	c := newFakeClock()
	ls := newSet(c, slog.New(slog.DiscardHandler))
	ls.Configure(map[string]Policy{"p": {Rate: &Rate{PerSecond: 1, Burst: 1}}})
	fake := &startingFake{fakeProvider: &fakeProvider{}}
	p := ls.Wrap("p", fake).(interface {
		Start(context.Context, providers.Request, func(providers.Response, error))
	})
	results := make(chan error, 2)
	for range 2 {
		p.Start(context.Background(), providers.Request{}, func(_ providers.Response, err error) { results <- err })
	}
	for range 2 {
		if err := <-results; err != nil {
			t.Fatal(err)
		}
	}
	if w := c.takeWaits(); fmt.Sprint(w) != "[1s]" {
		t.Errorf("waits %v, want [1s]: the second call waits for its token", w)
	}
	if n := fake.started.Load(); n != 0 {
		t.Errorf("%d paced calls skipped the wait through the provider's Start", n)
	}
}
