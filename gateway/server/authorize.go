package server

import (
	"context"
	"errors"
	"net/http"

	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/gateway/authz"
	"github.com/chaingate/gateway/gateway/server/internal/connguard"
)

// Authorize is where every entry point asks whether a subject may act: the
// API's routes, trigger deliveries, Slack's interactions and, through its
// host, the console. A refusal is a 403 *APIError naming what was missing.
func (s *Server) Authorize(ctx context.Context, sub authz.Subject, a authz.Action, t authz.Target) error {
	s.mu.RLock()
	decide := s.decide
	s.mu.RUnlock()
	err := decide(sub, a, t)
	var d *authz.Denied
	if errors.As(err, &d) {
		return &api.APIError{Status: http.StatusForbidden, Code: "forbidden", Message: d.Missing}
	}
	return err
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

// pausable is the trigger or schedule a pause route names.
func pausable(r *http.Request) authz.Target {
	return authz.Target{Kind: r.PathValue("kind"), Name: r.PathValue("name")}
}

// LoopbackOnly refuses a request from another machine, as an API without
// tokens does; the console, served beside it, refuses the same.
func LoopbackOnly(r *http.Request) *api.APIError { return connguard.LoopbackOnly(r) }
