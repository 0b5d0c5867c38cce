// Package local advances runs in the process of a command, for gateway
// run, resume and cancel: it opens the gateway over its store, answers
// gateway cancel on the store's control socket, works a distributed split's
// items, resumes what a crash or restart left, and cancels a run whether or
// not a gateway holds the store.
package local

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/gateway/audit"
	"github.com/chaingate/gateway/gateway/authz"
)

// Options configure a Session.
type Options struct {
	Config *chain.Config
	// State is the store's URL; empty takes [gateway].state.
	State  string
	Logger *slog.Logger
	// OnEvent sees every event of the runs this process advances.
	OnEvent func(store.Event)
	// Work runs here the items a distributed split hands out.
	Work bool
}

// Session is a gateway that advances runs in this process.
type Session struct {
	GW  *gateway.Gateway
	log *slog.Logger
	// stopWorker ends the worker that runs distributed splits' items here.
	stopWorker func()
	// stopControl closes the control socket and removes its file.
	stopControl func()
}

// Open opens the store and plugins for opts.Config, and listens on the
// store's control socket so gateway cancel can reach this process.
func Open(ctx context.Context, opts Options) (*Session, error) {
	gw, err := gateway.Open(ctx, gateway.Options{Config: opts.Config, State: opts.State, Logger: opts.Logger, OnEvent: opts.OnEvent})
	if err != nil {
		return nil, err
	}
	s := &Session{GW: gw, log: opts.Logger, stopWorker: func() {}, stopControl: func() {}}
	if gw.StoreFile != "" {
		stop, err := gateway.ServeControl(ctx, gateway.ControlPath(gw.StoreFile), gw.Engine, opts.Logger, ControlAudit(gw, opts.Logger))
		if err != nil {
			opts.Logger.Warn("gateway cancel will not reach this process", "err", err)
		} else {
			s.stopControl = stop
		}
	}
	if gw.Fanout != nil && opts.Work {
		// One process is enough: the items it hands out, it runs too.
		wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := gw.WorkItems(wctx); err != nil {
				opts.Logger.Error("working split items stopped", "err", err)
			}
		}()
		s.stopWorker = func() { cancel(); <-done }
	}
	return s, nil
}

// ControlAudit records in gw's audit log each cancel asked for on its
// control socket: by a user of this machine who may write the socket, the
// store's owner.
func ControlAudit(gw *gateway.Gateway, logger *slog.Logger) func(context.Context, string, error) {
	log := audit.New(gw.Store, logger)
	return func(ctx context.Context, run string, err error) {
		outcome, status, detail := store.AuditOK, http.StatusOK, ""
		if err != nil {
			outcome, status, detail = store.AuditFailed, http.StatusConflict, err.Error()
		}
		ctx = audit.WithOrigin(ctx, audit.Origin{EntryPoint: audit.ViaCLI, Route: "gateway cancel (control socket)"})
		log.Record(ctx, audit.Attempt{Subject: authz.Subject{Kind: authz.CLI, Name: "the store's owner"}, Action: authz.Cancel, Target: authz.Target{Kind: authz.OnRun, Name: run}}, outcome, status, detail)
	}
}

// Close stops the control socket and the worker, then the gateway.
func (s *Session) Close() {
	s.stopControl()
	s.stopWorker()
	if err := s.GW.Close(); err != nil {
		s.log.Error("closing gateway", "err", err)
	}
}

// Result waits for a run to end and returns its result. When ctx ends
// first, the error is ctx's, and the run stays persisted for a resume.
func (s *Session) Result(ctx context.Context, id string) (*engine.Result, error) {
	run, err := s.GW.Engine.Wait(ctx, id)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	return s.GW.Engine.Result(context.WithoutCancel(ctx), run.ID, false)
}

// Resumed is what a Resume took up, and what it left.
type Resumed struct {
	// Runs are the runs this process now advances.
	Runs []string
	// Damaged are the runs whose record cannot be read back.
	Damaged []store.DamagedRun
	// Elsewhere are the unfinished runs another gateway holds the lease of.
	Elsewhere []string
}

// Resume takes up every unfinished run in the store this process may.
func (s *Session) Resume(ctx context.Context) (Resumed, error) {
	unfinished, _ := s.GW.Store.UnfinishedRuns(ctx)
	ids, err := s.GW.Engine.Resume(ctx)
	res := Resumed{Runs: ids, Damaged: s.GW.Engine.Damaged()}
	if err != nil {
		return res, fmt.Errorf("resuming runs: %w", err)
	}
	for _, id := range unfinished {
		if slices.Contains(ids, id) {
			continue
		}
		if run, err := s.GW.Store.Run(ctx, id); err == nil && !run.Status.Final() {
			res.Elsewhere = append(res.Elsewhere, id)
		}
	}
	return res, nil
}

// ErrOpening marks a Cancel that could not open the store.
var ErrOpening = errors.New("opening the store")

// Cancel cancels a run in the store at state: through the control socket
// of the gateway that holds the store's file, or in the store itself.
func Cancel(ctx context.Context, cfg *chain.Config, state string, logger *slog.Logger, id string) error {
	gw, err := gateway.Open(ctx, gateway.Options{Config: cfg, State: state, Logger: logger, Existing: true})
	if errors.Is(err, store.ErrInUse) {
		return gateway.SendControl(ctx, gateway.ControlPath(gateway.StateFile(state)), "cancel "+id)
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrOpening, err)
	}
	err = gw.Engine.Cancel(ctx, id)
	ControlAudit(gw, logger)(ctx, id, err)
	return errors.Join(err, gw.Close())
}
