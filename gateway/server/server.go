// Package server is a gateway's HTTP server and its lifecycle: the API's
// routes and handlers, connection limits, token checks and the
// authorization seam every entry point asks (Server.Authorize), reload and
// graceful shutdown, and the loops a serving gateway runs (the door's
// inbox, schedules, retention, approval calls, taking over lapsed runs).
//
// It is the gateway's own package, with no compatibility promise.
package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/gateway/approvals"
	"github.com/chaingate/gateway/gateway/audit"
	"github.com/chaingate/gateway/gateway/authz"
	"github.com/chaingate/gateway/gateway/door"
	"github.com/chaingate/gateway/gateway/events"
	"github.com/chaingate/gateway/gateway/metrics"
	"github.com/chaingate/gateway/gateway/ops"
	"github.com/chaingate/gateway/gateway/schedules"
	"github.com/chaingate/gateway/gateway/server/internal/connguard"
	"github.com/chaingate/gateway/gateway/upkeep"
)

// Server is a gateway's HTTP API and its lifecycle: intake, adoption of
// runs other gateways left, reload, graceful shutdown.
type Server struct {
	gw      *gateway.Gateway
	ops     *ops.Local
	hub     *events.Hub
	metrics *metrics.Metrics
	log     *slog.Logger
	paths   []string // config paths, read again on reload

	mu     sync.RWMutex
	cfg    *chain.Config
	tokens *authz.Tokens

	draining atomic.Bool
	// stopping ends event streams and waits when shutdown begins, so
	// clients reconnect elsewhere instead of holding the drain.
	stopping context.Context
	stop     context.CancelFunc
	// aborting ends a drain before its grace is up.
	aborting context.Context
	abort    context.CancelFunc
	reloadMu sync.Mutex
	// reloadErr is why the last reload was refused; empty once one works.
	reloadErr atomic.Pointer[string]
	// workItems makes the server work the items of distributed splits too.
	workItems bool
	sched     *schedules.Scheduler
	// budget bounds how long a trigger delivery's alerts are turned into
	// runs before the answer goes.
	budget time.Duration
	// fails counts wrong credentials per remote address.
	fails *connguard.AuthFailures
	// slackOut, when set, posts Slack replies in place of
	// DefaultSlackResponder.
	slackOut atomic.Pointer[approvals.SlackResponder]
	// console builds the web console's handler for its base path; nil
	// serves none.
	console func(base string) http.Handler
	// door turns trigger deliveries into runs.
	door *door.Door
	// retention prunes what the config no longer keeps.
	retention *upkeep.Retention
	// audit is the audit log, in the store.
	audit *audit.Log
	// policy is who may do what, from the config's [gateway.auth].
	policy *authz.Policy
	// decide, when set, replaces policy's rule (tests).
	decide func(authz.Subject, authz.Action, authz.Target) error
}

// NewServer returns the API of gw. hub and metrics must be the ones gw's
// events and calls feed; paths are the config paths reload reads again.
func NewServer(gw *gateway.Gateway, hub *events.Hub, metrics *metrics.Metrics, paths []string) *Server {
	s := &Server{gw: gw, ops: &ops.Local{GW: gw, Hub: hub}, hub: hub, metrics: metrics, log: gw.Log.With("component", "api"), paths: paths, budget: door.DeliveryBudget, fails: connguard.NewAuthFailures(time.Now)}
	var prunes upkeep.Observer
	var delivered door.Observer
	if metrics != nil {
		prunes, delivered, s.ops.Prunes = metrics, metrics, metrics
	}
	s.retention = upkeep.NewRetention(gw, prunes)
	s.audit = audit.New(gw.Store, s.log)
	if metrics != nil {
		s.audit.Failed = metrics.AuditLost
	}
	s.door = door.New(gw, delivered)
	s.ops.Door = s.door
	s.stopping, s.stop = context.WithCancel(context.Background())
	s.aborting, s.abort = context.WithCancel(context.Background())
	metrics.Register(gw)
	s.setConfig(gw.Config)
	s.sched = schedules.NewScheduler(s.door, s.log, s.draining.Load)
	// Until the store closes, with the gateway.
	hub.Follow(context.Background(), gw.Store)
	return s
}

// WorkItems makes the gateway work the items of distributed splits as
// well as handing them out, so one machine needs no other process. It does
// nothing without [gateway.fanout].
func (s *Server) WorkItems() {
	s.workItems = s.gw.Fanout != nil
}

func (s *Server) setConfig(cfg *chain.Config) {
	toks := authz.LoadTokens(cfg, s.gw.SecretValues(), os.Environ())
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg = cfg
	s.tokens = toks
	s.policy = authz.NewPolicy(cfg.Gateway.Auth)
}

// Config is the config the gateway serves now: as loaded, or as last
// reloaded.
func (s *Server) Config() *chain.Config {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.cfg
}

// AuthConfigured reports whether cfg and the environment give the API any
// token, so an open API can be refused before anything is opened: before
// the secrets are read, a token that reads one counts (a gateway without
// the secret does not start).
func AuthConfigured(cfg *chain.Config) bool {
	return len(cfg.Gateway.Auth.Tokens)+len(cfg.Gateway.Auth.ReadTokens)+authz.LoadTokens(cfg, nil, os.Environ()).Len() > 0
}

// DefaultListen is where serve listens when neither --listen nor
// [gateway].listen says otherwise.
const DefaultListen = "127.0.0.1:8080"

// CheckAuth refuses to serve addr without API tokens, from cfg or the
// environment, unless only this machine can reach it.
func CheckAuth(cfg *chain.Config, addr string) error {
	if AuthConfigured(cfg) || loopback(addr) {
		return nil
	}
	return fmt.Errorf("refusing to serve %s without API tokens; set [gateway.auth] tokens or %s, or listen on a loopback address", addr, authz.EnvTokens)
}

// CheckServe reports, as a *chain.ConfigError, what serve (without
// --listen) would refuse cfg for in this environment that loading alone
// does not see: the secrets it reads (CheckSecrets), and API tokens for
// a [gateway].listen other machines can reach (CheckAuth).
func CheckServe(ctx context.Context, cfg *chain.Config) error {
	var diags []chain.Diagnostic
	var ce *chain.ConfigError
	switch err := gateway.CheckSecrets(ctx, cfg); {
	case errors.As(err, &ce):
		diags = append(diags, ce.Diagnostics...)
	case err != nil:
		return err
	}
	addr := cfg.Gateway.Listen
	if addr == "" {
		addr = DefaultListen
	}
	if err := CheckAuth(cfg, addr); err != nil {
		diags = append(diags, cfg.Gateway.Source.Key("listen").Errorf("serve: %v", err))
	}
	if len(diags) > 0 {
		return &chain.ConfigError{Diagnostics: gateway.SortDiagnostics(diags)}
	}
	return nil
}

// loopback reports whether addr only listens on this machine.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// AuthEnabled reports whether requests need a token.
func (s *Server) AuthEnabled() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.tokens.Len() > 0
}

// Reload loads the config, and the secrets it reads, again. A config with
// errors is refused, with a *chain.ConfigError, and the running one stays;
// running runs keep the definitions they started with either way.
func (s *Server) Reload() (*chain.Config, error) {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	cfg, err := gateway.LoadConfig(s.paths)
	if err == nil {
		err = s.checkAuthKept(cfg)
	}
	if err == nil {
		err = s.gw.CheckReloadSecrets(cfg)
	}
	if err != nil {
		s.log.Error("config reload refused; the running config stays", "err", err)
		msg := err.Error()
		s.reloadErr.Store(&msg)
		return nil, err
	}
	s.reloadErr.Store(nil)
	s.gw.Engine.SetConfig(cfg)
	if s.gw.Items != nil {
		s.gw.Items.SetConfig(cfg)
	}
	s.gw.Limits.Configure(gateway.LimitPolicies(cfg))
	s.setConfig(cfg)
	s.log.Info("config reloaded", "chains", len(cfg.Chains), "providers", len(cfg.Providers))
	return cfg, nil
}

// checkAuthKept refuses a config that would leave an API that asks for
// tokens open to anyone: a slip in one edit must not do that unnoticed.
// Serving without tokens takes a restart, which checks the listen address.
func (s *Server) checkAuthKept(cfg *chain.Config) error {
	if !s.AuthEnabled() || AuthConfigured(cfg) {
		return nil
	}
	return &chain.ConfigError{Diagnostics: []chain.Diagnostic{{
		Path:     "gateway.auth",
		Message:  "the new config has no API tokens; a reload cannot open the API to requests without a token (restart the gateway to serve without tokens)",
		Severity: chain.SeverityError,
	}}}
}

// Run serves the API on l until ctx is done, adopting runs whose lease has
// lapsed as it goes; then it stops intake, lets calls in flight finish for
// up to grace, and returns. The caller closes the gateway.
func (s *Server) Run(ctx context.Context, l net.Listener, grace time.Duration) error {
	lim := s.Config().Gateway.Limits
	srv := s.httpServer(lim)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(connguard.LimitConns(l, lim, s.metrics.Refused)) }()
	go s.adopt(ctx)
	go s.sched.Run(s.stopping)
	inboxDone := make(chan struct{})
	go func() {
		defer close(inboxDone)
		s.door.RunInbox(s.stopping)
	}()
	go s.retention.Run(s.stopping)
	go approvals.New(s.gw).Run(s.stopping, s.hub)
	workerCtx, stopWorker := context.WithCancel(context.Background())
	defer stopWorker()
	workerDone := make(chan struct{})
	if s.workItems {
		go func() {
			defer close(workerDone)
			if err := s.gw.WorkItems(workerCtx); err != nil {
				s.log.Error("working split items stopped", "err", err)
			}
		}()
	} else {
		close(workerDone)
	}
	s.log.Info("serving", "addr", l.Addr().String(), "owner", s.gw.Engine.Owner())

	select {
	case err := <-errc:
		return fmt.Errorf("serving: %w", err)
	case <-ctx.Done():
	}
	s.log.Info("shutting down: no new runs; calls in flight may finish", "grace", grace)
	s.draining.Store(true)
	s.stop()
	deadline := time.Now().Add(grace)
	engCtx, cancel := context.WithDeadline(s.aborting, deadline)
	defer cancel()
	// The kept deliveries this gateway works are let go of before it
	// stops, so that the gateway that carries on takes them up at once.
	select {
	case <-inboxDone:
	case <-engCtx.Done():
	}
	// The API keeps answering while the engine drains: /readyz says 503 so
	// load balancers move on, new runs get 503, reads still work.
	s.gw.Engine.Shutdown(engCtx)
	if s.gw.Items != nil {
		s.gw.Items.Shutdown(engCtx)
	}
	// Items the engine drained are acknowledged by now; the rest go back to
	// the queue with the worker's channel.
	stopWorker()
	<-workerDone
	// Requests still in flight get what is left of the grace, and at least
	// a moment to finish writing.
	httpCtx, cancelHTTP := context.WithTimeout(s.aborting, max(time.Until(deadline), httpShutdownMin))
	defer cancelHTTP()
	err := srv.Shutdown(httpCtx)
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		err = srv.Close()
	}
	return err
}

// LastReloadError is why the last reload was refused, as validate prints
// it; empty when it was not.
func (s *Server) LastReloadError() string {
	if p := s.reloadErr.Load(); p != nil {
		return *p
	}
	return ""
}

// Abort cuts a shutdown short: calls still in flight are cancelled instead
// of awaited, and Run returns. Their runs stay as persisted and resume on
// the next start, or on another gateway sharing the store.
func (s *Server) Abort() { s.abort() }

// httpShutdownMin is the least time requests get to finish once the
// engine has stopped.
const httpShutdownMin = time.Second

// untilStop is ctx, ended also when the server begins shutting down.
func (s *Server) untilStop(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	unhook := context.AfterFunc(s.stopping, cancel)
	return ctx, func() { unhook(); cancel() }
}

// adopt resumes the unfinished runs nobody advances: those of a gateway
// that died, once their leases lapse. It looks a few times per lease, so a
// run resumes well within a second of its lease lapsing.
func (s *Server) adopt(ctx context.Context) {
	gateway.Adopt(ctx, s.gw.Engine, s.log, "unfinished runs", time.Duration(s.Config().Gateway.LeaseTTLSeconds)*time.Second)
}

func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	ae := api.AsAPIError(err)
	switch {
	case ae.Code == "shutting_down":
		// Expected while draining: load balancers probe /readyz to see it.
	case ae.Code == "server_busy":
		// One per connection of a flood: counted, not logged.
	case ae.Status == http.StatusServiceUnavailable:
		s.log.Warn("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	case ae.Status >= 500:
		s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	if connguard.BodyUnread(r) {
		// Refused before its body was read: answered at once, and the
		// connection closes rather than waiting for the rest.
		w.Header().Set("Connection", "close")
	}
	out := *ae
	out.Message = s.gw.Redactor.String(out.Message)
	audit.NoteDetail(r.Context(), out.Message)
	writeJSON(w, ae.Status, map[string]any{"error": out})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// guard asks the authorization seam whether the request's subject may do
// a on the route's target, and serves it only if so. What it lets through
// that may change something is recorded in the audit log with what came
// of it; the seam records what it refuses.
func (s *Server) guard(pattern string, a authz.Action, target func(*http.Request) authz.Target, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, _ := audit.WithNote(audit.WithOrigin(r.Context(), audit.From(r, audit.ViaAPI, pattern)))
		r = r.WithContext(ctx)
		sub, ok := s.subject(w, r)
		if !ok {
			return
		}
		t := target(r)
		if a != authz.Read {
			t = s.resolve(ctx, t)
		}
		if err := s.Authorize(ctx, sub, a, t); err != nil {
			s.writeError(w, r, err)
			return
		}
		if a == authz.Read {
			h(w, r.WithContext(engine.Acting(ctx, engine.Identity{Name: sub.Name, Groups: sub.Groups}, "API")))
			return
		}
		sw := &audit.StatusWriter{ResponseWriter: w}
		h(sw, r.WithContext(engine.Acting(ctx, engine.Identity{Name: sub.Name, Groups: sub.Groups}, "API")))
		s.Record(ctx, sub, a, t, sw.Status, "")
	}
}

// subject is who a request to the API is: the holder of the bearer token
// it presents, or, with no token configured, a client on this machine (a
// request from elsewhere is refused). It answers a request that proves no
// one itself, and reports false.
func (s *Server) subject(w http.ResponseWriter, r *http.Request) (authz.Subject, bool) {
	if !s.AuthEnabled() {
		if err := connguard.LoopbackOnly(r); err != nil {
			s.writeError(w, r, err)
			return authz.Subject{}, false
		}
		return authz.Subject{Kind: authz.Loopback, Name: "a loopback client"}, true
	}
	presented := r.Header.Get("Authorization")
	var sub authz.Subject
	var err error
	if presented == "" {
		err = ErrUnknownToken
	} else {
		tok, bearer := strings.CutPrefix(presented, "Bearer ")
		if !bearer {
			// Counted as a wrong token, whatever it holds.
			tok = ""
		}
		sub, err = s.CheckToken(r, tok)
	}
	var wait *CredentialWaitError
	switch {
	case errors.As(err, &wait):
		w.Header().Set("Retry-After", strconv.Itoa(wait.Seconds))
		s.writeError(w, r, &api.APIError{Status: http.StatusTooManyRequests, Code: "too_many_auth_failures", Message: wait.Error()})
		return authz.Subject{}, false
	case err != nil:
		w.Header().Set("WWW-Authenticate", `Bearer realm="chaingate"`)
		s.writeError(w, r, &api.APIError{Status: http.StatusUnauthorized, Code: "unauthorized", Message: "a valid bearer token is required"})
		return authz.Subject{}, false
	}
	return sub, true
}

// ErrUnknownToken is a token that is none of the API's.
var ErrUnknownToken = errors.New("the token is not one of the gateway's API tokens")

// CredentialWaitError refuses to check a credential from an address that
// presented too many wrong ones, for Seconds more.
type CredentialWaitError struct{ Seconds int }

func (e *CredentialWaitError) Error() string {
	return fmt.Sprintf("too many wrong credentials came from this address; the next one is checked in %d s", e.Seconds)
}

// CheckToken checks a token r presents, as a bearer token or in the
// console's sign-in form, against the API's tokens, so that both count
// wrong ones against the same address: a *CredentialWaitError while that
// address must wait, ErrUnknownToken (counted) for a token that is none
// of the API's.
func (s *Server) CheckToken(r *http.Request, tok string) (authz.Subject, error) {
	if wait := s.credentialWait(r); wait > 0 {
		return authz.Subject{}, &CredentialWaitError{Seconds: wait}
	}
	s.mu.RLock()
	sub, ok := s.tokens.Lookup(tok)
	s.mu.RUnlock()
	if !ok {
		s.failedCredential(r)
		return authz.Subject{}, ErrUnknownToken
	}
	return sub, nil
}

// credentialWait is how many seconds r's address must wait before a
// credential it presents is checked; 0 when it may present one now.
func (s *Server) credentialWait(r *http.Request) int {
	d, first := s.fails.Wait(connguard.RequestAddress(r))
	if d == 0 {
		return 0
	}
	secs := int(math.Ceil(d.Seconds()))
	if first {
		s.log.Warn("refusing credentials from an address that presented too many wrong ones", "remote", r.RemoteAddr, "for_seconds", secs)
	}
	s.metrics.Refused("too_many_auth_failures")
	return secs
}

// failedCredential counts a wrong credential against r's address.
func (s *Server) failedCredential(r *http.Request) {
	s.metrics.Refused("wrong_credential")
	s.fails.Fail(connguard.RequestAddress(r))
}

// readBody reads a request body up to the configured limit.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	limit := int64(s.Config().Gateway.Limits.MaxRequestBytes)
	if limit <= 0 {
		limit = chain.DefaultMaxRequestBytes
	}
	if r.ContentLength > limit {
		// Refused as announced, without reading what the client sends.
		return nil, &http.MaxBytesError{Limit: limit}
	}
	body := http.MaxBytesReader(w, r.Body, limit)
	defer body.Close()
	if n := r.ContentLength; n > 0 && n <= limit {
		// Read into a buffer of the announced size, not one grown by
		// copying: a split's payload can be tens of MB.
		buf := bytes.NewBuffer(make([]byte, 0, n+bytes.MinRead))
		_, err := buf.ReadFrom(body)
		return buf.Bytes(), err
	}
	return io.ReadAll(body)
}
