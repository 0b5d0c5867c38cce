package loader

import (
	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/templates"
)

var concurrencyKeys = []string{"key", "limit", "on_busy", "queue_limit", "queue_timeout_seconds"}

// chainConcurrencyRoots are what a chain's concurrency key reads: the run
// has taken no step yet when it asks for its slot.
var chainConcurrencyRoots = []string{"origin", "run", "chain"}

// concurrency reads a chain's or a step's concurrency table. compile
// compiles its key in the scope it is read in; step says it is a step's,
// which waits or skips but cancels no one.
func (t *table) concurrency(compile func(p chain.KeyPath, v any) *templates.Template, step bool) *chain.Concurrency {
	ct, ok := t.sub("concurrency")
	if !ok {
		return nil
	}
	c := &chain.Concurrency{Source: ct.d.source(ct.path)}
	if !ct.has("key") {
		ct.d.errorf(ct.path, `missing required key "key": what to hold one at a time, e.g. key = "<<origin.payload.host>>"`)
	} else if src := ct.nonEmpty("key"); src != "" {
		c.Key = compile(ct.path.Key("key"), src)
	}
	c.Limit, _ = ct.bounded("limit", "runs", 1, 0, chain.DefaultConcurrencyLimit)
	allowed := []string{string(chain.OnBusyQueue), string(chain.OnBusySkip), string(chain.OnBusyCancel)}
	if step {
		allowed = allowed[:2]
		if ct.str("on_busy") == string(chain.OnBusyCancel) {
			ct.d.errorf(ct.path.Key("on_busy"), `a step's concurrency waits ("queue") or skips the step ("skip"); cancelling the runs that hold a key is a chain's (on_busy = "cancel" on the chain's concurrency)`)
			allowed = append(allowed, string(chain.OnBusyCancel))
		}
	}
	c.OnBusy = chain.OnBusy(ct.enum("on_busy", allowed, string(chain.OnBusyQueue)))
	c.QueueLimit, _ = ct.bounded("queue_limit", "runs", 1, 0, chain.DefaultConcurrencyQueueLimit)
	c.QueueTimeoutSeconds, _ = ct.bounded("queue_timeout_seconds", "seconds", 1, 0, chain.DefaultConcurrencyQueueTimeout)
	ct.finish(concurrencyKeys)
	return c
}

// keyedSteps reports whether a split table's per-item steps, at any depth,
// take concurrency keys, as written.
func keyedSteps(t *table) bool {
	steps, _ := t.m["steps"].([]map[string]any)
	var list []any
	for _, m := range steps {
		list = append(list, m)
	}
	if l, ok := t.m["steps"].([]any); ok {
		list = l
	}
	for _, e := range list {
		m, ok := e.(map[string]any)
		if !ok {
			continue
		}
		if _, ok := m["concurrency"]; ok {
			return true
		}
		for _, nested := range []string{"split", "parallel"} {
			if sub, ok := m[nested].(map[string]any); ok && keyedSteps(&table{m: sub}) {
				return true
			}
		}
	}
	return false
}
