package server

import (
	"time"

	"github.com/chaingate/gateway/gateway/authz"
	"github.com/chaingate/gateway/gateway/door"
	"github.com/chaingate/gateway/gateway/upkeep"
)

// SetDeliveryBudget bounds how long a trigger delivery's alerts are
// turned into runs before the answer goes, so that a test can have them
// kept and started after it.
func (s *Server) SetDeliveryBudget(d time.Duration) { s.budget = d }

// Route is one of the API's routes and the action it asks the
// authorization seam for; "" for a route that asks for itself or not at all.
type Route struct {
	Pattern string
	Action  authz.Action
}

// Routes lists the API's routes.
func (s *Server) Routes() []Route {
	var out []Route
	for _, rt := range s.routes() {
		out = append(out, Route{Pattern: rt.pattern, Action: rt.action})
	}
	return out
}

// SetDecide replaces the authorization seam's rule.
func (s *Server) SetDecide(fn func(authz.Subject, authz.Action, authz.Target) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.decide = fn
}

// Retention is the server's retention, which Run drives.
func (s *Server) Retention() *upkeep.Retention { return s.retention }

// Door is the server's door.
func (s *Server) Door() *door.Door { return s.door }
