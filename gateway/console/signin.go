package console

import (
	"cmp"
	"errors"
	"html/template"
	"net/http"
	"strings"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/gateway/audit"
	"github.com/chaingate/gateway/gateway/authz"
	"github.com/chaingate/gateway/gateway/signin"
)

// signinCookie binds a sign-in begun to the browser that began it. It is
// Lax, not Strict, since the provider sends the browser back from another
// site; it holds only the sign-in's state.
const signinCookie = "chaingate_signin"

// oidc is the config's [gateway.ui.oidc], nil when people sign in with
// tokens only.
func (c *console) oidc() *chain.OIDC { return c.host.Config().Gateway.UI.OIDC }

// signInNeeded reports whether the console asks who is there: the API has
// tokens, or the config names an OpenID Provider.
func (c *console) signInNeeded() bool { return c.host.AuthEnabled() || c.oidc() != nil }

// tokensSignIn reports whether a token may be pasted to sign in.
func (c *console) tokensSignIn() bool {
	o := c.oidc()
	return o == nil || o.AllowTokens
}

// loginBody is what the sign-in page shows: the provider's button, the
// token form, or both.
func (c *console) loginBody(next string) map[string]any {
	return map[string]any{"Next": next, "SSO": c.oidc() != nil, "Tokens": c.tokensSignIn()}
}

// relyingParty is the console as the provider's relying party, made again
// when a reload changes [gateway.ui.oidc]; nil without one.
func (c *console) relyingParty() *signin.RP {
	o := c.oidc()
	if o == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rp == nil || c.rp.Config() != o {
		cfg := c.host.Config()
		redirect := strings.TrimSuffix(cfg.Gateway.ExternalURL, "/") + c.base + "/auth/callback"
		c.rp = signin.New(o, c.host.SecretValue(o.ClientSecret), redirect)
	}
	return c.rp
}

// signinStart sends the browser to the provider, with the sign-in's state
// in a cookie for the way back.
func (c *console) signinStart(w http.ResponseWriter, r *http.Request) {
	rp := c.relyingParty()
	if rp == nil {
		c.fail(w, r, http.StatusNotFound, "no OpenID Provider is configured ([gateway.ui.oidc])")
		return
	}
	to, state, err := rp.Begin(r.Context(), safeNext(c.base, r.URL.Query().Get("next")))
	if err != nil {
		c.log.Error("beginning a sign-in", "err", err)
		c.fail(w, r, http.StatusBadGateway, "the sign-in could not begin: "+err.Error())
		return
	}
	http.SetCookie(w, &http.Cookie{Name: signinCookie, Value: state, Path: c.base + "/auth", MaxAge: 600, HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: r.TLS != nil})
	http.Redirect(w, r, to, http.StatusSeeOther)
}

// signinCallback takes the provider's answer: the state must be the one
// this browser was given, once; the code is exchanged and the ID token
// verified; the person gets a session for [gateway.ui.oidc] session_ttl.
// A refusal is in the audit log.
func (c *console) signinCallback(w http.ResponseWriter, r *http.Request) {
	rp := c.relyingParty()
	if rp == nil {
		c.fail(w, r, http.StatusNotFound, "no OpenID Provider is configured ([gateway.ui.oidc])")
		return
	}
	bound := ""
	if ck, err := r.Cookie(signinCookie); err == nil {
		bound = ck.Value
	}
	http.SetCookie(w, &http.Cookie{Name: signinCookie, Path: c.base + "/auth", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: r.TLS != nil})
	person, next, err := rp.Finish(r.Context(), bound, r.URL.Query())
	if err != nil {
		status := http.StatusUnauthorized
		if !errors.Is(err, signin.ErrState) {
			c.log.Warn("a sign-in was refused", "remote", r.RemoteAddr, "err", err)
		}
		ctx := audit.WithOrigin(r.Context(), audit.From(r, audit.ViaConsole, "GET "+c.base+"/auth/callback"))
		c.host.Record(ctx, authz.Subject{Kind: authz.Person, Name: "someone signing in"}, authz.Read, authz.Target{Kind: authz.OnGateway}, status, err.Error())
		c.render(w, status, "login.html", pageData{Title: "Sign in", Base: c.base, Flash: "sign-in refused: " + err.Error(), Body: c.loginBody(c.base + "/")})
		return
	}
	o := rp.Config()
	c.newSession(w, r, authz.Subject{Kind: authz.Person, Name: person.Name, Groups: person.Groups}, cmp.Or(o.SessionTTL, chain.DefaultSessionTTL))
	c.log.Info("signed in", "person", person.Name, "groups", strings.Join(person.Groups, ","), "remote", r.RemoteAddr)
	ctx := audit.WithOrigin(r.Context(), audit.From(r, audit.ViaConsole, "GET "+c.base+"/auth/callback"))
	c.host.Record(ctx, authz.Subject{Kind: authz.Person, Name: person.Name, Groups: person.Groups}, authz.Read, authz.Target{Kind: authz.OnGateway}, http.StatusOK, "signed in through the OpenID Provider")
	// The session cookie is Strict: a redirect at the end of the way back
	// from the provider's site would not carry it, a navigation from this
	// page does.
	c.render(w, http.StatusOK, "signed-in.html", pageData{Title: "Signed in", Base: c.base, Body: map[string]any{"Next": template.URL(next), "Until": time.Now().Add(o.SessionTTL)}})
}
