package server

import (
	"net/http"
	"time"

	"github.com/chaingate/gateway/gateway/schedules"
)

// Scheduler returns the server's scheduler; Run drives it from the clock.
func (s *Server) Scheduler() *schedules.Scheduler { return s.sched }

func (s *Server) listSchedules(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"schedules": schedules.Schedules(r.Context(), s.gw.Engine.Config(), s.gw.Store, time.Now())})
}
