// Package signin signs people in to the console through an OpenID
// Provider: the authorization code flow with PKCE, a state that binds the
// provider's answer to the browser that asked and is taken once, a nonce
// bound into the ID token, and the ID token verified (signature, issuer,
// audience, expiry) before the person's name and groups are read from the
// claims the config names.
//
// It is the gateway's own package, with no compatibility promise.
package signin

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"github.com/chaingate/gateway/chain"
)

// Person is who signed in.
type Person struct {
	Name   string
	Groups []string
}

// pendingTTL is how long a sign-in may take at the provider; maxPending
// bounds the sign-ins begun and not finished, so that requests that never
// come back cannot grow them.
const (
	pendingTTL = 10 * time.Minute
	maxPending = 10000
)

// pending is a sign-in begun: what the callback must match.
type pending struct {
	verifier, nonce, next string
	expires               time.Time
}

// RP is the console as an OpenID relying party.
type RP struct {
	cfg      *chain.OIDC
	secret   string
	redirect string
	client   *http.Client

	mu       sync.Mutex
	provider *oidc.Provider
	pending  map[string]*pending
}

// New is the relying party for cfg, its client secret, and the callback
// URL the provider sends people back to.
func New(cfg *chain.OIDC, clientSecret, redirectURL string) *RP {
	return &RP{cfg: cfg, secret: clientSecret, redirect: redirectURL, client: &http.Client{Timeout: 15 * time.Second}, pending: map[string]*pending{}}
}

// Config is the [gateway.ui.oidc] the relying party was made for.
func (rp *RP) Config() *chain.OIDC { return rp.cfg }

// discover reads the provider's discovery document once it answers; until
// then each sign-in tries again, so a provider down when the gateway
// starts does not stop sign-ins once it is back.
func (rp *RP) discover(ctx context.Context) (*oidc.Provider, error) {
	rp.mu.Lock()
	p := rp.provider
	rp.mu.Unlock()
	if p != nil {
		return p, nil
	}
	p, err := oidc.NewProvider(oidc.ClientContext(ctx, rp.client), rp.cfg.Issuer)
	if err != nil {
		return nil, fmt.Errorf("reading the OpenID Provider's discovery document at %s: %w", rp.cfg.Issuer, err)
	}
	rp.mu.Lock()
	rp.provider = p
	rp.mu.Unlock()
	return p, nil
}

func (rp *RP) oauth(p *oidc.Provider) *oauth2.Config {
	return &oauth2.Config{ClientID: rp.cfg.ClientID, ClientSecret: rp.secret, RedirectURL: rp.redirect, Endpoint: p.Endpoint(), Scopes: rp.cfg.Scopes}
}

func random() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// Begin starts a sign-in that lands on next: the URL to send the browser
// to, and the state to bind to the browser (a cookie) for the callback.
func (rp *RP) Begin(ctx context.Context, next string) (authURL, state string, err error) {
	p, err := rp.discover(ctx)
	if err != nil {
		return "", "", err
	}
	state = random()
	pend := &pending{verifier: oauth2.GenerateVerifier(), nonce: random(), next: next, expires: time.Now().Add(pendingTTL)}
	rp.mu.Lock()
	if len(rp.pending) >= maxPending {
		// Past the bound, the expired go, then the oldest: a flood of
		// sign-ins begun and never finished costs a person at most a
		// second try, never a refusal for as long as the flood lasts.
		now := time.Now()
		var oldest string
		for k, v := range rp.pending {
			if now.After(v.expires) {
				delete(rp.pending, k)
			} else if oldest == "" || v.expires.Before(rp.pending[oldest].expires) {
				oldest = k
			}
		}
		if len(rp.pending) >= maxPending {
			delete(rp.pending, oldest)
		}
	}
	rp.pending[state] = pend
	rp.mu.Unlock()
	return rp.oauth(p).AuthCodeURL(state, oauth2.S256ChallengeOption(pend.verifier), oidc.Nonce(pend.nonce)), state, nil
}

// ErrState refuses a callback whose state this gateway did not give the
// browser that brings it, or gave and has taken already.
var ErrState = errors.New("the sign-in's state is not one this browser was given, or was used already: start the sign-in again")

// Finish completes the sign-in the callback's query q answers. bound is
// the state the browser's cookie holds: it must be the query's, and one
// begun here and not yet taken. It returns who signed in and where they
// were going.
func (rp *RP) Finish(ctx context.Context, bound string, q url.Values) (Person, string, error) {
	state := q.Get("state")
	if state == "" || bound == "" || state != bound {
		return Person{}, "", ErrState
	}
	rp.mu.Lock()
	pend := rp.pending[state]
	delete(rp.pending, state)
	rp.mu.Unlock()
	if pend == nil || time.Now().After(pend.expires) {
		return Person{}, "", ErrState
	}
	if e := q.Get("error"); e != "" {
		return Person{}, "", fmt.Errorf("the OpenID Provider refused the sign-in: %s %s", e, q.Get("error_description"))
	}
	code := q.Get("code")
	if code == "" {
		return Person{}, "", errors.New("the OpenID Provider's answer holds no code")
	}
	p, err := rp.discover(ctx)
	if err != nil {
		return Person{}, "", err
	}
	ctx = oidc.ClientContext(ctx, rp.client)
	tok, err := rp.oauth(p).Exchange(ctx, code, oauth2.VerifierOption(pend.verifier))
	if err != nil {
		return Person{}, "", fmt.Errorf("exchanging the sign-in's code: %w", err)
	}
	raw, _ := tok.Extra("id_token").(string)
	if raw == "" {
		return Person{}, "", errors.New("the OpenID Provider answered with no ID token")
	}
	person, err := rp.verify(ctx, p, raw, pend.nonce, tok)
	return person, pend.next, err
}

// verify checks an ID token and reads the person from its claims, and
// from the provider's userinfo for the same subject when it has some.
func (rp *RP) verify(ctx context.Context, p *oidc.Provider, raw, nonce string, tok *oauth2.Token) (Person, error) {
	idt, err := p.Verifier(&oidc.Config{ClientID: rp.cfg.ClientID}).Verify(ctx, raw)
	if err != nil {
		return Person{}, fmt.Errorf("verifying the ID token: %w", err)
	}
	if idt.Nonce != nonce {
		return Person{}, errors.New("verifying the ID token: its nonce is not this sign-in's")
	}
	claims := map[string]any{}
	if err := idt.Claims(&claims); err != nil {
		return Person{}, fmt.Errorf("reading the ID token's claims: %w", err)
	}
	if tok != nil {
		if ui, err := p.UserInfo(ctx, oauth2.StaticTokenSource(tok)); err == nil && ui.Subject == idt.Subject {
			more := map[string]any{}
			if ui.Claims(&more) == nil {
				for k, v := range more {
					if _, ok := claims[k]; !ok {
						claims[k] = v
					}
				}
			}
		}
	}
	name, _ := claims[rp.cfg.UsernameClaim].(string)
	if strings.TrimSpace(name) == "" || strings.ContainsFunc(name, func(r rune) bool { return r < ' ' }) {
		return Person{}, fmt.Errorf("the ID token has no %q claim to name the person by (username_claim)", rp.cfg.UsernameClaim)
	}
	person := Person{Name: name}
	switch g := claims[rp.cfg.GroupsClaim].(type) {
	case []any:
		for _, v := range g {
			if s, ok := v.(string); ok && s != "" {
				person.Groups = append(person.Groups, s)
			}
		}
	case string:
		person.Groups = []string{g}
	}
	return person, nil
}
