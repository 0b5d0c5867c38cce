package server

import (
	"context"
	"errors"
	"net/http"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/gateway/audit"
	"github.com/chaingate/gateway/gateway/authz"
	"github.com/chaingate/gateway/gateway/server/internal/connguard"
)

// Authorize is where every entry point asks whether a subject may act: the
// API's routes, trigger deliveries, Slack's interactions and, through its
// host, the console. The config's policy decides; a run's or a dead-letter
// entry's chain is read from the store when what the subject may do
// depends on it. A refusal is logged, counted, and returned as a 403
// *APIError naming what was missing.
func (s *Server) Authorize(ctx context.Context, sub authz.Subject, a authz.Action, t authz.Target) error {
	s.mu.RLock()
	policy, decide := s.policy, s.decide
	s.mu.RUnlock()
	if decide == nil {
		if policy.Scoped(sub) || a != authz.Read {
			t = s.resolve(ctx, t)
		}
		decide = policy.Decide
	}
	err := decide(sub, a, t)
	var d *authz.Denied
	if errors.As(err, &d) {
		s.log.Warn("denied", "subject", sub.Name, "subject_kind", string(sub.Kind), "action", string(a), "target", t.String(), "missing", d.Missing)
		if s.metrics != nil {
			s.metrics.Denied(string(a), t.Kind, string(sub.Kind))
		}
		s.audit.Record(ctx, audit.Attempt{Subject: sub, Roles: policy.RolesOf(sub), Action: a, Target: t}, store.AuditDenied, http.StatusForbidden, d.Missing)
		return &api.APIError{Status: http.StatusForbidden, Code: "forbidden", Message: d.Missing}
	}
	return err
}

// Record appends to the audit log what came of an action the seam let
// through: ok for a status below 400, else failed with the error the
// answer gave. ctx carries where the request came from (audit.WithOrigin)
// and what the action noted (audit.WithNote).
func (s *Server) Record(ctx context.Context, sub authz.Subject, a authz.Action, t authz.Target, status int, detail string) {
	s.mu.RLock()
	policy := s.policy
	s.mu.RUnlock()
	// A run deleted by the action has no chain left to read: the way in
	// resolves the target before acting where it matters.
	t = s.resolve(ctx, t)
	s.audit.Record(ctx, audit.Attempt{Subject: sub, Roles: policy.RolesOf(sub), Action: a, Target: t}, audit.Outcome(status), status, detail)
}

// MayChange reports whether sub may do anything but read, somewhere.
func (s *Server) MayChange(sub authz.Subject) bool {
	s.mu.RLock()
	policy := s.policy
	s.mu.RUnlock()
	return policy.MayChange(sub)
}

// resolve fills in the chain of a run, or the chain or trigger of a
// dead-letter entry, that t names. One that cannot be read is left
// without: only a grant on every chain covers it, and a refusal says no
// more of it than a run that is not there would.
func (s *Server) resolve(ctx context.Context, t authz.Target) authz.Target {
	if t.Name == "" || t.Chain != "" || t.Trigger != "" {
		return t
	}
	switch t.Kind {
	case authz.OnRun:
		if run, err := s.gw.Store.RunHeader(ctx, t.Name); err == nil {
			t.Chain = run.Chain
		}
	case authz.OnDLQ:
		if e, err := s.gw.Store.DLQ(ctx, t.Name); err == nil {
			t.Chain = e.Chain
			if e.Kind == store.DLQDelivery {
				t.Trigger = e.Trigger
			}
		}
	}
	return t
}

// on is the target a route's request names by the path value key, or the
// route's kind with no name.
func on(kind, key string) func(*http.Request) authz.Target {
	return func(r *http.Request) authz.Target {
		if key == "" {
			return authz.Target{Kind: kind}
		}
		return authz.Target{Kind: kind, Name: r.PathValue(key)}
	}
}

// ofChain is every one of kind, or those of the chain the request's query
// names: a role that may read some chains' runs lists them chain by chain.
func ofChain(kind string) func(*http.Request) authz.Target {
	return func(r *http.Request) authz.Target {
		return authz.Target{Kind: kind, Chain: r.URL.Query().Get("chain")}
	}
}

// pausable is the trigger or schedule a pause route names.
func pausable(r *http.Request) authz.Target {
	return authz.Target{Kind: r.PathValue("kind"), Name: r.PathValue("name")}
}

// LoopbackOnly refuses a request from another machine, as an API without
// tokens does; the console, served beside it, refuses the same.
func LoopbackOnly(r *http.Request) *api.APIError { return connguard.LoopbackOnly(r) }

// SecretValue is the value of the secret the config names name, as the
// gateway read it when it started.
func (s *Server) SecretValue(name string) string { return s.gw.SecretValues()[name] }
