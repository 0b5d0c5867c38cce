package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/templates"
)

// An approval step that waits tells people so through its notify call,
// reminds them every notify.remind_every, and escalates once through its
// escalate call, escalate.after it asked. Each call is claimed in the
// store under the step's wait before it is made, so that gateways sharing
// the store make it once between them: a call is made at most once, and a
// gateway dying between the claim and the call loses that one call (a
// reminder follows). The run's events say what was sent, or why not.

// approvalCallPoll is how often waiting approval steps are looked at.
const approvalCallPoll = 5 * time.Second

// RunApprovalCalls makes the calls of waiting approval steps as they come
// due, until ctx ends.
func (gw *Gateway) RunApprovalCalls(ctx context.Context) {
	t := time.NewTicker(approvalCallPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := gw.ApprovalCalls(ctx, time.Now()); err != nil && ctx.Err() == nil {
			gw.Log.Warn("making the calls of waiting approval steps", "err", err)
		}
	}
}

// ApprovalCalls makes, once, every notification, reminder and escalation
// of a waiting approval step due by now. Of the reminders missed while no
// gateway looked, only the latest is sent.
func (gw *Gateway) ApprovalCalls(ctx context.Context, now time.Time) error {
	f := store.RunFilter{Status: store.RunWaiting, Limit: 200, NoOrigins: true}
	for {
		page, err := gw.Store.ListRuns(ctx, f)
		if err != nil {
			return fmt.Errorf("listing waiting runs: %w", err)
		}
		for _, run := range page.Runs {
			gw.runApprovalCalls(ctx, run, now)
		}
		if page.Next == "" {
			return nil
		}
		f.Cursor = page.Next
	}
}

func (gw *Gateway) runApprovalCalls(ctx context.Context, run *store.Run, now time.Time) {
	def, err := gw.Engine.Definition(ctx, run.Chain, run.ChainHash)
	if err != nil {
		gw.Log.Warn("reading a waiting run's definition; its approval calls wait", "run", run.ID, "err", err)
		return
	}
	var recs []*store.StepRecord
	err = gw.Store.ForEachStep(ctx, run.ID, store.StepScan{SkipItems: true}, func(rec *store.StepRecord) error {
		if s := def.Step(rec.Name); rec.Status == store.StepRunning && s != nil && s.Kind == chain.KindApproval &&
			(s.Approval.Notify != nil || s.Approval.Escalate != nil) {
			recs = append(recs, rec)
		}
		return nil
	})
	if err != nil {
		gw.Log.Warn("reading a waiting run's steps; its approval calls wait", "run", run.ID, "err", err)
		return
	}
	for _, rec := range recs {
		a := def.Step(rec.Name).Approval
		asked := rec.StartedAt
		if n := a.Notify; n != nil {
			// The notification at ask, then the latest reminder due.
			k := 0
			if n.Every > 0 && now.After(asked) {
				k = int(now.Sub(asked) / n.Every)
			}
			gw.approvalCall(ctx, run, rec, n, "notify", k)
		}
		if e := a.Escalate; e != nil && !now.Before(asked.Add(e.After)) {
			gw.approvalCall(ctx, run, rec, e, "escalate", 0)
		}
	}
}

// approvalCall makes one call of an approval step's wait, unless a gateway
// has claimed it already.
func (gw *Gateway) approvalCall(ctx context.Context, run *store.Run, rec *store.StepRecord, c *chain.ApprovalCall, what string, n int) {
	key := "approval-call/" + run.ID + "/" + rec.Key + "/" + strconv.FormatInt(rec.StartedAt.UnixNano(), 10) + "/" + what + "/" + strconv.Itoa(n)
	// A value of its own: a claim with the value bound already succeeds.
	bound, err := gw.Store.ClaimKey(ctx, key, gw.Engine.Owner()+"/"+store.NewID(), 400*24*time.Hour)
	if err != nil || bound != "" {
		if err != nil {
			gw.Log.Warn("claiming an approval step's call", "run", run.ID, "step", rec.Key, "call", what, "err", err)
		}
		return
	}
	label := what
	switch {
	case what == "escalate":
		label = "escalated"
	case n == 0:
		label = "notified"
	default:
		label = fmt.Sprintf("reminded (%d)", n)
	}
	msg := fmt.Sprintf("approval step %q: %s through %s", rec.Key, label, c.Provider)
	if err := gw.callApproval(ctx, run, rec, c, key, n); err != nil {
		msg = fmt.Sprintf("approval step %q: could not be %s through %s: %v", rec.Key, label, c.Provider, err)
		gw.Log.Warn("an approval step's call failed", "run", run.ID, "step", rec.Key, "call", label, "provider", c.Provider, "err", err)
	} else {
		gw.Log.Info("approval call made", "run", run.ID, "step", rec.Key, "call", label, "provider", c.Provider)
	}
	if err := gw.Engine.Note(ctx, run.ID, gw.Redactor.String(msg), nil); err != nil {
		gw.Log.Warn("noting an approval step's call on its run", "run", run.ID, "err", err)
	}
}

// callApproval renders and makes the call; its dedup key is the claim's,
// so a provider that dedupes sends it once even if it is made again.
func (gw *Gateway) callApproval(ctx context.Context, run *store.Run, rec *store.StepRecord, c *chain.ApprovalCall, key string, n int) error {
	cfg := gw.Engine.Config()
	p := cfg.Providers[c.Provider]
	if p == nil {
		return fmt.Errorf("no provider %q in the config", c.Provider)
	}
	full, err := gw.Store.Run(ctx, run.ID)
	if err != nil {
		return err
	}
	var message map[string]any
	_ = json.Unmarshal(rec.Body, &message)
	var payload any
	_ = json.Unmarshal(full.Origin.Payload, &payload)
	url := cfg.Gateway.RunURL(run.ID)
	stepURL := ""
	if url != "" {
		stepURL = url + "/steps/" + rec.Key
	}
	approval := map[string]any{"step": rec.Key, "message": message["message"], "asked_at": rec.StartedAt.UTC().Format(time.RFC3339), "url": stepURL, "reminder": int64(n)}
	if !rec.Deadline.IsZero() {
		approval["deadline"] = rec.Deadline.UTC().Format(time.RFC3339)
	}
	labels := map[string]any{}
	for k, v := range run.Labels {
		labels[k] = v
	}
	scope := templates.MapScope{
		"approval": approval,
		"origin":   map[string]any{"payload": payload},
		"run":      map[string]any{"id": run.ID, "chain": run.Chain, "url": url, "labels": labels},
		"secrets":  gw.secretScope(),
	}
	body := []byte(`{}`)
	if c.Payload != nil {
		if body, err = c.Payload.AppendJSON(nil, scope); err != nil {
			return fmt.Errorf("rendering the payload: %w", err)
		}
	}
	config := p.Config
	if p.ConfigTemplate != nil {
		if config, err = p.ConfigTemplate.AppendJSON(nil, templates.MapScope{"secrets": gw.secretScope()}); err != nil {
			return fmt.Errorf("rendering the provider's config: %w", err)
		}
	}
	prov, err := gw.providers.Resolve(p)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	deadline, _ := cctx.Deadline()
	_, err = prov.Execute(cctx, providers.Request{ActionType: c.ActionType, Payload: body, Config: config, DedupKey: key, Attempt: 1, Deadline: deadline, RunID: run.ID, Step: rec.Key})
	var pe *providers.Error
	if errors.As(err, &pe) {
		return errors.New(gw.Redactor.String(pe.Error()))
	}
	return err
}

// secretScope is the secrets as templates read them.
func (gw *Gateway) secretScope() map[string]any {
	out := make(map[string]any, len(gw.secrets))
	for k, v := range gw.secrets {
		out[k] = v
	}
	return out
}
