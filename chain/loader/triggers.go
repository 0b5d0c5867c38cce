package loader

import (
	"errors"
	"slices"
	"strings"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/internal/condition"
	"github.com/chaingate/gateway/templates"
)

var triggerKeys = []string{"name", "type", "chain", "resolve_chain", "per", "when", "payload", "labels", "resolve_payload", "idempotency_key", "token", "secret", "signature", "max_alerts", "retention"}

func (l *loader) trigger(t *table) {
	tr := &chain.Trigger{Name: l.checkName(t, "trigger"), Source: t.d.source(t.path)}
	tr.Type = chain.TriggerType(t.enum("type", []string{"alertmanager", "grafana", "webhook"}, ""))
	if !t.has("type") {
		t.d.errorf(t.path, `missing required key "type" (alertmanager, grafana or webhook)`)
	}
	tr.Chain = t.requiredStr("chain")
	tr.ResolveChain = t.nonEmpty("resolve_chain")
	if tr.Type.Alerts() {
		tr.Per = chain.TriggerPer(t.enum("per", []string{"alert", "group"}, "alert"))
	} else {
		for _, k := range []string{"per", "resolve_chain", "resolve_payload"} {
			if t.has(k) {
				t.d.errorf(t.path.Key(k), "only a trigger of type alertmanager or grafana takes %s", k)
			}
		}
	}
	if tr.Type.Alerts() {
		tr.MaxAlerts = chain.DefaultMaxAlerts
		if t.has("max_alerts") {
			if tr.MaxAlerts = t.count("max_alerts", "alerts"); tr.MaxAlerts == 0 {
				t.d.errorf(t.path.Key("max_alerts"), "must be at least 1")
			}
		}
	} else if t.has("max_alerts") {
		t.d.errorf(t.path.Key("max_alerts"), "only a trigger of type alertmanager or grafana takes max_alerts")
	}
	if tr.Type != chain.TriggerWebhook && t.has("idempotency_key") {
		t.d.errorf(t.path.Key("idempotency_key"), "only a webhook trigger takes idempotency_key; an alert's run is keyed by its fingerprint and startsAt")
	}
	if t.has("resolve_payload") && !t.has("resolve_chain") {
		t.d.errorf(t.path.Key("resolve_payload"), "resolve_payload needs resolve_chain, the chain it starts")
	}
	roots := tr.TriggerRoots()
	if src := t.nonEmpty("when"); src != "" {
		e, err := condition.CompileExpr(src, roots)
		if err != nil {
			t.d.errorf(t.path.Key("when"), "%s; a trigger's condition reads %s", err, quoteList(roots))
		} else {
			tr.When = e
		}
	}
	if v, ok := t.value("payload"); ok {
		tr.Payload = triggerTemplate(t, "payload", v, roots)
	}
	if v, ok := t.value("labels"); ok {
		if _, isTable := v.(map[string]any); !isTable {
			t.d.errorf(t.path.Key("labels"), "must be a table of label names to strings (templates), got %s", describe(v))
		} else {
			tr.Labels = triggerTemplate(t, "labels", v, roots)
		}
	}
	if v, ok := t.value("resolve_payload"); ok {
		tr.ResolvePayload = triggerTemplate(t, "resolve_payload", v, append(slices.Clone(roots), "firing_run"))
	}
	if v, ok := t.value("idempotency_key"); ok {
		if _, isStr := v.(string); !isStr {
			t.d.errorf(t.path.Key("idempotency_key"), "must be a string template, got %s", describe(v))
		} else {
			tr.IdempotencyKey = triggerTemplate(t, "idempotency_key", v, roots)
		}
	}
	tr.Token = secretTemplate(t, "token")
	tr.Secret = secretTemplate(t, "secret")
	tr.Signature = t.enum("signature", []string{chain.SignatureHub, chain.SignatureChaingate}, chain.SignatureHub)
	if t.has("signature") && !t.has("secret") {
		t.d.errorf(t.path.Key("signature"), "signature needs secret, the HMAC key it is made with")
	}
	if t.has("retention") {
		tr.Retention = t.retentionOverride(false)
	}
	t.finish(triggerKeys)
	if tr.Name == "" {
		return
	}
	if prev, ok := l.cfg.Triggers[tr.Name]; ok {
		t.d.errorf(t.path.Key("name"), "trigger %q is already defined at %s", tr.Name, where(prev.Source))
		return
	}
	if l.cfg.Triggers == nil {
		l.cfg.Triggers = map[string]*chain.Trigger{}
	}
	l.cfg.Triggers[tr.Name] = tr
	l.cfg.TriggerNames = append(l.cfg.TriggerNames, tr.Name)
	l.later = append(l.later, func() {
		l.checkTriggerChains(t, tr)
		checkTriggerRefs(t, tr, l.cfg.Chains[tr.Chain])
	})
}

// triggerTemplate compiles one of a trigger's templates, which read the
// request's roots.
func triggerTemplate(t *table, key string, v any, roots []string) *templates.Template {
	p := t.path.Key(key)
	// Secrets compile, to be refused below with the reason.
	tpl := compileRoots(t.d, p, v, append(slices.Clone(roots), "secrets"))
	if tpl == nil {
		return nil
	}
	for _, r := range tpl.Refs() {
		if r.Root == "secrets" {
			// What the mapping makes is stored with the run as its origin.
			t.d.errorf(p.Sub(r.Key), "<<%s>>: a trigger's %s may not read secrets: it becomes the run's stored payload; read secrets in the chain's steps", r.Text, key)
		}
	}
	return tpl
}

// checkTriggerRefs checks what a trigger's condition and templates read
// against the request its type takes, and a resolve mapping's firing_run
// against firing, the chain whose run the alert's firing started.
func checkTriggerRefs(t *table, tr *chain.Trigger, firing *chain.Chain) {
	rs := triggerShapes(tr)
	if tr.When != nil {
		t.d.checkRefs(t.path.Key("when"), rs, conditionRefs(tr.When))
	}
	for key, tpl := range map[string]*templates.Template{"payload": tr.Payload, "labels": tr.Labels, "idempotency_key": tr.IdempotencyKey} {
		if tpl != nil {
			t.d.checkRefs(t.path.Key(key), rs, templateRefs(tpl))
		}
	}
	if tr.ResolvePayload != nil {
		rs["firing_run"] = firingRunShape(firing)
		t.d.checkRefs(t.path.Key("resolve_payload"), rs, templateRefs(tr.ResolvePayload))
	}
}

// compileRoots compiles a template that reads roots (a chain step's when
// nil), reporting each broken string at its key.
func compileRoots(d *fileDecoder, p chain.KeyPath, v any, roots []string) *templates.Template {
	tpl, err := templates.CompileRoots(v, roots)
	if err == nil {
		return tpl
	}
	errs := []error{err}
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		errs = joined.Unwrap()
	}
	for _, err := range errs {
		var ce *templates.CompileError
		if errors.As(err, &ce) && ce.Key != "" {
			d.errorf(p.Sub(ce.Key), "%s at offset %d", ce.Msg, ce.Offset)
		} else {
			d.errorf(p, "%v", err)
		}
	}
	return nil
}

// secretTemplate compiles a credential: a template that reads only
// secrets, so the value is never written in the config itself.
func secretTemplate(t *table, key string) *templates.Template {
	v, ok := t.value(key)
	if !ok {
		return nil
	}
	s, isStr := v.(string)
	if !isStr || s == "" {
		t.d.errorf(t.path.Key(key), `must be a non-empty string such as "<<secrets.NAME>>", got %s`, describe(v))
		return nil
	}
	tpl, err := templates.CompileString(s)
	if err != nil {
		t.d.errorf(t.path.Key(key), "%v", err)
		return nil
	}
	refs := tpl.Refs()
	if len(refs) == 0 {
		t.d.errorf(t.path.Key(key), `must read a secret ("<<secrets.NAME>>"), not hold the credential itself`)
		return nil
	}
	for _, r := range refs {
		if r.Root != "secrets" {
			t.d.errorf(t.path.Key(key), "<<%s>>: a trigger's %s may only read secrets.NAME", r.Text, key)
			return nil
		}
	}
	if tpl.Defaulted() {
		// The default is not shown: it would be the credential itself.
		t.d.errorf(t.path.Key(key), `takes no ?? default: a trigger's %s is a credential, and a default would be one written in the config; read it as "<<secrets.NAME>>" alone`, key)
		return nil
	}
	t.d.checkRefs(t.path.Key(key), secretShapes, templateRefs(tpl))
	return tpl
}

// checkTriggerChains checks, once every chain is loaded, that the chains a
// trigger starts exist and that its mappings give the input they declare.
func (l *loader) checkTriggerChains(t *table, tr *chain.Trigger) {
	for _, k := range []string{"chain", "resolve_chain"} {
		name := tr.Chain
		if k == "resolve_chain" {
			name = tr.ResolveChain
		}
		if name != "" && l.cfg.Chains[name] == nil {
			t.d.errorf(t.path.Key(k), "trigger %q starts chain %q, which is not defined%s", tr.Name, name, l.cfg.ChainHint(name))
		}
	}
	l.checkTriggerInput(t, tr.Chain, "payload", nil)
	if tr.ResolveChain != "" {
		passed := []string{"alert", "firing_run"}
		if tr.Per == chain.PerGroup {
			passed[0] = "group"
		}
		l.checkTriggerInput(t, tr.ResolveChain, "resolve_payload", passed)
	}
}

// checkTriggerInput checks that the mapping at key gives the input chain
// name declares. passed are the fields of what the trigger passes without
// a mapping; nil when that is the request as it came.
func (l *loader) checkTriggerInput(t *table, name, key string, passed []string) {
	c := l.cfg.Chains[name]
	if c == nil || c.Input == nil || c.Input.Schema != nil {
		return
	}
	fields := c.Input.Fields()
	raw, given := t.m[key]
	if !given {
		fits := passed != nil
		for _, f := range c.Input.Required {
			fits = fits && slices.Contains(passed, f)
		}
		for _, f := range passed {
			fits = fits && slices.Contains(fields, f)
		}
		if !fits {
			t.d.errorf(t.path, "chain %q declares its input (%s); map the request to it with %s = { ... }", name, strings.Join(fields, ", "), key)
		}
		return
	}
	obj, ok := raw.(map[string]any)
	if !ok {
		return
	}
	for _, f := range c.Input.Required {
		if _, ok := obj[f]; !ok {
			t.d.errorf(t.path.Key(key), "chain %q requires field %q in its payload, and the mapping does not give it", name, f)
		}
	}
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if !slices.Contains(fields, k) {
			t.d.errorf(t.path.Key(key).Key(k), "chain %q does not declare field %q in its input%s", name, k, didYouMean(k, fields, "fields"))
		}
	}
}
