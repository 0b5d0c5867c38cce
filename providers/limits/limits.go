// Package limits is provider middleware: a rate limit, a concurrency cap
// and a circuit breaker per provider, shared by every run's calls to it.
//
// It is the gateway's own package, with no compatibility promise.
package limits

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/chaingate/gateway/providers"
)

// clock is where limits read the time and wait; tests drive a fake one.
type clock interface {
	Now() time.Time
	// Timer fires once after d; stop releases it early.
	Timer(d time.Duration) (fire <-chan time.Time, stop func() bool)
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) Timer(d time.Duration) (<-chan time.Time, func() bool) {
	t := time.NewTimer(d)
	return t.C, t.Stop
}

// trialRetryAfter is the RetryAfter of a call refused while a half-open
// circuit's trial call is under way: a trial usually answers within
// moments, and a pause keeps retries from spinning on it.
const trialRetryAfter = time.Second

// Policy is one provider's limits; its zero value limits nothing.
type Policy struct {
	// Rate paces calls; nil means unpaced.
	Rate *Rate
	// MaxConcurrency bounds the calls in flight; 0 means unbounded.
	MaxConcurrency int
	// Breaker stops calling a failing provider for a while; nil means none.
	Breaker *Breaker
}

// Rate is a token bucket: PerSecond tokens a second, up to Burst at once.
type Rate struct {
	PerSecond float64
	Burst     int
}

// Breaker opens the circuit after Failures retryable failures in a row,
// for OpenSeconds, then lets one trial call through.
type Breaker struct {
	Failures    int
	OpenSeconds int
}

// Set holds every provider's limiter, by provider name, for the whole
// process: all runs' calls to a provider share its rate, its concurrency
// cap and its circuit. The current config sets them, whichever definition
// a run started with.
type Set struct {
	clock clock
	log   *slog.Logger

	mu     sync.Mutex
	byName map[string]*limiter
}

// New returns an empty Set that logs circuit changes to log.
func New(log *slog.Logger) *Set { return newSet(realClock{}, log) }

func newSet(c clock, log *slog.Logger) *Set {
	return &Set{clock: c, log: log, byName: map[string]*limiter{}}
}

// Configure applies policies, by provider name. A provider keeps its state
// (tokens, calls in flight, circuit) under new settings; one that policies
// no longer name is no longer limited.
func (ls *Set) Configure(policies map[string]Policy) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for name, l := range ls.byName {
		if _, ok := policies[name]; !ok {
			l.configure(Policy{})
		}
	}
	for name, p := range policies {
		l := ls.byName[name]
		if l == nil {
			l = &limiter{name: name, clock: ls.clock, log: ls.log}
			ls.byName[name] = l
		}
		l.configure(p)
	}
}

// Wrap returns p limited as the provider named name is.
func (ls *Set) Wrap(name string, p providers.Provider) providers.Provider {
	ls.mu.Lock()
	l := ls.byName[name]
	ls.mu.Unlock()
	if l == nil {
		// Only a provider that a stored definition names and no config
		// has had: there is nothing to limit it by.
		return p
	}
	return &limited{Provider: p, l: l}
}

// Stats returns each provider's limit state, sorted by name.
func (ls *Set) Stats() []Stats {
	ls.mu.Lock()
	all := make([]*limiter, 0, len(ls.byName))
	for _, l := range ls.byName {
		all = append(all, l)
	}
	ls.mu.Unlock()
	out := make([]Stats, len(all))
	for i, l := range all {
		out[i] = l.stats()
	}
	slices.SortFunc(out, func(a, b Stats) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// limited is a provider whose calls go through its limiter.
type limited struct {
	providers.Provider
	l *limiter
}

// Execute checks the circuit, takes a concurrency slot and then a rate
// token, in that order: a token taken while waiting for a slot would be
// spent before the call goes out, letting calls burst past the rate.
func (p *limited) Execute(ctx context.Context, req providers.Request) (providers.Response, error) {
	l := p.l
	t, err := l.admit()
	if err != nil {
		return providers.Response{}, err
	}
	if err := l.acquire(ctx); err != nil {
		l.settle(t, outcomeNone)
		return providers.Response{}, err
	}
	defer l.release()
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = req.Deadline
	}
	if err := l.waitToken(ctx, deadline); err != nil {
		l.settle(t, outcomeNone)
		return providers.Response{}, err
	}
	if t, err = l.readmit(t); err != nil {
		return providers.Response{}, err
	}
	resp, err := p.Provider.Execute(ctx, req)
	l.settle(t, outcomeOf(err))
	return resp, err
}

// starter is a provider that makes a call without a goroutine waiting on
// it, reporting its end to done, which must not block; a plugin's is.
type starter interface {
	Start(ctx context.Context, req providers.Request, done func(providers.Response, error))
}

// Start makes the call as Execute does and calls done with what Execute
// would return. A call the limits let go out at once, to a provider that
// starts calls, has nothing waiting on it: done must not block. One that
// waits for a slot or a token waits on a goroutine of its own.
func (p *limited) Start(ctx context.Context, req providers.Request, done func(providers.Response, error)) {
	inner, ok := p.Provider.(starter)
	if !ok || p.l.paced() {
		go func() { done(p.Execute(ctx, req)) }()
		return
	}
	l := p.l
	t, err := l.admit()
	if err != nil {
		done(providers.Response{}, err)
		return
	}
	if !l.tryAcquire() {
		l.settle(t, outcomeNone)
		go func() { done(p.Execute(ctx, req)) }()
		return
	}
	if t, err = l.readmit(t); err != nil {
		l.release()
		done(providers.Response{}, err)
		return
	}
	inner.Start(ctx, req, func(resp providers.Response, err error) {
		l.settle(t, outcomeOf(err))
		l.release()
		done(resp, err)
	})
}

// outcome is what a call says about its provider's health.
type outcome int

const (
	// outcomeNone says nothing: the call was cancelled, never went out, or
	// failed permanently (a bad payload is the request's fault).
	outcomeNone outcome = iota
	outcomeOK
	// outcomeFailed is a retryable error or a timeout: the provider is
	// down, overloaded or slow.
	outcomeFailed
)

func outcomeOf(err error) outcome {
	switch {
	case err == nil:
		return outcomeOK
	case errors.Is(err, context.Canceled):
		return outcomeNone
	case providers.IsRetryable(err):
		return outcomeFailed
	}
	return outcomeNone
}

// Circuit states, as chaingate_provider_circuit_state reports them.
const (
	CircuitClosed   = 0
	CircuitOpen     = 1
	CircuitHalfOpen = 2
)

// limiter is one provider's limits and their state.
type limiter struct {
	name  string
	clock clock
	log   *slog.Logger

	mu sync.Mutex
	// rate is nil when calls are not paced.
	rate *rate.Limiter
	// Concurrency: maxCalls 0 is unbounded; calls in use are counted
	// either way, so a cap set by a reload counts the calls under way.
	maxCalls int
	inUse    int
	waiters  []chan struct{}
	// Circuit: breaker nil is no breaker.
	breaker  *Breaker
	failures int // consecutive failed calls
	open     bool
	until    time.Time // while open, when a trial call may go out
	trial    bool      // a trial call is under way
	// gen changes whenever the circuit opens or closes (or the breaker
	// is reconfigured away), so that calls let through before cannot
	// move it.
	gen uint64
	// Counters for /metrics.
	rateLimited, waitSeconds         float64
	refusedRate, refusedOpen, opened float64
}

// Stats is one provider's limits and what they have done.
type Stats struct {
	Name string
	// Paced, Capped and Breaker say which limits the provider has.
	Paced, Capped, Breaker bool
	// RateLimited counts calls that waited for a token or were refused
	// one, WaitSeconds the time they waited.
	RateLimited, WaitSeconds float64
	InUse, Waiting, MaxCalls int
	// Circuit is CircuitClosed, CircuitOpen or CircuitHalfOpen.
	Circuit int
	// RefusedRate and RefusedOpen count calls refused without being made;
	// Opened counts the times the circuit opened.
	RefusedRate, RefusedOpen, Opened float64
}

func (l *limiter) configure(p Policy) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.Now()
	switch rl := p.Rate; {
	case rl == nil:
		l.rate = nil
	case l.rate == nil:
		l.rate = rate.NewLimiter(rate.Limit(rl.PerSecond), rl.Burst)
	default:
		l.rate.SetLimitAt(now, rate.Limit(rl.PerSecond))
		l.rate.SetBurstAt(now, rl.Burst)
	}
	l.maxCalls = p.MaxConcurrency
	l.grant()
	if p.Breaker == nil && l.breaker != nil {
		l.failures, l.open, l.trial, l.until = 0, false, false, time.Time{}
		l.gen++
	}
	l.breaker = p.Breaker
}

func (l *limiter) stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := Stats{
		Name: l.name, Paced: l.rate != nil, Capped: l.maxCalls > 0, Breaker: l.breaker != nil,
		RateLimited: l.rateLimited, WaitSeconds: l.waitSeconds, InUse: l.inUse, Waiting: len(l.waiters), MaxCalls: l.maxCalls,
		RefusedRate: l.refusedRate, RefusedOpen: l.refusedOpen, Opened: l.opened,
	}
	switch {
	case !l.open:
		s.Circuit = CircuitClosed
	case l.clock.Now().Before(l.until):
		s.Circuit = CircuitOpen
	default:
		s.Circuit = CircuitHalfOpen
	}
	return s
}

// ticket is a call the circuit let through.
type ticket struct {
	counted bool // a breaker was configured and the result counts
	trial   bool
	gen     uint64
}

// admit lets a call through the circuit or refuses it with a retryable
// circuit_open error. Once open_seconds have passed, the circuit is
// half-open: one call at a time goes through as a trial.
func (l *limiter) admit() (ticket, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.admitLocked()
}

// readmit checks the circuit again for a call that waited for a slot or a
// token: if the circuit opened meanwhile, the call must not go out.
func (l *limiter) readmit(t ticket) (ticket, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t.gen == l.gen {
		return t, nil
	}
	return l.admitLocked()
}

func (l *limiter) admitLocked() (ticket, error) {
	if l.breaker == nil {
		return ticket{}, nil
	}
	if !l.open {
		return ticket{counted: true, gen: l.gen}, nil
	}
	if wait := l.until.Sub(l.clock.Now()); wait > 0 {
		l.refusedOpen++
		return ticket{}, &providers.Error{
			Retryable:  true,
			Code:       "circuit_open",
			Message:    fmt.Sprintf("provider %s's circuit is open after %d consecutive failures; next trial in %ds", l.name, l.failures, int(math.Ceil(wait.Seconds()))),
			RetryAfter: wait,
		}
	}
	if l.trial {
		l.refusedOpen++
		return ticket{}, &providers.Error{
			Retryable:  true,
			Code:       "circuit_open",
			Message:    fmt.Sprintf("provider %s's circuit is open after %d consecutive failures; a trial call is under way", l.name, l.failures),
			RetryAfter: trialRetryAfter,
		}
	}
	l.trial = true
	return ticket{counted: true, trial: true, gen: l.gen}, nil
}

// settle applies a call's outcome to the circuit: failures open it, a
// success closes it, and a half-open circuit's trial decides which.
func (l *limiter) settle(t ticket, o outcome) {
	l.mu.Lock()
	if !t.counted || t.gen != l.gen {
		l.mu.Unlock()
		return
	}
	var opened, closed bool
	switch o {
	case outcomeNone:
		if t.trial {
			l.trial = false
		}
	case outcomeOK:
		l.failures = 0
		if t.trial {
			l.open, l.trial = false, false
			l.gen++
			closed = true
		}
	case outcomeFailed:
		l.failures++
		if t.trial || l.failures >= l.breaker.Failures {
			l.open, l.trial = true, false
			l.until = l.clock.Now().Add(time.Duration(l.breaker.OpenSeconds) * time.Second)
			l.gen++
			l.opened++
			opened = true
		}
	}
	failures := l.failures
	l.mu.Unlock()
	switch {
	case opened:
		l.log.Warn("provider circuit opened: calls fail fast until a trial call succeeds", "provider", l.name, "consecutive_failures", failures)
	case closed:
		l.log.Info("provider circuit closed: a trial call succeeded", "provider", l.name)
	}
}

// acquire takes a concurrency slot, waiting in line while the provider has
// max_concurrency calls under way; a call whose ctx ends leaves the line.
func (l *limiter) acquire(ctx context.Context) error {
	l.mu.Lock()
	if l.slotFree() {
		l.inUse++
		l.mu.Unlock()
		return nil
	}
	w := make(chan struct{})
	l.waiters = append(l.waiters, w)
	l.mu.Unlock()
	select {
	case <-w:
		return nil
	case <-ctx.Done():
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-w:
		// Granted as ctx ended: pass the slot on.
		l.inUse--
		l.grant()
	default:
		l.waiters = slices.DeleteFunc(l.waiters, func(c chan struct{}) bool { return c == w })
	}
	return fmt.Errorf("waiting for one of provider %s's %d call slots: %w", l.name, l.maxCalls, ctx.Err())
}

// slotFree reports whether a call may take a slot now; l.mu is held.
func (l *limiter) slotFree() bool {
	return len(l.waiters) == 0 && (l.maxCalls == 0 || l.inUse < l.maxCalls)
}

// tryAcquire takes a call slot if one is free now.
func (l *limiter) tryAcquire() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.slotFree() {
		return false
	}
	l.inUse++
	return true
}

// paced reports whether calls wait for rate tokens.
func (l *limiter) paced() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rate != nil
}

func (l *limiter) release() {
	l.mu.Lock()
	l.inUse--
	l.grant()
	l.mu.Unlock()
}

// grant hands free slots to the calls waiting longest. Called with mu held.
func (l *limiter) grant() {
	for len(l.waiters) > 0 && (l.maxCalls == 0 || l.inUse < l.maxCalls) {
		l.inUse++
		close(l.waiters[0])
		l.waiters = l.waiters[1:]
	}
}

// waitToken waits for a rate token. When none comes before deadline, it
// refuses at once with a retryable rate_limited error saying when one will,
// rather than sleeping into a timeout.
func (l *limiter) waitToken(ctx context.Context, deadline time.Time) error {
	l.mu.Lock()
	rl := l.rate
	l.mu.Unlock()
	if rl == nil {
		return nil
	}
	now := l.clock.Now()
	r := rl.ReserveN(now, 1)
	wait := r.DelayFrom(now)
	if wait == 0 {
		return nil
	}
	if !deadline.IsZero() && now.Add(wait).After(deadline) {
		r.CancelAt(now)
		l.count(func() { l.rateLimited++; l.refusedRate++ })
		return &providers.Error{
			Retryable:  true,
			Code:       "rate_limited",
			Message:    fmt.Sprintf("provider %s is limited to %s calls a second and has none free before the call's deadline; next in %s", l.name, strconv.FormatFloat(float64(rl.Limit()), 'g', -1, 64), wait.Round(time.Millisecond)),
			RetryAfter: wait,
		}
	}
	l.count(func() { l.rateLimited++ })
	fire, stop := l.clock.Timer(wait)
	select {
	case <-fire:
		l.count(func() { l.waitSeconds += wait.Seconds() })
		return nil
	case <-ctx.Done():
		stop()
		end := l.clock.Now()
		r.CancelAt(end)
		l.count(func() { l.waitSeconds += end.Sub(now).Seconds() })
		return fmt.Errorf("waiting for provider %s's rate limit: %w", l.name, ctx.Err())
	}
}

func (l *limiter) count(f func()) {
	l.mu.Lock()
	f()
	l.mu.Unlock()
}
