// Package fakeapi is what the fake services of the providers' test-server
// packages (slacktest, pagerdutytest, opsgenietest, webhooktest) share: an
// HTTP server that records what it receives, answers queued faults before
// its normal answers, and can be made slow. It needs no *testing.T, so load
// benchmarks use the fakes too.
package fakeapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"time"
)

// MaxBodyBytes bounds a request body a fake reads; the services these fakes
// stand for refuse far smaller ones.
const MaxBodyBytes = 4 << 20

// Request is one request a fake received.
type Request struct {
	Method string
	// Path is the escaped path, as sent.
	Path string
	// Query is the raw query string.
	Query  string
	Header http.Header
	Body   []byte
	// Answer is the status the fake answered with.
	Answer int
}

// Fault is an answer a fake gives instead of its normal one.
type Fault struct {
	Status int
	// RetryAfter, if not empty, is sent as the Retry-After header.
	RetryAfter  string
	ContentType string
	Body        string
}

// Handler answers a request whose body has been read.
type Handler func(w http.ResponseWriter, r *http.Request, body []byte) int

// Server is a fake service.
type Server struct {
	// URL is the server's base URL, such as http://127.0.0.1:40123.
	URL string

	srv     *httptest.Server
	handler Handler

	mu       sync.Mutex
	requests []Request
	gen      int // grows with each Reset
	count    int
	record   bool
	faults   []Fault
	latency  time.Duration
}

// New starts a fake that answers with handler; handler returns the status
// it wrote, for the record.
func New(handler Handler) *Server {
	s := &Server{handler: handler, record: true}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	s.URL = s.srv.URL
	return s
}

// Close shuts the server down, waiting for requests in flight.
func (s *Server) Close() { s.srv.Close() }

// Requests returns a copy of the requests received, in arrival order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Count returns how many requests arrived, recorded or not.
func (s *Server) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.count
}

// Record turns the keeping of requests on (the default) or off; a load
// benchmark sending millions turns it off and reads Count.
func (s *Server) Record(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.record = on
}

// FailNext makes the next n requests get f instead of their normal answer.
// Faults queue up in the order they were added.
func (s *Server) FailNext(n int, f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.faults = append(s.faults, f)
	}
}

// SetLatency makes every answer wait d first, or until the client gives up.
func (s *Server) SetLatency(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.latency = d
}

// Reset forgets the recorded requests, the count and the queued faults.
func (s *Server) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests, s.count, s.faults = nil, 0, nil
	s.gen++
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
	s.mu.Lock()
	s.count++
	idx, gen := -1, s.gen
	if s.record {
		idx = len(s.requests)
		s.requests = append(s.requests, Request{
			Method: r.Method, Path: r.URL.EscapedPath(), Query: r.URL.RawQuery,
			Header: r.Header.Clone(), Body: body,
		})
	}
	latency := s.latency
	var fault *Fault
	if len(s.faults) > 0 {
		fault = &s.faults[0]
		s.faults = s.faults[1:]
	}
	s.mu.Unlock()

	if latency > 0 {
		t := time.NewTimer(latency)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}
	var status int
	switch {
	case fault != nil:
		status = WriteFault(w, *fault)
	case err != nil:
		status = http.StatusBadRequest
		http.Error(w, "reading the body: "+err.Error(), status)
	case len(body) > MaxBodyBytes:
		status = http.StatusRequestEntityTooLarge
		http.Error(w, "request body too large", status)
	default:
		status = s.handler(w, r, body)
	}
	if idx >= 0 {
		s.mu.Lock()
		if gen == s.gen {
			s.requests[idx].Answer = status
		}
		s.mu.Unlock()
	}
}

// DecodeStrict decodes a JSON body into v, refusing an empty body, unknown
// fields and trailing data: the fakes check that a provider sends exactly
// the documented fields.
func DecodeStrict(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("unexpected data after the JSON value")
	}
	return nil
}

// WriteFault writes f and returns its status.
func WriteFault(w http.ResponseWriter, f Fault) int {
	if f.RetryAfter != "" {
		w.Header().Set("Retry-After", f.RetryAfter)
	}
	if f.ContentType != "" {
		w.Header().Set("Content-Type", f.ContentType)
	}
	w.WriteHeader(f.Status)
	_, _ = io.WriteString(w, f.Body)
	return f.Status
}

// WriteJSON writes v as a JSON answer and returns status.
func WriteJSON(w http.ResponseWriter, status int, v any) int {
	data, _ := json.Marshal(v) // the fakes answer with plain maps and structs
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.WriteHeader(status)
	_, _ = w.Write(data)
	return status
}
