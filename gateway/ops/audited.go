package ops

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/gateway/audit"
	"github.com/chaingate/gateway/gateway/authz"
)

// Audited records in the audit log every operation of Ops that may change
// something, as Subject did it through the command line: the API and the
// console record their own, with the route and address; this is for the
// operator who has the store at hand, and no seam between them and it.
type Audited struct {
	api.Ops
	Log     *audit.Log
	Subject authz.Subject
}

// record appends what came of a on t; ctx's note says the run.
func (a *Audited) record(ctx context.Context, act authz.Action, t authz.Target, err error) {
	status, detail := http.StatusOK, ""
	if err != nil {
		ae := api.AsAPIError(err)
		status, detail = ae.Status, ae.Message
	}
	a.Log.Record(ctx, audit.Attempt{Subject: a.Subject, Action: act, Target: t}, audit.Outcome(status), status, detail)
}

// begin is ctx for one operation: the command line's origin, a fresh note.
func begin(ctx context.Context, route string) context.Context {
	ctx, _ = audit.WithNote(audit.WithOrigin(ctx, audit.Origin{EntryPoint: audit.ViaCLI, Route: route}))
	return ctx
}

func onRun(id string) authz.Target { return authz.Target{Kind: authz.OnRun, Name: id} }

func (a *Audited) StartRun(ctx context.Context, chainName string, payload json.RawMessage, opts api.StartOptions) (*api.Run, error) {
	ctx = begin(ctx, "runs start")
	run, err := a.Ops.StartRun(ctx, chainName, payload, opts)
	a.record(ctx, authz.Start, authz.Target{Kind: authz.OnChain, Name: chainName}, err)
	return run, err
}

func (a *Audited) CancelRun(ctx context.Context, id string) error {
	ctx = begin(ctx, "runs cancel")
	err := a.Ops.CancelRun(ctx, id)
	a.record(ctx, authz.Cancel, onRun(id), err)
	return err
}

func (a *Audited) DeleteRun(ctx context.Context, id string) (*api.DeleteResult, error) {
	ctx = begin(ctx, "runs delete")
	res, err := a.Ops.DeleteRun(ctx, id)
	a.record(ctx, authz.Delete, onRun(id), err)
	return res, err
}

func (a *Audited) PruneRuns(ctx context.Context, opts api.PruneOptions) (*api.PruneResult, error) {
	ctx = begin(ctx, "runs prune")
	res, err := a.Ops.PruneRuns(ctx, opts)
	a.record(ctx, authz.Delete, authz.Target{Kind: authz.OnRun, Chain: opts.Chain}, err)
	return res, err
}

func (a *Audited) Signal(ctx context.Context, id, step, decision, comment string) (*engine.Decision, error) {
	ctx = begin(ctx, "runs "+decision)
	d, err := a.Ops.Signal(ctx, id, step, decision, comment)
	a.record(ctx, authz.Approve, onRun(id), err)
	return d, err
}

func (a *Audited) ReplayRun(ctx context.Context, id string, opts engine.ReplayOptions) (*api.Run, error) {
	ctx = begin(ctx, "runs replay")
	run, err := a.Ops.ReplayRun(ctx, id, opts)
	a.record(ctx, authz.Replay, onRun(id), err)
	return run, err
}

func (a *Audited) RedriveSplit(ctx context.Context, id, step string, opts engine.RedriveOptions) (*api.Run, error) {
	ctx = begin(ctx, "runs redrive")
	run, err := a.Ops.RedriveSplit(ctx, id, step, opts)
	a.record(ctx, authz.Redrive, onRun(id), err)
	return run, err
}

func (a *Audited) Pause(ctx context.Context, kind, name, reason string) (*api.Pause, error) {
	ctx = begin(ctx, "pause")
	p, err := a.Ops.Pause(ctx, kind, name, reason)
	a.record(ctx, authz.Pause, authz.Target{Kind: kind, Name: name}, err)
	return p, err
}

func (a *Audited) Resume(ctx context.Context, kind, name string) (*api.Pause, error) {
	ctx = begin(ctx, "unpause")
	p, err := a.Ops.Resume(ctx, kind, name)
	a.record(ctx, authz.Pause, authz.Target{Kind: kind, Name: name}, err)
	return p, err
}

func (a *Audited) Replay(ctx context.Context, id string, opts engine.ReplayOptions) (*api.Run, error) {
	ctx = begin(ctx, "dlq replay")
	run, err := a.Ops.Replay(ctx, id, opts)
	a.record(ctx, authz.Replay, authz.Target{Kind: authz.OnDLQ, Name: id}, err)
	return run, err
}

func (a *Audited) ReplayMany(ctx context.Context, f store.DLQFilter, opts engine.ReplayOptions, concurrency int) (*api.BulkReplay, error) {
	ctx = begin(ctx, "dlq replay")
	res, err := a.Ops.ReplayMany(ctx, f, opts, concurrency)
	a.record(ctx, authz.Replay, authz.Target{Kind: authz.OnDLQ, Chain: f.Chain}, err)
	return res, err
}

func (a *Audited) DeleteDLQ(ctx context.Context, id string) error {
	ctx = begin(ctx, "dlq delete")
	err := a.Ops.DeleteDLQ(ctx, id)
	a.record(ctx, authz.Delete, authz.Target{Kind: authz.OnDLQ, Name: id}, err)
	return err
}

func (a *Audited) PurgeDLQ(ctx context.Context, f store.DLQFilter) (int, error) {
	ctx = begin(ctx, "dlq purge")
	n, err := a.Ops.PurgeDLQ(ctx, f)
	a.record(ctx, authz.Delete, authz.Target{Kind: authz.OnDLQ, Chain: f.Chain}, err)
	return n, err
}
