// Package opsgenietest is a fake Opsgenie Alert API for tests and load
// benchmarks: create (POST /v2/alerts), acknowledge and close
// (POST /v2/alerts/{alias}/acknowledge|close?identifierType=alias), checked
// and answered as Opsgenie documents them, errors included.
//
// Use URL as the provider's base_url and APIKey as its api_key. Bodies are
// decoded strictly: a field the Alert API does not document is refused
// with 422. The fake keeps alerts by alias and deduplicates a create for
// an open alert into it, as Opsgenie does. Acknowledging or closing an
// unknown alias is accepted (202), as Opsgenie accepts it before
// processing it. Failures are injected with FailNext and the Fault helpers.
//
// It is the gateway's own package, with no compatibility promise.
package opsgenietest

import (
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/chaingate/gateway/providers/internal/fakeapi"
)

// APIKey is the API integration key the fake accepts.
const APIKey = "c0ffee00-0000-4000-8000-000000000001"

// Request is one request the fake received.
type Request = fakeapi.Request

// Fault is an answer given instead of the normal one; see FailNext.
type Fault = fakeapi.Fault

// Alert is an alert the fake holds.
type Alert struct {
	Alias    string
	Message  string
	Priority string
	// Status is open or closed.
	Status       string
	Acknowledged bool
	// Count is how many creates were deduplicated into the alert, plus one.
	Count int
}

// Server is the fake Alert API. The embedded *fakeapi.Server gives URL,
// Close, Requests, Count, Record, FailNext, SetLatency and Reset.
type Server struct {
	*fakeapi.Server

	mu     sync.Mutex
	seq    int
	alerts []*Alert
	open   map[string]*Alert // open alerts by alias
}

// NewServer starts a fake Alert API; Close it when done.
func NewServer() *Server {
	s := &Server{open: map[string]*Alert{}}
	s.Server = fakeapi.New(s.handle)
	return s
}

// Alerts returns a copy of the alerts, in the order they were created.
func (s *Server) Alerts() []Alert {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Alert, len(s.alerts))
	for i, a := range s.alerts {
		out[i] = *a
	}
	return out
}

// Reset forgets requests, queued faults and alerts.
func (s *Server) Reset() {
	s.Server.Reset()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.alerts, s.open = nil, map[string]*Alert{}
}

// Error is an error answer as Opsgenie gives it: status with
// {"message", "took", "requestId"}.
func Error(status int, message string) Fault {
	body, _ := json.Marshal(answer{Message: message, Took: 0.001, RequestID: "00000000-0000-4000-8000-fa0170000000"})
	return Fault{Status: status, ContentType: "application/json", Body: string(body)}
}

// RateLimited is Opsgenie's answer to a caller over its rate limit: HTTP
// 429 with Retry-After in seconds.
func RateLimited(retryAfterSeconds int) Fault {
	f := Error(http.StatusTooManyRequests, "You are making too many requests! To avoid errors, we recommend you limit requests.")
	f.RetryAfter = fmt.Sprint(retryAfterSeconds)
	return f
}

type answer struct {
	Result    string            `json:"result,omitempty"`
	Message   string            `json:"message,omitempty"`
	Errors    map[string]string `json:"errors,omitempty"`
	Took      float64           `json:"took"`
	RequestID string            `json:"requestId"`
}

type responder struct {
	Type     string `json:"type"`
	ID       string `json:"id"`
	Name     string `json:"name"`
	Username string `json:"username"`
}

type createRequest struct {
	Message     string            `json:"message"`
	Alias       string            `json:"alias"`
	Description string            `json:"description"`
	Responders  []responder       `json:"responders"`
	VisibleTo   []responder       `json:"visibleTo"`
	Actions     []string          `json:"actions"`
	Tags        []string          `json:"tags"`
	Details     map[string]string `json:"details"`
	Entity      string            `json:"entity"`
	Source      string            `json:"source"`
	Priority    string            `json:"priority"`
	User        string            `json:"user"`
	Note        string            `json:"note"`
}

type actionRequest struct {
	User   string `json:"user"`
	Source string `json:"source"`
	Note   string `json:"note"`
}

func (s *Server) requestID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	return fmt.Sprintf("00000000-0000-4000-8000-%012d", s.seq)
}

func (s *Server) fail(w http.ResponseWriter, status int, message string, errs map[string]string) int {
	return fakeapi.WriteJSON(w, status, answer{Message: message, Errors: errs, Took: 0.001, RequestID: s.requestID()})
}

func (s *Server) invalid(w http.ResponseWriter, field, msg string) int {
	return s.fail(w, http.StatusUnprocessableEntity, "Request has validation errors", map[string]string{field: msg})
}

func (s *Server) handle(w http.ResponseWriter, r *http.Request, body []byte) int {
	parts := strings.Split(strings.TrimPrefix(r.URL.EscapedPath(), "/"), "/")
	create := len(parts) == 2 && parts[0] == "v2" && parts[1] == "alerts"
	action := len(parts) == 4 && parts[0] == "v2" && parts[1] == "alerts" && (parts[3] == "acknowledge" || parts[3] == "close")
	if !create && !action {
		return s.fail(w, http.StatusNotFound, "Not Found", nil)
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return s.fail(w, http.StatusMethodNotAllowed, "Method Not Allowed", nil)
	}
	if r.Header.Get("Authorization") != "GenieKey "+APIKey {
		return s.fail(w, http.StatusUnauthorized, "Could not authenticate", nil)
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return s.fail(w, http.StatusUnsupportedMediaType, "Content-Type must be application/json", nil)
	}
	if create {
		return s.create(w, body)
	}
	alias, err := url.PathUnescape(parts[2])
	if err != nil || alias == "" {
		return s.fail(w, http.StatusBadRequest, "Invalid alert identifier", nil)
	}
	if r.URL.Query().Get("identifierType") != "alias" {
		return s.invalid(w, "identifierType", "the fake knows alerts by alias only")
	}
	var req actionRequest
	if err := fakeapi.DecodeStrict(body, &req); err != nil {
		return s.fail(w, http.StatusUnprocessableEntity, "Request has validation errors: "+err.Error(), nil)
	}
	s.mu.Lock()
	if a, ok := s.open[alias]; ok {
		if parts[3] == "close" {
			a.Status = "closed"
			delete(s.open, alias)
		} else {
			a.Acknowledged = true
		}
	}
	s.mu.Unlock()
	return s.accepted(w)
}

func (s *Server) accepted(w http.ResponseWriter) int {
	return fakeapi.WriteJSON(w, http.StatusAccepted, answer{Result: "Request will be processed", Took: 0.302, RequestID: s.requestID()})
}

func (s *Server) create(w http.ResponseWriter, body []byte) int {
	var req createRequest
	if err := fakeapi.DecodeStrict(body, &req); err != nil {
		return s.fail(w, http.StatusUnprocessableEntity, "Request has validation errors: "+err.Error(), nil)
	}
	switch n := utf8.RuneCountInString(req.Message); {
	case n == 0:
		return s.invalid(w, "message", "Message can not be empty.")
	case n > 130:
		return s.invalid(w, "message", "Message can not be longer than 130 characters.")
	}
	if utf8.RuneCountInString(req.Alias) > 512 {
		return s.invalid(w, "alias", "Alias can not be longer than 512 characters.")
	}
	if req.Priority != "" && !slices.Contains([]string{"P1", "P2", "P3", "P4", "P5"}, req.Priority) {
		return s.invalid(w, "priority", "Priority should be one of [P1, P2, P3, P4, P5]")
	}
	for _, rs := range []struct {
		field string
		list  []responder
		types []string
	}{
		{"responders", req.Responders, []string{"team", "user", "escalation", "schedule"}},
		{"visibleTo", req.VisibleTo, []string{"team", "user"}},
	} {
		for _, r := range rs.list {
			if !slices.Contains(rs.types, r.Type) || r.ID == "" && r.Name == "" && r.Username == "" {
				return s.invalid(w, rs.field, "Invalid "+rs.field+" type or identifier")
			}
		}
	}
	alias := req.Alias
	if alias == "" {
		// Opsgenie's default alias, so alerts with equal messages dedupe.
		alias = req.Message
	}
	priority := req.Priority
	if priority == "" {
		priority = "P3"
	}
	s.mu.Lock()
	if a, ok := s.open[alias]; ok {
		a.Count++
	} else {
		a := &Alert{Alias: alias, Message: req.Message, Priority: priority, Status: "open", Count: 1}
		s.alerts = append(s.alerts, a)
		s.open[alias] = a
	}
	s.mu.Unlock()
	return s.accepted(w)
}
