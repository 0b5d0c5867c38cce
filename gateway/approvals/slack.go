package approvals

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
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/gateway"
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
	SlackSignatureHeader = "X-Slack-Signature"
	slackTimestampHeader = "X-Slack-Request-Timestamp"
	// slackSkew is how far a request's timestamp may be from this
	// gateway's clock, either way, as Slack advises.
	slackSkew = 5 * time.Minute
	// SlackSeenTTL keeps a request's signature as long as a copy of it
	// could pass the timestamp check: one signed slackSkew ahead of this
	// clock passes for 2*slackSkew, and a minute more covers the clocks
	// of other gateways sharing the store.
	SlackSeenTTL = 2*slackSkew + time.Minute
	// SlackAnswerTime bounds recording an answer: Slack shows the person
	// an error unless it has its 200 within 3 s.
	SlackAnswerTime = 2 * time.Second
	// SlackReplyTime bounds posting what came of an answer to Slack.
	SlackReplyTime = 10 * time.Second
)

// SlackInteraction is what the gateway reads of the block_actions
// payload Slack posts when a message's button is clicked.
type SlackInteraction struct {
	Type string `json:"type"`
	User struct {
		ID       string `json:"id"`
		Username string `json:"username"`
	} `json:"user"`
	Actions     []gateway.SlackAction `json:"actions"`
	ResponseURL string                `json:"response_url"`
	// Message is the message the button is on.
	Message *struct {
		Text   string            `json:"text"`
		Blocks []json.RawMessage `json:"blocks"`
	} `json:"message"`
}

// SlackReply is a message posted to an interaction's response_url: the
// clicked message replaced, or a note only the person who clicked sees.
type SlackReply struct {
	ResponseType    string            `json:"response_type,omitempty"`
	ReplaceOriginal bool              `json:"replace_original"`
	Text            string            `json:"text"`
	Blocks          []json.RawMessage `json:"blocks,omitempty"`
}

// SlackNote is a reply only the person who clicked sees.
func SlackNote(text string) SlackReply {
	return SlackReply{ResponseType: "ephemeral", Text: slackEscape(text)}
}

// slackEscape escapes what Slack's message formatting reads as markup.
var slackEscape = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace

// CheckSlackSignature checks a request as Slack signs it: its
// X-Slack-Signature is v0= and the hex HMAC-SHA256, keyed with the app's
// signing secret, of "v0:", its X-Slack-Request-Timestamp, ":" and its raw
// body, and the timestamp is within slackSkew of now. It returns the
// signature, which names the request.
func CheckSlackSignature(secret []byte, h http.Header, body []byte, now time.Time) (string, error) {
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
	sig, ok := strings.CutPrefix(h.Get(SlackSignatureHeader), "v0=")
	got, err := hex.DecodeString(sig)
	if !ok || err != nil || len(got) != sha256.Size {
		return "", fmt.Errorf("checking a Slack signature: %s is not v0= and a hex HMAC-SHA256", SlackSignatureHeader)
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("v0:" + ts + ":"))
	m.Write(body)
	if !hmac.Equal(got, m.Sum(nil)) {
		return "", fmt.Errorf("checking a Slack signature: %s does not match the body", SlackSignatureHeader)
	}
	return hex.EncodeToString(got), nil
}

// ParseSlackInteraction reads the body Slack posts: form-encoded, with the
// interaction as JSON in its payload field.
func ParseSlackInteraction(body []byte) (*SlackInteraction, error) {
	form, err := url.ParseQuery(string(body))
	if err != nil {
		return nil, fmt.Errorf("reading a Slack interaction: the body is not form-encoded: %w", err)
	}
	raw := form.Get("payload")
	if raw == "" {
		return nil, errors.New("reading a Slack interaction: the body has no payload field")
	}
	var in SlackInteraction
	if err := json.Unmarshal([]byte(raw), &in); err != nil {
		return nil, fmt.Errorf("reading a Slack interaction: the payload is not an interaction: %w", err)
	}
	return &in, nil
}

// AnswerAction is the click on an answer button, if it was one.
func (in *SlackInteraction) AnswerAction() (gateway.SlackAction, bool) {
	if in.Type != "block_actions" {
		return gateway.SlackAction{}, false
	}
	for _, a := range in.Actions {
		if strings.HasPrefix(a.ActionID, gateway.SlackActionPrefix) {
			return a, true
		}
	}
	return gateway.SlackAction{}, false
}

// AnsweredMessage is the clicked message as it reads once answered: its
// answer buttons for the step gone, and who answered said below it.
func AnsweredMessage(in *SlackInteraction, a gateway.SlackAction, d *engine.Decision) SlackReply {
	said := decisionLine(d)
	if in.Message == nil {
		return SlackNote(said)
	}
	return SlackReply{ReplaceOriginal: true, Text: in.Message.Text, Blocks: settledBlocks(in.Message.Blocks, a.Value, said)}
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
			var btn gateway.SlackAction
			if json.Unmarshal(e, &btn) == nil && strings.HasPrefix(btn.ActionID, gateway.SlackActionPrefix) && btn.Value == value {
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

// SlackResponder posts what came of an answer to an interaction's
// response_url.
type SlackResponder struct {
	Client *http.Client
	// Allowed says whether a response_url may be posted to, given the
	// hosts [gateway.slack] response_url_hosts allows.
	Allowed func(u *url.URL, hosts []string) bool
}

// DefaultSlackResponder posts only to the response URLs of the hosts the
// config allows, Slack's own unless it says otherwise: any other would
// take the reply, and what it says of the run, elsewhere, and have the
// gateway make requests for whoever holds the signing secret.
var DefaultSlackResponder = &SlackResponder{
	Client: &http.Client{
		Timeout:       SlackReplyTime,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	},
	Allowed: slackResponseURLAllowed,
}

// slackResponseURLAllowed reports whether u is an https URL on one of
// hosts, exactly, with no port or user info.
func slackResponseURLAllowed(u *url.URL, hosts []string) bool {
	return u.Scheme == "https" && u.User == nil && u.Port() == "" && slices.Contains(hosts, strings.ToLower(u.Hostname()))
}

// ResponseURLHosts are the hosts an interaction's response_url may name.
func ResponseURLHosts(sl *chain.Slack) []string {
	if sl == nil || sl.ResponseURLHosts == nil {
		return chain.DefaultSlackResponseURLHosts
	}
	return sl.ResponseURLHosts
}

// Respond posts reply to an interaction's response_url. A response
// URL lets anyone holding it post to the channel for a while, so the log
// names its host only.
func (out *SlackResponder) Respond(ctx context.Context, log *slog.Logger, responseURL string, hosts []string, reply SlackReply) {
	u, err := url.Parse(responseURL)
	if err != nil || !out.Allowed(u, hosts) {
		host := ""
		if u != nil {
			host = u.Host
		}
		log.Warn("not posting an answer's outcome to Slack: the interaction's response_url is not on a host [gateway.slack] response_url_hosts allows", "host", host)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, SlackReplyTime)
	defer cancel()
	b, err := jsonx.Marshal(reply)
	if err != nil {
		log.Error("encoding an answer's outcome for Slack", "err", err)
		return
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(b))
	if err != nil {
		log.Error("posting an answer's outcome to Slack", "err", err)
		return
	}
	req.Header.Set("Content-Type", "application/json; charset=utf-8")
	resp, err := out.Client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		log.Warn("posting an answer's outcome to Slack", "host", u.Host, "err", err)
		return
	}
	defer resp.Body.Close()
	said, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		log.Warn("Slack refused an answer's outcome", "status", resp.StatusCode, "said", string(said))
	}
}
