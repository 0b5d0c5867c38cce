// Package oidcop is a real OpenID Provider for tests: zitadel/oidc's, with
// its example storage and login form, on a port of its own, its people
// with groups.
package oidcop

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/zitadel/oidc/v3/example/server/exampleop"
	"github.com/zitadel/oidc/v3/example/server/storage"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
	"golang.org/x/text/language"
)

// OP is a running provider.
type OP struct {
	URL     string
	clients map[string]*storage.Client
}

// People are the provider's people and their groups (the groups claim);
// each one's password is their name and "-pw".
var People = map[string][]string{"alice": {"dba"}, "bob": {"viewers"}}

type opUsers map[string]*storage.User

func (u opUsers) GetUserByID(id string) *storage.User { return u[id] }
func (u opUsers) GetUserByUsername(name string) *storage.User {
	for _, user := range u {
		if user.Username == name {
			return user
		}
	}
	return nil
}
func (u opUsers) ExampleClientID() string { return "service" }

// groupsStorage adds the groups claim to what the example storage says of
// a person.
type groupsStorage struct{ *storage.Storage }

func (s groupsStorage) SetUserinfoFromScopes(ctx context.Context, ui *oidc.UserInfo, userID, clientID string, scopes []string) error {
	err := s.Storage.SetUserinfoFromScopes(ctx, ui, userID, clientID, scopes)
	ui.AppendClaims("groups", People[userID])
	return err
}

func (s groupsStorage) SetUserinfoFromToken(ctx context.Context, ui *oidc.UserInfo, tokenID, subject, origin string) error {
	err := s.Storage.SetUserinfoFromToken(ctx, ui, tokenID, subject, origin)
	ui.AppendClaims("groups", People[subject])
	return err
}

func (s groupsStorage) SetUserinfoFromRequest(ctx context.Context, ui *oidc.UserInfo, token op.IDTokenRequest, scopes []string) error {
	err := s.Storage.SetUserinfoFromRequest(ctx, ui, token, scopes)
	ui.AppendClaims("groups", People[token.GetSubject()])
	return err
}

// Start starts a provider until the test ends; add its clients with
// AddClient.
func Start(t testing.TB) *OP {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	issuer := "http://" + l.Addr().String()
	users := opUsers{}
	for name := range People {
		users[name] = &storage.User{ID: name, Username: name, Password: name + "-pw", FirstName: name, LastName: "Example", Email: name + "@example.com", EmailVerified: true, PreferredLanguage: language.English}
	}
	o := &OP{URL: issuer, clients: map[string]*storage.Client{}}
	st := groupsStorage{storage.NewStorageWithClients(users, o.clients)}
	// The example provider logs each request through the default logger;
	// the gateway logs only through the loggers it is given, so quieting
	// the default quiets the provider alone.
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	srv := &http.Server{Handler: exampleop.SetupServer(issuer, st, nil, false)}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return o
}

// AddClient registers a web client sending people back to redirect.
func (o *OP) AddClient(id, secret, redirect string) {
	o.clients[id] = storage.WebClient(id, secret, redirect)
}

// hiddenID is the sign-in's id the provider's login form carries.
var hiddenID = regexp.MustCompile(`name="id" value="([^"]+)"`)

// Login signs person in at the provider as a browser would, from authURL
// (the provider's authorization URL a relying party sent the browser to),
// with client's cookies, and returns the URL the provider sends the
// browser back to: the relying party's callback with its code and state.
func (o *OP) Login(t testing.TB, client *http.Client, authURL, person string) string {
	t.Helper()
	c := *client
	var back string
	c.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if !strings.HasPrefix(req.URL.String(), o.URL) {
			back = req.URL.String()
			return http.ErrUseLastResponse
		}
		return nil
	}
	resp, err := c.Get(authURL)
	if err != nil {
		t.Fatalf("opening the provider's sign-in: %v", err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := hiddenID.FindSubmatch(page)
	if m == nil {
		t.Fatalf("the provider's sign-in page holds no form (%d):\n%s", resp.StatusCode, page)
	}
	resp, err = c.PostForm(o.URL+"/login/username", url.Values{"id": {string(m[1])}, "username": {person}, "password": {person + "-pw"}})
	if err != nil {
		t.Fatalf("signing in at the provider: %v", err)
	}
	resp.Body.Close()
	if back == "" {
		t.Fatalf("the provider sent no one back after signing %s in (%d)", person, resp.StatusCode)
	}
	return back
}
