package chaintest

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/internal/jsonx"
	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/builtin"
)

// Call is one call a step made, as its provider received it.
type Call struct {
	RunID   string
	Step    string // the step's key: name, group/name, or split[i]/name
	Attempt int
	// Provider and Action are the provider called and the action_type.
	Provider, Action string
	// Mocked is false for a call that went to a real provider.
	Mocked bool
	// Request is the rendered payload, secrets redacted.
	Request json.RawMessage
}

// mocks answers the calls of a case: a step's mock, or the provider's
// plugin for a provider the case runs for real. It records every call.
type mocks struct {
	c     *Case
	clock *virtualClock
	real  map[string]bool
	// empty answers every unmocked call with an empty success (a dry run)
	// instead of failing it.
	empty  bool
	next   engine.ProviderResolver
	redact func([]byte) []byte
	// items reads the value of a split's item, for mocks that match on it.
	items func(runID, itemKey string, index int) any

	mu    sync.Mutex
	calls []Call
	// unmocked are the steps that called a provider with no mock.
	unmocked map[string]string
}

func (m *mocks) Resolve(p *chain.Provider) (providers.Provider, error) {
	if m.real[p.Name] {
		real, err := m.next.Resolve(p)
		if err != nil {
			return nil, err
		}
		return recording{m: m, provider: p.Name, next: real}, nil
	}
	mp := &mockProvider{m: m, provider: p.Name, config: p.Config}
	if impl, ok := builtin.New(p.Type); ok {
		mp.checker, _ = impl.(providers.CallChecker)
	}
	return mp, nil
}

// CheckProvider checks only the providers that run for real.
func (m *mocks) CheckProvider(ctx context.Context, p *chain.Provider) error {
	if pc, ok := m.next.(engine.ProviderChecker); ok && m.real[p.Name] {
		return pc.CheckProvider(ctx, p)
	}
	return nil
}

func (m *mocks) record(provider string, mocked bool, req providers.Request) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls = append(m.calls, Call{RunID: req.RunID, Step: req.Step, Attempt: req.Attempt, Provider: provider, Action: req.ActionType, Mocked: mocked,
		Request: m.redact(slices.Clone(req.Payload))})
}

// recording passes a call to a real provider and records it.
type recording struct {
	m        *mocks
	provider string
	next     providers.Provider
}

func (r recording) Execute(ctx context.Context, req providers.Request) (providers.Response, error) {
	r.m.record(r.provider, false, req)
	return r.next.Execute(ctx, req)
}

func (r recording) Describe(ctx context.Context) (providers.Info, error) { return r.next.Describe(ctx) }

type mockProvider struct {
	m        *mocks
	provider string
	// checker, for a provider whose config declares what its calls may
	// ask (exec, ssh), refuses a mocked call the provider would refuse:
	// a mock stands in for what the command does, not for its checks.
	checker providers.CallChecker
	config  json.RawMessage
}

func (p *mockProvider) Describe(context.Context) (providers.Info, error) {
	return providers.Info{Name: p.provider}, nil
}

func (p *mockProvider) Execute(ctx context.Context, req providers.Request) (providers.Response, error) {
	p.m.record(p.provider, true, req)
	name, index := stepName(req.Step)
	if p.checker != nil {
		if err := p.checker.CheckCall(ctx, p.config, providers.Call{Name: name, ActionType: req.ActionType, Payload: req.Payload}); err != nil {
			return providers.Response{}, err
		}
	}
	mock := p.m.c.Mocks[name]
	if mock == nil {
		if p.m.empty {
			return providers.Response{Body: json.RawMessage(`{}`)}, nil
		}
		p.m.mu.Lock()
		if p.m.unmocked == nil {
			p.m.unmocked = map[string]string{}
		}
		p.m.unmocked[name] = p.provider
		p.m.mu.Unlock()
		return providers.Response{}, providers.Permanent("unmocked", "step %q calls provider %q, and the case has no mock for it: add [tests.mocks.%s], or list %q in real_providers", name, p.provider, name, p.provider)
	}
	o := mock.answer(req.Attempt, index, p.m.item(req, index))
	if o.Delay > 0 {
		wait := o.Delay
		if !req.Deadline.IsZero() {
			wait = min(wait, req.Deadline.Sub(p.m.clock.Now()))
		}
		if !p.m.clock.sleep(ctx.Done(), wait) {
			return providers.Response{}, providers.Retryable("cancelled", "%v", ctx.Err())
		}
		if wait < o.Delay {
			return providers.Response{}, providers.Retryable("timeout", "%v: the mock takes %s", context.DeadlineExceeded, o.Delay)
		}
	}
	if o.Error != "" {
		if o.Retryable {
			return providers.Response{}, providers.Retryable(o.Code, "%s", o.Error)
		}
		return providers.Response{}, providers.Permanent(o.Code, "%s", o.Error)
	}
	body := o.Body
	if body == nil {
		body = json.RawMessage(`{}`)
	}
	return providers.Response{Body: body}, nil
}

// item is the value of a split's item a call is made for, or nil.
func (m *mocks) item(req providers.Request, index int) any {
	if index < 0 {
		return nil
	}
	if m.items == nil {
		return nil
	}
	// A match compares the values JSON decoding gives.
	b, err := jsonx.Marshal(m.items(req.RunID, req.Step, index))
	if err != nil {
		return nil
	}
	return decode(b)
}

// answer is what the mock answers the given attempt, for a split's item
// (index ≥ 0, item its value) or a step.
func (mk *Mock) answer(attempt, index int, item any) Outcome {
	for _, im := range mk.Items {
		if (im.Index != nil && *im.Index == index) || (im.Match != nil && index >= 0 && contains(item, im.Match)) {
			return pick(im.Outcome, im.Attempts, attempt)
		}
	}
	return pick(mk.Outcome, mk.Attempts, attempt)
}

func pick(o Outcome, attempts []Outcome, attempt int) Outcome {
	if len(attempts) == 0 {
		return o
	}
	return attempts[min(attempt, len(attempts))-1]
}

// stepName splits a call's step key into the step's name and, for a
// step of a split's item (split[3]/name), the item's index; -1 otherwise.
// Keys join a group's or an item's steps to it with "/".
func stepName(key string) (string, int) {
	index := -1
	name := key
	if slash := strings.LastIndex(key, "/"); slash >= 0 {
		name = key[slash+1:]
		if _, i, ok := itemOf(key[:slash]); ok {
			index = i
		}
	}
	return name, index
}

// itemOf splits an item's key (split[007]) into its split's key and index.
func itemOf(key string) (string, int, bool) {
	if !strings.HasSuffix(key, "]") {
		return "", 0, false
	}
	open := strings.LastIndex(key, "[")
	if open < 0 {
		return "", 0, false
	}
	n, err := strconv.Atoi(key[open+1 : len(key)-1])
	if err != nil {
		return "", 0, false
	}
	return key[:open], n, true
}
