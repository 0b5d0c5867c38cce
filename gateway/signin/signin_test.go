package signin

import (
	"context"
	"errors"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"slices"
	"strings"
	"testing"

	"golang.org/x/oauth2"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/internal/testutil/oidcop"
)

func newRP(op *oidcop.OP, client, secret string) *RP {
	cfg := &chain.OIDC{Issuer: op.URL, ClientID: client, Scopes: chain.DefaultOIDCScopes, UsernameClaim: chain.DefaultUsernameClaim, GroupsClaim: chain.DefaultGroupsClaim}
	return New(cfg, secret, "http://"+client+".invalid/ui/auth/callback")
}

func browser() *http.Client {
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar}
}

// signIn runs a sign-in of person at rp through the provider, and returns
// the state bound to the browser and the callback's query.
func signIn(t *testing.T, op *oidcop.OP, rp *RP, person string) (string, url.Values) {
	t.Helper()
	authURL, state, err := rp.Begin(context.Background(), "/ui/runs")
	if err != nil {
		t.Fatal(err)
	}
	back, err := url.Parse(op.Login(t, browser(), authURL, person))
	if err != nil {
		t.Fatal(err)
	}
	return state, back.Query()
}

// TestSignIn signs people in through a real OpenID Provider: the name and
// groups come from the claims; a state not bound to the browser, or used
// once already, is refused, and takes nothing from the browser it was
// given to; so is an ID token made for another client, or another nonce.
func TestSignIn(t *testing.T) {
	op := oidcop.Start(t)
	op.AddClient("gw", "gw-secret", "http://gw.invalid/ui/auth/callback")
	op.AddClient("other", "other-secret", "http://other.invalid/ui/auth/callback")
	rp := newRP(op, "gw", "gw-secret")
	ctx := context.Background()

	state, q := signIn(t, op, rp, "alice")
	person, next, err := rp.Finish(ctx, state, q)
	if err != nil || person.Name != "alice" || !slices.Equal(person.Groups, []string{"dba"}) || next != "/ui/runs" {
		t.Fatalf("alice's sign-in: %+v %q %v", person, next, err)
	}
	if _, _, err := rp.Finish(ctx, state, q); !errors.Is(err, ErrState) {
		t.Errorf("the same answer taken twice: %v, want ErrState", err)
	}

	state, q = signIn(t, op, rp, "bob")
	if _, _, err := rp.Finish(ctx, "another-browser's-state", q); !errors.Is(err, ErrState) {
		t.Errorf("an answer brought by a browser the state was not given to: %v", err)
	}
	forged := url.Values{"state": {"forged"}, "code": q["code"]}
	if _, _, err := rp.Finish(ctx, "forged", forged); !errors.Is(err, ErrState) {
		t.Errorf("a forged state: %v", err)
	}
	// Refusing those took nothing from the browser the state was given to.
	if person, _, err := rp.Finish(ctx, state, q); err != nil || person.Name != "bob" || !slices.Equal(person.Groups, []string{"viewers"}) {
		t.Errorf("bob's own answer after the forged ones: %+v %v", person, err)
	}

	// An ID token the provider made for the other client, with its nonce,
	// is not one for this gateway.
	other := newRP(op, "other", "other-secret")
	state, q = signIn(t, op, other, "alice")
	other.mu.Lock()
	pend := other.pending[state]
	other.mu.Unlock()
	p, err := other.discover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := other.oauth(p).Exchange(ctx, q.Get("code"), oauth2.VerifierOption(pend.verifier))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := tok.Extra("id_token").(string)
	gwp, _ := rp.discover(ctx)
	if _, err := rp.verify(ctx, gwp, raw, pend.nonce, nil); err == nil || !strings.Contains(err.Error(), "audience") {
		t.Errorf("an ID token for another client: %v, want an audience refusal", err)
	}
	if _, err := other.verify(ctx, p, raw, "another nonce", nil); err == nil || !strings.Contains(err.Error(), "nonce") {
		t.Errorf("an ID token with another sign-in's nonce: %v", err)
	}
	if _, err := other.verify(ctx, p, raw, pend.nonce, tok); err != nil {
		t.Errorf("the other client's own ID token: %v", err)
	}
}

// TestSignInsBegunAreBounded: sign-ins begun and never finished, past the
// bound, push the oldest out rather than refuse the next one.
func TestSignInsBegunAreBounded(t *testing.T) {
	op := oidcop.Start(t)
	op.AddClient("gw", "gw-secret", "http://gw.invalid/ui/auth/callback")
	rp := newRP(op, "gw", "gw-secret")
	ctx := context.Background()
	first := ""
	for i := range maxPending + 10 {
		_, state, err := rp.Begin(ctx, "/ui/")
		if err != nil {
			t.Fatalf("begin %d: %v", i, err)
		}
		if i == 0 {
			first = state
		}
	}
	rp.mu.Lock()
	n, kept := len(rp.pending), rp.pending[first] != nil
	rp.mu.Unlock()
	if n != maxPending || kept {
		t.Errorf("%d sign-ins kept (the first among them: %v), want %d without the first", n, kept, maxPending)
	}
	state, q := signIn(t, op, rp, "alice")
	if person, _, err := rp.Finish(ctx, state, q); err != nil || person.Name != "alice" {
		t.Errorf("a sign-in after the flood: %+v %v", person, err)
	}
}
