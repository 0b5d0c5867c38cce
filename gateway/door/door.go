// Package door is where an alert becomes a run: trigger deliveries are
// checked, mapped to runs and started once each, what cannot start yet is
// kept in the inbox and started later, and triggers and schedules are
// paused and resumed.
//
// It is the gateway's own package, with no compatibility promise.
package door

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/internal/jsonx"
	"github.com/chaingate/gateway/templates"
)

// The door is everything between a delivery arriving at a trigger and its
// runs starting. Every alert, alert group or body it takes ends in one of
// the outcomes below, each logged and counted: nothing it cannot turn into a
// run is dropped; it is parked in the dead-letter queue, replayable once
// the config is fixed.

// Door turns what triggers deliver into runs, keeps what it cannot start
// yet in its inbox, and pauses triggers and schedules.
type Door struct {
	*gateway.Gateway
	// Observer is told what the door does.
	Observer Observer
	// inboxWake tells RunInbox that this gateway kept a delivery.
	inboxWake chan struct{}
}

// New returns gw's door, telling obs (nil: no one) what it does.
func New(gw *gateway.Gateway, obs Observer) *Door {
	if obs == nil {
		obs = noObserver{}
	}
	return &Door{Gateway: gw, Observer: obs, inboxWake: make(chan struct{}, 1)}
}

// Observer is told what the door does, for metrics. Its methods must not
// block.
type Observer interface {
	// Delivered is one alert, group or body a trigger took, or one request
	// it refused.
	Delivered(trigger, outcome string)
	// Ticked is what n ticks of a schedule did: started, deduplicated,
	// caught_up, missed (passed while the gateway was not checking) or
	// failed.
	Ticked(schedule, outcome string, n int)
}

type noObserver struct{}

func (noObserver) Delivered(string, string)   {}
func (noObserver) Ticked(string, string, int) {}

const (
	// triggerTTL is how long a trigger remembers what it started: an alert
	// Alertmanager keeps sending (every repeat_interval) starts one run for
	// as long as it fires, up to this.
	triggerTTL = 7 * 24 * time.Hour
	// DeliveryBudget is how long a delivery's alerts are turned into runs
	// before the answer goes: the rest are kept, and started after it.
	DeliveryBudget = 500 * time.Millisecond
	// deliveryWorkers turn one delivery's alerts into runs at once.
	deliveryWorkers = 8
	// inboxRecheck is how often kept deliveries are looked for, so that
	// those a gateway kept and died before starting are started elsewhere.
	inboxRecheck = 5 * time.Second
	// inboxClaimTTL is how long a gateway's claim on a kept delivery
	// outlives the gateway: the claim is renewed every third of it while
	// the delivery is worked, and released once it is, or when the gateway
	// stops. Working one twice starts nothing twice; the claim only keeps
	// gateways from doing the same work at once.
	inboxClaimTTL = 15 * time.Second
	// keepGrace is how long a dead-letter entry bound to a key may take to
	// be written: a key bound to an entry that is not there after it holds
	// nothing, the entry was replayed or deleted.
	keepGrace = time.Minute
)

// inbound is one delivery as the door works it.
type inbound struct {
	tr  *chain.Trigger
	doc any
	// headers are a webhook's, credentials left out.
	headers map[string]any
	// meta becomes the runs' origin.metadata.
	meta map[string]string
	// key makes two webhook deliveries the same: the Idempotency-Key
	// header, or the signature of a signed body.
	key string
	// replay is the dead-letter entry this delivery is a replay of: it is
	// neither capped nor parked again.
	replay string
	// paused is the trigger's pause, when the delivery came while it was
	// paused: what it brings is kept for a replay, not started.
	paused *api.Pause
}

// DeliverInbound turns a delivery into runs. Alerts not started by until (zero:
// no bound) are kept, and started after the answer.
func (gw *Door) DeliverInbound(ctx context.Context, in *inbound, until time.Time) api.TriggerResponse {
	resp := api.TriggerResponse{Trigger: in.tr.Name, Results: []api.TriggerResult{}}
	defer func() {
		for _, res := range resp.Results {
			gw.observe(in.tr, res)
		}
	}()
	in.paused = gw.pause(ctx, in.tr.Name)
	if !in.tr.Type.Alerts() {
		resp.Results = append(resp.Results, gw.guard(in.tr, api.TriggerResult{Chain: in.tr.Chain}, func() api.TriggerResult { return gw.fireWebhook(ctx, in) }))
		return resp
	}
	group := in.doc.(map[string]any)
	alerts := group["alerts"].([]any)
	if n, _ := group["truncatedAlerts"].(float64); n > 0 && in.replay == "" {
		gw.Log.Warn("the sender truncated this notification: alerts it holds were never delivered; raise the sender's max_alerts", "trigger", in.tr.Name, "truncated", int(n))
	}
	if in.tr.Per == chain.PerGroup {
		resp.Results = append(resp.Results, gw.guard(in.tr, api.TriggerResult{Chain: in.tr.Chain}, func() api.TriggerResult { return gw.fireGroup(ctx, in, group, alerts) }))
		return resp
	}
	if limit := in.tr.MaxAlerts; in.replay == "" && in.paused == nil && len(alerts) > limit {
		// The alerts beyond the cap are parked in entries of at most the cap
		// each, so that replaying one starts a bounded number of runs (as a
		// paused trigger keeps its alerts).
		resp.TruncatedAlerts = len(alerts) - limit
		cause := fmt.Errorf("the delivery holds %d alerts, and trigger %q turns at most max_alerts = %d of one delivery into runs", len(alerts), in.tr.Name, limit)
		for rest := alerts[limit:]; len(rest) > 0; rest = rest[min(limit, len(rest)):] {
			chunk := rest[:min(limit, len(rest))]
			resp.Results = append(resp.Results, gw.park(ctx, in, api.TriggerResult{Chain: in.tr.Chain}, withAlerts(group, chunk), "", cause, "max_alerts"))
		}
		alerts = alerts[:limit]
	}
	results, rest := gw.takeAlerts(ctx, in, group, alerts, until)
	resp.Results = append(results, resp.Results...)
	if len(rest) > 0 {
		resp.Results = append(resp.Results, gw.queue(ctx, in, group, rest)...)
	}
	return resp
}

// pause is the trigger's pause now, or nil.
func (gw *Door) pause(ctx context.Context, trigger string) *api.Pause {
	p, err := gw.Paused(ctx, api.PauseTrigger, trigger)
	if err != nil {
		// A pause that cannot be read holds nothing back.
		gw.Log.Warn("reading whether the trigger is paused; taking the delivery", "trigger", trigger, "err", err)
	}
	return p
}

// guard does one unit of the door's work, an alert, a group or a body, so
// that a bug met on it fails that unit, logged with its stack and counted
// as a failed delivery, rather than take the gateway down: the sender
// sends it again, or the inbox tries it again.
func (gw *Door) guard(tr *chain.Trigger, res api.TriggerResult, fn func() api.TriggerResult) (out api.TriggerResult) {
	defer func() {
		if p := recover(); p != nil {
			gw.Log.Error("the door hit a bug taking a delivery; it failed, to be sent or tried again", "trigger", tr.Name, "alert", res.Alert, "group", res.Group, "panic", p, "stack", string(debug.Stack()))
			res.Action, res.Reason = "failed", fmt.Sprintf("the gateway hit a bug taking it (%v); its log has the details", p)
			out = res
		}
	}()
	return fn()
}

// takeAlerts starts the runs of a notification's alerts until until, or
// keeps them while the trigger is paused; it returns what each alert it
// took did, and the alerts it did not take.
func (gw *Door) takeAlerts(ctx context.Context, in *inbound, group map[string]any, alerts []any, until time.Time) ([]api.TriggerResult, []any) {
	if in.paused != nil {
		return gw.keepPaused(ctx, in, group, alerts), nil
	}
	return gw.fireAlerts(ctx, in, group, alerts, until)
}

// fireAlerts starts the runs of alerts, several at once, until until or
// ctx ends; it returns what each alert it took did, and the alerts it did
// not take.
func (gw *Door) fireAlerts(ctx context.Context, in *inbound, group map[string]any, alerts []any, until time.Time) ([]api.TriggerResult, []any) {
	results := make([]api.TriggerResult, len(alerts))
	taken := atOnce(ctx, len(alerts), until, func(i int) {
		results[i] = gw.guard(in.tr, alertResult(in.tr, alerts[i]), func() api.TriggerResult { return gw.fireAlert(ctx, in, group, alerts[i]) })
	})
	return results[:taken], alerts[taken:]
}

// atOnce calls fn for 0 to n-1, deliveryWorkers at a time, in order, until
// until (zero: no bound) or ctx ends; it returns how many it called.
func atOnce(ctx context.Context, n int, until time.Time, fn func(i int)) int {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(n, deliveryWorkers) {
		wg.Go(func() {
			for ctx.Err() == nil && (until.IsZero() || !time.Now().After(until)) {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				fn(i)
			}
		})
	}
	wg.Wait()
	return min(int(next.Load()), n)
}

// queue keeps the alerts of a delivery not started before its answer, and
// wakes the inbox to start them.
func (gw *Door) queue(ctx context.Context, in *inbound, group map[string]any, rest []any) []api.TriggerResult {
	results := make([]api.TriggerResult, len(rest))
	for i, a := range rest {
		results[i] = alertResult(in.tr, a)
		results[i].Action = "queued"
	}
	body, err := jsonx.Marshal(withAlerts(group, rest))
	var meta []byte
	if err == nil {
		meta, err = jsonx.Marshal(in.meta)
	}
	if err == nil {
		err = gw.Store.PutDelivery(ctx, &store.Delivery{ID: store.NewID(), Trigger: in.tr.Name, Body: body, Metadata: meta, ReceivedAt: time.Now().UTC()})
	}
	if err != nil {
		for i := range results {
			results[i].Action, results[i].Reason = "failed", "keeping the alerts to start after the answer: "+err.Error()
		}
		return results
	}
	select {
	case gw.inboxWake <- struct{}{}:
	default:
	}
	return results
}

// fireAlert starts the run one alert asks for: the trigger's chain when
// it fires, its resolve chain when it is resolved. Its fingerprint and
// startsAt key both, so Alertmanager's repeats start nothing new.
func (gw *Door) fireAlert(ctx context.Context, in *inbound, group map[string]any, a any) api.TriggerResult {
	tr := in.tr
	alert, ok := a.(map[string]any)
	if !ok {
		res := api.TriggerResult{Chain: tr.Chain}
		return gw.park(ctx, in, res, withAlerts(group, []any{a}), "", errors.New("an alert must be a JSON object"), "invalid_alert")
	}
	fp, status, startsAt := alertIdentity(alert)
	res := api.TriggerResult{Alert: fp, AlertStatus: status}
	key := "trigger/" + tr.Name + "/alert/" + keyPart(fp) + "/" + keyPart(startsAt)
	st := start{
		scope: map[string]any{"alert": alert, "group": group},
		meta:  withMeta(in.meta, "alert_fingerprint", fp, "alert_status", status),
		kept:  withAlerts(group, []any{alert}),
	}
	if status != "resolved" {
		st.chain, st.tpl, st.whole, st.key = tr.Chain, tr.Payload, alert, key
		return gw.start(ctx, in, res, st)
	}
	firing, err := gw.Store.KeyRun(ctx, key)
	if err == nil && firing == "" {
		// An alert that fired before keys were escaped.
		firing, err = gw.Store.KeyRun(ctx, "trigger/"+tr.Name+"/"+fp+"/"+startsAt)
	}
	if err != nil {
		res.Action, res.Reason = "failed", "finding the run the alert's firing started: "+err.Error()
		return res
	}
	res.FiringRun = firing
	res.OnResolve = gw.resolveApprovals(ctx, firing, tr.Name)
	if tr.ResolveChain == "" {
		return resolvedOnly(res)
	}
	fr := gw.firingRun(ctx, firing)
	st.scope["firing_run"] = fr
	st.meta = withMeta(st.meta, "firing_run", firing)
	st.chain, st.tpl, st.key = tr.ResolveChain, tr.ResolvePayload, key+"/resolved"
	st.whole = map[string]any{"alert": alert, "firing_run": fr}
	return gw.start(ctx, in, res, st)
}

// alertIdentity is what tells an alert from others: its fingerprint (or,
// from an Alertmanager that sends none, its labels'), status and startsAt.
func alertIdentity(alert map[string]any) (fp, status, startsAt string) {
	status, _ = alert["status"].(string)
	fp, _ = alert["fingerprint"].(string)
	if fp == "" {
		// Alertmanager before 0.20 sent none: the labels identify the alert.
		labels, _ := jsonx.Marshal(alert["labels"])
		sum := sha256.Sum256(labels)
		fp = hex.EncodeToString(sum[:8])
	}
	startsAt, _ = alert["startsAt"].(string)
	return fp, status, startsAt
}

// alertResult is a result naming an alert, and the chain it starts.
func alertResult(tr *chain.Trigger, a any) api.TriggerResult {
	res := api.TriggerResult{Chain: tr.Chain}
	if alert, ok := a.(map[string]any); ok {
		res.Alert, res.AlertStatus, _ = alertIdentity(alert)
	}
	return res
}

// resolvedOnly is the result of a resolution that starts no run: resolved
// when on_resolve acted on the run its firing started, else skipped.
func resolvedOnly(res api.TriggerResult) api.TriggerResult {
	if len(res.OnResolve) == 0 {
		res.Action, res.Reason = "skipped", "resolved, and the trigger has no resolve_chain"
		return res
	}
	did := make([]string, len(res.OnResolve))
	res.Action, res.Run = "resolved", res.FiringRun
	for i, st := range res.OnResolve {
		did[i] = fmt.Sprintf("step %q of run %s: %s", st.Step, st.Run, st.Outcome)
		if st.Outcome == "failed" {
			// Sent again, the resolution applies it again.
			res.Action = "failed"
			did[i] += " (" + st.Reason + ")"
		}
	}
	res.Reason = "resolved: on_resolve applied to " + strings.Join(did, ", ")
	return res
}

// fireGroup starts one run for an alert group. The group's run lives from
// its first firing notification until the group is resolved: notifications
// in between, whoever joined or left the group, are noted on it; the
// resolved group starts the resolve chain once, and a later firing starts a
// run anew.
func (gw *Door) fireGroup(ctx context.Context, in *inbound, group map[string]any, alerts []any) api.TriggerResult {
	tr := in.tr
	status, _ := group["status"].(string)
	groupKey, _ := group["groupKey"].(string)
	members := membersHash(status, alerts)
	if groupKey == "" {
		// No group key: the alerts in it are the group.
		groupKey = "members:" + members
	}
	res := api.TriggerResult{Group: groupKey, AlertStatus: status}
	if in.paused != nil {
		// The same notification sent again is kept once.
		res.Chain = tr.Chain
		return gw.park(ctx, in, res, group, "trigger/"+tr.Name+"/paused/group/"+keyPart(groupKey)+"/"+members, pausedCause(in), "trigger_paused")
	}
	key := "trigger/" + tr.Name + "/group/" + keyPart(groupKey)
	st := start{
		scope: map[string]any{"group": group},
		meta:  withMeta(in.meta, "alert_group", groupKey, "alert_status", status),
		kept:  group,
	}
	open, err := gw.Store.KeyRun(ctx, key)
	if err != nil {
		res.Action, res.Reason = "failed", "finding the group's open run: "+err.Error()
		return res
	}
	seen := key + "/seen/" + members
	if status != "resolved" {
		if open != "" {
			gw.noteGroup(ctx, open, seen, group, alerts)
			res.Action, res.Run, res.Chain = "replayed", open, tr.Chain
			res.Status = gw.runStatus(ctx, open)
			res.Reason = "the group's run is open until the group is resolved; this notification is noted on it"
			return res
		}
		// The notification the run starts with is not noted again when the
		// other member of an HA pair delivers it too.
		if _, err := gw.Store.ClaimKey(ctx, seen, store.NewID(), triggerTTL); err != nil {
			res.Action, res.Reason = "failed", "recording the group's notification: "+err.Error()
			return res
		}
		st.chain, st.tpl, st.whole, st.key = tr.Chain, tr.Payload, group, key
		return gw.start(ctx, in, res, st)
	}
	res.FiringRun = open
	if open != "" {
		gw.noteGroup(ctx, open, seen, group, alerts)
		res.OnResolve = gw.resolveApprovals(ctx, open, tr.Name)
	}
	release := func() {
		if open == "" {
			return
		}
		if err := gw.Store.ReleaseKey(context.WithoutCancel(ctx), key, open); err != nil {
			gw.Log.Error("releasing a resolved alert group's run: its next firing is noted on that run", "trigger", tr.Name, "group", groupKey, "run", open, "err", err)
		}
	}
	if tr.ResolveChain == "" {
		release()
		return resolvedOnly(res)
	}
	fr := gw.firingRun(ctx, open)
	st.scope["firing_run"] = fr
	st.meta = withMeta(st.meta, "firing_run", open)
	// A resolution is keyed by the run it closes; the same notification
	// coming again once that run is let go of (from the other member of an
	// HA pair, say) finds it by what it holds.
	byMembers := key + "/resolved/members/" + members
	st.chain, st.tpl, st.key = tr.ResolveChain, tr.ResolvePayload, key+"/resolved/"+keyPart(open)
	if open == "" {
		st.key = byMembers
	}
	st.whole = map[string]any{"group": group, "firing_run": fr}
	res = gw.start(ctx, in, res, st)
	if res.Action == "parked" || res.Action == "failed" {
		return res
	}
	if open != "" && res.Run != "" {
		if _, err := gw.Store.ClaimKey(ctx, byMembers, res.Run, triggerTTL); err != nil {
			gw.Log.Warn("recording a resolved alert group's notification", "trigger", tr.Name, "group", groupKey, "err", err)
		}
	}
	release()
	return res
}

// noteGroup notes a notification of an alert group on its open run, once
// whichever of an HA pair delivers it.
func (gw *Door) noteGroup(ctx context.Context, run, seen string, group map[string]any, alerts []any) {
	if bound, err := gw.Store.ClaimKey(ctx, seen, store.NewID(), triggerTTL); err != nil || bound != "" {
		return
	}
	status, _ := group["status"].(string)
	firing, resolved := 0, 0
	for _, a := range alerts {
		if alert, ok := a.(map[string]any); ok && alert["status"] == "resolved" {
			resolved++
		} else {
			firing++
		}
	}
	msg := fmt.Sprintf("alert group notified again: %s, %d firing, %d resolved", status, firing, resolved)
	if status == "resolved" {
		msg = fmt.Sprintf("alert group resolved: %d alerts", len(alerts))
	}
	data, _ := jsonx.Marshal(map[string]any{"status": status, "firing": firing, "resolved": resolved, "alerts": alertIDs(alerts)})
	if err := gw.Engine.Note(ctx, run, msg, data); err != nil {
		gw.Log.Warn("noting an alert group's notification on its run", "run", run, "err", err)
	}
}

// fireWebhook starts the run a webhook's body asks for.
func (gw *Door) fireWebhook(ctx context.Context, in *inbound) api.TriggerResult {
	tr := in.tr
	scope := map[string]any{"body": in.doc, "headers": in.headers}
	res := api.TriggerResult{}
	st := start{chain: tr.Chain, tpl: tr.Payload, scope: scope, whole: in.doc, meta: in.meta, kept: in.doc}
	key := in.key
	if tr.IdempotencyKey != nil {
		v, err := tr.IdempotencyKey.Render(templates.MapScope(scope))
		if err != nil {
			res.Chain = tr.Chain
			return gw.park(ctx, in, res, in.doc, "", fmt.Errorf("rendering idempotency_key: %w", err), "trigger_mapping")
		}
		if v != nil {
			key = fmt.Sprint(v)
		}
	}
	if in.paused != nil {
		// The same delivery sent again, by its key, is kept once.
		pauseKey := ""
		if key != "" {
			pauseKey = "trigger/" + tr.Name + "/paused/" + keyPart(key)
		}
		res.Chain = tr.Chain
		return gw.park(ctx, in, res, in.doc, pauseKey, pausedCause(in), "trigger_paused")
	}
	if key != "" {
		st.key = "trigger/" + tr.Name + "/key/" + keyPart(key)
		st.meta = withMeta(st.meta, "idempotency_key", key)
	}
	return gw.start(ctx, in, res, st)
}

// pausedCause says why a paused trigger's delivery is kept.
func pausedCause(in *inbound) error {
	p := in.paused
	return fmt.Errorf("trigger %q is paused (by %s at %s%s): the delivery is kept here; unpause the trigger and replay the entry", in.tr.Name, p.By, p.At.Format(time.RFC3339), ReasonText(p.Reason))
}

// keepPaused keeps the alerts of a notification to a paused trigger in
// the dead-letter queue, each alert once: one that an earlier
// notification brought is found in the entry keeping it, the others go
// in new entries of at most max_alerts alerts. A replay parks nothing
// anew: its entry stays.
func (gw *Door) keepPaused(ctx context.Context, in *inbound, group map[string]any, alerts []any) []api.TriggerResult {
	cause := pausedCause(in)
	results := make([]api.TriggerResult, len(alerts))
	for i, a := range alerts {
		results[i] = alertResult(in.tr, a)
		results[i].Action, results[i].Reason, results[i].DeadLetter = "parked", cause.Error(), in.replay
	}
	if in.replay != "" {
		return results
	}
	limit := max(in.tr.MaxAlerts, 1)
	for from := 0; from < len(alerts); from += limit {
		to := min(from+limit, len(alerts))
		gw.keepPausedAlerts(ctx, in, group, alerts[from:to], results[from:to], cause)
	}
	return results
}

// keepPausedAlerts keeps, in one new entry, the alerts no entry keeps
// yet, and says in results where each alert is kept. The notification is
// claimed whole first, so that the same one sent at once to several
// gateways is kept in one entry, not spread over several.
func (gw *Door) keepPausedAlerts(ctx context.Context, in *inbound, group map[string]any, alerts []any, results []api.TriggerResult, cause error) {
	id := store.NewID()
	groupKey, _ := group["groupKey"].(string)
	status, _ := group["status"].(string)
	whole := "trigger/" + in.tr.Name + "/paused/notification/" + keyPart(groupKey) + "/" + membersHash(status, alerts)
	bound, err := gw.claimEntry(ctx, whole, id)
	if err != nil || bound != "" {
		for i := range results {
			results[i].DeadLetter = bound
			if err != nil {
				results[i].Action, results[i].Reason = "failed", fmt.Sprintf("%s; keeping it: %v", cause, err)
			}
		}
		return
	}
	keys := make([]string, len(alerts))
	atOnce(context.WithoutCancel(ctx), len(alerts), time.Time{}, func(i int) {
		results[i] = gw.guard(in.tr, results[i], func() api.TriggerResult {
			res := results[i]
			alert, _ := alerts[i].(map[string]any)
			fp, status, startsAt := alertIdentity(alert)
			key := "trigger/" + in.tr.Name + "/paused/alert/" + keyPart(fp) + "/" + keyPart(startsAt) + "/" + keyPart(status)
			bound, err := gw.claimEntry(ctx, key, id)
			switch {
			case err != nil:
				res.Action, res.Reason = "failed", fmt.Sprintf("%s; keeping it: %v", cause, err)
			case bound != "":
				res.DeadLetter = bound
			default:
				keys[i], res.DeadLetter = key, id
			}
			return res
		})
	})
	var kept []any
	var claimed []string
	for i, key := range keys {
		if key != "" && results[i].Action == "parked" {
			kept, claimed = append(kept, alerts[i]), append(claimed, key)
		}
	}
	if len(kept) == 0 {
		// Each alert is kept already: the notification binds no entry.
		_ = gw.Store.ReleaseKey(context.WithoutCancel(ctx), whole, id)
		return
	}
	if err := gw.addEntry(ctx, in, id, in.tr.Chain, withAlerts(group, kept), cause, "trigger_paused", "", ""); err != nil {
		for _, key := range append(claimed, whole) {
			_ = gw.Store.ReleaseKey(context.WithoutCancel(ctx), key, id)
		}
		for i := range results {
			if results[i].DeadLetter == id {
				results[i].Action, results[i].Reason, results[i].DeadLetter = "failed", fmt.Sprintf("%s; keeping it: %v", cause, err), ""
			}
		}
	}
}

// start is what one alert, group or body starts, and how.
type start struct {
	chain string
	tpl   *templates.Template
	scope map[string]any
	// whole is the payload when there is no template.
	whole any
	// key makes repeats of the delivery find the run it started.
	key  string
	meta map[string]string
	// kept is what a parked entry keeps of the delivery.
	kept any
}

// start checks the trigger's condition, maps the payload and starts the
// run under the start's key; a delivery it cannot start a run for is
// parked.
func (gw *Door) start(ctx context.Context, in *inbound, res api.TriggerResult, st start) api.TriggerResult {
	res.Chain = st.chain
	parkKey := ""
	if st.key != "" {
		parkKey = st.key + "/parked"
	}
	if in.tr.When != nil {
		ok, err := in.tr.When.Eval(st.scope)
		if err != nil {
			return gw.park(ctx, in, res, st.kept, parkKey, fmt.Errorf("evaluating when (%s): %w", in.tr.When.String(), err), "trigger_when")
		}
		if !ok {
			res.Action, res.Reason = "skipped", "when is false: "+in.tr.When.String()
			return res
		}
	}
	var payload []byte
	var err error
	if st.tpl != nil {
		payload, err = st.tpl.AppendJSON(nil, templates.MapScope(st.scope))
	} else {
		payload, err = jsonx.Marshal(st.whole)
	}
	if err != nil {
		return gw.park(ctx, in, res, st.kept, parkKey, fmt.Errorf("mapping the payload: %w", err), "trigger_mapping")
	}
	labels, err := triggerLabels(in.tr, st.scope)
	if err != nil {
		return gw.park(ctx, in, res, st.kept, parkKey, fmt.Errorf("mapping the labels: %w", err), "trigger_mapping")
	}
	mb, _ := jsonx.Marshal(st.meta)
	ctx = engine.Acting(ctx, engine.Identity{Name: "trigger " + in.tr.Name}, "")
	input := engine.Input{Payload: payload, Metadata: mb, StartedBy: store.StartedByTrigger + ":" + in.tr.Name, Labels: labels}
	id, status, replayed, err := gw.StartKeyed(ctx, st.chain, "", st.key, triggerTTL, input)
	switch {
	case err == nil:
	case errors.Is(err, engine.ErrClosed), errors.Is(err, store.ErrClosed), ctx.Err() != nil:
		// The gateway is stopping: the sender sends it again, or the inbox
		// of the gateway that carries on takes it up.
		res.Action, res.Reason = "failed", fmt.Sprintf("starting the run: %v", err)
		return res
	default:
		return gw.park(ctx, in, res, st.kept, parkKey, fmt.Errorf("starting the run: %w", err), "trigger_start")
	}
	res.Run, res.Status, res.Action = id, status, "started"
	if replayed {
		res.Action = "replayed"
	}
	return res
}

// resolveApprovals applies on_resolve to the approval steps the run an
// alert's firing started waits at, now that the alert is resolved: the
// question may no longer stand (a restart asked for a database that has
// recovered). It returns what it did to each. A repeat finds the run no
// longer waiting, or the step answered by the resolution already, and
// does nothing.
func (gw *Door) resolveApprovals(ctx context.Context, runID, trigger string) []api.ResolvedStep {
	if runID == "" {
		return nil
	}
	run, err := gw.Store.RunHeader(ctx, runID)
	if err != nil || run.Status != store.RunWaiting {
		return nil
	}
	def, err := gw.Engine.Definition(ctx, run.Chain, run.ChainHash)
	if err != nil {
		gw.Log.Warn("reading the definition of a resolved alert's run; its approval steps wait on", "run", runID, "err", err)
		return nil
	}
	var waiting []*store.StepRecord
	err = gw.Store.ForEachStep(ctx, runID, store.StepScan{SkipItems: true}, func(rec *store.StepRecord) error {
		if s := def.Step(rec.Name); rec.Status == store.StepRunning && s != nil && s.Kind == chain.KindApproval && s.Approval.OnResolve != "" {
			waiting = append(waiting, rec)
		}
		return nil
	})
	if err != nil {
		gw.Log.Warn("reading the steps of a resolved alert's run; its approval steps wait on", "run", runID, "err", err)
		return nil
	}
	actor := engine.WithActor(ctx, "alert resolved ("+trigger+")")
	var did []api.ResolvedStep
	for _, rec := range waiting {
		st := api.ResolvedStep{Run: runID, Step: rec.Key, OnResolve: def.Step(rec.Name).Approval.OnResolve}
		switch st.OnResolve {
		case "cancel":
			// Through another gateway too: the one advancing the run ends it.
			err = gw.Engine.Cancel(actor, runID)
			st.Outcome = "cancelled"
		default:
			_, err = gw.Engine.Signal(actor, runID, rec.Key, st.OnResolve, "the alert resolved")
			st.Outcome = map[string]string{chain.DecisionApprove: "approved", chain.DecisionReject: "rejected"}[st.OnResolve]
		}
		switch {
		case errors.As(err, new(*engine.AnsweredError)), errors.As(err, new(*engine.LateError)), errors.Is(err, engine.ErrNotWaiting), errors.Is(err, engine.ErrFinished):
			// Answered (by this resolution too, when it came before), timed
			// out or ended meanwhile: the question no longer stands.
			continue
		case err != nil:
			gw.Log.Warn("applying on_resolve to an approval step", "run", runID, "step", rec.Key, "err", err)
			st.Outcome, st.Reason = "failed", err.Error()
		default:
			gw.Log.Info("the alert resolved: on_resolve applied to an approval step", "run", runID, "step", rec.Key, "on_resolve", st.OnResolve)
		}
		did = append(did, st)
		if st.Outcome == "cancelled" {
			// The run ends: what its other steps wait for no longer matters.
			break
		}
	}
	return did
}

// triggerLabels are the labels of a run a trigger starts: its labels
// mapping's, or else an alert's own labels (a group's common labels).
func triggerLabels(tr *chain.Trigger, scope map[string]any) (map[string]string, error) {
	var v any
	switch {
	case tr.Labels != nil:
		var err error
		if v, err = tr.Labels.Render(templates.MapScope(scope)); err != nil {
			return nil, err
		}
	case scope["alert"] != nil:
		a, _ := scope["alert"].(map[string]any)
		v = a["labels"]
	case scope["group"] != nil:
		g, _ := scope["group"].(map[string]any)
		v = g["commonLabels"]
	}
	m, _ := v.(map[string]any)
	return LabelStrings(m), nil
}

// LabelStrings makes labels of a table's values, within the bounds: a
// string as it is, any other value as JSON, a null left out.
func LabelStrings(m map[string]any) map[string]string {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]string, min(len(m), api.MaxLabels))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if len(out) == api.MaxLabels || len(k) > api.MaxLabelKeyBytes || k == "" || m[k] == nil {
			continue
		}
		s, ok := m[k].(string)
		if !ok {
			b, _ := jsonx.Marshal(m[k])
			s = string(b)
		}
		if len(s) > api.MaxLabelValueSize {
			s = strings.ToValidUTF8(s[:api.MaxLabelValueSize], "")
		}
		out[k] = s
	}
	return out
}

// park keeps what a delivery brought that no run could be started for as
// a dead-letter entry of its own kind, once per key, and says so loudly.
// A replay of an entry parks nothing anew: the entry stays.
func (gw *Door) park(ctx context.Context, in *inbound, res api.TriggerResult, kept any, key string, cause error, code string) api.TriggerResult {
	res.Action, res.Reason = "parked", cause.Error()
	if in.replay != "" {
		res.DeadLetter = in.replay
		return res
	}
	id := store.NewID()
	if key != "" {
		bound, err := gw.claimEntry(ctx, key, id)
		if err != nil {
			res.Action, res.Reason = "failed", fmt.Sprintf("%s; parking it: %v", cause, err)
			return res
		}
		if bound != "" {
			res.DeadLetter = bound
			return res
		}
	}
	if err := gw.addEntry(ctx, in, id, res.Chain, kept, cause, code, res.Alert, res.Group); err != nil {
		if key != "" {
			_ = gw.Store.ReleaseKey(context.WithoutCancel(ctx), key, id)
		}
		res.Action, res.Reason = "failed", fmt.Sprintf("%s; parking it: %v", cause, err)
		return res
	}
	res.DeadLetter = id
	return res
}

// claimEntry binds key to the dead-letter entry id unless an entry that
// is there binds it, whose id it returns. A key bound to an entry since
// replayed or deleted is bound anew, so that what comes again is kept
// again; one bound to an entry still being written is left to it.
func (gw *Door) claimEntry(ctx context.Context, key, id string) (string, error) {
	for {
		bound, err := gw.Store.ClaimKey(ctx, key, id, triggerTTL)
		if err != nil || bound == "" {
			return bound, err
		}
		if at, ok := store.IDTime(bound); ok && time.Since(at) < keepGrace {
			return bound, nil
		}
		if _, err := gw.Store.DLQ(ctx, bound); !errors.Is(err, store.ErrNotFound) {
			return bound, nil
		}
		if err := gw.Store.ReleaseKey(ctx, key, bound); err != nil {
			return "", err
		}
	}
}

// addEntry writes what a delivery brought as the dead-letter entry id.
func (gw *Door) addEntry(ctx context.Context, in *inbound, id, chainName string, kept any, cause error, code, alert, group string) error {
	body, err := jsonx.Marshal(kept)
	var meta []byte
	if err == nil {
		meta, err = jsonx.Marshal(in.meta)
	}
	var headers map[string]string
	if len(in.headers) > 0 {
		headers = make(map[string]string, len(in.headers))
		for k, v := range in.headers {
			headers[k] = fmt.Sprint(v)
		}
	}
	if err == nil {
		err = gw.Store.AddDLQ(ctx, &store.DLQEntry{
			ID: id, Kind: store.DLQDelivery, Chain: chainName, Trigger: in.tr.Name,
			Error:   store.ErrorInfo{Message: gw.Redactor.String(cause.Error()), Code: code},
			Payload: gw.Redactor.JSON(body), Headers: headers, Metadata: meta, CreatedAt: time.Now().UTC(),
		})
	}
	if err != nil {
		return err
	}
	gw.Log.Error("a trigger delivery was parked in the dead-letter queue: no run started for it; fix the config and replay the entry",
		"trigger", in.tr.Name, "chain", chainName, "entry", id, "alert", alert, "group", group, "code", code, "err", cause)
	return nil
}

// observe logs and counts what one result did.
func (gw *Door) observe(tr *chain.Trigger, res api.TriggerResult) {
	outcome := res.Action
	switch res.Action {
	case "replayed":
		outcome = api.OutcomeDeduplicated
	case "started":
		gw.Log.Info("trigger started a run", "trigger", tr.Name, "chain", res.Chain, "run", res.Run, "alert", res.Alert, "group", res.Group, "alert_status", res.AlertStatus)
	case "failed":
		gw.Log.Error("a trigger delivery could not be taken: its sender must send it again", "trigger", tr.Name, "alert", res.Alert, "group", res.Group, "err", res.Reason)
	}
	gw.Observer.Delivered(tr.Name, outcome)
}

// firingRun is what a resolve mapping reads of the run the alert started:
// its id, status, result, and each top-level step's status and body.
func (gw *Door) firingRun(ctx context.Context, id string) any {
	if id == "" {
		return nil
	}
	v, err := api.ReadRunView(ctx, gw.Store, id, false)
	if err != nil {
		return map[string]any{"id": id}
	}
	steps := map[string]any{}
	for _, name := range v.Path {
		if st := v.Steps[name]; st != nil {
			body, _ := engine.DecodeJSON(st.Body)
			steps[name] = map[string]any{"status": st.Status, "body": body}
		}
	}
	result := v.Body
	if st := v.Steps[v.BodyStep]; v.BodyStep != "" && st != nil {
		result = st.Body
	}
	body, _ := engine.DecodeJSON(result)
	return map[string]any{"id": id, "status": v.Status, "body": body, "steps": steps}
}

// runStatus is a run's status, or "" when it cannot be read.
func (gw *Door) runStatus(ctx context.Context, id string) string {
	run, err := gw.Store.RunHeader(ctx, id)
	if err != nil {
		return ""
	}
	return string(run.Status)
}

// RunInbox starts the runs of kept deliveries until ctx ends: this
// gateway's as soon as it keeps them, and every inboxRecheck those any
// gateway kept and did not get to. It returns once it has let go of the
// deliveries it was working, so that another gateway, or this one
// started again, takes them up at once.
func (gw *Door) RunInbox(ctx context.Context) {
	t := time.NewTicker(inboxRecheck)
	defer t.Stop()
	for {
		gw.drainInbox(ctx)
		select {
		case <-ctx.Done():
			return
		case <-gw.inboxWake:
		case <-t.C:
		}
	}
}

// drainInbox starts the runs of the kept deliveries no other gateway is
// working, and lets go of each once every alert in it is started, parked
// or skipped.
func (gw *Door) drainInbox(ctx context.Context) {
	defer gw.survive("going through the kept deliveries")
	for ctx.Err() == nil {
		ds, err := gw.Store.Deliveries(ctx, 16)
		if err != nil {
			if ctx.Err() == nil {
				gw.Log.Error("reading kept deliveries", "err", err)
			}
			return
		}
		worked := 0
		for _, d := range ds {
			if ctx.Err() != nil {
				return
			}
			claim := "inbox/" + d.ID
			if bound, err := gw.Store.ClaimKey(ctx, claim, gw.Engine.Owner(), inboxClaimTTL); err != nil || bound != "" {
				continue
			}
			if gw.workClaimed(ctx, claim, d) {
				worked++
			}
		}
		if worked == 0 {
			return
		}
	}
}

// survive keeps a bug met in the door's background work from ending the
// process: it is logged with its stack, and what it was doing is done at
// the next pass over the kept deliveries (a claim no longer kept lapses).
func (gw *Door) survive(doing string) {
	if p := recover(); p != nil {
		gw.Log.Error("the door hit a bug taking a delivery; it failed, to be sent or tried again", "doing", doing, "in", inboxRecheck, "panic", p, "stack", string(debug.Stack()))
	}
}

// workClaimed works a kept delivery this gateway has claimed, keeping the
// claim while it does, and lets go of it after; it reports whether the
// delivery is done with, and gone.
func (gw *Door) workClaimed(ctx context.Context, claim string, d *store.Delivery) bool {
	owner := gw.Engine.Owner()
	stop := make(chan struct{})
	var renewing sync.WaitGroup
	renewing.Go(func() {
		defer gw.survive("keeping the claim on a kept delivery")
		t := time.NewTicker(inboxClaimTTL / 3)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			if bound, err := gw.Store.ClaimKey(ctx, claim, owner, inboxClaimTTL); (err != nil && ctx.Err() == nil) || bound != "" {
				gw.Log.Warn("keeping the claim on a kept delivery; another gateway may work it too, which starts nothing twice", "delivery", d.ID, "bound", bound, "err", err)
			}
		}
	})
	done := gw.workDelivery(ctx, d)
	close(stop)
	renewing.Wait()
	// What was done is recorded, and the claim let go of at once, by a
	// stopping gateway too.
	after, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if done {
		if err := gw.Store.DeleteDelivery(after, d.ID); err != nil {
			gw.Log.Error("deleting a kept delivery whose runs started", "delivery", d.ID, "err", err)
		}
	}
	if err := gw.Store.ReleaseKey(after, claim, owner); err != nil {
		gw.Log.Warn("letting go of a kept delivery; another gateway takes it up once the claim lapses", "delivery", d.ID, "in", inboxClaimTTL, "err", err)
	}
	return done
}

// workDelivery starts the runs of one kept delivery, or keeps its alerts
// while the trigger is paused; it reports whether the delivery is done
// with. A bug met on it leaves it to be tried again.
func (gw *Door) workDelivery(ctx context.Context, d *store.Delivery) (done bool) {
	log := gw.Log.With("delivery", d.ID, "trigger", d.Trigger)
	defer func() {
		if p := recover(); p != nil {
			log.Error("the door hit a bug taking a delivery; it failed, to be sent or tried again", "in", inboxRecheck, "panic", p, "stack", string(debug.Stack()))
			gw.Observer.Delivered(d.Trigger, api.OutcomeFailed)
			done = false
		}
	}()
	tr := gw.Engine.Config().Triggers[d.Trigger]
	doc, err := engine.DecodeJSON(d.Body)
	group, _ := doc.(map[string]any)
	alerts, _ := group["alerts"].([]any)
	var meta map[string]string
	if err == nil && len(d.Metadata) > 0 {
		err = jsonx.Unmarshal(d.Metadata, &meta)
	}
	if err != nil || alerts == nil {
		log.Error("a kept delivery cannot be read back; it is dropped", "err", err)
		return true
	}
	if tr == nil || !tr.Type.Alerts() {
		// A reload removed the trigger: what it kept is parked.
		tr = &chain.Trigger{Name: d.Trigger, Type: chain.TriggerAlertmanager}
		in := &inbound{tr: tr, doc: doc, meta: meta}
		res := gw.park(ctx, in, api.TriggerResult{}, group, "", fmt.Errorf("trigger %q is no longer configured", d.Trigger), "trigger_removed")
		gw.observe(tr, res)
		return res.Action == "parked"
	}
	in := &inbound{tr: tr, doc: doc, meta: meta, paused: gw.pause(ctx, tr.Name)}
	results, rest := gw.takeAlerts(ctx, in, group, alerts, time.Time{})
	done = len(rest) == 0
	for _, res := range results {
		gw.observe(tr, res)
		if res.Action == "failed" {
			done = false
		}
	}
	if !done && ctx.Err() == nil {
		log.Warn("some alerts of a kept delivery could not be taken; they are tried again", "in", inboxRecheck)
	}
	return done
}

// Redeliver delivers a parked delivery again, through its trigger as
// configured now, and returns what each alert (or the group, or the body)
// did, and the run the first of them started or found. The entry goes
// once each alert in it is started, or found started, or skipped; else it
// is kept, with a *APIError saying why.
func (gw *Door) Redeliver(ctx context.Context, e *store.DLQEntry) (string, []api.TriggerResult, error) {
	what := fmt.Sprintf("replaying delivery %s", e.ID)
	tr := gw.Engine.Config().Triggers[e.Trigger]
	if tr == nil {
		return "", nil, &api.APIError{Status: 409, Code: "trigger_removed", Message: fmt.Sprintf("%s: trigger %q is not configured", what, e.Trigger)}
	}
	doc, err := engine.DecodeJSON(e.Payload)
	if err != nil {
		return "", nil, fmt.Errorf("%s: reading what it kept: %w", what, err)
	}
	in := &inbound{tr: tr, doc: doc, replay: e.ID, meta: map[string]string{}}
	if len(e.Metadata) > 0 {
		if err := jsonx.Unmarshal(e.Metadata, &in.meta); err != nil {
			return "", nil, fmt.Errorf("%s: reading its metadata: %w", what, err)
		}
	}
	in.key = in.meta["idempotency_key"]
	if tr.Type.Alerts() {
		if err := checkAlertGroup(tr, doc); err != nil {
			return "", nil, fmt.Errorf("%s: %w", what, err)
		}
	} else {
		in.headers = map[string]any{}
		for k, v := range e.Headers {
			in.headers[k] = v
		}
	}
	resp := gw.DeliverInbound(ctx, in, time.Time{})
	run := ""
	counts := map[string]int{}
	var kept []string
	for _, res := range resp.Results {
		counts[res.Action]++
		switch res.Action {
		case "started", "replayed", "resolved":
			if run == "" {
				run = res.Run
			}
		case "skipped":
		default:
			kept = append(kept, res.Action+": "+res.Reason)
		}
	}
	if len(kept) > 0 {
		var did []string
		for _, action := range []string{"started", "replayed", "resolved", "skipped", "parked", "failed"} {
			if counts[action] > 0 {
				did = append(did, fmt.Sprintf("%d %s", counts[action], action))
			}
		}
		return run, resp.Results, &api.APIError{Status: 409, Code: "not_replayed", Message: fmt.Sprintf("%s (%s): %s; the entry is kept", what, strings.Join(did, ", "), kept[0])}
	}
	if err := gw.Store.DeleteDLQ(ctx, e.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		return run, resp.Results, fmt.Errorf("%s: deleting the entry: %w", what, err)
	}
	return run, resp.Results, nil
}

// checkAlertGroup checks that an alert trigger's body is an alert group.
func checkAlertGroup(tr *chain.Trigger, doc any) error {
	group, ok := doc.(map[string]any)
	if _, isList := group["alerts"].([]any); !ok || !isList {
		return api.BadRequest("invalid_payload", "trigger %q (type %s) takes the webhook's alert group: a JSON object with an alerts array", tr.Name, tr.Type)
	}
	return nil
}

// keyPart escapes one part of a key, so that no two different inputs make
// the same key: "/" never appears inside a part. A part longer than
// maxKeyPart once escaped is its digest instead, marked "%s", which no
// escaped text holds ('%' is always followed by two hex digits there):
// whatever a payload brings, a key stays far inside store.MaxKeyBytes.
func keyPart(s string) string {
	p := url.PathEscape(s)
	if len(p) <= maxKeyPart {
		return p
	}
	sum := sha256.Sum256([]byte(s))
	return "%sha256-" + hex.EncodeToString(sum[:])
}

// maxKeyPart is the longest part of a key kept as it came; real
// fingerprints, group keys and idempotency keys are far shorter.
const maxKeyPart = 512

// membersHash names a notification of an alert group: its status and each
// alert's fingerprint, startsAt and status.
func membersHash(status string, alerts []any) string {
	ids := alertIDs(alerts)
	slices.Sort(ids)
	b, _ := jsonx.Marshal(append([]string{status}, ids...))
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:12])
}

// alertIDs are the alerts of a group as fingerprint@startsAt:status.
func alertIDs(alerts []any) []string {
	ids := make([]string, 0, len(alerts))
	for _, a := range alerts {
		alert, _ := a.(map[string]any)
		fp, _ := alert["fingerprint"].(string)
		startsAt, _ := alert["startsAt"].(string)
		status, _ := alert["status"].(string)
		ids = append(ids, keyPart(fp)+"@"+keyPart(startsAt)+":"+status)
	}
	return ids
}

// withAlerts is a copy of an alert group holding alerts.
func withAlerts(group map[string]any, alerts []any) map[string]any {
	out := make(map[string]any, len(group))
	for k, v := range group {
		out[k] = v
	}
	out["alerts"] = alerts
	return out
}

func withMeta(meta map[string]string, kv ...string) map[string]string {
	out := make(map[string]string, len(meta)+len(kv)/2)
	for k, v := range meta {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			out[kv[i]] = kv[i+1]
		}
	}
	return out
}

// credentialHeader reports whether a header may carry a credential, by
// its name or its value's scheme: such headers never reach a run.
func credentialHeader(name, value string) bool {
	n := strings.ToLower(name)
	if n == "idempotency-key" {
		return false
	}
	for _, part := range []string{"auth", "token", "secret", "signature", "cookie", "key", "pass", "credential", "session", "csrf", "xsrf", "jwt", "bearer"} {
		if strings.Contains(n, part) {
			return true
		}
	}
	v := strings.ToLower(strings.TrimSpace(value))
	for _, scheme := range []string{"bearer ", "basic ", "digest ", "token ", "negotiate "} {
		if strings.HasPrefix(v, scheme) {
			return true
		}
	}
	return false
}
