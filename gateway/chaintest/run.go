// Package chaintest runs the test files of `gateway test`: cases that start
// a chain (or deliver a request to a trigger), answer its provider calls
// and approvals with mocks, and check what the run did. Each case runs on
// the gateway's own engine and door, in memory, on a virtual clock, with
// no store file, network call or plugin process unless it asks for one.
//
// It is the gateway's own package, with no compatibility promise.
package chaintest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/memory"
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/gateway/door"
	"github.com/chaingate/gateway/gateway/schedules"
)

// Options says which cases run and how.
type Options struct {
	// Run selects the cases whose "FILE/NAME" or name matches; nil runs all.
	Run *regexp.Regexp
	// Parallel is how many cases run at once; default GOMAXPROCS.
	Parallel int
	// Executable serves the built-in providers a case runs for real.
	Executable string
	Logger     *slog.Logger
	// DryRun answers every call no mock answers with an empty success.
	DryRun bool
}

// Result is what one case did.
type Result struct {
	File, Case string
	Src        chain.Source
	Failures   []Failure
	// Runs are the runs the case started, their sub-chains' included.
	Runs []*RunRecord
	// Calls are the provider calls the runs made, in order.
	Calls []Call
	// Trigger is what the door did, for a trigger case.
	Trigger *api.TriggerResponse
	// Ended is how long the case took on its own clock.
	Ended time.Duration
	Took  time.Duration
}

// Failed reports whether the case failed.
func (r *Result) Failed() bool { return len(r.Failures) > 0 }

// Failure is one expectation not met, or why a case could not run.
type Failure struct {
	Src     chain.Source
	Message string
}

// RunRecord is one run a case started and its steps.
type RunRecord struct {
	Run   *store.Run
	Steps []*store.StepRecord
}

// Suite is the cases of a set of test files, loaded with their configs.
type Suite struct {
	Files   []*File
	configs map[string]*chain.Config
}

// Load reads the test files paths name and the configs they test.
func Load(paths []string) (*Suite, error) {
	names, err := Find(paths)
	if err != nil {
		return nil, err
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("finding test files: no *_test.toml file in %s", strings.Join(paths, ", "))
	}
	s := &Suite{configs: map[string]*chain.Config{}}
	var errs []error
	for _, name := range names {
		f, err := LoadFile(name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		key := configKey(f)
		if _, ok := s.configs[key]; !ok {
			cfg, err := gateway.LoadConfig(f.Config)
			if err != nil {
				errs = append(errs, fmt.Errorf("loading the config %s tests: %w", f.Path, err))
				continue
			}
			s.configs[key] = cfg
		}
		s.Files = append(s.Files, f)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for _, f := range s.Files {
		if err := s.check(f); err != nil {
			errs = append(errs, err)
		}
	}
	return s, errors.Join(errs...)
}

// Config is the config f's cases run against.
func (s *Suite) Config(f *File) *chain.Config { return s.configs[configKey(f)] }

// configKey names the config f tests.
func configKey(f *File) string { return strings.Join(f.Config, "\x00") + "\x00" }

// check refuses cases that name chains, triggers, steps or providers the
// config does not have, at the line that names them.
func (s *Suite) check(f *File) error {
	cfg := s.Config(f)
	var diags []chain.Diagnostic
	bad := func(src chain.Source, format string, args ...any) {
		diags = append(diags, src.Errorf(format, args...))
	}
	for _, p := range f.Real {
		if cfg.Providers[p] == nil {
			bad(chain.Source{File: f.Path}, "real_providers: no provider %q in the config", p)
		}
	}
	for _, c := range f.Cases {
		switch {
		case c.Chain != "" && cfg.Chains[c.Chain] == nil:
			bad(c.Src, "case %q: no chain %q in the config%s", c.Name, c.Chain, cfg.ChainHint(c.Chain))
		case c.Trigger != "" && cfg.Triggers[c.Trigger] == nil:
			bad(c.Src, "case %q: no trigger %q in the config", c.Name, c.Trigger)
		case c.Schedule != "" && cfg.Schedules[c.Schedule] == nil:
			bad(c.Src, "case %q: no schedule %q in the config", c.Name, c.Schedule)
		}
		steps := stepNames(cfg)
		for name, m := range c.Mocks {
			if steps[name] == 0 {
				bad(m.Src, "case %q: mocks.%s: no step %q in any chain", c.Name, name, name)
			}
		}
		for name := range c.Approvals {
			switch kind := steps[name]; {
			case kind == 0:
				bad(c.Src, "case %q: approvals.%s: no step %q in any chain", c.Name, name, name)
			case kind != chain.KindApproval:
				bad(c.Src, "case %q: approvals.%s: step %q is a %s step, not an approval step", c.Name, name, name, kind)
			}
		}
		for _, name := range c.Expect.stepOrder {
			if steps[name] == 0 {
				bad(c.Src, "case %q: expect.steps.%s: no step %q in any chain", c.Name, name, name)
			}
		}
		for _, p := range c.Real {
			if cfg.Providers[p] == nil {
				bad(c.Src, "case %q: real_providers: no provider %q in the config", c.Name, p)
			}
		}
	}
	if len(diags) > 0 {
		return &chain.ConfigError{Diagnostics: diags}
	}
	return nil
}

// stepNames are the kinds of the steps of every chain, by name.
func stepNames(cfg *chain.Config) map[string]chain.StepKind {
	out := map[string]chain.StepKind{}
	var walk func([]*chain.Step)
	walk = func(list []*chain.Step) {
		for _, s := range list {
			out[s.Name] = s.Kind
			if s.Parallel != nil {
				walk(s.Parallel.Steps)
			}
			if s.Split != nil {
				walk(s.Split.Steps)
			}
		}
	}
	for _, c := range cfg.Chains {
		walk(c.Steps)
		walk(c.OnFailure)
		walk(c.Finally)
	}
	return out
}

// Run runs the suite's selected cases, several at once, and returns their
// results in file and case order.
func (s *Suite) Run(ctx context.Context, opts Options) []*Result {
	type job struct {
		f *File
		c *Case
		i int
	}
	var jobs []job
	for _, f := range s.Files {
		for _, c := range f.Cases {
			if opts.Run == nil || opts.Run.MatchString(c.Name) || opts.Run.MatchString(f.Path+"/"+c.Name) {
				jobs = append(jobs, job{f, c, len(jobs)})
			}
		}
	}
	n := opts.Parallel
	if n <= 0 {
		n = runtime.GOMAXPROCS(0)
	}
	results := make([]*Result, len(jobs))
	ch := make(chan job)
	var wg sync.WaitGroup
	for range min(n, max(len(jobs), 1)) {
		wg.Go(func() {
			for j := range ch {
				results[j.i] = s.RunCase(ctx, j.f, j.c, opts)
			}
		})
	}
	for _, j := range jobs {
		ch <- j
	}
	close(ch)
	wg.Wait()
	return results
}

// maxWakes bounds how often a case's clock may move: a run that waits on
// something that never comes (an approval nobody answers, polled) fails
// the case rather than spin.
const maxWakes = 100_000

// RunCase runs one case and checks its expectations.
func (s *Suite) RunCase(ctx context.Context, f *File, c *Case, opts Options) *Result {
	began := time.Now()
	res := &Result{File: f.Path, Case: c.Name, Src: c.Src}
	defer func() { res.Took = time.Since(began) }()
	cfg := s.Config(f)
	fail := func(src chain.Source, format string, args ...any) {
		res.Failures = append(res.Failures, Failure{Src: src, Message: fmt.Sprintf(format, args...)})
	}
	// A case runs in this process: no broker, whatever the config says.
	local := *cfg
	gwCfg := cfg.Gateway
	gwCfg.Fanout = nil
	local.Gateway = gwCfg

	start := time.Now().UTC().Truncate(time.Second)
	clock := newVirtualClock(start)
	m := &mocks{c: c, clock: clock, real: map[string]bool{}, empty: opts.DryRun}
	for _, p := range append(append([]string{}, f.Real...), c.Real...) {
		m.real[p] = true
	}
	asked := &approvals{}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	st := memory.New()
	gw, err := gateway.Open(ctx, gateway.Options{
		Config: &local, Store: st, Secrets: caseSecrets(cfg, f.Secrets), Clock: clock, LocalSplits: true, Logger: log, Executable: opts.Executable,
		Providers: func(next engine.ProviderResolver) engine.ProviderResolver {
			m.next = next
			return m
		},
		OnEvent: asked.event,
	})
	if err != nil {
		fail(c.Src, "opening the gateway: %v", err)
		return res
	}
	defer gw.Close()
	m.redact = gw.Redactor.JSON
	m.items = func(runID, key string, index int) any {
		split, _, _ := itemOf(key[:strings.LastIndex(key, "/")])
		v, _ := gw.Engine.ItemValue(ctx, runID, split, index)
		return v
	}

	clock.Begin()
	runIDs, err := s.start(ctx, gw, c, res)
	clock.End()
	if err != nil {
		checkRefused(c, err, fail)
		return res
	}
	if err := drive(ctx, gw, clock, c, asked); err != nil {
		fail(c.Src, "%v", err)
	}
	res.Ended = clock.Now().Sub(start)
	for _, id := range runIDs {
		res.Runs = append(res.Runs, collect(ctx, st, id)...)
	}
	m.mu.Lock()
	res.Calls = m.calls
	for _, name := range sortedKeys(m.unmocked) {
		fail(c.Src, "step %q called provider %q with no mock: add [tests.mocks.%s] to the case, or list %q in real_providers", name, m.unmocked[name], name, m.unmocked[name])
	}
	m.mu.Unlock()
	dlq, _ := st.ListDLQ(ctx, store.DLQFilter{})
	check(c, res, dlq, fail)
	return res
}

// caseSecrets are the file's secrets, and for every other secret the
// config reads a stand-in ("test-NAME"), so a case needs none of the
// environment's and a template reading one still renders.
func caseSecrets(cfg *chain.Config, given map[string]string) map[string]string {
	out := map[string]string{}
	for _, name := range gateway.SecretNames(cfg) {
		out[name] = "test-" + name
	}
	for k, v := range given {
		out[k] = v
	}
	return out
}

// start starts what the case names and returns the runs it started.
func (s *Suite) start(ctx context.Context, gw *gateway.Gateway, c *Case, res *Result) ([]string, error) {
	switch {
	case c.Chain != "":
		run, err := gw.Engine.Start(ctx, c.Chain, engine.Input{Payload: c.Payload, StartedBy: "test"})
		if err != nil {
			return nil, err
		}
		return []string{run.ID}, nil
	case c.Schedule != "":
		sch := gw.Config.Schedules[c.Schedule]
		in, err := schedules.ScheduleInput(sch, gw.Engine.Clock().Now())
		if err != nil {
			return nil, err
		}
		if c.Payload != nil {
			in.Payload = c.Payload
		}
		run, err := gw.Engine.Start(ctx, sch.Chain, in)
		if err != nil {
			return nil, err
		}
		return []string{run.ID}, nil
	}
	h := http.Header{"Content-Type": {"application/json"}}
	for k, v := range c.Headers {
		h.Set(k, v)
	}
	resp, err := door.New(gw, nil).Deliver(ctx, c.Trigger, c.Request, h)
	if err != nil {
		return nil, err
	}
	res.Trigger = &resp
	var ids []string
	for _, r := range resp.Results {
		if r.Action == "started" && r.Run != "" {
			ids = append(ids, r.Run)
		}
	}
	return ids, nil
}

// approvals are the approval steps that asked, in the order they asked.
type approvals struct {
	mu      sync.Mutex
	pending []question
}

type question struct {
	run, step string
	at        time.Time
}

func (a *approvals) event(ev store.Event) {
	if ev.Type != store.EventStepStarted || !strings.HasPrefix(ev.Message, "waiting for approval") {
		return
	}
	a.mu.Lock()
	a.pending = append(a.pending, question{run: ev.RunID, step: ev.Step, at: ev.Time})
	a.mu.Unlock()
}

// drive moves the case's clock on whenever nothing is under way, answering
// approvals when their answer is due, until no run is left advancing.
func drive(ctx context.Context, gw *gateway.Gateway, clock *virtualClock, c *Case, asked *approvals) error {
	stop := ctx.Done()
	for range maxWakes {
		if !clock.settle(stop) {
			return ctx.Err()
		}
		if gw.Engine.Active() == 0 {
			return nil
		}
		next, ok := clock.next()
		asked.mu.Lock()
		var due *question
		var answer *Answer
		for i := range asked.pending {
			p := &asked.pending[i]
			name, _ := stepName(p.step)
			a := c.Approvals[name]
			if a == nil || a.Decision == "timeout" {
				continue
			}
			if at := p.at.Add(a.After); due == nil || at.Before(due.at.Add(answer.After)) {
				due, answer = p, a
			}
		}
		if due != nil && (!ok || !due.at.Add(answer.After).After(next)) {
			p := *due
			asked.pending = slicesDelete(asked.pending, due)
			asked.mu.Unlock()
			clock.advance(p.at.Add(answer.After))
			if !clock.settle(stop) {
				return ctx.Err()
			}
			var late *engine.LateError
			if _, err := gw.Engine.Signal(engine.WithActor(ctx, answer.By), p.run, p.step, answer.Decision, answer.Comment); err != nil && !errors.As(err, &late) {
				// An answer after the deadline is refused, and the timeout
				// answers: what the case asked for.
				return fmt.Errorf("answering approval step %q: %w", p.step, err)
			}
			continue
		}
		asked.mu.Unlock()
		if !ok {
			return errors.New("the run waits for something that never comes: nothing is under way and no timer is set")
		}
		clock.advance(next)
	}
	return fmt.Errorf("the run did not end after its clock moved %d times (to %s): an approval with no timeout that the case does not answer waits for ever; answer it in [tests.approvals]", maxWakes, clock.Now().UTC().Format(time.RFC3339))
}

func slicesDelete(list []question, p *question) []question {
	for i := range list {
		if &list[i] == p {
			return append(list[:i], list[i+1:]...)
		}
	}
	return list
}

// collect reads a run and its sub-chains' runs.
func collect(ctx context.Context, st store.Store, id string) []*RunRecord {
	run, err := st.Run(ctx, id)
	if err != nil {
		return nil
	}
	steps, _ := st.Steps(ctx, id, "")
	out := []*RunRecord{{Run: run, Steps: steps}}
	for _, rec := range steps {
		if rec.Child != "" {
			out = append(out, collect(ctx, st, rec.Child)...)
		}
	}
	return out
}
