package server_test

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/internal/testutil/oidcop"
)

const oidcRoles = `[gateway.auth]
tokens = [{ name = "root", token = "root-tok" }]

[gateway.auth.roles.dbas]
grants = [{ actions = ["read", "start", "cancel", "approve"], chains = ["*"] }]

[gateway.auth.groups]
dba = ["dbas"]
`

// withOIDC serves env's console with sign-in through op, sessions lasting
// ttl: the provider and the config learn the gateway's address, and the
// gateway reloads.
func withOIDC(t *testing.T, env *apiEnv, op *oidcop.OP, ttl string) {
	t.Helper()
	op.AddClient("chaingate", "gw-secret", env.url+"/ui/auth/callback")
	cfg := mustRead(t, env.cfg)
	if !strings.Contains(cfg, "external_url") {
		cfg = strings.Replace(cfg, "[gateway]\n", "[gateway]\nexternal_url = \""+env.url+"\"\n", 1)
	}
	if i := strings.Index(cfg, "\n[gateway.ui.oidc]"); i >= 0 {
		cfg = cfg[:i]
	}
	cfg += "\n[gateway.ui.oidc]\nissuer = \"" + op.URL + "\"\nclient_id = \"chaingate\"\nclient_secret = \"<<secrets.OIDC_SECRET>>\"\nsession_ttl = \"" + ttl + "\"\n"
	env.write(cfg)
	env.token = "root-tok"
	if code, _, body := env.call("POST", "/v1/admin/reload", "", nil, nil); code != http.StatusOK {
		t.Fatalf("reloading with [gateway.ui.oidc]: %d %s", code, body)
	}
}

// TestBrowserSignInThroughOpenIDProvider signs people in to the console in
// Chromium through a real OpenID Provider: alice's group gives her a role
// that reads and acts on every chain but not the audit log; bob's group
// gives him none; signing out ends the session, as does its expiry; token
// sign-in is off.
func TestBrowserSignInThroughOpenIDProvider(t *testing.T) {
	t.Setenv("CHAINGATE_SECRET_OIDC_SECRET", "gw-secret")
	op := oidcop.Start(t)
	env := newActionsAPI(t, oidcRoles)
	env.write(strings.Replace(mustRead(t, env.cfg), `approval = { message = "Restart <<origin.payload.host>>?" }`,
		`approval = { message = "Restart <<origin.payload.host>>?", four_eyes = true, approvers = ["group:dba"] }`, 1))
	withOIDC(t, env, op, "12h")
	env.token = "root-tok"
	hello := startWait(t, env, "hello", `{"who": "ops"}`)
	restart := startRun(t, env, "restart-db", `{"host": "db-1"}`)
	waitAsking(t, env, restart, "ask")

	ctx := chrome(t)
	login := func(person string) {
		t.Helper()
		do(t, ctx, "signing in as "+person, chromedp.Navigate(env.url+"/ui/runs/"+hello), chromedp.WaitVisible(chromedp.CSS("#sso")),
			chromedp.Click(chromedp.CSS("#sso")), chromedp.WaitVisible(chromedp.CSS("#username")),
			chromedp.SendKeys(chromedp.CSS("#username"), person), chromedp.SendKeys(chromedp.CSS("#password"), person+"-pw"),
			chromedp.Submit(chromedp.CSS("#password")), chromedp.WaitVisible(chromedp.CSS("main")))
	}
	if n := eval[int](t, ctx, `document.querySelectorAll('input[name=token]').length`); n != 0 {
		t.Errorf("the sign-in page offers token sign-in beside the provider's (%d)", n)
	}
	login("alice")
	poll(t, ctx, "alice's run page", `location.pathname.endsWith('/ui/runs/`+hello+`') && document.getElementById('who') && document.getElementById('who').textContent === 'alice' && document.querySelector('svg.graph') !== null`)
	if status := eval[int](t, ctx, `fetch('/ui/audit').then(r => r.status)`); status != http.StatusForbidden {
		t.Errorf("alice's role has no admin, yet the audit page answered %d", status)
	}
	// The step takes answers from group dba, which alice is in, and not
	// from root, who started the run.
	do(t, ctx, "approving as alice", chromedp.Navigate(env.url+"/ui/runs/"+restart+"/steps/ask"), chromedp.WaitVisible(chromedp.CSS("#answer-approve")),
		chromedp.Click(chromedp.CSS("#answer-approve")))
	if v := waitRunEnd(t, env, restart); v.Status != string(store.RunSucceeded) || v.Steps["ask"] == nil || !strings.Contains(string(v.Steps["ask"].Body), "alice (console)") {
		t.Errorf("after alice's approval the run is %s: %+v", v.Status, v.Steps["ask"])
	}

	// Signing out ends the session.
	do(t, ctx, "signing out", chromedp.Click(chromedp.CSS("form[action$='/logout'] button")), chromedp.WaitVisible(chromedp.CSS("#sso")))
	do(t, ctx, "opening a run signed out", chromedp.Navigate(env.url+"/ui/runs/"+hello), chromedp.WaitVisible(chromedp.CSS("#sso")))

	// bob's group gives him no role: signed in, he may read nothing, and
	// may still sign out.
	login("bob")
	poll(t, ctx, "bob's refusal", `document.body.textContent.includes('bob holds no role')`)
	do(t, ctx, "signing bob out", chromedp.Click(chromedp.CSS("form[action$='/logout'] button")), chromedp.WaitVisible(chromedp.CSS("#sso")))

	// Sessions that end: a second's session is over a little later.
	withOIDC(t, env, op, "1s")
	login("alice")
	poll(t, ctx, "alice signed in", `document.getElementById('who') !== null`)
	time.Sleep(1500 * time.Millisecond)
	do(t, ctx, "opening a run after the session ended", chromedp.Navigate(env.url+"/ui/runs/"+hello), chromedp.WaitVisible(chromedp.CSS("#sso")))

	// A token cannot be pasted in while the provider signs people in.
	if code, _, _ := newBrowser(t, env).post("/ui/login", url.Values{"token": {"root-tok"}}); code != http.StatusForbidden {
		t.Errorf("token sign-in with the provider on: %d", code)
	}

	got := auditLog(t, env)
	signedIn := 0
	for _, e := range got {
		if e.Route == "GET /ui/auth/callback" && e.Outcome == store.AuditOK {
			signedIn++
		}
	}
	if signedIn != 3 {
		t.Errorf("%d sign-ins recorded, want 3", signedIn)
	}
}

// TestSignInStateForgedOrReplayed brings the provider's answer back twice,
// and with a state no one was given: each is refused and recorded, and the
// browser that signed in keeps its session.
func TestSignInStateForgedOrReplayed(t *testing.T) {
	t.Setenv("CHAINGATE_SECRET_OIDC_SECRET", "gw-secret")
	op := oidcop.Start(t)
	env := newConsoleAPI(t, oidcRoles)
	withOIDC(t, env, op, "12h")
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Get(env.url + "/ui/auth/start?next=/ui/runs")
	if err != nil || resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("beginning a sign-in: %v %v", resp, err)
	}
	resp.Body.Close()
	back := op.Login(t, &http.Client{Jar: jar}, resp.Header.Get("Location"), "alice")
	get := func(u string) (int, string) {
		resp, err := client.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b := new(strings.Builder)
		_, _ = io.Copy(b, resp.Body)
		return resp.StatusCode, b.String()
	}
	if code, body := get(back); code != http.StatusOK || !strings.Contains(body, "Signed in") {
		t.Fatalf("the provider's answer: %d %s", code, body)
	}
	if code, body := get(back); code != http.StatusUnauthorized || !strings.Contains(body, "was used already") {
		t.Errorf("the same answer again: %d %.300s", code, body)
	}
	u, _ := url.Parse(back)
	q := u.Query()
	q.Set("state", "forged")
	u.RawQuery = q.Encode()
	if code, body := get(u.String()); code != http.StatusUnauthorized || !strings.Contains(body, "sign-in refused") {
		t.Errorf("a forged state: %d %.300s", code, body)
	}
	if code, _ := get(env.url + "/ui/runs"); code != http.StatusOK {
		t.Errorf("the browser that signed in lost its session: %d", code)
	}
	refused := 0
	for _, e := range auditLog(t, env) {
		if e.Route == "GET /ui/auth/callback" && e.Outcome == store.AuditFailed && e.Status == http.StatusUnauthorized {
			refused++
		}
	}
	if refused != 2 {
		t.Errorf("%d refused sign-ins recorded, want 2", refused)
	}
}
