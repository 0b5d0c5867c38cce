// Package pagerdutytest is a fake PagerDuty Events API v2 for tests and load
// benchmarks: POST /v2/enqueue and POST /v2/change/enqueue, checked and
// answered as PagerDuty documents them, errors included.
//
// Use URL as the provider's base_url and RoutingKey as its routing_key.
// Events are decoded strictly: a field the Events API does not document is
// refused as an invalid event. The fake keeps one alert per dedup_key, as
// PagerDuty does: a trigger for an open alert is deduplicated into it.
// Failures are injected with FailNext and the Fault helpers.
//
// It is the gateway's own package, with no compatibility promise.
package pagerdutytest

import (
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/chaingate/gateway/providers/internal/fakeapi"
)

// RoutingKey is the integration key the fake accepts.
const RoutingKey = "R0PAGERDUTYTEST0ROUTINGKEY000000"

// Request is one request the fake received.
type Request = fakeapi.Request

// Fault is an answer given instead of the normal one; see FailNext.
type Fault = fakeapi.Fault

// Alert is an alert the fake holds.
type Alert struct {
	DedupKey string
	// Status is triggered, acknowledged or resolved.
	Status   string
	Summary  string
	Severity string
	// Events counts the events for this alert, deduplicated triggers included.
	Events int
}

// Server is the fake Events API. The embedded *fakeapi.Server gives URL,
// Close, Requests, Count, Record, FailNext, SetLatency and Reset.
type Server struct {
	*fakeapi.Server

	mu      sync.Mutex
	seq     int
	alerts  []*Alert
	byKey   map[string]*Alert // open alerts by dedup_key
	changes int
}

// NewServer starts a fake Events API; Close it when done.
func NewServer() *Server {
	s := &Server{byKey: map[string]*Alert{}}
	s.Server = fakeapi.New(s.handle)
	return s
}

// Alerts returns a copy of the alerts, in the order they were opened.
func (s *Server) Alerts() []Alert {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Alert, len(s.alerts))
	for i, a := range s.alerts {
		out[i] = *a
	}
	return out
}

// Changes returns how many change events were accepted.
func (s *Server) Changes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changes
}

// Reset forgets requests, queued faults, alerts and change events.
func (s *Server) Reset() {
	s.Server.Reset()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.alerts, s.byKey, s.changes = nil, map[string]*Alert{}, 0
}

// RateLimited is PagerDuty's answer to a caller over its rate limit: HTTP
// 429 with Retry-After in seconds.
func RateLimited(retryAfterSeconds int) Fault {
	return Fault{
		Status: http.StatusTooManyRequests, RetryAfter: fmt.Sprint(retryAfterSeconds),
		ContentType: "application/json",
		Body:        `{"status":"throttle event","message":"Requests for this service are arriving too quickly. Please retry later."}`,
	}
}

// ServerError is an answer with a 5xx status, such as 500 or 503.
func ServerError(status int) Fault {
	return Fault{Status: status, ContentType: "text/plain", Body: http.StatusText(status)}
}

// InvalidEvent is PagerDuty's HTTP 400 answer to an event it refuses.
func InvalidEvent(errs ...string) Fault {
	body, _ := json.Marshal(answer{Status: "invalid event", Message: "Event object is invalid", Errors: errs})
	return Fault{Status: http.StatusBadRequest, ContentType: "application/json", Body: string(body)}
}

type answer struct {
	Status   string   `json:"status"`
	Message  string   `json:"message"`
	DedupKey string   `json:"dedup_key,omitempty"`
	Errors   []string `json:"errors,omitempty"`
}

type image struct {
	Src  string `json:"src"`
	Href string `json:"href"`
	Alt  string `json:"alt"`
}

type link struct {
	Href string `json:"href"`
	Text string `json:"text"`
}

type event struct {
	RoutingKey  string `json:"routing_key"`
	EventAction string `json:"event_action"`
	DedupKey    string `json:"dedup_key"`
	Payload     *struct {
		Summary       string          `json:"summary"`
		Source        string          `json:"source"`
		Severity      string          `json:"severity"`
		Timestamp     string          `json:"timestamp"`
		Component     string          `json:"component"`
		Group         string          `json:"group"`
		Class         string          `json:"class"`
		CustomDetails json.RawMessage `json:"custom_details"`
	} `json:"payload"`
	Images    []image `json:"images"`
	Links     []link  `json:"links"`
	Client    string  `json:"client"`
	ClientURL string  `json:"client_url"`
}

type changeEvent struct {
	RoutingKey string `json:"routing_key"`
	Payload    *struct {
		Summary       string          `json:"summary"`
		Source        string          `json:"source"`
		Timestamp     string          `json:"timestamp"`
		CustomDetails json.RawMessage `json:"custom_details"`
	} `json:"payload"`
	Links []link `json:"links"`
}

func invalid(w http.ResponseWriter, errs ...string) int {
	return fakeapi.WriteJSON(w, http.StatusBadRequest, answer{Status: "invalid event", Message: "Event object is invalid", Errors: errs})
}

func (s *Server) handle(w http.ResponseWriter, r *http.Request, body []byte) int {
	if r.URL.Path != "/v2/enqueue" && r.URL.Path != "/v2/change/enqueue" {
		return fakeapi.WriteJSON(w, http.StatusNotFound, answer{Status: "not found", Message: "Not Found"})
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return fakeapi.WriteJSON(w, http.StatusMethodNotAllowed, answer{Status: "method not allowed", Message: "Method Not Allowed"})
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return invalid(w, "Content-Type must be application/json")
	}
	if r.URL.Path == "/v2/change/enqueue" {
		return s.change(w, body)
	}
	var ev event
	if err := fakeapi.DecodeStrict(body, &ev); err != nil {
		return invalid(w, err.Error())
	}
	if errs := checkRoutingKey(ev.RoutingKey); errs != nil {
		return invalid(w, errs...)
	}
	if utf8.RuneCountInString(ev.DedupKey) > 255 {
		return invalid(w, "'dedup_key' is too long (maximum is 255 characters)")
	}
	switch ev.EventAction {
	case "trigger":
		if errs := checkTrigger(ev); errs != nil {
			return invalid(w, errs...)
		}
	case "acknowledge", "resolve":
		if ev.DedupKey == "" {
			return invalid(w, "'dedup_key' is missing or blank")
		}
	default:
		return invalid(w, "'event_action' is invalid (must be one of: trigger, acknowledge, resolve)")
	}

	s.mu.Lock()
	key := ev.DedupKey
	if key == "" {
		s.seq++
		key = fmt.Sprintf("%032x", s.seq)
	}
	if a, open := s.byKey[key]; open {
		a.Events++
		switch ev.EventAction {
		case "acknowledge":
			a.Status = "acknowledged"
		case "resolve":
			a.Status = "resolved"
			delete(s.byKey, key)
		}
	} else if ev.EventAction == "trigger" {
		// Acknowledging or resolving no open alert is accepted and dropped.
		a := &Alert{DedupKey: key, Status: "triggered", Summary: ev.Payload.Summary, Severity: ev.Payload.Severity, Events: 1}
		s.alerts = append(s.alerts, a)
		s.byKey[key] = a
	}
	s.mu.Unlock()
	return fakeapi.WriteJSON(w, http.StatusAccepted, answer{Status: "success", Message: "Event processed", DedupKey: key})
}

func checkRoutingKey(key string) []string {
	switch {
	case len(key) != 32:
		return []string{"Length of 'routing_key' is incorrect (should be 32 characters)"}
	case key != RoutingKey:
		return []string{"Invalid routing key"}
	}
	return nil
}

func checkTrigger(ev event) []string {
	if ev.Payload == nil {
		return []string{"'payload' is missing or blank"}
	}
	var errs []string
	pl := ev.Payload
	switch n := utf8.RuneCountInString(pl.Summary); {
	case n == 0:
		errs = append(errs, "'payload.summary' is missing or blank")
	case n > 1024:
		errs = append(errs, "'payload.summary' is too long (maximum is 1024 characters)")
	}
	if pl.Source == "" {
		errs = append(errs, "'payload.source' is missing or blank")
	}
	switch pl.Severity {
	case "critical", "error", "warning", "info":
	default:
		errs = append(errs, "'payload.severity' is invalid (must be one of: critical, error, warning, info)")
	}
	if pl.Timestamp != "" && !validTimestamp(pl.Timestamp) {
		errs = append(errs, "'payload.timestamp' is invalid (must be ISO 8601)")
	}
	for _, im := range ev.Images {
		if im.Src == "" {
			errs = append(errs, "'images.src' is missing or blank")
		}
	}
	return append(errs, checkLinks(ev.Links)...)
}

func checkLinks(links []link) []string {
	var errs []string
	for _, l := range links {
		if l.Href == "" {
			errs = append(errs, "'links.href' is missing or blank")
		}
	}
	return errs
}

// validTimestamp accepts the ISO 8601 forms PagerDuty's examples use.
func validTimestamp(s string) bool {
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05.999999999-0700"} {
		if _, err := time.Parse(layout, s); err == nil {
			return true
		}
	}
	return false
}

func (s *Server) change(w http.ResponseWriter, body []byte) int {
	var ev changeEvent
	if err := fakeapi.DecodeStrict(body, &ev); err != nil {
		return invalid(w, err.Error())
	}
	if errs := checkRoutingKey(ev.RoutingKey); errs != nil {
		return invalid(w, errs...)
	}
	switch {
	case ev.Payload == nil || ev.Payload.Summary == "":
		return invalid(w, "'payload.summary' is missing or blank")
	case utf8.RuneCountInString(ev.Payload.Summary) > 1024:
		return invalid(w, "'payload.summary' is too long (maximum is 1024 characters)")
	case ev.Payload.Timestamp != "" && !validTimestamp(ev.Payload.Timestamp):
		return invalid(w, "'payload.timestamp' is invalid (must be ISO 8601)")
	}
	if errs := checkLinks(ev.Links); errs != nil {
		return invalid(w, errs...)
	}
	s.mu.Lock()
	s.changes++
	s.mu.Unlock()
	return fakeapi.WriteJSON(w, http.StatusAccepted, answer{Status: "success", Message: "Change event processed"})
}
