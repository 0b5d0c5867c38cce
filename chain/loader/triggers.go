package loader

import (
	"errors"
	"slices"
	"strings"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/internal/condition"
	"github.com/chaingate/gateway/templates"
)

var triggerKeys = []string{"name", "type", "chain", "resolve_chain", "per", "when", "payload", "resolve_payload", "idempotency_key", "token", "secret", "signature"}

// The fields of an alert and of its group, as Alertmanager's webhook
// (version 4) and Grafana's add them, so a typo in a mapping is caught
// when the config loads.
var (
	alertFields = []string{"status", "labels", "annotations", "startsAt", "endsAt", "generatorURL", "fingerprint",
		"values", "valueString", "silenceURL", "dashboardURL", "panelURL", "imageURL"}
	groupFields = []string{"version", "groupKey", "truncatedAlerts", "status", "receiver", "groupLabels", "commonLabels",
		"commonAnnotations", "externalURL", "alerts", "orgId", "title", "state", "message"}
)

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
	raw := t.m["payload"]
	l.later = append(l.later, func() { l.checkTriggerChains(t, tr, raw) })
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
		at := p.Sub(r.Key)
		if r.Root == "secrets" {
			// What the mapping makes is stored with the run as its origin.
			t.d.errorf(at, "<<%s>>: a trigger's %s may not read secrets: it becomes the run's stored payload; read secrets in the chain's steps", r.Text, key)
			continue
		}
		var fields []string
		switch r.Root {
		case "alert":
			fields = alertFields
		case "group":
			fields = groupFields
		case "firing_run":
			fields = []string{"id", "status", "body", "steps"}
		}
		if fields != nil && len(r.Path) > 0 && !slices.Contains(fields, r.Path[0]) {
			t.d.errorf(at, "<<%s>>: %s", r.Text, unknownField(r.Root, r.Path[0], fields))
		}
	}
	return tpl
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
	return tpl
}

// checkTriggerChains checks, once every chain is loaded, that the chains a
// trigger starts exist and that its payload gives the input a chain
// declares.
func (l *loader) checkTriggerChains(t *table, tr *chain.Trigger, raw any) {
	for _, k := range []string{"chain", "resolve_chain"} {
		name := tr.Chain
		if k == "resolve_chain" {
			name = tr.ResolveChain
		}
		if name != "" && l.cfg.Chains[name] == nil {
			t.d.errorf(t.path.Key(k), "trigger %q starts chain %q, which is not defined%s", tr.Name, name, l.cfg.ChainHint(name))
		}
	}
	c := l.cfg.Chains[tr.Chain]
	if c == nil || c.Input == nil || c.Input.Schema != nil {
		return
	}
	obj, ok := raw.(map[string]any)
	if !ok {
		if raw == nil {
			t.d.errorf(t.path, "chain %q declares its input (%s); map the request to it with payload = { ... }", tr.Chain, strings.Join(c.Input.Fields(), ", "))
		}
		return
	}
	for _, f := range c.Input.Required {
		if _, ok := obj[f]; !ok {
			t.d.errorf(t.path.Key("payload"), "chain %q requires field %q in its payload, and the mapping does not give it", tr.Chain, f)
		}
	}
	fields := c.Input.Fields()
	for k := range obj {
		if !slices.Contains(fields, k) {
			t.d.errorf(t.path.Key("payload").Key(k), "chain %q does not declare field %q in its input%s", tr.Chain, k, didYouMean(k, fields, "fields"))
		}
	}
}
