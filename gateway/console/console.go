// Package console is the operator's web UI, served under [gateway.ui]
// base_path. Its pages are rendered here from the same operations the API
// serves (api.Ops), never from the store; a little script follows runs
// live. Everything it needs is compiled in: no CDN, no font, nothing
// fetched from elsewhere. It is the gateway's own, with no compatibility
// promise.
package console

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/gateway/audit"
	"github.com/chaingate/gateway/gateway/authz"
	"github.com/chaingate/gateway/gateway/events"
	"github.com/chaingate/gateway/gateway/metrics"
	"github.com/chaingate/gateway/gateway/server"
	"github.com/chaingate/gateway/gateway/signin"
	"github.com/chaingate/gateway/providers/limits"
)

//go:embed ui/templates/*.html
var uiTemplates embed.FS

//go:embed ui/static
var uiStatic embed.FS

// Host is the gateway the console serves, and all it reads it through:
// the operations the API serves, and what a page shows besides.
// *gateway.Server is one.
type Host interface {
	// Ops are the operations on runs, dead letters and pauses, as the API
	// serves them; every action the console takes goes through them.
	Ops() api.Ops
	// Config is the config served now; it changes on reload.
	Config() *chain.Config
	// Definition is the chain a run started with, by its hash.
	Definition(ctx context.Context, name, hash string) (*chain.Chain, error)
	// AuthEnabled reports whether the API asks for tokens; without them,
	// the console, like the API, answers loopback requests only.
	AuthEnabled() bool
	// CheckToken checks a token signing in, counting a wrong one against
	// the request's address as the API does.
	CheckToken(r *http.Request, tok string) (authz.Subject, error)
	// Authorize is the gateway's authorization seam: every page and action
	// asks it whether the session's subject may act, before acting.
	Authorize(ctx context.Context, sub authz.Subject, a authz.Action, t authz.Target) error
	// Record appends to the audit log what came of an action the seam let
	// through, as the API records its own.
	Record(ctx context.Context, sub authz.Subject, a authz.Action, t authz.Target, status int, detail string)
	// SecretValue is the value of the secret the config names name.
	SecretValue(name string) string
	// MayChange reports whether sub may do anything but read, somewhere:
	// whether the pages offer it forms.
	MayChange(sub authz.Subject) bool
	// ProviderStats, MetricSamples and Distributes are what the Now page
	// shows of providers and distributed splits.
	ProviderStats() []limits.Stats
	MetricSamples(name string) []metrics.MetricSample
	Distributes() bool
	// WatchRuns follows every run's status changes.
	WatchRuns() *events.RunWatch
	// ServeRunEvents streams a run's events, and ServeRunChanges every
	// run's status changes, as the API does.
	ServeRunEvents(w http.ResponseWriter, r *http.Request, id string, pace time.Duration)
	ServeRunChanges(w http.ResponseWriter, r *http.Request)
	// Stopping ends when the gateway begins to shut down.
	Stopping() context.Context
	// LastReloadError is why the last reload was refused; empty when it
	// was not.
	LastReloadError() string
}

var _ Host = (*server.Server)(nil)

const (
	sessionCookie = "chaingate_console"
	sessionTTL    = 12 * time.Hour
	// maxSessions bounds the sessions kept at once.
	maxSessions = 10000
)

// console serves the web UI of one gateway.
type console struct {
	host Host
	ops  api.Ops
	base string
	log  *slog.Logger
	tmpl *template.Template

	mu       sync.Mutex
	sessions map[string]*uiSession
	jobs     map[string]*bulkJob
	// rp signs people in through the config's OpenID Provider, built for
	// the [gateway.ui.oidc] it holds.
	rp *signin.RP
}

// uiSession is one signed-in browser. The API token it signed in with is
// not kept: only who it proved to be.
type uiSession struct {
	sub authz.Subject
	// write is whether the subject may change anything at all, so that the
	// pages offer the forms that do; the seam decides each action.
	write   bool
	csrf    string
	expires time.Time
}

// New is the console of host, answering everything under base (such as
// "/ui"); log takes what goes wrong drawing a page.
func New(host Host, base string, log *slog.Logger) http.Handler {
	c := &console{host: host, ops: host.Ops(), base: base, log: log, sessions: map[string]*uiSession{}, jobs: map[string]*bulkJob{}}
	c.tmpl = template.Must(template.New("").Funcs(c.funcs()).ParseFS(uiTemplates, "ui/templates/*.html"))
	return c.handler()
}

// uiRoute is one of the console's pages or actions, under the base path,
// and what a request to it asks the authorization seam.
type uiRoute struct {
	pattern string
	ask     func(*http.Request) (authz.Action, authz.Target)
	handler func(http.ResponseWriter, *http.Request, *uiSession)
}

func (c *console) routes() []uiRoute {
	return []uiRoute{
		// Signing out asks nothing: no role may keep anyone signed in.
		{"POST /logout", func(*http.Request) (authz.Action, authz.Target) { return "", authz.Target{} }, c.logout},
		// The Now page shows every chain's runs.
		{"GET /{$}", do(authz.Read, authz.OnRun, ""), c.nowPage},
		{"GET /runs", ofChain(authz.OnRun), c.runsPage},
		{"GET /runs/{id}", do(authz.Read, authz.OnRun, "id"), c.runPage},
		{"GET /runs-stream", do(authz.Read, authz.OnRun, ""), func(w http.ResponseWriter, r *http.Request, _ *uiSession) { c.host.ServeRunChanges(w, r) }},
		{"GET /runs/{id}/live", do(authz.Read, authz.OnRun, "id"), c.runLive},
		{"GET /runs/{id}/stream", do(authz.Read, authz.OnRun, "id"), c.runStream},
		{"GET /runs/{id}/steps/{key...}", do(authz.Read, authz.OnRun, "id"), c.stepPage},
		{"GET /runs/{id}/items/{key...}", do(authz.Read, authz.OnRun, "id"), c.itemsPage},
		{"POST /runs/{id}/cancel", do(authz.Cancel, authz.OnRun, "id"), c.cancelRun},
		{"POST /runs/{id}/replay", do(authz.Replay, authz.OnRun, "id"), c.replayRun},
		{"POST /runs/{id}/delete", do(authz.Delete, authz.OnRun, "id"), c.deleteRun},
		{"POST /runs/{id}/answer/{step}", do(authz.Approve, authz.OnRun, "id"), c.answer},
		{"POST /runs/{id}/redrive/{step}", do(authz.Redrive, authz.OnRun, "id"), c.redrive},
		{"GET /approvals", do(authz.Read, authz.OnRun, ""), c.approvalsPage},
		{"GET /dlq", ofChain(authz.OnDLQ), c.dlqPage},
		{"GET /dlq/{id}", do(authz.Read, authz.OnDLQ, "id"), c.dlqEntryPage},
		{"POST /dlq/{id}/replay", do(authz.Replay, authz.OnDLQ, "id"), c.replayEntry},
		{"POST /dlq/{id}/delete", do(authz.Delete, authz.OnDLQ, "id"), c.deleteEntry},
		{"POST /dlq-bulk", bulk, c.bulkDLQ},
		{"GET /dlq-jobs/{id}", do(authz.Read, authz.OnDLQ, ""), c.jobPage},
		{"GET /chains", do(authz.Read, authz.OnChain, ""), c.chainsPage},
		{"GET /audit", do(authz.Admin, authz.OnGateway, ""), c.auditPage},
		{"GET /chains/{name}", do(authz.Read, authz.OnChain, "name"), c.chainPage},
		{"POST /chains/{name}/run", do(authz.Start, authz.OnChain, "name"), c.startRun},
		{"POST /pauses/{kind}/{name}", pauseTarget, c.pauseAction},
	}
}

// handler answers everything under the base path.
func (c *console) handler() http.Handler {
	mux := http.NewServeMux()
	b := c.base
	static, _ := fs.Sub(uiStatic, "ui/static")
	mux.Handle("GET "+b+"/static/", http.StripPrefix(b+"/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET "+b+"/login", c.loginPage)
	mux.HandleFunc("POST "+b+"/login", c.login)
	mux.HandleFunc("GET "+b+"/auth/start", c.signinStart)
	mux.HandleFunc("GET "+b+"/auth/callback", c.signinCallback)
	for _, rt := range c.routes() {
		mux.HandleFunc(strings.Replace(rt.pattern, " ", " "+b, 1), c.signedIn(rt.pattern, rt.ask, rt.handler))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		// Nothing the console serves runs script or loads anything from
		// elsewhere, so provider output that slipped past escaping still
		// could not run.
		h.Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "same-origin")
		h.Set("Cache-Control", "no-store")
		if !c.signInNeeded() {
			if err := server.LoopbackOnly(r); err != nil {
				c.fail(w, r, err.Status, err.Message)
				return
			}
		}
		if r.URL.Path == b {
			http.Redirect(w, r, b+"/", http.StatusSeeOther)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// pageData is what every page's layout reads.
type pageData struct {
	Title    string
	Base     string
	Nav      string
	CanWrite bool
	ReadOnly bool
	CSRF     string
	// Who is the signed-in subject's name.
	Who   string
	Flash string
	Auth  bool
	// Refresh reloads the page every second, for progress that has no
	// stream of its own.
	Refresh bool
	Body    any
}

// flashes are what the banner says after an action, by the code the
// action's redirect carries in ?done=. Only these: a link from elsewhere
// cannot put its own words in the console's banner.
var flashes = map[string]string{
	"cancel-requested": "cancel requested",
	"replayed-resume":  "replayed (resume)",
	"replayed-restart": "replayed (restart)",
	"run-deleted":      "the run is deleted, and its dead letters with it",
	"entry-deleted":    "the dead letter is deleted",
	"entry-skipped":    "replayed: each alert it kept was skipped, so no run started, and it is removed",
	"answered-approve": "answered: approve",
	"answered-reject":  "answered: reject",
	"redriven-failed":  "redriven: the split's failed items run again",
	"redriven-skipped": "redriven: the split's failed and skipped items run again",
	"paused":           "paused",
	"unpaused":         "unpaused",
	"not-paused":       "it was not paused",
	"started":          "run started",
}

// flashed is the address of a page with the banner saying code's message.
func flashed(path, code string) string { return path + "?done=" + code }

func (c *console) page(w http.ResponseWriter, r *http.Request, sess *uiSession, name, title, nav string, body any) {
	c.pageStatus(w, r, sess, http.StatusOK, name, title, nav, body)
}

// livePage is a page whose script draws its live part again as runs
// start and end: the part alone (template part) when the script asks for
// it with ?fragment=1, else the whole page.
func (c *console) livePage(w http.ResponseWriter, r *http.Request, sess *uiSession, part, name, title, nav string, body any) {
	if r.URL.Query().Get("fragment") == "1" {
		c.render(w, http.StatusOK, part, pageData{Base: c.base, Body: body})
		return
	}
	c.page(w, r, sess, name, title, nav, body)
}

// pageStatus is page, answering status: a form sent back with what was
// wrong with it.
func (c *console) pageStatus(w http.ResponseWriter, r *http.Request, sess *uiSession, status int, name, title, nav string, body any) {
	d := pageData{Title: title, Base: c.base, Nav: nav, Body: body, Flash: flashes[r.URL.Query().Get("done")], Auth: c.signInNeeded(), ReadOnly: c.readOnly()}
	if job, ok := body.(*bulkJob); ok {
		d.Refresh = !job.Finished
	}
	if sess != nil {
		d.CanWrite, d.CSRF, d.Who = c.canWrite(sess), sess.csrf, sess.sub.Name
	}
	c.render(w, status, name, d)
}

// pageBuffers hold pages being rendered: a run page of a few hundred steps
// is a few hundred KB, which a new buffer would grow to by copying it
// several times over.
var pageBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxPooledPage is the largest buffer kept for the next page.
const maxPooledPage = 4 << 20

func (c *console) render(w http.ResponseWriter, status int, name string, d any) {
	b := pageBuffers.Get().(*bytes.Buffer)
	b.Reset()
	defer func() {
		if b.Cap() <= maxPooledPage {
			pageBuffers.Put(b)
		}
	}()
	if err := c.tmpl.ExecuteTemplate(b, name, d); err != nil {
		c.log.Error("rendering a console page", "page", name, "err", err)
		http.Error(w, "rendering the page failed; the gateway's log has the details", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

func (c *console) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	audit.NoteDetail(r.Context(), msg)
	d := pageData{Title: http.StatusText(status), Base: c.base, Body: map[string]any{"Status": status, "Message": msg}}
	// Someone refused can still sign out, to sign in as someone else.
	if sess := c.session(r); sess != nil && c.signInNeeded() {
		d.Auth, d.CSRF, d.Who = true, sess.csrf, sess.sub.Name
	}
	c.render(w, status, "error.html", d)
}

// failErr answers an operation's error with the status the API gives it.
func (c *console) failErr(w http.ResponseWriter, r *http.Request, err error) {
	ae := api.AsAPIError(err)
	c.fail(w, r, ae.Status, ae.Message)
}

func (c *console) readOnly() bool { return c.host.Config().Gateway.UI.ReadOnly }

func (c *console) canWrite(sess *uiSession) bool { return sess.write && !c.readOnly() }

// signedIn guards a page or action: the browser needs a session, and an
// action needs write access and the session's CSRF token.
func (c *console) signedIn(pattern string, ask func(*http.Request) (authz.Action, authz.Target), h func(http.ResponseWriter, *http.Request, *uiSession)) http.HandlerFunc {
	route := strings.Replace(pattern, " ", " "+c.base, 1)
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, _ := audit.WithNote(audit.WithOrigin(r.Context(), audit.From(r, audit.ViaConsole, route)))
		r = r.WithContext(ctx)
		sess := c.session(r)
		if sess == nil && !c.signInNeeded() {
			// Without tokens the console, like the API, answers loopback
			// requests only; a session still carries the CSRF token.
			sess = c.newSession(w, r, authz.Subject{Kind: authz.Loopback, Name: "a loopback client"}, sessionTTL)
		}
		if sess == nil {
			if r.Method == http.MethodGet {
				http.Redirect(w, r, c.base+"/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			c.fail(w, r, http.StatusUnauthorized, "sign in first")
			return
		}
		if r.Method != http.MethodGet {
			if err := sameOrigin(r); err != nil {
				c.fail(w, r, http.StatusForbidden, err.Error())
				return
			}
			if subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(sess.csrf)) != 1 {
				c.fail(w, r, http.StatusForbidden, "the form's CSRF token is missing or stale; reload the page and try again")
				return
			}
		}
		a, target := ask(r)
		sub := c.subject(sess)
		if a == "" {
			h(w, r, sess)
			return
		}
		if err := c.host.Authorize(ctx, sub, a, target); err != nil {
			c.failErr(w, r, err)
			return
		}
		if r.Method != http.MethodGet && c.readOnly() {
			c.fail(w, r, http.StatusForbidden, "the console is read-only ([gateway.ui] read_only)")
			return
		}
		if a == authz.Read {
			h(w, r.WithContext(engine.Acting(ctx, engine.Identity{Name: sess.sub.Name, Groups: sess.sub.Groups}, "console")), sess)
			return
		}
		sw := &audit.StatusWriter{ResponseWriter: w}
		h(sw, r.WithContext(engine.Acting(ctx, engine.Identity{Name: sess.sub.Name, Groups: sess.sub.Groups}, "console")), sess)
		c.host.Record(ctx, sub, a, target, sw.Status, "")
	}
}

// subject is who a session acts as, for the authorization seam. A session
// begun while the gateway had no tokens acts as nobody once it has some.
func (c *console) subject(sess *uiSession) authz.Subject {
	if sess.sub.Kind == authz.Loopback && c.signInNeeded() {
		return authz.Subject{Name: sess.sub.Name}
	}
	return sess.sub
}

// do asks to do a on the target the request names by the path value key,
// or on the kind with no name.
func do(a authz.Action, kind, key string) func(*http.Request) (authz.Action, authz.Target) {
	return func(r *http.Request) (authz.Action, authz.Target) {
		if key == "" {
			return a, authz.Target{Kind: kind}
		}
		return a, authz.Target{Kind: kind, Name: r.PathValue(key)}
	}
}

// ofChain asks to read every one of kind, or those of the chain the query
// names: a role that may read some chains' runs lists them chain by chain.
func ofChain(kind string) func(*http.Request) (authz.Action, authz.Target) {
	return func(r *http.Request) (authz.Action, authz.Target) {
		return authz.Read, authz.Target{Kind: kind, Chain: r.URL.Query().Get("chain")}
	}
}

// bulk asks for what the bulk form does to dead letters: replay them, or
// purge them.
func bulk(r *http.Request) (authz.Action, authz.Target) {
	if r.PostFormValue("action") == "purge" {
		return authz.Delete, authz.Target{Kind: authz.OnDLQ}
	}
	return authz.Replay, authz.Target{Kind: authz.OnDLQ}
}

// pauseTarget asks to pause or resume the trigger or schedule the route names.
func pauseTarget(r *http.Request) (authz.Action, authz.Target) {
	return authz.Pause, authz.Target{Kind: r.PathValue("kind"), Name: r.PathValue("name")}
}

// sameOrigin refuses a state change sent from another origin, whatever
// cookie it carries.
func sameOrigin(r *http.Request) error {
	origin := r.Header.Get("Origin")
	if origin == "" {
		if r.Header.Get("Sec-Fetch-Site") == "cross-site" {
			return errors.New("a request from another site may change nothing")
		}
		return nil
	}
	u, err := url.Parse(origin)
	if err != nil || !strings.EqualFold(u.Host, r.Host) {
		return fmt.Errorf("a request from origin %q may change nothing here", origin)
	}
	return nil
}

func (c *console) session(r *http.Request) *uiSession {
	ck, err := r.Cookie(sessionCookie)
	if err != nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	sess := c.sessions[ck.Value]
	if sess == nil || time.Now().After(sess.expires) {
		delete(c.sessions, ck.Value)
		return nil
	}
	return sess
}

func (c *console) newSession(w http.ResponseWriter, r *http.Request, sub authz.Subject, ttl time.Duration) *uiSession {
	id, csrf := randomToken(), randomToken()
	sess := &uiSession{sub: sub, write: c.host.MayChange(sub), csrf: csrf, expires: time.Now().Add(ttl)}
	c.mu.Lock()
	if len(c.sessions) >= maxSessions {
		// Expired sessions go first; past the cap, the one to expire
		// soonest, so that clients without cookies cannot grow the map.
		now := time.Now()
		var oldest string
		for k, v := range c.sessions {
			if now.After(v.expires) {
				delete(c.sessions, k)
			} else if oldest == "" || v.expires.Before(c.sessions[oldest].expires) {
				oldest = k
			}
		}
		if len(c.sessions) >= maxSessions {
			delete(c.sessions, oldest)
		}
	}
	c.sessions[id] = sess
	c.mu.Unlock()
	http.SetCookie(w, &http.Cookie{
		Name: sessionCookie, Value: id, Path: c.base, MaxAge: int(ttl / time.Second),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
	})
	return sess
}

func randomToken() string {
	var b [tokenBytes]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// tokenBytes is how many random bytes a session id, a CSRF token or a
// form's nonce holds.
const tokenBytes = 24

// isToken reports whether s is what randomToken returns.
func isToken(s string) bool {
	b, err := hex.DecodeString(s)
	return err == nil && len(b) == tokenBytes
}

func (c *console) loginPage(w http.ResponseWriter, r *http.Request) {
	if !c.signInNeeded() {
		http.Redirect(w, r, c.base+"/", http.StatusSeeOther)
		return
	}
	c.render(w, http.StatusOK, "login.html", pageData{Title: "Sign in", Base: c.base, Body: c.loginBody(safeNext(c.base, r.URL.Query().Get("next")))})
}

// login exchanges an API token for a session cookie, once.
func (c *console) login(w http.ResponseWriter, r *http.Request) {
	if err := sameOrigin(r); err != nil {
		c.fail(w, r, http.StatusForbidden, err.Error())
		return
	}
	if !c.tokensSignIn() {
		c.fail(w, r, http.StatusForbidden, "sign in through the OpenID Provider: token sign-in is off while [gateway.ui.oidc] is set (allow_tokens keeps both)")
		return
	}
	tok := strings.TrimSpace(r.PostFormValue("token"))
	next := c.loginBody(safeNext(c.base, r.PostFormValue("next")))
	cred, err := authz.Subject{}, server.ErrUnknownToken
	if tok != "" {
		cred, err = c.host.CheckToken(r, tok)
	}
	var wait *server.CredentialWaitError
	if errors.As(err, &wait) {
		w.Header().Set("Retry-After", strconv.Itoa(wait.Seconds))
		c.render(w, http.StatusTooManyRequests, "login.html", pageData{Title: "Sign in", Base: c.base, Body: next,
			Flash: fmt.Sprintf("too many wrong tokens came from this address; try again in %d s", wait.Seconds)})
		return
	}
	if err != nil {
		c.render(w, http.StatusUnauthorized, "login.html", pageData{Title: "Sign in", Base: c.base, Flash: "that token is not one of the gateway's API tokens", Body: next})
		return
	}
	c.newSession(w, r, cred, sessionTTL)
	http.Redirect(w, r, safeNext(c.base, r.PostFormValue("next")), http.StatusSeeOther)
}

// safeNext keeps a redirect after sign-in inside the console.
func safeNext(base, next string) string {
	if !strings.HasPrefix(next, base+"/") || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n") {
		return base + "/"
	}
	return next
}

func (c *console) logout(w http.ResponseWriter, r *http.Request, _ *uiSession) {
	if ck, err := r.Cookie(sessionCookie); err == nil {
		c.mu.Lock()
		delete(c.sessions, ck.Value)
		c.mu.Unlock()
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: c.base, MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, c.base+"/login", http.StatusSeeOther)
}

// runStatuses are the statuses the runs page filters by.
var runStatuses = store.RunStatuses
