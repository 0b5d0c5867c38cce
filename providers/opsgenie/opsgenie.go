// Package opsgenie is the Opsgenie provider: it creates, acknowledges and
// closes alerts through the Alert API (v2).
//
// Config: api_key (the key of an API integration; a credential), base_url
// (default https://api.opsgenie.com; accounts in the EU region use
// https://api.eu.opsgenie.com).
//
// A created alert's alias is the payload's alias, or else the step's dedup
// key, so a retried or replayed create lands on the same open alert, which
// Opsgenie deduplicates, instead of opening a second one. Opsgenie takes
// at most 512 characters; a longer alias is shortened deterministically
// (see apicall.ShortenKey). The step body carries the alias, for a later
// acknowledge or close step.
//
// Opsgenie processes alert requests asynchronously: its 202 answer means
// the request was accepted, and the body's request_id identifies it in
// GET /v2/alerts/requests/{id}, which tells whether it then succeeded.
//
// It is the gateway's own package, with no compatibility promise.
package opsgenie

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"

	"github.com/chaingate/gateway/internal/jsonx"
	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/internal/apicall"
)

// DefaultBaseURL is the Alert API's address for accounts outside the EU.
const DefaultBaseURL = "https://api.opsgenie.com"

// Action types.
const (
	CreateAlert      = "create_alert"
	AcknowledgeAlert = "acknowledge_alert"
	CloseAlert       = "close_alert"
)

// MaxAliasBytes is Opsgenie's limit on an alias.
const MaxAliasBytes = 512

// MaxMessageChars is Opsgenie's limit on an alert's message; a longer one
// is cut and ends with "…".
const MaxMessageChars = 130

const configSchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "title": "opsgenie provider config",
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "api_key": {"type": "string", "minLength": 1, "x-secret": true,
      "description": "key of an Opsgenie API integration"},
    "base_url": {"type": "string", "minLength": 1, "default": "https://api.opsgenie.com",
      "description": "Alert API base URL; https://api.eu.opsgenie.com for EU accounts"},
    "deny_private_networks": {"type": "boolean",
      "description": "refuse to connect to loopback, private and link-local addresses"}
  },
  "required": ["api_key"]
}`

// Provider is the Opsgenie provider.
type Provider struct {
	Net *apicall.Net
}

// New returns an Opsgenie provider with its own connection pool.
func New() providers.Provider { return &Provider{Net: apicall.NewNet()} }

type config struct {
	APIKey              string `json:"api_key"`
	BaseURL             string `json:"base_url"`
	DenyPrivateNetworks bool   `json:"deny_private_networks"`
}

// checkConfig checks a decoded config and returns the base URL to call.
func checkConfig(cfg config) (string, error) {
	if cfg.APIKey == "" {
		return "", errors.New("the config has no api_key")
	}
	if !apicall.ValidHeaderValue(cfg.APIKey) {
		return "", errors.New("the api_key holds a control character such as CR or LF")
	}
	return apicall.BaseURL(cfg.BaseURL, DefaultBaseURL)
}

// CheckConfig implements providers.ConfigChecker.
func (p *Provider) CheckConfig(_ context.Context, raw json.RawMessage) error {
	var cfg config
	if err := apicall.DecodeStrict(raw, &cfg); err != nil {
		return fmt.Errorf("decoding opsgenie config: %w", err)
	}
	_, err := checkConfig(cfg)
	return err
}

type responder struct {
	Type     string `json:"type"`
	ID       string `json:"id,omitempty"`
	Name     string `json:"name,omitempty"`
	Username string `json:"username,omitempty"`
}

// alert is both a create_alert step's payload and the request body: the
// step speaks Opsgenie's field names, visibleTo included.
type alert struct {
	Message     string            `json:"message"`
	Alias       string            `json:"alias,omitempty"`
	Description string            `json:"description,omitempty"`
	Responders  []responder       `json:"responders,omitempty"`
	VisibleTo   []responder       `json:"visibleTo,omitempty"`
	Actions     []string          `json:"actions,omitempty"`
	Tags        []string          `json:"tags,omitempty"`
	Details     map[string]string `json:"details,omitempty"`
	Entity      string            `json:"entity,omitempty"`
	Source      string            `json:"source,omitempty"`
	Priority    string            `json:"priority,omitempty"`
	User        string            `json:"user,omitempty"`
	Note        string            `json:"note,omitempty"`
}

// followUp is an acknowledge_alert or close_alert step's payload; the
// request body is the same without the alias, which goes in the path.
type followUp struct {
	Alias  string `json:"alias,omitempty"`
	User   string `json:"user,omitempty"`
	Source string `json:"source,omitempty"`
	Note   string `json:"note,omitempty"`
}

// answer is what the Alert API answers, success and failure alike.
type answer struct {
	Result    string            `json:"result"`
	Message   string            `json:"message"`
	RequestID string            `json:"requestId"`
	Errors    map[string]string `json:"errors"`
}

type result struct {
	Alias     string `json:"alias"`
	RequestID string `json:"request_id"`
	Result    string `json:"result"`
}

func (p *Provider) Describe(context.Context) (providers.Info, error) {
	return providers.Info{
		Name:         "opsgenie",
		Version:      "1",
		ActionTypes:  []string{CreateAlert, AcknowledgeAlert, CloseAlert},
		ConfigSchema: json.RawMessage(configSchema),
	}, nil
}

func (p *Provider) Execute(ctx context.Context, req providers.Request) (providers.Response, error) {
	var cfg config
	if err := apicall.DecodeStrict(req.Config, &cfg); err != nil {
		return providers.Response{}, providers.Permanent("bad_config", "decoding opsgenie config: %v", err)
	}
	base, err := checkConfig(cfg)
	if err != nil {
		return providers.Response{}, providers.Permanent("bad_config", "opsgenie: %v", err)
	}

	switch req.ActionType {
	case CreateAlert:
		var pl alert
		if err := decodePayload(req.Payload, &pl); err != nil {
			return providers.Response{}, err
		}
		if err := pl.check(); err != nil {
			return providers.Response{}, err
		}
		if pl.Alias == "" {
			pl.Alias = req.DedupKey
		}
		pl.Alias = apicall.ShortenKey(pl.Alias, MaxAliasBytes)
		pl.Message = apicall.Truncate(pl.Message, MaxMessageChars)
		return p.send(ctx, cfg, base+"/v2/alerts", "opsgenie "+req.ActionType, pl.Alias, pl)
	case AcknowledgeAlert, CloseAlert:
		var pl followUp
		if err := decodePayload(req.Payload, &pl); err != nil {
			return providers.Response{}, err
		}
		// The step's own dedup key names this step, not the alert.
		if pl.Alias == "" {
			return providers.Response{}, providers.Permanent("bad_payload", "opsgenie %s: alias is required: it names the alert; pass the create step's, e.g. alias = \"<<steps.alert.body.alias>>\"", req.ActionType)
		}
		alias := apicall.ShortenKey(pl.Alias, MaxAliasBytes)
		pl.Alias = ""
		verb := strings.TrimSuffix(req.ActionType, "_alert")
		target := base + "/v2/alerts/" + url.PathEscape(alias) + "/" + verb + "?identifierType=alias"
		return p.send(ctx, cfg, target, "opsgenie "+req.ActionType, alias, pl)
	default:
		return providers.Response{}, providers.Permanent("bad_action_type", "opsgenie: unknown action type %q; want %s, %s or %s", req.ActionType, CreateAlert, AcknowledgeAlert, CloseAlert)
	}
}

func decodePayload(raw json.RawMessage, v any) error {
	if err := apicall.DecodeStrict(raw, v); err != nil {
		return providers.Permanent("bad_payload", "decoding opsgenie payload: %v", err)
	}
	return nil
}

func (a *alert) check() error {
	if a.Message == "" {
		return providers.Permanent("bad_payload", "opsgenie create_alert: message is required")
	}
	if a.Priority != "" && !slices.Contains([]string{"P1", "P2", "P3", "P4", "P5"}, a.Priority) {
		return providers.Permanent("bad_payload", "opsgenie create_alert: priority %q is not one of P1, P2, P3, P4, P5", a.Priority)
	}
	if err := checkResponders("responders", a.Responders, "team", "user", "escalation", "schedule"); err != nil {
		return err
	}
	return checkResponders("visibleTo", a.VisibleTo, "team", "user")
}

func checkResponders(field string, rs []responder, types ...string) error {
	for i, r := range rs {
		if !slices.Contains(types, r.Type) {
			return providers.Permanent("bad_payload", "opsgenie create_alert: %s[%d].type %q is not one of %s", field, i, r.Type, strings.Join(types, ", "))
		}
		if r.ID == "" && r.Name == "" && r.Username == "" {
			return providers.Permanent("bad_payload", "opsgenie create_alert: %s[%d] needs an id, a name or a username", field, i)
		}
	}
	return nil
}

func (p *Provider) send(ctx context.Context, cfg config, target, where, alias string, v any) (providers.Response, error) {
	body, err := jsonx.Marshal(v)
	if err != nil {
		return providers.Response{}, providers.Permanent("bad_payload", "encoding the %s body: %v", where, err)
	}
	header := http.Header{}
	header.Set("Authorization", "GenieKey "+cfg.APIKey)
	a, err := apicall.Post(ctx, p.Net.Client(apicall.Policy{DenyPrivate: cfg.DenyPrivateNetworks}), apicall.Request{URL: target, Where: where, Header: header, Body: body, Hide: []string{cfg.APIKey}})
	if err != nil {
		return providers.Response{}, err
	}
	var ans answer
	parsed := json.Unmarshal(a.Body, &ans) == nil
	if !a.OK() {
		reason := ""
		if parsed {
			reason = ans.reason()
		}
		return providers.Response{}, apicall.StatusError(fmt.Sprintf("opsgenie_http_%d", a.Status), where, a, reason, cfg.APIKey)
	}
	if !parsed || ans.RequestID == "" {
		return providers.Response{}, providers.Permanent("opsgenie_bad_response", "%s: HTTP %d with an answer that is not Opsgenie's: %s", where, a.Status, apicall.Snippet(a.Body, cfg.APIKey))
	}
	out, err := jsonx.Marshal(result{Alias: alias, RequestID: ans.RequestID, Result: ans.Result})
	if err != nil {
		return providers.Response{}, providers.Permanent("opsgenie_bad_response", "%s: encoding the result: %v", where, err)
	}
	return providers.Response{Body: out}, nil
}

// reason is Opsgenie's message with its per-field errors and request id,
// which Opsgenie's support asks for.
func (a answer) reason() string {
	var b strings.Builder
	b.WriteString(a.Message)
	fields := make([]string, 0, len(a.Errors))
	for f := range a.Errors {
		fields = append(fields, f)
	}
	sort.Strings(fields)
	for _, f := range fields {
		fmt.Fprintf(&b, "; %s: %s", f, a.Errors[f])
	}
	if a.RequestID != "" {
		fmt.Fprintf(&b, " (request id %s)", a.RequestID)
	}
	return strings.TrimPrefix(b.String(), "; ")
}
