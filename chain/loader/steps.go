package loader

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/internal/condition"
	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/templates"
)

// chainBuild carries what decoding one chain needs across its steps.
type chainBuild struct {
	l       *loader
	c       *chain.Chain
	d       *fileDecoder
	sources map[string]chain.Source
	byName  map[string]*chain.Step
	// checks run once every step of the chain is known: references to
	// steps by name may point forward.
	checks []func()

	// handler is the handler list being decoded (failure.go), "" for the
	// chain's own steps; catchTargets are the steps a catch routes to so
	// far; failureHere says the step being decoded may read failure.
	handler      string
	catchTargets map[string]bool
	failureHere  bool
}

// scope is the set of step names one step list can read through steps.NAME:
// its own list with any parallel sub-steps, plus the enclosing lists. Steps
// inside a split are private to each item.
type scope struct {
	names  map[string]bool
	parent *scope
	split  string // the split step owning this scope, "" at top level
}

func (s *scope) visible(name string) bool {
	for ; s != nil; s = s.parent {
		if s.names[name] {
			return true
		}
	}
	return false
}

var stepKeys = []string{
	"name", "provider", "action_type", "payload_template", "on_failure", "timeout_seconds", "delay_seconds",
	"retry", "when", "default_next", "branches", "parallel", "split", "sub_chain", "input", "approval",
	"concurrency",
	"catch",
}

var kindKeys = []string{"provider", "parallel", "split", "sub_chain", "approval"}

// stepRoots are the names a step's templates and when condition may read.
var stepRoots = []string{"origin", "steps", "prev", "run", "chain"}

func (b *chainBuild) steps(tables []*table, parent *chain.Step, sc *scope) []*chain.Step {
	list := make([]*chain.Step, 0, len(tables))
	for _, t := range tables {
		if s := b.step(t, parent, sc); s != nil {
			s.Index = len(list)
			list = append(list, s)
		}
	}
	for _, s := range list {
		s.List = list
	}
	return list
}

func (b *chainBuild) step(t *table, parent *chain.Step, sc *scope) *chain.Step {
	s := &chain.Step{Parent: parent, Source: t.d.source(t.path)}
	s.Name = b.l.checkName(t, "step")
	if s.Name == chain.EndTarget {
		t.d.errorf(t.path.Key("name"), "step name %q is reserved: a branch or default_next target %q ends the list", chain.EndTarget, chain.EndTarget)
	}
	if s.Name != "" {
		if prev, ok := b.sources[s.Name]; ok {
			t.d.errorf(t.path.Key("name"), "step %q is already defined at %s; step names are unique within a chain, sub-steps included", s.Name, where(prev))
		} else {
			b.sources[s.Name] = s.Source
			b.byName[s.Name] = s
			sc.names[s.Name] = true
		}
	}
	b.noteFailureScope(s, parent)

	var kinds []string
	for _, k := range kindKeys {
		if t.has(k) {
			kinds = append(kinds, k)
		}
	}
	switch len(kinds) {
	case 0:
		t.d.errorf(t.path, "step has no kind; set exactly one of provider, parallel, split, sub_chain or approval")
	case 1:
	default:
		t.d.errorf(t.path, "step sets %s; a step is exactly one of provider, parallel, split, sub_chain or approval", strings.Join(kinds, " and "))
	}
	inParallel := parent != nil && parent.Kind == chain.KindParallel

	s.OnFailure = chain.OnFailure(t.enum("on_failure", []string{"abort", "skip", "dlq"}, "abort"))
	s.TimeoutSeconds = t.count("timeout_seconds", "seconds")
	s.DelaySeconds = t.count("delay_seconds", "seconds")
	if rt, ok := t.sub("retry"); ok {
		s.Retry = decodeRetry(rt)
	}
	if src := t.nonEmpty("when"); src != "" {
		s.When = b.condition(t.path.Key("when"), src, sc, nil)
	}
	s.Concurrency = t.concurrency(func(p chain.KeyPath, v any) *templates.Template { return b.template(p, v, sc) }, true)
	if s.Concurrency != nil && parent != nil && parent.Kind == chain.KindParallel {
		t.d.errorf(t.path.Key("concurrency"), "a parallel sub-step cannot take a concurrency key; put it on the parallel step itself")
	}

	switch {
	case t.has("provider"):
		s.Kind = chain.KindProvider
		s.Provider = t.nonEmpty("provider")
		s.ActionType = t.nonEmpty("action_type")
		if strings.HasPrefix(s.ActionType, providers.ReservedActionPrefix) {
			t.d.errorf(t.path.Key("action_type"), "action type %q is in the %q namespace, which the gateway reserves for its own use (the conformance probe); name the provider's action instead", s.ActionType, providers.ReservedActionPrefix)
		}
		payload, hasPayload := t.value("payload_template")
		if s.Provider != "" {
			b.l.later = append(b.l.later, func() {
				if _, ok := b.l.cfg.Providers[s.Provider]; !ok {
					t.d.errorf(t.path.Key("provider"), "unknown provider %q%s", s.Provider, b.l.providerHint(s.Provider))
				}
			})
		}
		if hasPayload {
			s.Payload = b.template(t.path.Key("payload_template"), payload, sc)
		}
	case t.has("parallel"):
		s.Kind = chain.KindParallel
		if inParallel {
			t.d.errorf(t.path.Key("parallel"), "a parallel group cannot nest another parallel group")
		} else if pt, ok := t.sub("parallel"); ok {
			s.Parallel = b.parallel(pt, s, sc)
		}
	case t.has("split"):
		s.Kind = chain.KindSplit
		if inParallel {
			t.d.errorf(t.path.Key("split"), "a parallel sub-step cannot be a split; put the parallel group inside the split's steps instead")
		} else if st, ok := t.sub("split"); ok {
			s.Split = b.split(st, s, sc)
		}
	case t.has("sub_chain"):
		s.Kind = chain.KindSubChain
		s.SubChain = t.nonEmpty("sub_chain")
		if inParallel {
			t.d.errorf(t.path.Key("sub_chain"), "a parallel sub-step cannot call a sub-chain")
		}
		input, hasInput := t.value("input")
		if hasInput {
			s.Input = b.template(t.path.Key("input"), input, sc)
		}
		if s.SubChain != "" {
			b.l.later = append(b.l.later, func() {
				sub, ok := b.l.cfg.Chains[s.SubChain]
				switch {
				case !ok:
					t.d.errorf(t.path.Key("sub_chain"), "unknown chain %q%s", s.SubChain, b.l.cfg.ChainHint(s.SubChain))
				case sub.Input != nil && hasInput:
					checkInputCall(sub.Input, t.d, t.path.Key("input"), sub.Name, input)
				case sub.Input != nil && len(sub.Input.Required) > 0:
					t.d.errorf(t.path, "chain %q requires the input fields %s; give them in input = { ... }", sub.Name, quoteList(sub.Input.Required))
				}
			})
		}
	case t.has("approval"):
		s.Kind = chain.KindApproval
		if parent != nil {
			t.d.errorf(t.path.Key("approval"), "an approval step waits for a person and must be a top-level step of its chain, not inside a parallel group or a split")
		}
		if at, ok := t.sub("approval"); ok {
			s.Approval = b.approval(at, sc)
		}
		if t.has("retry") {
			t.d.errorf(t.path.Key("retry"), "an approval step is answered once; it takes no retry")
		}
	}
	if s.Kind != chain.KindProvider {
		for _, k := range []string{"action_type", "payload_template"} {
			if t.has(k) {
				t.d.errorf(t.path.Key(k), "only a provider step takes %s", k)
			}
		}
	}
	if s.Kind != chain.KindSubChain && t.has("input") {
		t.d.errorf(t.path.Key("input"), "only a sub_chain step takes input")
	}

	if inParallel {
		for _, k := range []string{"branches", "default_next"} {
			if t.has(k) {
				t.d.errorf(t.path.Key(k), "a parallel sub-step cannot have %s; branch on the parallel step itself, which sees every sub-step's result", k)
			}
		}
	} else {
		b.routing(t, s, sc)
	}
	b.catches(t, s, parent)
	t.finish(stepKeys)
	return s
}

// rootNames are the names a condition may read in scope sc.
func rootNames(sc *scope, branch bool) []string {
	r := append([]string(nil), stepRoots...)
	if sc.split != "" {
		r = append(r, "item", "item_index")
	}
	if branch {
		r = append(r, "result")
	}
	return r
}

func (l *loader) providerHint(name string) string {
	if s := chain.Suggest(name, l.cfg.ProviderNames); s != "" {
		return fmt.Sprintf(" (did you mean %q?)", s)
	}
	if len(l.cfg.ProviderNames) == 0 {
		return "; define it in a [[providers]] table"
	}
	return "; defined providers are " + quoteList(l.cfg.ProviderNames)
}

func decodeRetry(t *table) *chain.Retry {
	r := &chain.Retry{
		MaxRetries:   t.count("max_retries", "retries"),
		BackoffMS:    t.count("backoff_ms", "milliseconds"),
		Strategy:     chain.BackoffStrategy(t.enum("strategy", []string{"fixed", "linear", "exponential"}, "exponential")),
		MaxBackoffMS: t.count("max_backoff_ms", "milliseconds"),
		JitterMS:     t.count("jitter_ms", "milliseconds"),
	}
	if r.MaxBackoffMS > 0 && r.BackoffMS > r.MaxBackoffMS {
		t.d.errorf(t.path.Key("max_backoff_ms"), "is smaller than backoff_ms (%d < %d)", r.MaxBackoffMS, r.BackoffMS)
	}
	t.finish([]string{"max_retries", "backoff_ms", "strategy", "max_backoff_ms", "jitter_ms"})
	return r
}

// routing decodes branches and default_next, whose targets must be steps of
// the same list.
func (b *chainBuild) routing(t *table, s *chain.Step, sc *scope) {
	if target := t.nonEmpty("default_next"); target != "" {
		s.DefaultNext = target
		b.checkTarget(t.path.Key("default_next"), s, target)
	}
	branches, ok := t.tables("branches")
	if !ok {
		return
	}
	for _, bt := range branches {
		br := &chain.Branch{Source: bt.d.source(bt.path)}
		br.Target = bt.requiredStr("target")
		if br.Target != "" {
			b.checkTarget(bt.path.Key("target"), s, br.Target)
		}
		hasField := bt.has("field") || bt.has("operator") || bt.has("value")
		switch {
		case bt.has("when") && hasField:
			bt.d.errorf(bt.path, "a branch has either when or field/operator/value, not both")
		case bt.has("when"):
			if src := bt.nonEmpty("when"); src != "" {
				if c := b.condition(bt.path.Key("when"), src, sc, s); c != nil {
					br.Cond = c
				}
			}
		case hasField:
			field := bt.requiredStr("field")
			op := bt.requiredStr("operator")
			value, _ := bt.value("value")
			if field != "" && op != "" {
				f, err := condition.CompileField(field, op, value)
				var fe *condition.FieldError
				switch {
				case errors.As(err, &fe):
					bt.d.errorf(bt.path.Key(fe.Key), "%s", fe.Msg)
				case err != nil:
					bt.d.errorf(bt.path, "%v", err)
				default:
					br.Cond = f
					// Checked as the branch's own result: field = "body.x" reads result.body.x.
					path, _ := condition.ParsePath(field)
					b.checkRefs(bt.path.Key("field"), sc, s, []ref{{root: "result", path: path, text: fmt.Sprintf("field %q", field)}})
				}
			}
		default:
			bt.d.errorf(bt.path, "a branch needs a condition: when = '...' or field/operator/value")
		}
		bt.finish([]string{"field", "operator", "value", "when", "target"})
		s.Branches = append(s.Branches, br)
	}
}

func (b *chainBuild) checkTarget(p chain.KeyPath, s *chain.Step, target string) {
	if target == chain.EndTarget {
		return
	}
	b.checks = append(b.checks, func() {
		for _, other := range s.List {
			if other.Name == target {
				if other.Index <= s.Index {
					b.d.errorf(p, "target %q does not come after %q; branches and default_next route forward only, so every run ends", target, s.Name)
				}
				return
			}
		}
		if b.byName[target] != nil {
			b.d.errorf(p, "target %q is not in the same step list as %q; branches and default_next route between steps of one list", target, s.Name)
			return
		}
		b.d.errorf(p, "unknown step %q%s", target, hint(target, s.List))
	})
}

func hint(name string, list []*chain.Step) string {
	names := make([]string, len(list))
	for i, s := range list {
		names[i] = s.Name
	}
	if s := chain.Suggest(name, names); s != "" {
		return fmt.Sprintf(" (did you mean %q?)", s)
	}
	return ""
}

var parallelKeys = []string{"join", "on_failure", "timeout_seconds", "max_concurrency", "steps"}

func (b *chainBuild) parallel(t *table, owner *chain.Step, sc *scope) *chain.Parallel {
	p := &chain.Parallel{
		Join:           chain.Join(t.enum("join", []string{"all", "any"}, "all")),
		OnFailure:      chain.GroupFailure(t.enum("on_failure", []string{"fail_fast", "best_effort"}, "fail_fast")),
		TimeoutSeconds: t.count("timeout_seconds", "seconds"),
		MaxConcurrency: t.count("max_concurrency", "sub-steps"),
	}
	if p.TimeoutSeconds == 0 {
		p.TimeoutSeconds = chain.DefaultParallelTimeoutSeconds
	}
	if steps, ok := t.tables("steps"); ok && len(steps) > 0 {
		p.Steps = b.steps(steps, owner, sc)
	} else if ok || !t.has("steps") {
		t.d.errorf(t.path, "a parallel group needs at least one sub-step ([[chains.steps.parallel.steps]])")
	}
	t.finish(parallelKeys)
	return p
}

var splitKeys = []string{"items", "mode", "max_concurrency", "tolerated_failures", "timeout_seconds", "steps"}

var percentRE = regexp.MustCompile(`^(\d{1,3})%$`)

func (b *chainBuild) split(t *table, owner *chain.Step, sc *scope) *chain.Split {
	sp := &chain.Split{
		Mode:           chain.SplitMode(t.enum("mode", []string{string(chain.SplitAuto), string(chain.SplitLocal), string(chain.SplitDistributed)}, string(chain.SplitAuto))),
		MaxConcurrency: t.count("max_concurrency", "items"),
		TimeoutSeconds: t.count("timeout_seconds", "seconds"),
	}
	// [gateway] may be in a file read after this one. A stored definition
	// has none; its broker is checked when the run gets here.
	if sp.Mode == chain.SplitDistributed && !b.l.opts.Stored && keyedSteps(t) {
		t.d.errorf(t.path.Key("mode"), "a split whose steps take concurrency keys runs its items in the gateway that runs its chain, where their slots are held; use mode = %q or %q", chain.SplitAuto, chain.SplitLocal)
	}
	if sp.Mode == chain.SplitDistributed && !b.l.opts.Stored {
		b.l.later = append(b.l.later, func() {
			if b.l.cfg.Gateway.Fanout == nil {
				t.d.errorf(t.path.Key("mode"), "mode %q needs a broker: add [gateway.fanout] with rabbitmq_url and redis_url (or use mode = %q, which runs locally without one)", chain.SplitDistributed, chain.SplitAuto)
			}
		})
	}
	if t.has("items") {
		if src := t.nonEmpty("items"); src != "" {
			sp.Items = b.template(t.path.Key("items"), src, sc)
			// A string that reads nothing renders to itself, never to an array.
			if sp.Items != nil && sp.Items.Static() {
				t.d.errorf(t.path.Key("items"), "reads nothing, so it cannot render to an array; write a placeholder, e.g. items = \"<<steps.inventory.body.hosts>>\"")
				sp.Items = nil
			}
		}
	} else {
		t.d.errorf(t.path, "missing required key %q: the array to split, e.g. items = \"<<steps.inventory.body.hosts>>\"", "items")
	}
	if v, ok := t.value("tolerated_failures"); ok {
		switch tv := v.(type) {
		case int64:
			if tv < 0 {
				t.d.errorf(t.path.Key("tolerated_failures"), "must not be negative")
			}
			sp.ToleratedFailures = int(max(tv, 0))
		case string:
			m := percentRE.FindStringSubmatch(tv)
			n := 0
			if m != nil {
				n, _ = strconv.Atoi(m[1])
			}
			if m == nil || n > 100 {
				t.d.errorf(t.path.Key("tolerated_failures"), "must be a count (3) or a percentage from 0%% to 100%% (\"10%%\"), got %q", tv)
			}
			sp.ToleratedFailures, sp.ToleratedPercent = n, true
		default:
			t.d.errorf(t.path.Key("tolerated_failures"), "must be a count (3) or a percentage (\"10%%\"), got %s", describe(v))
		}
	}
	inner := &scope{names: map[string]bool{}, parent: sc, split: owner.Name}
	if steps, ok := t.tables("steps"); ok && len(steps) > 0 {
		sp.Steps = b.steps(steps, owner, inner)
	} else if ok || !t.has("steps") {
		t.d.errorf(t.path, "a split needs at least one per-item step ([[chains.steps.split.steps]])")
	}
	t.finish(splitKeys)
	return sp
}

// template compiles a payload, input, items or message template, whose
// paths are checked once every step of the chain is known.
func (b *chainBuild) template(p chain.KeyPath, v any, sc *scope) *templates.Template {
	tpl := compileRoots(b.d, p, v, nil)
	if tpl == nil {
		return nil
	}
	b.checkRefs(p, sc, nil, templateRefs(tpl))
	b.warnCurlyPlaceholders(p, v)
	return tpl
}

// condition compiles a when condition: a step's, or with self set, a
// branch's of step self, which reads its result.
func (b *chainBuild) condition(p chain.KeyPath, src string, sc *scope, self *chain.Step) *condition.Expr {
	names := rootNames(sc, self != nil)
	if b.failureHere {
		names = append(names, "failure")
	}
	e, err := condition.CompileExpr(src, names)
	if err != nil {
		msg := err.Error()
		switch {
		case strings.Contains(msg, "unknown name failure"):
			msg += "; " + failureUnset
		case strings.Contains(msg, "unknown name result"):
			msg += "; result is only available in branch conditions"
		case strings.Contains(msg, "unknown name item"):
			msg += "; item and item_index are only set inside a split's per-item steps"
		}
		b.d.errorf(p, "%s", msg)
		return nil
	}
	b.checkRefs(p, sc, self, conditionRefs(e))
	return e
}

// checkRefs checks refs, read in scope sc, once every step of the chain is
// known: steps.NAME may name a later one.
func (b *chainBuild) checkRefs(p chain.KeyPath, sc *scope, self *chain.Step, refs []ref) {
	here := b.failureHere
	b.checks = append(b.checks, func() {
		rs := b.stepShapes(sc, self)
		failureRoot(rs, here)
		b.d.checkRefs(p, rs, refs)
	})
	b.l.noteRunURL(b.d, p, refs)
}

func enclosingSplit(s *chain.Step) string {
	for p := s.Parent; p != nil; p = p.Parent {
		if p.Kind == chain.KindSplit {
			return p.Name
		}
	}
	return ""
}

var curlyRE = regexp.MustCompile(`\{\{\s*((?:origin|steps|prev|run|chain|item)[^}]*?)\s*\}\}`)

// warnCurlyPlaceholders flags Acteon-style {{...}} text, which this gateway
// would send literally.
func (b *chainBuild) warnCurlyPlaceholders(p chain.KeyPath, v any) {
	switch t := v.(type) {
	case string:
		if m := curlyRE.FindStringSubmatch(t); m != nil {
			b.d.warnf(p, "%q is sent as literal text; placeholders are written <<%s>>", m[0], m[1])
		}
	case map[string]any:
		for k, e := range t {
			b.warnCurlyPlaceholders(p.Key(k), e)
		}
	case []any:
		for i, e := range t {
			b.warnCurlyPlaceholders(p.Elem(i, ""), e)
		}
	}
}

// approvalCall decodes an approval step's notify or escalate table: a
// provider call whose payload reads chain.ApprovalCallRoots, and its
// timing key (remind_every or after).
func (b *chainBuild) approvalCall(t *table, timing string) *chain.ApprovalCall {
	c := &chain.ApprovalCall{Provider: t.nonEmpty("provider"), ActionType: t.nonEmpty("action_type"), Source: t.d.source(t.path)}
	if c.Provider != "" {
		b.l.later = append(b.l.later, func() {
			if _, ok := b.l.cfg.Providers[c.Provider]; !ok {
				t.d.errorf(t.path.Key("provider"), "unknown provider %q%s", c.Provider, b.l.providerHint(c.Provider))
			}
		})
	}
	if v, ok := t.value("payload_template"); ok {
		c.Payload = compileRoots(t.d, t.path.Key("payload_template"), v, append(slices.Clone(chain.ApprovalCallRoots), "secrets"))
	}
	if _, ok := t.value(timing); ok {
		if d, ok := t.duration(timing); ok {
			// Calls are timed to the second from when the step asked, so
			// a part of a second could not be honoured.
			if d%time.Second != 0 {
				t.d.errorf(t.path.Key(timing), `must be whole seconds, at least 1s ("90s", "15m"): calls are timed to the second; got %s`, d)
			}
			if timing == "after" {
				c.After = d
			} else {
				c.Every = d
			}
		}
	}
	t.finish([]string{"provider", "action_type", "payload_template", timing})
	return c
}

// approval decodes an approval step's table.
func (b *chainBuild) approval(t *table, sc *scope) *chain.Approval {
	a := &chain.Approval{
		OnTimeout: t.enum("on_timeout", []string{"approve", "reject", "fail"}, "fail"),
		OnReject:  t.enum("on_reject", []string{"fail", "continue"}, "fail"),
		OnResolve: t.enum("on_resolve", []string{"cancel", "approve", "reject"}, ""),
	}
	if v, ok := t.value("message"); ok {
		a.Message = b.template(t.path.Key("message"), v, sc)
	}
	if nt, ok := t.sub("notify"); ok && nt != nil {
		a.Notify = b.approvalCall(nt, "remind_every")
	}
	if et, ok := t.sub("escalate"); ok && et != nil {
		a.Escalate = b.approvalCall(et, "after")
		if a.Escalate != nil && a.Escalate.After <= 0 {
			t.d.errorf(t.path.Key("escalate").Key("after"), `an escalation needs after, how long after the step asked it calls ("45m")`)
		}
	}
	if v, ok := t.value("approvers"); ok {
		arr, isArr := v.([]any)
		if !isArr {
			t.d.errorf(t.path.Key("approvers"), `must be an array of people ("alice") and groups ("group:sre"), got %s`, describe(v))
		} else if len(arr) == 0 {
			t.d.errorf(t.path.Key("approvers"), `names no one, so no one could answer: name people ("alice") or groups ("group:sre"), or leave it out`)
		}
		for i, e := range arr {
			at := t.path.Key("approvers").Elem(i, "")
			who, isStr := e.(string)
			name, group := strings.CutPrefix(who, chain.GroupPrefix)
			switch {
			case !isStr || strings.TrimSpace(name) == "" || strings.ContainsFunc(name, unicode.IsControl):
				t.d.errorf(at, `must be a person's name ("alice") or a group ("group:sre"), got %s`, describe(e))
			case !group && strings.Contains(who, ":"):
				t.d.errorf(at, `%q: a group is written "group:NAME"; a name holds no other prefix`, who)
			default:
				a.Approvers = append(a.Approvers, who)
			}
		}
	}
	a.FourEyes = t.boolean("four_eyes", false)
	t.finish([]string{"message", "on_timeout", "on_reject", "on_resolve", "notify", "escalate", "approvers", "four_eyes"})
	return a
}
