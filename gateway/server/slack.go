package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/gateway/approvals"
	"github.com/chaingate/gateway/gateway/audit"
	"github.com/chaingate/gateway/gateway/authz"
)

// slackInteractions serves POST /v1/slack/interactions, Slack's callback
// for clicks on a message's buttons. It checks Slack's signature over the
// raw body, refuses a request it has taken before, and answers the
// approval step an answer button names. Slack gets its 200 once the
// answer is recorded or refused; what came of it goes to the
// interaction's response_url.
func (s *Server) slackInteractions(w http.ResponseWriter, r *http.Request) {
	sl := s.Config().Gateway.Slack
	if sl == nil {
		s.writeError(w, r, &api.APIError{Status: http.StatusNotFound, Code: "not_found", Message: "Slack interactions are not configured: the config has no [gateway.slack]"})
		return
	}
	if r.Header.Get(approvals.SlackSignatureHeader) != "" {
		if wait := s.credentialWait(r); wait > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(wait))
			s.writeError(w, r, &api.APIError{Status: http.StatusTooManyRequests, Code: "too_many_auth_failures", Message: fmt.Sprintf("too many wrong credentials came from this address; the next one is checked in %d s", wait)})
			return
		}
	}
	body, err := s.readBody(w, r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sig, err := approvals.CheckSlackSignature([]byte(s.gw.SecretValues()[sl.SigningSecret]), r.Header, body, time.Now())
	if err != nil {
		s.refuseSlack(w, r, err)
		return
	}
	// Slack never sends an interaction twice, so a second one is a copy
	// of a captured request. The record is in the store, so a copy sent
	// to another gateway sharing it is refused too.
	switch bound, err := s.gw.Store.ClaimKey(r.Context(), "slack/request/"+sig, store.NewID(), approvals.SlackSeenTTL); {
	case err != nil:
		s.writeError(w, r, fmt.Errorf("recording a Slack request as taken: %w", err))
		return
	case bound != "":
		s.refuseSlack(w, r, errors.New("the same signed request was taken before"))
		return
	}
	in, err := approvals.ParseSlackInteraction(body)
	if err != nil {
		s.writeError(w, r, api.BadRequest("invalid_payload", "%v", err))
		return
	}
	a, ok := in.AnswerAction()
	if !ok {
		// Another of the app's buttons, a link to the console say:
		// Slack wants its 200 all the same.
		w.WriteHeader(http.StatusOK)
		return
	}
	actx, _ := audit.WithNote(audit.WithOrigin(r.Context(), audit.From(r, audit.ViaSlack, "POST /v1/slack/interactions")))
	reply := s.slackAnswer(actx, sl, in, a)
	w.WriteHeader(http.StatusOK)
	if in.ResponseURL != "" {
		go s.SlackResponder().Respond(context.WithoutCancel(r.Context()), s.log, in.ResponseURL, approvals.ResponseURLHosts(s.Config().Gateway.Slack), reply)
	}
}

// refuseSlack answers a request that is not Slack's, or not Slack's
// first, and counts a signature it brought against the sender's address;
// the log says why.
func (s *Server) refuseSlack(w http.ResponseWriter, r *http.Request, why error) {
	if r.Header.Get(approvals.SlackSignatureHeader) != "" {
		s.failedCredential(r)
	}
	s.log.Warn("Slack request refused", "remote_addr", r.RemoteAddr, "why", why.Error())
	s.writeError(w, r, &api.APIError{Status: http.StatusUnauthorized, Code: "unauthorized", Message: "a valid, fresh Slack signature is required"})
}

// slackAnswer answers the approval step button a names, as the person the
// config maps the Slack user to, and says what came of it.
func (s *Server) slackAnswer(ctx context.Context, sl *chain.Slack, in *approvals.SlackInteraction, a gateway.SlackAction) approvals.SlackReply {
	decision := strings.TrimPrefix(a.ActionID, gateway.SlackActionPrefix)
	i := strings.LastIndexByte(a.Value, '/')
	if (decision != chain.DecisionApprove && decision != chain.DecisionReject) || i <= 0 || i == len(a.Value)-1 {
		s.log.Warn("Slack click refused: not an answer button", "action_id", a.ActionID, "value", a.Value, "slack_user", in.User.ID)
		return approvals.SlackNote(fmt.Sprintf("This button answers nothing: an answer button's action_id is %q or %q, and its value is the run and the step, \"<<run.id>>/STEP\"; this one has %q and %q.",
			gateway.SlackActionPrefix+chain.DecisionApprove, gateway.SlackActionPrefix+chain.DecisionReject, a.ActionID, a.Value))
	}
	runID, step := a.Value[:i], a.Value[i+1:]
	log := s.log.With("run", runID, "step", step, "decision", decision, "slack_user", in.User.ID, "slack_username", in.User.Username)
	name, ok := sl.Users[in.User.ID]
	if !ok {
		log.Warn("Slack answer refused: [gateway.slack] users does not name the Slack user")
		return approvals.SlackNote(fmt.Sprintf("Your answer was not recorded: the gateway takes answers from Slack only from the people its [gateway.slack] users names, and your Slack user ID, %s, is not one of them.", in.User.ID))
	}
	sub, target := authz.Subject{Kind: authz.Slack, Name: name}, s.resolve(ctx, authz.Target{Kind: authz.OnRun, Name: runID})
	if err := s.Authorize(ctx, sub, authz.Approve, target); err != nil {
		log.Warn("Slack answer refused", "err", err)
		return approvals.SlackNote("Your answer was not recorded: " + err.Error())
	}
	ctx, cancel := context.WithTimeout(engine.Acting(ctx, engine.Identity{Name: name}, "Slack"), approvals.SlackAnswerTime)
	defer cancel()
	d, err := s.ops.Signal(ctx, runID, step, decision, "")
	if err != nil {
		s.Record(ctx, sub, authz.Approve, target, api.AsAPIError(err).Status, s.gw.Redactor.String(err.Error()))
	} else {
		s.Record(ctx, sub, authz.Approve, target, http.StatusOK, "")
	}
	if err != nil {
		if api.AsAPIError(err).Status >= http.StatusInternalServerError {
			log.Error("recording an answer from Slack", "err", err)
		} else {
			log.Info("Slack answer refused", "err", err)
		}
		return approvals.SlackNote("Your answer was not recorded: " + s.gw.Redactor.String(err.Error()))
	}
	return approvals.AnsweredMessage(in, a, d)
}

// SlackResponder is what posts answers' outcomes back to Slack.
func (s *Server) SlackResponder() *approvals.SlackResponder {
	if out := s.slackOut.Load(); out != nil {
		return out
	}
	return approvals.DefaultSlackResponder
}
