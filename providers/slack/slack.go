// Package slack is the Slack provider: it posts and updates messages through
// the Web API (chat.postMessage, chat.update) with a bot token, and posts
// through an incoming webhook.
//
// Config: token (bot token, for post_message and update_message),
// webhook_url (for webhook_message), base_url (default
// https://slack.com/api). The token and the webhook URL are credentials:
// they never appear in messages, and the webhook URL is named only as
// "slack webhook".
//
// Slack takes no idempotency key. A post whose answer was lost (a timeout,
// a connection reset) is posted again if the step is retried, so the
// channel may show it twice; update_message is safe to repeat.
//
// It is the gateway's own package, with no compatibility promise.
package slack

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/chaingate/gateway/internal/jsonx"
	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/internal/apicall"
)

// DefaultBaseURL is the Web API's address.
const DefaultBaseURL = "https://slack.com/api"

// Action types.
const (
	PostMessage    = "post_message"
	UpdateMessage  = "update_message"
	WebhookMessage = "webhook_message"
)

const configSchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "title": "slack provider config",
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "token": {"type": "string", "minLength": 1, "x-secret": true,
      "description": "bot token (xoxb-...), for post_message and update_message"},
    "webhook_url": {"type": "string", "minLength": 1, "x-secret": true,
      "description": "incoming webhook URL, for webhook_message"},
    "base_url": {"type": "string", "minLength": 1, "default": "https://slack.com/api",
      "description": "Web API base URL"},
    "deny_private_networks": {"type": "boolean",
      "description": "refuse to connect to loopback, private and link-local addresses"}
  },
  "anyOf": [{"required": ["token"]}, {"required": ["webhook_url"]}]
}`

// Provider is the Slack provider.
type Provider struct {
	Net *apicall.Net
}

// New returns a Slack provider with its own connection pools.
func New() providers.Provider { return &Provider{Net: apicall.NewNet()} }

type config struct {
	Token               string `json:"token"`
	WebhookURL          string `json:"webhook_url"`
	BaseURL             string `json:"base_url"`
	DenyPrivateNetworks bool   `json:"deny_private_networks"`
}

// CheckConfig implements providers.ConfigChecker.
func (p *Provider) CheckConfig(_ context.Context, raw json.RawMessage) error {
	var cfg config
	if err := apicall.DecodeStrict(raw, &cfg); err != nil {
		return fmt.Errorf("decoding slack config: %w", err)
	}
	if _, err := apicall.BaseURL(cfg.BaseURL, DefaultBaseURL); err != nil {
		return err
	}
	if cfg.Token != "" && !apicall.ValidHeaderValue(cfg.Token) {
		return errors.New("the token holds a control character such as CR or LF")
	}
	if cfg.WebhookURL != "" {
		if _, err := apicall.BaseURL(cfg.WebhookURL, ""); err != nil {
			// The URL is the credential: only say what is wrong with it.
			return errors.New("webhook_url is not an http or https URL with a host")
		}
	}
	return nil
}

// content is what a message shows, in chat.postMessage, chat.update and
// webhook payloads alike.
type content struct {
	Text        string          `json:"text,omitempty"`
	Blocks      json.RawMessage `json:"blocks,omitempty"`
	Attachments json.RawMessage `json:"attachments,omitempty"`
}

type postPayload struct {
	Channel string `json:"channel"`
	content
	ThreadTS       string `json:"thread_ts,omitempty"`
	ReplyBroadcast *bool  `json:"reply_broadcast,omitempty"`
	Mrkdwn         *bool  `json:"mrkdwn,omitempty"`
	UnfurlLinks    *bool  `json:"unfurl_links,omitempty"`
	UnfurlMedia    *bool  `json:"unfurl_media,omitempty"`
	Username       string `json:"username,omitempty"`
	IconEmoji      string `json:"icon_emoji,omitempty"`
	IconURL        string `json:"icon_url,omitempty"`
}

type updatePayload struct {
	Channel string `json:"channel"`
	TS      string `json:"ts"`
	content
}

type webhookPayload struct {
	content
	ThreadTS    string `json:"thread_ts,omitempty"`
	Mrkdwn      *bool  `json:"mrkdwn,omitempty"`
	UnfurlLinks *bool  `json:"unfurl_links,omitempty"`
	UnfurlMedia *bool  `json:"unfurl_media,omitempty"`
}

// result is the step body of post_message and update_message.
type result struct {
	OK       bool   `json:"ok"`
	Channel  string `json:"channel"`
	TS       string `json:"ts"`
	ThreadTS string `json:"thread_ts,omitempty"`
}

// envelope is what every Web API method answers.
type envelope struct {
	OK      bool   `json:"ok"`
	Error   string `json:"error"`
	Channel string `json:"channel"`
	TS      string `json:"ts"`
	Message struct {
		ThreadTS string `json:"thread_ts"`
	} `json:"message"`
	ResponseMetadata struct {
		Messages []string `json:"messages"`
	} `json:"response_metadata"`
}

func (p *Provider) Describe(context.Context) (providers.Info, error) {
	return providers.Info{
		Name:         "slack",
		Version:      "1",
		ActionTypes:  []string{PostMessage, UpdateMessage, WebhookMessage},
		ConfigSchema: json.RawMessage(configSchema),
	}, nil
}

func (p *Provider) Execute(ctx context.Context, req providers.Request) (providers.Response, error) {
	var cfg config
	if err := apicall.DecodeStrict(req.Config, &cfg); err != nil {
		return providers.Response{}, providers.Permanent("bad_config", "decoding slack config: %v", err)
	}
	switch req.ActionType {
	case PostMessage:
		var pl postPayload
		if err := decodePayload(req.Payload, &pl); err != nil {
			return providers.Response{}, err
		}
		if pl.Channel == "" {
			return providers.Response{}, providers.Permanent("bad_payload", "slack post_message: channel is required")
		}
		if err := pl.check(); err != nil {
			return providers.Response{}, err
		}
		return p.callAPI(ctx, cfg, "chat.postMessage", pl)
	case UpdateMessage:
		var pl updatePayload
		if err := decodePayload(req.Payload, &pl); err != nil {
			return providers.Response{}, err
		}
		if pl.Channel == "" || pl.TS == "" {
			return providers.Response{}, providers.Permanent("bad_payload", "slack update_message: channel and ts are required (ts is the posting step's body.ts)")
		}
		if err := pl.check(); err != nil {
			return providers.Response{}, err
		}
		return p.callAPI(ctx, cfg, "chat.update", pl)
	case WebhookMessage:
		var pl webhookPayload
		if err := decodePayload(req.Payload, &pl); err != nil {
			return providers.Response{}, err
		}
		if err := pl.check(); err != nil {
			return providers.Response{}, err
		}
		return p.callWebhook(ctx, cfg, pl)
	default:
		return providers.Response{}, providers.Permanent("bad_action_type", "slack: unknown action type %q; want %s, %s or %s", req.ActionType, PostMessage, UpdateMessage, WebhookMessage)
	}
}

func decodePayload(raw json.RawMessage, v any) error {
	if err := apicall.DecodeStrict(raw, v); err != nil {
		return providers.Permanent("bad_payload", "decoding slack payload: %v", err)
	}
	return nil
}

// check applies Slack's rule that a message has text, blocks or
// attachments, and that the latter two are arrays. A null, as a template
// may render for a missing value, counts as absent.
func (c *content) check() error {
	c.Blocks, c.Attachments = nilIfNull(c.Blocks), nilIfNull(c.Attachments)
	if c.Text == "" && len(c.Blocks) == 0 && len(c.Attachments) == 0 {
		return providers.Permanent("bad_payload", "slack payload: one of text, blocks and attachments is required")
	}
	if !isArray(c.Blocks) {
		return providers.Permanent("bad_payload", "slack payload: blocks must be an array")
	}
	if !isArray(c.Attachments) {
		return providers.Permanent("bad_payload", "slack payload: attachments must be an array")
	}
	return nil
}

// isArray reports whether raw is absent or a JSON array.
func isArray(raw json.RawMessage) bool {
	return len(raw) == 0 || bytes.HasPrefix(bytes.TrimSpace(raw), []byte("["))
}

func nilIfNull(raw json.RawMessage) json.RawMessage {
	if string(bytes.TrimSpace(raw)) == "null" {
		return nil
	}
	return raw
}

func (p *Provider) callAPI(ctx context.Context, cfg config, method string, payload any) (providers.Response, error) {
	if cfg.Token == "" {
		return providers.Response{}, providers.Permanent("bad_config", "slack %s: the config has no token", method)
	}
	if !apicall.ValidHeaderValue(cfg.Token) {
		return providers.Response{}, providers.Permanent("bad_config", "slack %s: the token holds a control character such as CR or LF", method)
	}
	base, err := apicall.BaseURL(cfg.BaseURL, DefaultBaseURL)
	if err != nil {
		return providers.Response{}, providers.Permanent("bad_config", "slack: %v", err)
	}
	body, err := jsonx.Marshal(payload)
	if err != nil {
		return providers.Response{}, providers.Permanent("bad_payload", "encoding slack %s body: %v", method, err)
	}
	where := "slack " + method
	header := http.Header{}
	header.Set("Authorization", "Bearer "+cfg.Token)
	header.Set("Content-Type", "application/json; charset=utf-8")
	a, err := apicall.Post(ctx, p.Net.Client(apicall.Policy{DenyPrivate: cfg.DenyPrivateNetworks}), apicall.Request{URL: base + "/" + method, Where: where, Header: header, Body: body, Hide: []string{cfg.Token}})
	if err != nil {
		return providers.Response{}, err
	}

	var env envelope
	parsed := json.Unmarshal(a.Body, &env) == nil
	switch {
	case a.OK() && parsed && env.OK:
		if env.Channel == "" || env.TS == "" {
			return providers.Response{}, providers.Permanent("slack_bad_response", "%s: the answer has no channel or ts: %s", where, apicall.Snippet(a.Body, cfg.Token))
		}
		out, err := jsonx.Marshal(result{OK: true, Channel: env.Channel, TS: env.TS, ThreadTS: env.Message.ThreadTS})
		if err != nil {
			return providers.Response{}, providers.Permanent("slack_bad_response", "%s: encoding the result: %v", where, err)
		}
		return providers.Response{Body: out}, nil
	case a.Status == http.StatusTooManyRequests || a.Status >= 500:
		code := fmt.Sprintf("slack_http_%d", a.Status)
		if env.Error != "" {
			code = "slack_" + env.Error
		}
		return providers.Response{}, apicall.StatusError(code, where, a, env.reason(), cfg.Token)
	case parsed && env.Error != "":
		return providers.Response{}, apiError(where, a, env, cfg.Token)
	case !a.OK():
		return providers.Response{}, apicall.StatusError(fmt.Sprintf("slack_http_%d", a.Status), where, a, "", cfg.Token)
	default:
		return providers.Response{}, providers.Permanent("slack_bad_response", "%s: HTTP %d with an answer that is not Slack's: %s", where, a.Status, apicall.Snippet(a.Body, cfg.Token))
	}
}

// retryableErrors are the Web API errors that say Slack, not the request,
// is at fault; every other error, unknown ones included, is permanent,
// since repeating the same request would only fail the same way.
var retryableErrors = map[string]bool{
	"ratelimited":         true,
	"rate_limited":        true,
	"internal_error":      true,
	"fatal_error":         true,
	"service_unavailable": true,
	"request_timeout":     true,
	"team_added_to_org":   true,
}

func apiError(where string, a *apicall.Answer, env envelope, token string) error {
	msg := where + ": " + apicall.Redact(env.reason(), token)
	if !retryableErrors[env.Error] {
		return &providers.Error{Code: "slack_" + env.Error, Message: msg}
	}
	return &providers.Error{Retryable: true, Code: "slack_" + env.Error, Message: msg, RetryAfter: apicall.RetryAfter(a.Header, time.Now())}
}

// reason is Slack's error code with the detail Slack gives for it, such as
// "invalid_arguments ([ERROR] missing required field: channel)".
func (e envelope) reason() string {
	if len(e.ResponseMetadata.Messages) == 0 {
		return e.Error
	}
	return e.Error + " (" + strings.Join(e.ResponseMetadata.Messages, "; ") + ")"
}

func (p *Provider) callWebhook(ctx context.Context, cfg config, payload webhookPayload) (providers.Response, error) {
	const where = "slack webhook"
	if cfg.WebhookURL == "" {
		return providers.Response{}, providers.Permanent("bad_config", "%s: the config has no webhook_url", where)
	}
	// Only the scheme is shown: the whole URL is the credential.
	if !strings.HasPrefix(cfg.WebhookURL, "https://") && !strings.HasPrefix(cfg.WebhookURL, "http://") {
		return providers.Response{}, providers.Permanent("bad_config", "%s: webhook_url is not an http or https URL", where)
	}
	body, err := jsonx.Marshal(payload)
	if err != nil {
		return providers.Response{}, providers.Permanent("bad_payload", "encoding the slack webhook body: %v", err)
	}
	hide := webhookSecrets(cfg.WebhookURL)
	a, err := apicall.Post(ctx, p.Net.Client(apicall.Policy{DenyPrivate: cfg.DenyPrivateNetworks}), apicall.Request{URL: cfg.WebhookURL, Where: where, Body: body, Hide: hide})
	if err != nil {
		return providers.Response{}, err
	}
	if !a.OK() {
		// Slack answers webhook errors as plain text codes: invalid_payload,
		// no_service, channel_is_archived.
		code := fmt.Sprintf("slack_http_%d", a.Status)
		if text := strings.TrimSpace(string(a.Body)); isCode(text) {
			code = "slack_" + text
		}
		return providers.Response{}, apicall.StatusError(code, where, a, "", hide...)
	}
	return providers.Response{Body: json.RawMessage(`{"ok":true}`)}, nil
}

// webhookSecrets are the parts of a webhook URL an answer must not echo
// into a message: the URL, and its path, which holds the secret.
func webhookSecrets(webhookURL string) []string {
	hide := []string{webhookURL}
	if u, err := url.Parse(webhookURL); err == nil && len(u.Path) > 1 {
		hide = append(hide, u.EscapedPath(), u.Path)
	}
	return hide
}

// isCode reports whether s looks like one of Slack's error codes.
func isCode(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if (c < 'a' || c > 'z') && c != '_' && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}
