// Package pagerduty is the PagerDuty provider: it sends events to the
// Events API v2 — trigger, acknowledge and resolve alerts, and change events.
//
// Config: routing_key (the integration key of a service's Events API v2
// integration; a credential), base_url (default
// https://events.pagerduty.com).
//
// A trigger's dedup_key is the payload's dedup_key, or else the step's
// dedup key, so a retried or replayed trigger updates the same alert
// instead of opening a second one. PagerDuty takes at most 255 characters;
// a longer key is shortened deterministically (see apicall.ShortenKey), so
// the same long key always names the same alert. The step body carries the
// key, for a later acknowledge or resolve step.
//
// It is the gateway's own package, with no compatibility promise.
package pagerduty

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/chaingate/gateway/internal/jsonx"
	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/internal/apicall"
)

// DefaultBaseURL is the Events API's address.
const DefaultBaseURL = "https://events.pagerduty.com"

// Action types.
const (
	Trigger     = "trigger"
	Acknowledge = "acknowledge"
	Resolve     = "resolve"
	Change      = "change"
)

// MaxDedupKeyBytes is PagerDuty's limit on a dedup_key.
const MaxDedupKeyBytes = 255

// MaxSummaryChars is PagerDuty's limit on a summary; a longer one is cut
// and ends with "…".
const MaxSummaryChars = 1024

const configSchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "title": "pagerduty provider config",
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "routing_key": {"type": "string", "minLength": 1, "x-secret": true,
      "description": "integration key of the service's Events API v2 integration"},
    "base_url": {"type": "string", "minLength": 1, "default": "https://events.pagerduty.com",
      "description": "Events API base URL"},
    "deny_private_networks": {"type": "boolean",
      "description": "refuse to connect to loopback, private and link-local addresses"}
  },
  "required": ["routing_key"]
}`

// Provider is the PagerDuty provider.
type Provider struct {
	Net *apicall.Net
}

// New returns a PagerDuty provider with its own connection pool.
func New() providers.Provider { return &Provider{Net: apicall.NewNet()} }

type config struct {
	RoutingKey          string `json:"routing_key"`
	BaseURL             string `json:"base_url"`
	DenyPrivateNetworks bool   `json:"deny_private_networks"`
}

// checkConfig checks a decoded config and returns the base URL to call.
func checkConfig(cfg config) (string, error) {
	if cfg.RoutingKey == "" {
		return "", errors.New("the config has no routing_key")
	}
	return apicall.BaseURL(cfg.BaseURL, DefaultBaseURL)
}

// CheckConfig implements providers.ConfigChecker.
func (p *Provider) CheckConfig(_ context.Context, raw json.RawMessage) error {
	var cfg config
	if err := apicall.DecodeStrict(raw, &cfg); err != nil {
		return fmt.Errorf("decoding pagerduty config: %w", err)
	}
	_, err := checkConfig(cfg)
	return err
}

type image struct {
	Src  string `json:"src"`
	Href string `json:"href,omitempty"`
	Alt  string `json:"alt,omitempty"`
}

type link struct {
	Href string `json:"href"`
	Text string `json:"text,omitempty"`
}

// triggerPayload is a trigger step's payload: the event's fields, flat.
type triggerPayload struct {
	DedupKey      string          `json:"dedup_key"`
	Summary       string          `json:"summary"`
	Source        string          `json:"source"`
	Severity      string          `json:"severity"`
	Timestamp     string          `json:"timestamp"`
	Component     string          `json:"component"`
	Group         string          `json:"group"`
	Class         string          `json:"class"`
	CustomDetails json.RawMessage `json:"custom_details"`
	Images        []image         `json:"images"`
	Links         []link          `json:"links"`
	Client        string          `json:"client"`
	ClientURL     string          `json:"client_url"`
}

// followUpPayload is an acknowledge or resolve step's payload.
type followUpPayload struct {
	DedupKey string `json:"dedup_key"`
}

type changeStepPayload struct {
	Summary       string          `json:"summary"`
	Source        string          `json:"source"`
	Timestamp     string          `json:"timestamp"`
	CustomDetails json.RawMessage `json:"custom_details"`
	Links         []link          `json:"links"`
}

// event is what POST /v2/enqueue takes.
type event struct {
	RoutingKey  string        `json:"routing_key"`
	EventAction string        `json:"event_action"`
	DedupKey    string        `json:"dedup_key,omitempty"`
	Payload     *eventPayload `json:"payload,omitempty"`
	Images      []image       `json:"images,omitempty"`
	Links       []link        `json:"links,omitempty"`
	Client      string        `json:"client,omitempty"`
	ClientURL   string        `json:"client_url,omitempty"`
}

type eventPayload struct {
	Summary       string          `json:"summary"`
	Source        string          `json:"source"`
	Severity      string          `json:"severity"`
	Timestamp     string          `json:"timestamp,omitempty"`
	Component     string          `json:"component,omitempty"`
	Group         string          `json:"group,omitempty"`
	Class         string          `json:"class,omitempty"`
	CustomDetails json.RawMessage `json:"custom_details,omitempty"`
}

// changeEvent is what POST /v2/change/enqueue takes.
type changeEvent struct {
	RoutingKey string        `json:"routing_key"`
	Payload    changePayload `json:"payload"`
	Links      []link        `json:"links,omitempty"`
}

type changePayload struct {
	Summary       string          `json:"summary"`
	Source        string          `json:"source,omitempty"`
	Timestamp     string          `json:"timestamp,omitempty"`
	CustomDetails json.RawMessage `json:"custom_details,omitempty"`
}

// answer is what the Events API answers, success and failure alike; it is
// also the step body, without errors.
type answer struct {
	Status   string   `json:"status"`
	Message  string   `json:"message"`
	DedupKey string   `json:"dedup_key,omitempty"`
	Errors   []string `json:"errors,omitempty"`
}

func (p *Provider) Describe(context.Context) (providers.Info, error) {
	return providers.Info{
		Name:         "pagerduty",
		Version:      "1",
		ActionTypes:  []string{Trigger, Acknowledge, Resolve, Change},
		ConfigSchema: json.RawMessage(configSchema),
	}, nil
}

func (p *Provider) Execute(ctx context.Context, req providers.Request) (providers.Response, error) {
	var cfg config
	if err := apicall.DecodeStrict(req.Config, &cfg); err != nil {
		return providers.Response{}, providers.Permanent("bad_config", "decoding pagerduty config: %v", err)
	}
	base, err := checkConfig(cfg)
	if err != nil {
		return providers.Response{}, providers.Permanent("bad_config", "pagerduty: %v", err)
	}

	var body any
	path := "/v2/enqueue"
	switch req.ActionType {
	case Trigger:
		ev, err := triggerEvent(cfg.RoutingKey, req)
		if err != nil {
			return providers.Response{}, err
		}
		body = ev
	case Acknowledge, Resolve:
		var pl followUpPayload
		if err := decodePayload(req.Payload, &pl); err != nil {
			return providers.Response{}, err
		}
		// The step's own dedup key names this step, not the alert.
		if pl.DedupKey == "" {
			return providers.Response{}, providers.Permanent("bad_payload", "pagerduty %s: dedup_key is required: it names the alert to %s; pass the trigger step's, e.g. dedup_key = \"<<steps.page.body.dedup_key>>\"", req.ActionType, req.ActionType)
		}
		body = event{RoutingKey: cfg.RoutingKey, EventAction: req.ActionType, DedupKey: apicall.ShortenKey(pl.DedupKey, MaxDedupKeyBytes)}
	case Change:
		ev, err := changeEventOf(cfg.RoutingKey, req.Payload)
		if err != nil {
			return providers.Response{}, err
		}
		body, path = ev, "/v2/change/enqueue"
	default:
		return providers.Response{}, providers.Permanent("bad_action_type", "pagerduty: unknown action type %q; want %s, %s, %s or %s", req.ActionType, Trigger, Acknowledge, Resolve, Change)
	}
	return p.send(ctx, cfg, base+path, "pagerduty "+req.ActionType, body)
}

func decodePayload(raw json.RawMessage, v any) error {
	if err := apicall.DecodeStrict(raw, v); err != nil {
		return providers.Permanent("bad_payload", "decoding pagerduty payload: %v", err)
	}
	return nil
}

func triggerEvent(routingKey string, req providers.Request) (event, error) {
	var pl triggerPayload
	if err := decodePayload(req.Payload, &pl); err != nil {
		return event{}, err
	}
	var missing []string
	for _, f := range []struct{ name, value string }{{"summary", pl.Summary}, {"source", pl.Source}, {"severity", pl.Severity}} {
		if f.value == "" {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return event{}, providers.Permanent("bad_payload", "pagerduty trigger: missing required fields: %s", strings.Join(missing, ", "))
	}
	switch pl.Severity {
	case "critical", "error", "warning", "info":
	default:
		return event{}, providers.Permanent("bad_payload", "pagerduty trigger: severity %q is not one of critical, error, warning, info", pl.Severity)
	}
	for i, im := range pl.Images {
		if im.Src == "" {
			return event{}, providers.Permanent("bad_payload", "pagerduty trigger: images[%d].src is required", i)
		}
	}
	if err := checkLinks(pl.Links); err != nil {
		return event{}, err
	}
	key := pl.DedupKey
	if key == "" {
		key = req.DedupKey
	}
	return event{
		RoutingKey:  routingKey,
		EventAction: Trigger,
		DedupKey:    apicall.ShortenKey(key, MaxDedupKeyBytes),
		Payload: &eventPayload{
			Summary: apicall.Truncate(pl.Summary, MaxSummaryChars), Source: pl.Source, Severity: pl.Severity,
			Timestamp: pl.Timestamp, Component: pl.Component, Group: pl.Group, Class: pl.Class,
			CustomDetails: nilIfNull(pl.CustomDetails),
		},
		Images: pl.Images, Links: pl.Links, Client: pl.Client, ClientURL: pl.ClientURL,
	}, nil
}

func changeEventOf(routingKey string, raw json.RawMessage) (changeEvent, error) {
	var pl changeStepPayload
	if err := decodePayload(raw, &pl); err != nil {
		return changeEvent{}, err
	}
	if pl.Summary == "" {
		return changeEvent{}, providers.Permanent("bad_payload", "pagerduty change: summary is required")
	}
	if err := checkLinks(pl.Links); err != nil {
		return changeEvent{}, err
	}
	return changeEvent{
		RoutingKey: routingKey,
		Payload: changePayload{
			Summary: apicall.Truncate(pl.Summary, MaxSummaryChars), Source: pl.Source,
			Timestamp: pl.Timestamp, CustomDetails: nilIfNull(pl.CustomDetails),
		},
		Links: pl.Links,
	}, nil
}

func checkLinks(links []link) error {
	for i, l := range links {
		if l.Href == "" {
			return providers.Permanent("bad_payload", "pagerduty: links[%d].href is required", i)
		}
	}
	return nil
}

// nilIfNull drops a null, as a template may render for a missing value.
func nilIfNull(raw json.RawMessage) json.RawMessage {
	if string(bytes.TrimSpace(raw)) == "null" {
		return nil
	}
	return raw
}

func (p *Provider) send(ctx context.Context, cfg config, target, where string, ev any) (providers.Response, error) {
	body, err := jsonx.Marshal(ev)
	if err != nil {
		return providers.Response{}, providers.Permanent("bad_payload", "encoding the %s event: %v", where, err)
	}
	a, err := apicall.Post(ctx, p.Net.Client(apicall.Policy{DenyPrivate: cfg.DenyPrivateNetworks}), apicall.Request{URL: target, Where: where, Body: body, Hide: []string{cfg.RoutingKey}})
	if err != nil {
		return providers.Response{}, err
	}
	var ans answer
	parsed := json.Unmarshal(a.Body, &ans) == nil
	if !a.OK() {
		code := fmt.Sprintf("pagerduty_http_%d", a.Status)
		if a.Status == http.StatusBadRequest {
			code = "pagerduty_invalid_event"
		}
		reason := ""
		if parsed && ans.Message != "" {
			reason = strings.Join(append([]string{ans.Message}, ans.Errors...), ": ")
		}
		return providers.Response{}, apicall.StatusError(code, where, a, reason, cfg.RoutingKey)
	}
	if !parsed || ans.Status != "success" {
		return providers.Response{}, providers.Permanent("pagerduty_bad_response", "%s: HTTP %d with an answer that is not PagerDuty's: %s", where, a.Status, apicall.Snippet(a.Body, cfg.RoutingKey))
	}
	out, err := jsonx.Marshal(answer{Status: ans.Status, Message: ans.Message, DedupKey: ans.DedupKey})
	if err != nil {
		return providers.Response{}, providers.Permanent("pagerduty_bad_response", "%s: encoding the result: %v", where, err)
	}
	return providers.Response{Body: out}, nil
}
