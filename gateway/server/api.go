package server

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"path"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/gateway/audit"
	"github.com/chaingate/gateway/gateway/authz"
	"github.com/chaingate/gateway/gateway/events"
	"github.com/chaingate/gateway/gateway/ops"
	"github.com/chaingate/gateway/gateway/server/internal/connguard"
	"github.com/chaingate/gateway/internal/jsonx"
)

// apiRoute is one of the API's routes and what a request to it asks to do,
// on what: the authorization seam's question. A route without an action is
// open to anyone (health checks), or checks its own credential and asks the
// seam itself (triggers, Slack).
type apiRoute struct {
	pattern string
	action  authz.Action
	target  func(*http.Request) authz.Target
	handler http.HandlerFunc
}

func (s *Server) routes() []apiRoute {
	gw, runs, dlq := on(authz.OnGateway, ""), on(authz.OnRun, "id"), on(authz.OnDLQ, "id")
	return []apiRoute{
		{"GET /healthz", "", nil, s.healthz},
		{"GET /readyz", "", nil, s.readyz},
		{"GET /metrics", authz.Read, gw, s.serveMetrics},

		{"POST /v1/chains/{name}/runs", authz.Start, on(authz.OnChain, "name"), s.startRun},
		// A trigger checks its own credential, or a full token without one.
		{"POST /v1/triggers/{name}", "", nil, s.trigger},
		// Slack's callback carries Slack's signature.
		{"POST /v1/slack/interactions", "", nil, s.slackInteractions},
		{"GET /v1/chains", authz.Read, on(authz.OnChain, ""), s.listChains},
		{"GET /v1/chains/{name}", authz.Read, on(authz.OnChain, "name"), s.getChain},
		{"GET /v1/schedules", authz.Read, on(authz.OnSchedule, ""), s.listSchedules},
		{"GET /v1/pauses", authz.Read, gw, s.listPauses},
		{"POST /v1/pauses/{kind}/{name}", authz.Pause, pausable, s.pause},
		{"DELETE /v1/pauses/{kind}/{name}", authz.Pause, pausable, s.resume},

		{"GET /v1/runs", authz.Read, ofChain(authz.OnRun), s.listRuns},
		{"GET /v1/runs/{id}", authz.Read, runs, s.getRun},
		{"GET /v1/events", authz.Read, on(authz.OnRun, ""), s.ServeRunChanges},
		{"POST /v1/runs/{id}/cancel", authz.Cancel, runs, s.cancelRun},
		{"DELETE /v1/runs/{id}", authz.Delete, runs, s.deleteRun},
		{"POST /v1/runs/prune", authz.Delete, on(authz.OnRun, ""), s.pruneRuns},
		{"POST /v1/runs/{id}/replay", authz.Replay, runs, s.replayRun},
		{"POST /v1/runs/{id}/steps/{step}/redrive", authz.Redrive, runs, s.redriveSplit},
		{"POST /v1/runs/{id}/signals/{step}", authz.Approve, runs, s.signal},
		{"GET /v1/runs/{id}/events", authz.Read, runs, s.runEvents},
		{"GET /v1/runs/{id}/dag", authz.Read, runs, s.runDAG},
		{"GET /v1/runs/{id}/steps/{key...}", authz.Read, runs, s.getStep},
		{"GET /v1/runs/{id}/items", authz.Read, runs, s.splitItems},

		{"GET /v1/dlq", authz.Read, ofChain(authz.OnDLQ), s.listDLQ},
		{"GET /v1/dlq/{id}", authz.Read, dlq, s.getDLQ},
		{"POST /v1/dlq/{id}/replay", authz.Replay, dlq, s.replayDLQ},
		{"POST /v1/dlq/replay", authz.Replay, on(authz.OnDLQ, ""), s.replayManyDLQ},
		{"DELETE /v1/dlq/{id}", authz.Delete, dlq, s.deleteDLQ},
		{"POST /v1/dlq/purge", authz.Delete, on(authz.OnDLQ, ""), s.purgeDLQ},

		{"GET /v1/audit", authz.Admin, gw, s.listAudit},
		{"GET /v1/audit/export", authz.Admin, gw, s.exportAudit},
		{"POST /v1/admin/reload", authz.Admin, gw, s.reload},
		{"POST /v1/admin/backup", authz.Backup, gw, s.backup},
	}
}

// Handler returns the API's routes. Everything answers JSON, errors
// included; everything but the health checks needs a token when tokens are
// configured.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	for _, rt := range s.routes() {
		h := rt.handler
		if rt.action != "" {
			h = s.guard(rt.pattern, rt.action, rt.target, h)
		}
		mux.HandleFunc(rt.pattern, h)
	}
	if ui := s.Config().Gateway.UI; !ui.Disabled && s.console != nil {
		base := cmp.Or(ui.BasePath, chain.DefaultUIBasePath)
		con := s.console(base)
		mux.Handle(base, con)
		mux.Handle(base+"/", con)
	}
	mux.HandleFunc("/", s.noRoute(mux))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer s.recoverRequest(r)
		if r.Body != nil && r.Body != http.NoBody {
			r.Body = &connguard.BodyWatch{ReadCloser: r.Body}
		}
		defer func() {
			if connguard.BodyUnread(r) {
				connguard.CloseUnread(w, r)
			}
		}()
		if c := connguard.ReserveConn(r); c != nil {
			// Answered once; only the health checks are served.
			w.Header().Set("Connection", "close")
			if r.URL.Path != "/healthz" && r.URL.Path != "/readyz" {
				s.metrics.Refused(c.Over.Code)
				w.Header().Set("Retry-After", "1")
				s.writeError(w, r, c.Over)
				return
			}
		}
		if !canonicalPath(r.URL.Path) {
			// The mux would redirect, in HTML; an API answers what was asked.
			s.writeError(w, r, &api.APIError{Status: http.StatusNotFound, Code: "not_found", Message: fmt.Sprintf("%s %s: not found (paths hold no empty, . or .. segments)", r.Method, r.URL.Path)})
			return
		}
		// The check first: a call's arguments are built, and allocated,
		// whether or not the line is written.
		if !s.log.Enabled(r.Context(), slog.LevelDebug) {
			mux.ServeHTTP(w, r)
			return
		}
		start := time.Now()
		mux.ServeHTTP(w, r)
		s.log.Debug("request", "method", r.Method, "path", r.URL.Path, "took", time.Since(start))
	})
}

// recoverRequest logs a bug met serving a request, with its stack, in
// the gateway's log, and cuts the answer short: net/http keeps the
// gateway up too, but logs outside that log. The answer may have begun,
// so none is written over it.
func (s *Server) recoverRequest(r *http.Request) {
	p := recover()
	if p == nil {
		return
	}
	if p != http.ErrAbortHandler {
		s.log.Error("serving a request hit a bug; its connection is cut", "method", r.Method, "path", r.URL.Path, "panic", p, "stack", string(debug.Stack()))
	}
	panic(http.ErrAbortHandler)
}

// canonicalPath reports whether p is a path the mux serves as it is,
// without redirecting to a cleaned one.
func canonicalPath(p string) bool {
	if p == "" || p[0] != '/' {
		return false
	}
	clean := path.Clean(p)
	if p[len(p)-1] == '/' && clean != "/" {
		clean += "/"
	}
	return clean == p
}

// allowProbe are the methods tried to tell a wrong method from a wrong path.
var allowProbe = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

// noRoute answers, in JSON, what no route matches: 405 with Allow when the
// path exists with other methods, else 404.
func (s *Server) noRoute(mux *http.ServeMux) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var allow []string
		for _, m := range allowProbe {
			if _, pattern := mux.Handler(&http.Request{Method: m, Host: r.Host, URL: r.URL}); pattern != "/" {
				allow = append(allow, m)
			}
		}
		status, code := http.StatusNotFound, "not_found"
		if len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			status, code = http.StatusMethodNotAllowed, "method_not_allowed"
		}
		s.writeError(w, r, &api.APIError{Status: status, Code: code, Message: fmt.Sprintf("%s %s: %s", r.Method, r.URL.Path, strings.ToLower(http.StatusText(status)))})
	}
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		s.writeError(w, r, engine.ErrClosed)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if _, err := s.gw.Store.CountDLQ(ctx); err != nil {
		s.writeError(w, r, &api.APIError{Status: http.StatusServiceUnavailable, Code: "store_unavailable", Message: err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ready", "owner": s.gw.Engine.Owner(), "active_runs": s.gw.Engine.Active()})
}

func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	_ = s.metrics.Write(w)
}

// maxWait bounds ?wait= on POST /v1/chains/{name}/runs.
const maxWait = 60 * time.Second

func (s *Server) startRun(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		s.writeError(w, r, engine.ErrClosed)
		return
	}
	name := r.PathValue("name")
	if cfg := s.gw.Engine.Config(); cfg.Chains[name] == nil {
		s.writeError(w, r, fmt.Errorf("%w %q%s", engine.ErrUnknownChain, name, cfg.ChainHint(name)))
		return
	}
	var wait time.Duration
	if v := r.URL.Query().Get("wait"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > maxWait {
			s.writeError(w, r, api.BadRequest("invalid_parameter", "wait must be a duration up to %s, e.g. wait=10s", maxWait))
			return
		}
		wait = d
	}
	body, err := s.readBody(w, r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if len(bytes.TrimSpace(body)) == 0 {
		body = []byte(`{}`)
	}
	if err := api.ParseJSON(body, nil); err != nil {
		s.writeError(w, r, api.BadRequest("invalid_json", "the request body is the run's payload and must be one JSON value: %v", err))
		return
	}
	labels, err := api.ParseLabels("label", r.URL.Query()["label"], true)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ctx := r.Context()
	in := engine.Input{Payload: body, Metadata: requestMetadata(r), StartedBy: store.StartedByAPI, Labels: labels}
	id, status, replayed, err := s.gw.StartKeyed(ctx, name, ops.StartKeyPrefix(name), r.Header.Get("Idempotency-Key"), ops.IdempotencyTTL, in)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	audit.NoteRun(ctx, id)
	if replayed {
		audit.NoteDetail(ctx, "the idempotency key's run, started before")
	}
	resp := api.StartResponse{ID: id, Chain: name, Status: status, Replayed: replayed, Links: map[string]string{
		"self": "/v1/runs/" + id, "events": "/v1/runs/" + id + "/events", "dag": "/v1/runs/" + id + "/dag",
	}}
	code := http.StatusAccepted
	if replayed {
		code = http.StatusOK
	}
	if wait > 0 {
		// The wait, and then the time any answer may take to write.
		connguard.HoldOpen(w, wait+time.Duration(s.Config().Gateway.Limits.RequestTimeoutSeconds)*time.Second)
		wctx, cancel := s.untilStop(ctx)
		wctx, cancelWait := context.WithTimeout(wctx, wait)
		v, err := s.waitRun(wctx, id)
		cancelWait()
		cancel()
		if err == nil && store.RunStatus(v.Status).Final() {
			resp.Status, resp.Run, code = v.Status, v, http.StatusOK
		}
	}
	writeJSON(w, code, resp)
}

// waitRun waits for a run to end, wherever it is advanced, and reads it as
// the answer shows it: a run this gateway does not hold (another took it
// over, or started it first) is followed through its events.
func (s *Server) waitRun(ctx context.Context, id string) (*api.RunView, error) {
	if err := s.gw.Engine.AwaitEnd(ctx, id); err != nil {
		return nil, err
	}
	v, err := s.ops.Run(ctx, id, false)
	if err != nil || store.RunStatus(v.Status).Final() {
		return v, err
	}
	if err := s.ops.StoreEvents(ctx, id, v.Seq, true, func(store.Event) error { return nil }); err != nil {
		return nil, err
	}
	return s.ops.Run(ctx, id, false)
}

// reservedMetadata are the origin.metadata keys the gateway sets itself; a
// caller's X-Chaingate-Meta-* header cannot stand in for them.
var reservedMetadata = map[string]bool{
	"remote_addr": true, "user_agent": true, "idempotency_key": true,
	// Set by a restart replay, so a run cannot pass for one.
	"replay_of": true, "dead_letter_entry": true,
}

// requestMetadata is what origin.metadata holds for a run started over
// HTTP: where it came from, and every X-Chaingate-Meta-NAME header as NAME.
func requestMetadata(r *http.Request) json.RawMessage {
	m := map[string]string{}
	for name, vals := range r.Header {
		key, ok := strings.CutPrefix(name, "X-Chaingate-Meta-")
		key = strings.ToLower(key)
		if ok && key != "" && !reservedMetadata[key] && len(vals) > 0 {
			m[key] = vals[0]
		}
	}
	m["remote_addr"], m["user_agent"] = r.RemoteAddr, r.UserAgent()
	if k := r.Header.Get("Idempotency-Key"); k != "" {
		m["idempotency_key"] = k
	}
	b, _ := jsonx.Marshal(m)
	return b
}

func (s *Server) listChains(w http.ResponseWriter, r *http.Request) {
	cfg := s.gw.Engine.Config()
	out := make([]map[string]any, 0, len(cfg.ChainNames))
	for _, name := range cfg.ChainNames {
		c := cfg.Chains[name]
		out = append(out, map[string]any{"name": c.Name, "hash": c.Hash, "timeout_seconds": c.TimeoutSeconds, "steps": len(c.Steps)})
	}
	writeJSON(w, http.StatusOK, map[string]any{"chains": out})
}

func (s *Server) getChain(w http.ResponseWriter, r *http.Request) {
	cfg := s.gw.Engine.Config()
	name := r.PathValue("name")
	c := cfg.Chains[name]
	if c == nil {
		s.writeError(w, r, fmt.Errorf("%w %q%s", engine.ErrUnknownChain, name, cfg.ChainHint(name)))
		return
	}
	def, err := cfg.Outline(name)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"name": c.Name, "hash": c.Hash, "timeout_seconds": c.TimeoutSeconds,
		"definition": string(def), "graph": c.Graph(), "mermaid": c.Mermaid(),
	})
}

// runFilter reads a run listing's query parameters.
func runFilter(r *http.Request) (store.RunFilter, error) {
	q := r.URL.Query()
	f := store.RunFilter{Chain: q.Get("chain"), Status: store.RunStatus(q.Get("status")), Cursor: q.Get("cursor"), StartedBy: q.Get("started_by"), HideChains: q["hide_chain"]}
	if err := cmp.Or(api.CheckRunStatus(f.Status), api.CheckStartedBy("started_by", f.StartedBy), api.CheckHideChains("hide_chain", f.HideChains)); err != nil {
		return f, err
	}
	var err error
	if f.Labels, err = api.ParseLabels("label", q["label"], false); err != nil {
		return f, err
	}
	if f.Since, err = api.ParseSince(q.Get("since")); err != nil {
		return f, err
	}
	if f.Limit, err = api.ParseLimit(q.Get("limit")); err != nil {
		return f, err
	}
	return f, nil
}

func (s *Server) listRuns(w http.ResponseWriter, r *http.Request) {
	f, err := runFilter(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	page, err := s.ops.ListRuns(r.Context(), f)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, page)
}

func (s *Server) getRun(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("items") == "true" {
		s.streamRun(w, r, r.PathValue("id"))
		return
	}
	v, err := s.ops.Run(r.Context(), r.PathValue("id"), false)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// streamRun writes a run with every step record, its splits' items
// included, as it reads them: a split of 100,000 items is never held in
// memory whole. The answer is the same JSON as without streaming, its
// members in another order.
func (s *Server) streamRun(w http.ResponseWriter, r *http.Request, id string) {
	ctx := r.Context()
	run, err := s.gw.Store.Run(ctx, id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	head, err := jsonx.Marshal(api.RunOf(run))
	if err != nil || len(head) < 2 || head[len(head)-1] != '}' {
		s.writeError(w, r, fmt.Errorf("encoding run %s: %v", id, err))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	out := bufio.NewWriterSize(w, 64<<10)
	out.Write(head[:len(head)-1])
	if len(head) > 2 {
		out.WriteByte(',')
	}
	out.WriteString(`"steps":{`)
	n := 0
	distributed := []string{}
	err = s.gw.Store.ForEachStep(ctx, id, store.StepScan{}, func(rec *store.StepRecord) error {
		if api.DistributedSplit(rec) {
			distributed = append(distributed, rec.Key)
		}
		key, _ := jsonx.Marshal(rec.Key)
		body, err := jsonx.Marshal(api.StepOf(rec))
		if err != nil {
			return fmt.Errorf("encoding step %s: %w", rec.Key, err)
		}
		if n > 0 {
			out.WriteByte(',')
		}
		n++
		if out.Available() < len(key)+len(body)+1 {
			connguard.HoldOpen(w, streamWriteTimeout)
		}
		out.Write(key)
		out.WriteByte(':')
		_, err = out.Write(body)
		return err
	})
	if err != nil {
		// The status is sent: cutting the answer short is the one way left
		// to say it is not whole.
		s.log.Error("streaming a run's steps failed", "run", id, "err", err)
		panic(http.ErrAbortHandler)
	}
	tail, _ := jsonx.Marshal(distributed)
	out.WriteString(`},"distributed_splits":`)
	out.Write(tail)
	out.WriteString("}\n")
	_ = out.Flush()
}

func (s *Server) cancelRun(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := s.ops.CancelRun(r.Context(), id); err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]string{"id": id, "cancel": "requested"})
}

// heartbeat is how often an idle event stream sends a comment, so proxies
// keep it open.
const heartbeat = 15 * time.Second

// streamWriteTimeout bounds each write of an event stream: a client that
// stops reading is let go, one that reads is kept as long as the run goes.
const streamWriteTimeout = 2 * heartbeat

// runEvents streams a run's events as Server-Sent Events: first the log
// from after Last-Event-ID, then new events live, until the run ends.
func (s *Server) runEvents(w http.ResponseWriter, r *http.Request) {
	s.ServeRunEvents(w, r, r.PathValue("id"), 0)
}

// ServeRunEvents serves run id's events as GET /v1/runs/{id}/events does,
// writing at most once per pace (see Local.StoreEventsPaced): a console's page
// is redrawn at most that often, however busy the run.
func (s *Server) ServeRunEvents(w http.ResponseWriter, r *http.Request, id string, pace time.Duration) {
	after := uint64(0)
	last, source := r.Header.Get("Last-Event-ID"), "Last-Event-ID"
	if last == "" {
		last, source = r.URL.Query().Get("after"), "after"
	}
	fromNow := last == "now" && source == "after"
	if last != "" && !fromNow {
		n, err := strconv.ParseUint(last, 10, 64)
		if err != nil {
			s.writeError(w, r, api.BadRequest("invalid_parameter", "%s %q is not an event sequence number (or, for after, now)", source, last))
			return
		}
		after = n
	}
	run, err := s.gw.Store.RunHeader(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if fromNow {
		after = run.Seq
	}
	sse := events.OpenSSE(w, func() { connguard.HoldOpen(w, streamWriteTimeout) })
	follow := r.URL.Query().Get("follow") != "false"
	lastWrite := time.Now()
	ctx, cancel := s.untilStop(r.Context())
	defer cancel()
	// Events are written as they come and sent a batch at a time, when the
	// stream has caught up: one write for a commit's events, however many
	// consoles follow the run.
	unsent := false
	err = s.ops.StoreEventsPaced(ctx, id, after, follow, pace, func(ev store.Event) error {
		if ev.Seq == 0 {
			if !unsent && time.Since(lastWrite) < heartbeat {
				return nil
			}
			sse.Hold()
			var err error
			if !unsent {
				err = sse.Write(": heartbeat\n\n")
			}
			unsent, lastWrite = false, time.Now()
			sse.Flush()
			return err
		}
		// The write deadline is set once for what is sent together.
		if !unsent {
			sse.Hold()
		}
		err := sse.Write("id: %d\nevent: %s\ndata: %s\n\n", ev.Seq, ev.Type, s.hub.EventJSON(ev))
		unsent = true
		return err
	})
	if err != nil && !errors.Is(err, context.Canceled) {
		s.log.Debug("event stream ended", "run", id, "err", err)
	}
}

// ServeRunChanges streams, as Server-Sent Events, every run's status changes:
// runs starting, resuming, replayed, ending, on this gateway and, through
// the store's feed, on the others sharing its store. A client that falls
// behind gets a "resync" event and reads the runs again.
func (s *Server) ServeRunChanges(w http.ResponseWriter, r *http.Request) {
	sse := events.OpenSSE(w, func() { connguard.HoldOpen(w, streamWriteTimeout) })
	ctx, cancel := s.untilStop(r.Context())
	defer cancel()
	s.hub.StreamRunChanges(ctx, sse, heartbeat)
}

func (s *Server) getStep(w http.ResponseWriter, r *http.Request) {
	st, err := s.ops.Step(r.Context(), r.PathValue("id"), r.PathValue("key"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

func (s *Server) runDAG(w http.ResponseWriter, r *http.Request) {
	d, err := s.ops.DAG(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, d)
}

func (s *Server) splitItems(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	split := q.Get("split")
	if split == "" {
		s.writeError(w, r, api.BadRequest("invalid_parameter", "split is required: the split step's record key, such as fan or notify/fan"))
		return
	}
	status := q.Get("status")
	if status != "" && !store.StepStatus(status).Final() {
		s.writeError(w, r, api.BadRequest("invalid_parameter", "status must be a finished item's: succeeded, failed or skipped; got %q", status))
		return
	}
	offset, err := api.IntParam(q.Get("offset"), "offset", 0, 0, math.MaxInt32)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	limit, err := api.IntParam(q.Get("limit"), "limit", 100, 1, api.MaxItemPage)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	page, err := s.ops.SplitItems(r.Context(), r.PathValue("id"), split, status, offset, limit)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, page)
}

// readJSON reads a request body into v; an empty body leaves v as it is.
func (s *Server) readJSON(w http.ResponseWriter, r *http.Request, v any) error {
	body, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	if err := api.ParseJSON(body, v); err != nil {
		return api.BadRequest("invalid_json", "reading the request body: %v", err)
	}
	return nil
}

func (s *Server) listDLQ(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, err := api.ParseLimit(q.Get("limit"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	since, err := api.ParseSince(q.Get("since"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	entries, err := s.ops.ListDLQ(r.Context(), store.DLQFilter{Chain: q.Get("chain"), Step: q.Get("step"), Since: since, Limit: limit, After: q.Get("after")})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"entries": entries})
}

func (s *Server) getDLQ(w http.ResponseWriter, r *http.Request) {
	e, err := s.ops.DLQEntry(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, e)
}

// replayBody is the body of a replay of one entry.
type replayBody struct {
	Mode       string `json:"mode"`
	Definition string `json:"definition"`
}

// readReplay reads a replay's options from its body, or its query.
func (s *Server) readReplay(w http.ResponseWriter, r *http.Request) (engine.ReplayOptions, error) {
	var b replayBody
	if err := s.readJSON(w, r, &b); err != nil {
		return engine.ReplayOptions{}, err
	}
	if m := r.URL.Query().Get("mode"); m != "" {
		b.Mode = m
	}
	if d := r.URL.Query().Get("definition"); d != "" {
		b.Definition = d
	}
	return api.ParseReplayOptions(b.Mode, b.Definition)
}

// signalBody answers an approval step.
type signalBody struct {
	Decision string `json:"decision"`
	Comment  string `json:"comment"`
}

// signal answers a waiting approval step; the first answer wins.
func (s *Server) signal(w http.ResponseWriter, r *http.Request) {
	var b signalBody
	if err := s.readJSON(w, r, &b); err != nil {
		s.writeError(w, r, err)
		return
	}
	if b.Decision != chain.DecisionApprove && b.Decision != chain.DecisionReject {
		s.writeError(w, r, api.BadRequest("invalid_parameter", `decision must be "approve" or "reject", got %q`, b.Decision))
		return
	}
	if len(b.Comment) > api.MaxComment {
		s.writeError(w, r, api.BadRequest("invalid_parameter", "comment is %d bytes; at most %d", len(b.Comment), api.MaxComment))
		return
	}
	d, err := s.ops.Signal(r.Context(), r.PathValue("id"), r.PathValue("step"), b.Decision, b.Comment)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusAccepted, d)
}

// replayRun runs a run that ended without success again: the run's own
// id, with or without a dead-letter entry for its failure.
func (s *Server) replayRun(w http.ResponseWriter, r *http.Request) {
	opts, err := s.readReplay(w, r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	id := r.PathValue("id")
	run, err := s.ops.ReplayRun(r.Context(), id, opts)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]any{"replay_of": id, "mode": opts.Mode, "definition": opts.Definition, "run": run.ID,
		"chain_hash": run.ChainHash, "links": map[string]string{"run": "/v1/runs/" + run.ID}})
}

// redriveBody is the body of POST /v1/runs/{id}/steps/{step}/redrive.
type redriveBody struct {
	Items      string `json:"items"`
	Definition string `json:"definition"`
}

// redriveSplit runs again the items of a split that did not succeed.
func (s *Server) redriveSplit(w http.ResponseWriter, r *http.Request) {
	var b redriveBody
	if err := s.readJSON(w, r, &b); err != nil {
		s.writeError(w, r, err)
		return
	}
	opts := engine.RedriveOptions{Definition: engine.ReplayDefinition(b.Definition)}
	switch b.Items {
	case "", api.RedriveFailed:
	case api.RedriveFailedAndSkipped:
		opts.Skipped = true
	default:
		s.writeError(w, r, api.BadRequest("invalid_parameter", "items must be %q or %q, got %q", api.RedriveFailed, api.RedriveFailedAndSkipped, b.Items))
		return
	}
	if err := (engine.ReplayOptions{Definition: opts.Definition}).Check(); err != nil {
		s.writeError(w, r, api.BadRequest("invalid_parameter", "%s", strings.TrimPrefix(err.Error(), engine.ErrNotReplayable.Error()+": ")))
		return
	}
	id, step := r.PathValue("id"), r.PathValue("step")
	run, err := s.ops.RedriveSplit(r.Context(), id, step, opts)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]any{"run": run.ID, "step": step, "items": cmp.Or(b.Items, api.RedriveFailed),
		"chain_hash": run.ChainHash, "links": map[string]string{"run": "/v1/runs/" + run.ID}})
}

func (s *Server) replayDLQ(w http.ResponseWriter, r *http.Request) {
	opts, err := s.readReplay(w, r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	run, results, err := s.ops.ReplayWithResults(r.Context(), r.PathValue("id"), opts)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := map[string]any{"entry": r.PathValue("id"), "mode": opts.Mode, "definition": opts.Definition}
	if results != nil {
		out["results"] = results
	}
	if run.ID == "" {
		// A delivery whose every alert was skipped: nothing runs.
		writeJSON(w, http.StatusOK, out)
		return
	}
	out["run"], out["chain_hash"], out["links"] = run.ID, run.ChainHash, map[string]string{"run": "/v1/runs/" + run.ID}
	writeJSON(w, http.StatusAccepted, out)
}

// bulkBody selects the entries a bulk replay or purge acts on: a filter
// that names them, or says all, so an empty request cannot empty the queue.
type bulkBody struct {
	Chain string `json:"chain"`
	Step  string `json:"step"`
	Since string `json:"since"`
	Limit int    `json:"limit"`
	All   bool   `json:"all"`
}

func (b bulkBody) filter(verb string) (store.DLQFilter, error) {
	if b.Chain == "" && b.Step == "" && b.Since == "" && !b.All {
		return store.DLQFilter{}, api.BadRequest("filter_required", `give chain, step or since, or "all": true to %s every entry`, verb)
	}
	since, err := api.ParseSince(b.Since)
	if err != nil {
		return store.DLQFilter{}, err
	}
	if b.Limit != 0 {
		if err := api.CheckRange("limit", b.Limit, api.MaxBulkLimit); err != nil {
			return store.DLQFilter{}, err
		}
	}
	return store.DLQFilter{Chain: b.Chain, Step: b.Step, Since: since, Limit: b.Limit}, nil
}

// bulkReplayBody is the body of a bulk replay.
type bulkReplayBody struct {
	bulkBody
	Mode        string `json:"mode"`
	Definition  string `json:"definition"`
	Concurrency int    `json:"concurrency"`
}

func (s *Server) replayManyDLQ(w http.ResponseWriter, r *http.Request) {
	var b bulkReplayBody
	if err := s.readJSON(w, r, &b); err != nil {
		s.writeError(w, r, err)
		return
	}
	f, err := b.filter("replay")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	// Thousands of entries may take longer than a request may; the caller
	// holds a write token, so it is no slow client to guard against.
	connguard.HoldOpen(w, api.BulkTimeout)
	opts, err := api.ParseReplayOptions(b.Mode, b.Definition)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if b.Concurrency != 0 {
		if err := api.CheckRange("concurrency", b.Concurrency, api.MaxConcurrency); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	res, err := s.ops.ReplayMany(r.Context(), f, opts, b.Concurrency)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) deleteRun(w http.ResponseWriter, r *http.Request) {
	// A run of a million split items takes a while to go.
	connguard.HoldOpen(w, api.BulkTimeout)
	res, err := s.ops.DeleteRun(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) pruneRuns(w http.ResponseWriter, r *http.Request) {
	var b api.PruneBody
	if err := s.readJSON(w, r, &b); err != nil {
		s.writeError(w, r, err)
		return
	}
	older, err := chain.ParseDuration(b.OlderThan)
	if err != nil || older <= 0 {
		s.writeError(w, r, api.BadRequest("invalid_parameter", `older_than must be a positive duration such as "36h", "30d" or "2w"`))
		return
	}
	connguard.HoldOpen(w, api.BulkTimeout)
	ctx, cancel := context.WithTimeout(r.Context(), api.BulkTimeout)
	defer cancel()
	res, err := s.ops.PruneRuns(ctx, api.PruneOptions{OlderThan: older, Chain: b.Chain, Status: store.RunStatus(b.Status), DryRun: b.DryRun})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) deleteDLQ(w http.ResponseWriter, r *http.Request) {
	if err := s.ops.DeleteDLQ(r.Context(), r.PathValue("id")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) purgeDLQ(w http.ResponseWriter, r *http.Request) {
	var b bulkBody
	if err := s.readJSON(w, r, &b); err != nil {
		s.writeError(w, r, err)
		return
	}
	f, err := b.filter("purge")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	connguard.HoldOpen(w, api.BulkTimeout)
	n, err := s.ops.PurgeDLQ(r.Context(), f)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int{"purged": n})
}

func (s *Server) reload(w http.ResponseWriter, r *http.Request) {
	cfg, err := s.Reload()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int{"chains": len(cfg.Chains), "providers": len(cfg.Providers)})
}

func (s *Server) listAudit(w http.ResponseWriter, r *http.Request) {
	f, err := api.ParseAuditFilter(r.URL.Query())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	page, err := s.ops.ListAudit(r.Context(), f)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, page)
}

// exportAudit streams the entries the query selects, oldest first, as JSON
// lines: one entry a line, for a SIEM to take in.
func (s *Server) exportAudit(w http.ResponseWriter, r *http.Request) {
	f, err := api.ParseAuditFilter(r.URL.Query())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	out := bufio.NewWriterSize(w, 64<<10)
	err = s.ops.ExportAudit(r.Context(), f, func(e *api.AuditEntry) error {
		b, err := jsonx.Marshal(e)
		if err != nil {
			return err
		}
		if out.Available() < len(b)+1 {
			connguard.HoldOpen(w, streamWriteTimeout)
		}
		out.Write(b)
		return out.WriteByte('\n')
	})
	if err != nil {
		// The status is sent: cutting the answer short says it is not whole.
		s.log.Error("exporting the audit log failed", "err", err)
		panic(http.ErrAbortHandler)
	}
	_ = out.Flush()
}
