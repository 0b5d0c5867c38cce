package server

import (
	"fmt"
	"net/http"

	"github.com/chaingate/gateway/gateway/api"
)

// pauseBody is the optional body of POST /v1/pauses/{kind}/{name}.
type pauseBody struct {
	Reason string `json:"reason"`
}

func (s *Server) listPauses(w http.ResponseWriter, r *http.Request) {
	ps, err := s.door.Pauses(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"pauses": ps})
}

// pause pauses a trigger or schedule: 201 with the pause, or 200 with the
// one already there.
func (s *Server) pause(w http.ResponseWriter, r *http.Request) {
	var b pauseBody
	if err := s.readJSON(w, r, &b); err != nil {
		s.writeError(w, r, err)
		return
	}
	if len(b.Reason) > api.MaxComment {
		s.writeError(w, r, api.BadRequest("invalid_parameter", "reason is %d bytes; at most %d", len(b.Reason), api.MaxComment))
		return
	}
	before, err := s.door.Paused(r.Context(), r.PathValue("kind"), r.PathValue("name"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	p, err := s.door.Pause(r.Context(), r.PathValue("kind"), r.PathValue("name"), b.Reason)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	code := http.StatusCreated
	if before != nil {
		code = http.StatusOK
	}
	writeJSON(w, code, p)
}

// resume lifts a pause: 200 with the pause lifted, 404 not_paused without
// one.
func (s *Server) resume(w http.ResponseWriter, r *http.Request) {
	p, err := s.door.Resume(r.Context(), r.PathValue("kind"), r.PathValue("name"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if p == nil {
		s.writeError(w, r, &api.APIError{Status: http.StatusNotFound, Code: "not_paused", Message: fmt.Sprintf("%s %q is not paused", r.PathValue("kind"), r.PathValue("name"))})
		return
	}
	writeJSON(w, http.StatusOK, p)
}
