// Package webhooktest is a receiver for the webhook provider, for tests and
// load benchmarks. It does what a careful receiver does: it takes only
// POSTs of JSON, checks the signature with webhook.Verify (401 if it does
// not hold), requires an Idempotency-Key and delivers each key once,
// answering a repeat as it answered the first (with Idempotent-Replayed:
// true). A delivery is answered 200 with {"received":true,"delivery":N}.
// Failures are injected with FailNext and the Fault helpers.
//
// It is the gateway's own package, with no compatibility promise.
package webhooktest

import (
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"sync"
	"time"

	"github.com/chaingate/gateway/providers/internal/fakeapi"
	"github.com/chaingate/gateway/providers/webhook"
)

// Secret is the signing secret the receiver checks, until SetSecret.
const Secret = "whsec-webhooktest-0123456789abcdef"

// Request is one request the receiver got.
type Request = fakeapi.Request

// Fault is an answer given instead of the normal one; see FailNext.
type Fault = fakeapi.Fault

// Delivery is one distinct Idempotency-Key the receiver accepted.
type Delivery struct {
	// Number is the delivery's place in arrival order, from 1.
	Number         int
	IdempotencyKey string
	Path           string
	Body           json.RawMessage
	// Attempts counts the requests that carried the key, repeats included.
	Attempts int
}

// Server is the receiver. The embedded *fakeapi.Server gives URL, Close,
// Requests, Count, Record, FailNext, SetLatency and Reset.
type Server struct {
	*fakeapi.Server

	mu         sync.Mutex
	secret     []byte
	deliveries []*Delivery
	byKey      map[string]*Delivery
}

// NewServer starts a receiver that checks signatures made with Secret;
// Close it when done.
func NewServer() *Server {
	s := &Server{secret: []byte(Secret), byKey: map[string]*Delivery{}}
	s.Server = fakeapi.New(s.handle)
	return s
}

// SetSecret changes the secret signatures are checked with; nil accepts
// unsigned requests and checks none.
func (s *Server) SetSecret(secret []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.secret = secret
}

// Deliveries returns a copy of the deliveries, in arrival order.
func (s *Server) Deliveries() []Delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Delivery, len(s.deliveries))
	for i, d := range s.deliveries {
		out[i] = *d
	}
	return out
}

// Reset forgets requests, queued faults and deliveries.
func (s *Server) Reset() {
	s.Server.Reset()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.deliveries, s.byKey = nil, map[string]*Delivery{}
}

// RateLimited is an HTTP 429 answer with Retry-After in seconds.
func RateLimited(retryAfterSeconds int) Fault {
	return Fault{Status: http.StatusTooManyRequests, RetryAfter: fmt.Sprint(retryAfterSeconds), ContentType: "application/json", Body: `{"error":"rate limited"}`}
}

// ServerError is an answer with a 5xx status, such as 500 or 503.
func ServerError(status int) Fault {
	return Fault{Status: status, ContentType: "text/plain", Body: http.StatusText(status)}
}

func fail(w http.ResponseWriter, status int, msg string) int {
	return fakeapi.WriteJSON(w, status, map[string]string{"error": msg})
}

func (s *Server) handle(w http.ResponseWriter, r *http.Request, body []byte) int {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return fail(w, http.StatusMethodNotAllowed, "only POST")
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return fail(w, http.StatusUnsupportedMediaType, "Content-Type must be application/json")
	}
	s.mu.Lock()
	secret := s.secret
	s.mu.Unlock()
	if secret != nil {
		if err := webhook.Verify(secret, r.Header.Get(webhook.TimestampHeader), r.Header.Get(webhook.SignatureHeader), body, webhook.DefaultTolerance, time.Now()); err != nil {
			return fail(w, http.StatusUnauthorized, err.Error())
		}
	}
	if !json.Valid(body) {
		return fail(w, http.StatusBadRequest, "the body is not valid JSON")
	}
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		return fail(w, http.StatusBadRequest, "Idempotency-Key is required")
	}

	s.mu.Lock()
	d, seen := s.byKey[key]
	if seen {
		d.Attempts++
	} else {
		d = &Delivery{Number: len(s.deliveries) + 1, IdempotencyKey: key, Path: r.URL.EscapedPath(), Body: body, Attempts: 1}
		s.deliveries = append(s.deliveries, d)
		s.byKey[key] = d
	}
	n := d.Number
	s.mu.Unlock()
	if seen {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	return fakeapi.WriteJSON(w, http.StatusOK, map[string]any{"received": true, "delivery": n})
}
