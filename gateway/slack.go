package gateway

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/gateway/authz"
	"github.com/chaingate/gateway/internal/jsonx"
)

// Approvals answered in Slack. A chain's Slack step posts a message with
// buttons whose action_id is chaingate:approve or chaingate:reject and
// whose value is RUN/STEP; Slack posts each click to
// POST /v1/slack/interactions, signed with the Slack app's signing secret.
// A click answers the approval step through the engine, as the API and
// the console do, as the person [gateway.slack] users maps the Slack user
// to, so the first answer wins on every path.

const (
	slackSignatureHeader = "X-Slack-Signature"
	slackTimestampHeader = "X-Slack-Request-Timestamp"
	// slackActionPrefix starts the action_id of an answer button; the
	// decision follows it.
	slackActionPrefix = "chaingate:"
	// slackSkew is how far a request's timestamp may be from this
	// gateway's clock, either way, as Slack advises.
	slackSkew = 5 * time.Minute
	// slackSeenTTL keeps a request's signature as long as a copy of it
	// could pass the timestamp check: one signed slackSkew ahead of this
	// clock passes for 2*slackSkew, and a minute more covers the clocks
	// of other gateways sharing the store.
	slackSeenTTL = 2*slackSkew + time.Minute
	// slackAnswerTime bounds recording an answer: Slack shows the person
	// an error unless it has its 200 within 3 s.
	slackAnswerTime = 2 * time.Second
	// slackReplyTime bounds posting what came of an answer to Slack.
	slackReplyTime = 10 * time.Second
)

// slackInteraction is what the gateway reads of the block_actions
// payload Slack posts when a message's button is clicked.
type slackInteraction struct {
	Type string `json:"type"`
	User struct {
		ID       string `json:"id"`
		Username string `json:"username"`
	} `json:"user"`
	Actions     []slackAction `json:"actions"`
	ResponseURL string        `json:"response_url"`
	// Message is the message the button is on.
	Message *struct {
		Text   string            `json:"text"`
		Blocks []json.RawMessage `json:"blocks"`
	} `json:"message"`
}

type slackAction struct {
	ActionID string `json:"action_id"`
	Value    string `json:"value"`
}

// slackReply is a message posted to an interaction's response_url: the
// clicked message replaced, or a note only the person who clicked sees.
type slackReply struct {
	ResponseType    string            `json:"response_type,omitempty"`
	ReplaceOriginal bool              `json:"replace_original"`
	Text            string            `json:"text"`
	Blocks          []json.RawMessage `json:"blocks,omitempty"`
}

// slackNote is a reply only the person who clicked sees.
func slackNote(text string) slackReply {
	return slackReply{ResponseType: "ephemeral", Text: slackEscape(text)}
}

// slackEscape escapes what Slack's message formatting reads as markup.
var slackEscape = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace

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
	if r.Header.Get(slackSignatureHeader) != "" {
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
	sig, err := checkSlackSignature([]byte(s.gw.secrets[sl.SigningSecret]), r.Header, body, time.Now())
	if err != nil {
		s.refuseSlack(w, r, err)
		return
	}
	// Slack never sends an interaction twice, so a second one is a copy
	// of a captured request. The record is in the store, so a copy sent
	// to another gateway sharing it is refused too.
	switch bound, err := s.gw.Store.ClaimKey(r.Context(), "slack/request/"+sig, store.NewID(), slackSeenTTL); {
	case err != nil:
		s.writeError(w, r, fmt.Errorf("recording a Slack request as taken: %w", err))
		return
	case bound != "":
		s.refuseSlack(w, r, errors.New("the same signed request was taken before"))
		return
	}
	in, err := parseSlackInteraction(body)
	if err != nil {
		s.writeError(w, r, api.BadRequest("invalid_payload", "%v", err))
		return
	}
	a, ok := in.answerAction()
	if !ok {
		// Another of the app's buttons, a link to the console say:
		// Slack wants its 200 all the same.
		w.WriteHeader(http.StatusOK)
		return
	}
	reply := s.slackAnswer(r.Context(), sl, in, a)
	w.WriteHeader(http.StatusOK)
	if in.ResponseURL != "" {
		go s.slackRespond(context.WithoutCancel(r.Context()), in.ResponseURL, reply)
	}
}

// refuseSlack answers a request that is not Slack's, or not Slack's
// first, and counts a signature it brought against the sender's address;
// the log says why.
func (s *Server) refuseSlack(w http.ResponseWriter, r *http.Request, why error) {
	if r.Header.Get(slackSignatureHeader) != "" {
		s.failedCredential(r)
	}
	s.log.Warn("Slack request refused", "remote_addr", r.RemoteAddr, "why", why.Error())
	s.writeError(w, r, &api.APIError{Status: http.StatusUnauthorized, Code: "unauthorized", Message: "a valid, fresh Slack signature is required"})
}

// checkSlackSignature checks a request as Slack signs it: its
// X-Slack-Signature is v0= and the hex HMAC-SHA256, keyed with the app's
// signing secret, of "v0:", its X-Slack-Request-Timestamp, ":" and its raw
// body, and the timestamp is within slackSkew of now. It returns the
// signature, which names the request.
func checkSlackSignature(secret []byte, h http.Header, body []byte, now time.Time) (string, error) {
	if len(secret) == 0 {
		return "", errors.New("checking a Slack signature: the signing secret is empty")
	}
	ts := h.Get(slackTimestampHeader)
	secs, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return "", fmt.Errorf("checking a Slack signature: %s %.32q is not Unix seconds", slackTimestampHeader, ts)
	}
	if at := time.Unix(secs, 0); now.Sub(at) > slackSkew || at.Sub(now) > slackSkew {
		return "", fmt.Errorf("checking a Slack signature: signed at %s, more than %s from this gateway's clock (%s)", at.UTC().Format(time.RFC3339), slackSkew, now.UTC().Format(time.RFC3339))
	}
	sig, ok := strings.CutPrefix(h.Get(slackSignatureHeader), "v0=")
	got, err := hex.DecodeString(sig)
	if !ok || err != nil || len(got) != sha256.Size {
		return "", fmt.Errorf("checking a Slack signature: %s is not v0= and a hex HMAC-SHA256", slackSignatureHeader)
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("v0:" + ts + ":"))
	m.Write(body)
	if !hmac.Equal(got, m.Sum(nil)) {
		return "", fmt.Errorf("checking a Slack signature: %s does not match the body", slackSignatureHeader)
	}
	return hex.EncodeToString(got), nil
}

// parseSlackInteraction reads the body Slack posts: form-encoded, with the
// interaction as JSON in its payload field.
func parseSlackInteraction(body []byte) (*slackInteraction, error) {
	form, err := url.ParseQuery(string(body))
	if err != nil {
		return nil, fmt.Errorf("reading a Slack interaction: the body is not form-encoded: %w", err)
	}
	raw := form.Get("payload")
	if raw == "" {
		return nil, errors.New("reading a Slack interaction: the body has no payload field")
	}
	var in slackInteraction
	if err := json.Unmarshal([]byte(raw), &in); err != nil {
		return nil, fmt.Errorf("reading a Slack interaction: the payload is not an interaction: %w", err)
	}
	return &in, nil
}

// answerAction is the click on an answer button, if it was one.
func (in *slackInteraction) answerAction() (slackAction, bool) {
	if in.Type != "block_actions" {
		return slackAction{}, false
	}
	for _, a := range in.Actions {
		if strings.HasPrefix(a.ActionID, slackActionPrefix) {
			return a, true
		}
	}
	return slackAction{}, false
}

// slackAnswer answers the approval step button a names, as the person the
// config maps the Slack user to, and says what came of it.
func (s *Server) slackAnswer(ctx context.Context, sl *chain.Slack, in *slackInteraction, a slackAction) slackReply {
	decision := strings.TrimPrefix(a.ActionID, slackActionPrefix)
	i := strings.LastIndexByte(a.Value, '/')
	if (decision != chain.DecisionApprove && decision != chain.DecisionReject) || i <= 0 || i == len(a.Value)-1 {
		s.log.Warn("Slack click refused: not an answer button", "action_id", a.ActionID, "value", a.Value, "slack_user", in.User.ID)
		return slackNote(fmt.Sprintf("This button answers nothing: an answer button's action_id is %q or %q, and its value is the run and the step, \"<<run.id>>/STEP\"; this one has %q and %q.",
			slackActionPrefix+chain.DecisionApprove, slackActionPrefix+chain.DecisionReject, a.ActionID, a.Value))
	}
	runID, step := a.Value[:i], a.Value[i+1:]
	log := s.log.With("run", runID, "step", step, "decision", decision, "slack_user", in.User.ID, "slack_username", in.User.Username)
	name, ok := sl.Users[in.User.ID]
	if !ok {
		log.Warn("Slack answer refused: [gateway.slack] users does not name the Slack user")
		return slackNote(fmt.Sprintf("Your answer was not recorded: the gateway takes answers from Slack only from the people its [gateway.slack] users names, and your Slack user ID, %s, is not one of them.", in.User.ID))
	}
	if err := s.Authorize(ctx, authz.Subject{Kind: authz.Slack, Name: name}, authz.Approve, authz.Target{Kind: authz.OnRun, Name: runID}); err != nil {
		log.Warn("Slack answer refused", "err", err)
		return slackNote("Your answer was not recorded: " + err.Error())
	}
	ctx, cancel := context.WithTimeout(engine.WithActor(ctx, name+" (Slack)"), slackAnswerTime)
	defer cancel()
	d, err := s.ops.Signal(ctx, runID, step, decision, "")
	if err != nil {
		if api.AsAPIError(err).Status >= http.StatusInternalServerError {
			log.Error("recording an answer from Slack", "err", err)
		} else {
			log.Info("Slack answer refused", "err", err)
		}
		return slackNote("Your answer was not recorded: " + s.gw.Redactor.String(err.Error()))
	}
	return answeredMessage(in, a, d)
}

// answeredMessage is the clicked message as it reads once answered: its
// answer buttons for the step gone, and who answered said below it.
func answeredMessage(in *slackInteraction, a slackAction, d *engine.Decision) slackReply {
	said := decisionLine(d)
	if in.Message == nil {
		return slackNote(said)
	}
	return slackReply{ReplaceOriginal: true, Text: in.Message.Text, Blocks: settledBlocks(in.Message.Blocks, a.Value, said)}
}

// slackStamp is how a message says when something happened.
const slackStamp = "2006-01-02 15:04 UTC"

// decisionLine says under a question's message what its answer was.
func decisionLine(d *engine.Decision) string {
	verb, mark := "Approved", ":white_check_mark:"
	if d.Decision == chain.DecisionReject {
		verb, mark = "Rejected", ":x:"
	}
	if d.TimedOut {
		return fmt.Sprintf("%s %s at %s: no answer before the step's deadline", mark, verb, d.At.UTC().Format(slackStamp))
	}
	return fmt.Sprintf("%s %s by %s at %s", mark, verb, d.By, d.At.UTC().Format(slackStamp))
}

// settledBlocks are a question's blocks once it no longer stands: without
// the answer buttons whose value is value, and with said below them.
func settledBlocks(blocks []json.RawMessage, value, said string) []json.RawMessage {
	note, _ := jsonx.Marshal(map[string]any{"type": "context", "elements": []any{map[string]any{"type": "plain_text", "text": said, "emoji": true}}})
	return append(withoutAnswerButtons(blocks, value), note)
}

// withoutAnswerButtons is blocks without the answer buttons whose value
// is value, and without an actions block they leave empty. Other blocks,
// and other buttons (a link to the console, say), stay as they are.
func withoutAnswerButtons(blocks []json.RawMessage, value string) []json.RawMessage {
	out := make([]json.RawMessage, 0, len(blocks)+1)
	for _, raw := range blocks {
		var b struct {
			Type     string            `json:"type"`
			Elements []json.RawMessage `json:"elements"`
		}
		if json.Unmarshal(raw, &b) != nil || b.Type != "actions" {
			out = append(out, raw)
			continue
		}
		var kept []json.RawMessage
		for _, e := range b.Elements {
			var btn slackAction
			if json.Unmarshal(e, &btn) == nil && strings.HasPrefix(btn.ActionID, slackActionPrefix) && btn.Value == value {
				continue
			}
			kept = append(kept, e)
		}
		if len(kept) == len(b.Elements) {
			out = append(out, raw)
			continue
		}
		if len(kept) == 0 {
			continue
		}
		var whole map[string]json.RawMessage
		if json.Unmarshal(raw, &whole) != nil {
			continue
		}
		whole["elements"], _ = jsonx.Marshal(kept)
		if rewritten, err := jsonx.Marshal(whole); err == nil {
			out = append(out, rewritten)
		}
	}
	return out
}

// slackResponder posts what came of an answer to an interaction's
// response_url.
type slackResponder struct {
	client *http.Client
	// allowed says whether a response_url may be posted to, given the
	// hosts [gateway.slack] response_url_hosts allows.
	allowed func(u *url.URL, hosts []string) bool
}

// defaultSlackResponder posts only to the response URLs of the hosts the
// config allows, Slack's own unless it says otherwise: any other would
// take the reply, and what it says of the run, elsewhere, and have the
// gateway make requests for whoever holds the signing secret.
var defaultSlackResponder = &slackResponder{
	client: &http.Client{
		Timeout:       slackReplyTime,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	},
	allowed: slackResponseURLAllowed,
}

// slackResponseURLAllowed reports whether u is an https URL on one of
// hosts, exactly, with no port or user info.
func slackResponseURLAllowed(u *url.URL, hosts []string) bool {
	return u.Scheme == "https" && u.User == nil && u.Port() == "" && slices.Contains(hosts, strings.ToLower(u.Hostname()))
}

// responseURLHosts are the hosts an interaction's response_url may name.
func responseURLHosts(sl *chain.Slack) []string {
	if sl == nil || sl.ResponseURLHosts == nil {
		return chain.DefaultSlackResponseURLHosts
	}
	return sl.ResponseURLHosts
}

func (s *Server) slackResponder() *slackResponder {
	if out := s.slackOut.Load(); out != nil {
		return out
	}
	return defaultSlackResponder
}

// slackRespond posts reply to an interaction's response_url. A response
// URL lets anyone holding it post to the channel for a while, so the log
// names its host only.
func (s *Server) slackRespond(ctx context.Context, responseURL string, reply slackReply) {
	out := s.slackResponder()
	u, err := url.Parse(responseURL)
	if err != nil || !out.allowed(u, responseURLHosts(s.Config().Gateway.Slack)) {
		host := ""
		if u != nil {
			host = u.Host
		}
		s.log.Warn("not posting an answer's outcome to Slack: the interaction's response_url is not on a host [gateway.slack] response_url_hosts allows", "host", host)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, slackReplyTime)
	defer cancel()
	b, err := jsonx.Marshal(reply)
	if err != nil {
		s.log.Error("encoding an answer's outcome for Slack", "err", err)
		return
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(b))
	if err != nil {
		s.log.Error("posting an answer's outcome to Slack", "err", err)
		return
	}
	req.Header.Set("Content-Type", "application/json; charset=utf-8")
	resp, err := out.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		s.log.Warn("posting an answer's outcome to Slack", "host", u.Host, "err", err)
		return
	}
	defer resp.Body.Close()
	said, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		s.log.Warn("Slack refused an answer's outcome", "status", resp.StatusCode, "said", string(said))
	}
}
