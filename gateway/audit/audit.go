// Package audit keeps the gateway's audit log in its store: every operator
// action and every refusal of the authorization seam, with who asked, for
// what, on what, from which address and way in, and what came of it. The
// seam records refusals; each way in records what it let through once it
// has acted. Reading it is an admin's action.
//
// It is the gateway's own package, with no compatibility promise.
package audit

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway/authz"
)

// Ways in, as entries name them.
const (
	ViaAPI     = "api"
	ViaConsole = "console"
	ViaSlack   = "slack"
	ViaTrigger = "trigger"
	ViaCLI     = "cli"
)

// Origin is where a request came from: the way in, the route it asked
// for and the address it came from.
type Origin struct {
	EntryPoint string
	Route      string
	Address    string
}

type originKey struct{}
type noteKey struct{}

// WithOrigin is ctx carrying o, for the entries recorded under it.
func WithOrigin(ctx context.Context, o Origin) context.Context {
	return context.WithValue(ctx, originKey{}, o)
}

// OriginOf is the origin ctx carries.
func OriginOf(ctx context.Context) Origin {
	o, _ := ctx.Value(originKey{}).(Origin)
	return o
}

// Note is what an action learns as it acts, for its entry: the run it
// started or replayed as, a word on what it did.
type Note struct {
	mu     sync.Mutex
	run    string
	detail string
}

// WithNote is ctx carrying a fresh Note, and the note.
func WithNote(ctx context.Context) (context.Context, *Note) {
	n := &Note{}
	return context.WithValue(ctx, noteKey{}, n), n
}

// NoteRun notes the run an action started or acted as; nothing without a
// Note in ctx.
func NoteRun(ctx context.Context, run string) {
	if n, ok := ctx.Value(noteKey{}).(*Note); ok {
		n.mu.Lock()
		n.run = run
		n.mu.Unlock()
	}
}

// NoteDetail notes a word on what an action did.
func NoteDetail(ctx context.Context, detail string) {
	if n, ok := ctx.Value(noteKey{}).(*Note); ok {
		n.mu.Lock()
		n.detail = detail
		n.mu.Unlock()
	}
}

func (n *Note) read() (run, detail string) {
	if n == nil {
		return "", ""
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.run, n.detail
}

// Log appends entries to the store's audit log.
type Log struct {
	st  store.Store
	log *slog.Logger
	// Failed, when set, is told of each entry that could not be kept.
	Failed func()
}

// New returns the audit log of st; what cannot be kept is logged to log.
func New(st store.Store, log *slog.Logger) *Log {
	return &Log{st: st, log: log}
}

// Attempt is one action asked of the seam, to be recorded.
type Attempt struct {
	Subject authz.Subject
	// Roles are the roles the subject held when it asked.
	Roles  []string
	Action authz.Action
	Target authz.Target
}

// Record appends what came of a: outcome (store.AuditOK, AuditDenied,
// AuditFailed), the HTTP status where there was one, and why. The way in
// comes from ctx's Origin, the run from its Note. An entry that cannot be
// kept is logged as an error: the action it records has happened.
func (l *Log) Record(ctx context.Context, a Attempt, outcome string, status int, detail string) {
	o := OriginOf(ctx)
	n, _ := ctx.Value(noteKey{}).(*Note)
	run, noted := n.read()
	if detail == "" {
		detail = noted
	}
	if run == "" && a.Target.Kind == authz.OnRun {
		run = a.Target.Name
	}
	e := &store.AuditEntry{
		ID: store.NewID(), Time: time.Now().UTC(),
		Subject: a.Subject.Name, SubjectKind: string(a.Subject.Kind), Roles: a.Roles, Groups: a.Subject.Groups,
		Action: string(a.Action), TargetKind: a.Target.Kind, Target: a.Target.Name, Chain: a.Target.Chain, Trigger: a.Target.Trigger,
		Run: run, EntryPoint: o.EntryPoint, Route: o.Route, Address: o.Address,
		Outcome: outcome, Status: status, Detail: detail,
	}
	if e.Chain == "" && a.Target.Kind == authz.OnChain {
		e.Chain = a.Target.Name
	}
	if e.Trigger == "" && a.Target.Kind == authz.OnTrigger {
		e.Trigger = a.Target.Name
	}
	if err := l.st.AppendAudit(context.WithoutCancel(ctx), e); err != nil {
		l.log.Error("an audit entry could not be kept", "err", err, "subject", e.Subject, "action", e.Action, "target", a.Target.String(), "outcome", outcome)
		if l.Failed != nil {
			l.Failed()
		}
	}
}

// Prune removes the entries made longer ago than keep.
func (l *Log) Prune(ctx context.Context, keep time.Duration) (int, error) {
	return l.st.PruneAudit(ctx, time.Now().Add(-keep))
}

// StatusWriter remembers the status a handler answered with.
type StatusWriter struct {
	http.ResponseWriter
	Status int
}

// WriteHeader implements http.ResponseWriter.
func (w *StatusWriter) WriteHeader(status int) {
	if w.Status == 0 {
		w.Status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

// Write implements http.ResponseWriter.
func (w *StatusWriter) Write(b []byte) (int, error) {
	if w.Status == 0 {
		w.Status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Flush implements http.Flusher, for the streams.
func (w *StatusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection beneath.
func (w *StatusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Outcome is what an answer's status says came of an action: a 403 is a
// refusal, whichever rule made it (the seam's, an approval step's four
// eyes).
func Outcome(status int) string {
	switch {
	case status == http.StatusForbidden:
		return store.AuditDenied
	case status >= 400:
		return store.AuditFailed
	}
	return store.AuditOK
}

// From is the origin of r, come in through via (ViaAPI…) for route.
func From(r *http.Request, via, route string) Origin {
	addr := r.RemoteAddr
	if host, _, err := net.SplitHostPort(addr); err == nil {
		addr = host
	}
	return Origin{EntryPoint: via, Route: route, Address: addr}
}
