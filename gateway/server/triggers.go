package server

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/gateway/audit"
	"github.com/chaingate/gateway/gateway/authz"
	"github.com/chaingate/gateway/gateway/door"
	"github.com/chaingate/gateway/gateway/server/internal/connguard"
	"github.com/chaingate/gateway/providers/webhook"
	"github.com/chaingate/gateway/templates"
)

// trigger serves POST /v1/triggers/{name}: it takes an alert group or a
// webhook body and hands it to the door, which turns it into runs. Wrong
// credentials count against the sender's address as the API's do.
func (s *Server) trigger(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		s.writeError(w, r, engine.ErrClosed)
		return
	}
	presented := r.Header.Get("Authorization") != "" || r.Header.Get("X-Hub-Signature-256") != "" || r.Header.Get(webhook.SignatureHeader) != ""
	if presented {
		if wait := s.credentialWait(r); wait > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(wait))
			s.writeError(w, r, &api.APIError{Status: http.StatusTooManyRequests, Code: "too_many_auth_failures", Message: fmt.Sprintf("too many wrong credentials came from this address; the next one is checked in %d s", wait)})
			return
		}
	}
	refuse := func(tr *chain.Trigger, why string) {
		if presented {
			s.failedCredential(r)
		}
		s.refuseTrigger(w, r, tr, why)
	}
	cfg := s.gw.Engine.Config()
	name := r.PathValue("name")
	tr := cfg.Triggers[name]
	tokenSub, isToken, open := s.apiAccess(r)
	if open {
		if err := connguard.LoopbackOnly(r); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	if tr == nil {
		// Only a client the API trusts learns which triggers there are:
		// anyone else is refused as at a trigger that exists.
		if !open && !isToken {
			refuse(nil, "no such trigger")
			return
		}
		msg := fmt.Sprintf("no trigger %q", name)
		if sug := chain.Suggest(name, cfg.TriggerNames); sug != "" {
			msg += fmt.Sprintf(" (did you mean %q?)", sug)
		}
		s.writeError(w, r, &api.APIError{Status: http.StatusNotFound, Code: "not_found", Message: msg})
		return
	}
	actx, _ := audit.WithNote(audit.WithOrigin(r.Context(), audit.From(r, audit.ViaTrigger, "POST /v1/triggers/{name}")))
	r = r.WithContext(actx)
	ctx := engine.WithActor(actx, "trigger "+tr.Name)
	deliver := func(sub authz.Subject, body []byte, sig string) {
		target := authz.Target{Kind: authz.OnTrigger, Name: tr.Name}
		if err := s.Authorize(actx, sub, authz.Deliver, target); err != nil {
			s.writeError(w, r, err)
			return
		}
		sw := &audit.StatusWriter{ResponseWriter: w}
		s.fire(sw, r.WithContext(ctx), tr, body, sig)
		s.Record(actx, sub, authz.Deliver, target, sw.Status, "")
	}
	if tr.Token == nil && tr.Secret == nil {
		// No credential of its own: the API's tokens.
		switch {
		case open:
			deliver(authz.Subject{Kind: authz.Loopback, Name: "a loopback client"}, nil, "")
		case isToken:
			deliver(tokenSub, nil, "")
		default:
			refuse(tr, "the trigger takes the API's full tokens")
		}
		return
	}
	body, err := s.readBody(w, r)
	if err != nil {
		s.door.Observer.Delivered(tr.Name, api.OutcomeRefused)
		s.writeError(w, r, err)
		return
	}
	sig, err := s.triggerAuth(r, tr, body)
	if err != nil {
		refuse(tr, err.Error())
		return
	}
	deliver(authz.Subject{Kind: authz.Trigger, Name: "trigger " + tr.Name, Trigger: tr.Name}, body, sig)
}

// apiAccess is the subject the request's bearer token proves, if it is one
// of the API's, or that the API is open (no tokens configured).
func (s *Server) apiAccess(r *http.Request) (sub authz.Subject, ok, open bool) {
	if !s.AuthEnabled() {
		return authz.Subject{}, false, true
	}
	tok, bearer := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !bearer {
		return authz.Subject{}, false, false
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	sub, ok = s.tokens.Lookup(tok)
	return sub, ok, false
}

// refuseTrigger answers a request that brought no credential the trigger
// takes, in the same words whether the trigger exists or not; the log
// says why.
func (s *Server) refuseTrigger(w http.ResponseWriter, r *http.Request, tr *chain.Trigger, why string) {
	if tr != nil {
		s.door.Observer.Delivered(tr.Name, api.OutcomeRefused)
		s.log.Warn("trigger request refused", "trigger", tr.Name, "remote_addr", r.RemoteAddr, "why", why)
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="chaingate"`)
	s.writeError(w, r, &api.APIError{Status: http.StatusUnauthorized, Code: "unauthorized", Message: "a valid bearer token or signature is required"})
}

// triggerAuth checks a request against the trigger's own credential: its
// bearer token, or its HMAC signature over the body. A signed request
// returns its signature, which a captured copy of it brings again.
func (s *Server) triggerAuth(r *http.Request, tr *chain.Trigger, body []byte) (string, error) {
	if tr.Token != nil {
		want, err := s.renderSecret(tr.Token)
		if err != nil {
			return "", err
		}
		if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && subtle.ConstantTimeCompare([]byte(tok), want) == 1 {
			return "", nil
		}
	}
	if tr.Secret != nil {
		key, err := s.renderSecret(tr.Secret)
		if err != nil {
			return "", err
		}
		switch tr.Signature {
		case chain.SignatureChaingate:
			ts, sig := r.Header.Get(webhook.TimestampHeader), r.Header.Get(webhook.SignatureHeader)
			if sig == "" {
				break
			}
			if err := webhook.Verify(key, ts, sig, body, 0, time.Now()); err != nil {
				return "", fmt.Errorf("checking the request's signature: %w", err)
			}
			return "chaingate:" + sig, nil
		default:
			sig, ok := strings.CutPrefix(r.Header.Get("X-Hub-Signature-256"), "sha256=")
			if !ok {
				break
			}
			got, err := hex.DecodeString(sig)
			m := hmac.New(sha256.New, key)
			m.Write(body)
			if err != nil || !hmac.Equal(got, m.Sum(nil)) {
				return "", errors.New("checking the request's signature: X-Hub-Signature-256 does not match the body")
			}
			return "hub:" + strings.ToLower(sig), nil
		}
	}
	var ways []string
	if tr.Token != nil {
		ways = append(ways, "its bearer token")
	}
	if tr.Secret != nil {
		if tr.Signature == chain.SignatureChaingate {
			ways = append(ways, "an X-Chaingate-Signature")
		} else {
			ways = append(ways, "an X-Hub-Signature-256 signature")
		}
	}
	return "", fmt.Errorf("trigger %q needs %s", tr.Name, strings.Join(ways, " or "))
}

// renderSecret renders a trigger credential from the gateway's secrets.
func (s *Server) renderSecret(tpl *templates.Template) ([]byte, error) {
	m := make(map[string]any, len(s.gw.SecretValues()))
	for k, v := range s.gw.SecretValues() {
		m[k] = v
	}
	v, err := tpl.Render(templates.MapScope{"secrets": m})
	if err != nil {
		return nil, fmt.Errorf("rendering the trigger's credential: %w", err)
	}
	str, _ := v.(string)
	if str == "" {
		return nil, errors.New("the trigger's credential is empty")
	}
	return []byte(str), nil
}

// fire hands the request to the door and answers with what it did: 202
// when it started or kept something, or a resolution applied on_resolve,
// 200 when everything was a repeat or skipped, 503 when part of it could not be taken and must be sent again
// (what was taken is found, not started twice, when it is).
func (s *Server) fire(w http.ResponseWriter, r *http.Request, tr *chain.Trigger, body []byte, sig string) {
	if body == nil {
		var err error
		if body, err = s.readBody(w, r); err != nil {
			s.door.Observer.Delivered(tr.Name, api.OutcomeRefused)
			s.writeError(w, r, err)
			return
		}
	}
	in, err := door.NewInbound(tr, body, r.Header, sig, map[string]string{"trigger": tr.Name, "remote_addr": r.RemoteAddr, "user_agent": r.UserAgent()})
	if err != nil {
		s.door.Observer.Delivered(tr.Name, api.OutcomeRefused)
		s.writeError(w, r, err)
		return
	}
	// What the sender brought is taken whether or not it waits for the
	// answer.
	resp := s.door.DeliverInbound(context.WithoutCancel(r.Context()), in, time.Now().Add(s.budget))
	code := http.StatusOK
	var did []string
	for _, res := range resp.Results {
		did = append(did, res.Action)
		if res.Run != "" && len(resp.Results) == 1 {
			audit.NoteRun(r.Context(), res.Run)
		}
		switch res.Action {
		case "failed":
			code = http.StatusServiceUnavailable
		case "started", "resolved", "parked", "queued":
			if code == http.StatusOK {
				code = http.StatusAccepted
			}
		}
	}
	if code == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "5")
	}
	audit.NoteDetail(r.Context(), strings.Join(did, ", "))
	writeJSON(w, code, resp)
}
