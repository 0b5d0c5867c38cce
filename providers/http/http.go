// Package http is the HTTP provider: each call makes one HTTP request.
//
// Payload fields: url (required; appended to the config's base_url unless it
// is absolute), method (default: the action type when it names an HTTP
// method, else GET), headers (object of strings), body (a string is sent
// as-is; any other JSON value is sent JSON-encoded as application/json),
// timeout_ms. Config fields: base_url, headers (defaults that payload headers
// override; sent only to base_url's origin), allowed_hosts (where else an
// absolute url may point), follow_redirects, deny_private_networks,
// max_response_bytes (default 1 MiB). A url is usually filled from the
// alert, so where a request may go, and with which credentials, is the
// config's to say: see package apicall's Egress.
//
// The step's dedup key is always sent as the Idempotency-Key header. The
// result body is {"status", "headers", "body"}, with header names lowercased
// and the response body parsed when it is JSON. Answers of 5xx and 429,
// whatever their size, network failures and timeouts are retryable errors;
// other non-2xx answers and bad payloads (headers that are not valid HTTP
// included) are permanent. Messages name the URL without its query string.
//
// It is the gateway's own package, with no compatibility promise.
package http

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"mime"
	nethttp "net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/chaingate/gateway/internal/jsonx"
	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/internal/apicall"
)

// DefaultMaxResponseBytes is the largest response body read when the config
// sets no max_response_bytes.
const DefaultMaxResponseBytes = 1 << 20

// snippetBytes is how much of an error response's body goes in the message.
const snippetBytes = 512

const configSchema = `{
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "base_url": {"type": "string", "minLength": 1},
    "headers": {"type": "object", "additionalProperties": {"type": "string"}},
    "allowed_hosts": {"type": "array", "items": {"type": "string", "minLength": 1}},
    "follow_redirects": {"type": "boolean"},
    "deny_private_networks": {"type": "boolean"},
    "max_response_bytes": {"type": "integer", "minimum": 1}
  }
}`

// Provider is the HTTP provider.
type Provider struct {
	Net *apicall.Net
}

// New returns an HTTP provider with its own connection pools.
func New() providers.Provider { return &Provider{Net: apicall.NewNet()} }

type payload struct {
	URL       string            `json:"url"`
	Method    string            `json:"method"`
	Headers   map[string]string `json:"headers"`
	Body      json.RawMessage   `json:"body"`
	TimeoutMS int64             `json:"timeout_ms"`
}

type config struct {
	BaseURL             string            `json:"base_url"`
	Headers             map[string]string `json:"headers"`
	AllowedHosts        []string          `json:"allowed_hosts"`
	FollowRedirects     bool              `json:"follow_redirects"`
	DenyPrivateNetworks bool              `json:"deny_private_networks"`
	MaxResponseBytes    int64             `json:"max_response_bytes"`
}

// checkConfig checks a decoded config and returns where its requests may go.
func checkConfig(cfg config) (*apicall.Egress, error) {
	if cfg.BaseURL == "" && len(cfg.AllowedHosts) == 0 {
		return nil, errors.New("give base_url, allowed_hosts or both: with neither, there is nowhere a request may go")
	}
	egress, err := apicall.NewEgress(cfg.BaseURL, cfg.AllowedHosts)
	if err != nil {
		return nil, err
	}
	// net/http would refuse these only when sending, as a network error,
	// which is retried although no attempt can succeed.
	if err := apicall.CheckHeaders(cfg.Headers); err != nil {
		return nil, fmt.Errorf("config headers: %w", err)
	}
	return egress, nil
}

// CheckConfig implements providers.ConfigChecker.
func (p *Provider) CheckConfig(_ context.Context, raw json.RawMessage) error {
	var cfg config
	if err := apicall.DecodeStrict(raw, &cfg); err != nil {
		return fmt.Errorf("decoding http config: %w", err)
	}
	_, err := checkConfig(cfg)
	return err
}

type result struct {
	Status  int               `json:"status"`
	Headers map[string]string `json:"headers"`
	Body    json.RawMessage   `json:"body"`
}

func (p *Provider) Describe(context.Context) (providers.Info, error) {
	return providers.Info{Name: "http", Version: "1", ConfigSchema: json.RawMessage(configSchema)}, nil
}

func (p *Provider) Execute(ctx context.Context, req providers.Request) (providers.Response, error) {
	var cfg config
	if err := apicall.DecodeStrict(req.Config, &cfg); err != nil {
		return providers.Response{}, providers.Permanent("bad_config", "decoding http config: %v", err)
	}
	egress, err := checkConfig(cfg)
	if err != nil {
		return providers.Response{}, providers.Permanent("bad_config", "http config: %v", err)
	}
	var pl payload
	if err := apicall.DecodeStrict(req.Payload, &pl); err != nil {
		return providers.Response{}, providers.Permanent("bad_payload", "decoding http payload: %v", err)
	}
	target, err := resolveURL(cfg.BaseURL, pl.URL)
	if err != nil {
		return providers.Response{}, providers.Permanent("bad_payload", "%v", err)
	}
	method, err := chooseMethod(pl.Method, req.ActionType)
	if err != nil {
		return providers.Response{}, providers.Permanent("bad_payload", "%v", err)
	}
	if pl.TimeoutMS < 0 {
		return providers.Response{}, providers.Permanent("bad_payload", "timeout_ms must not be negative, got %d", pl.TimeoutMS)
	}
	body, contentType, err := requestBody(pl.Body)
	if err != nil {
		return providers.Response{}, providers.Permanent("bad_payload", "%v", err)
	}
	if err := apicall.CheckHeaders(pl.Headers); err != nil {
		return providers.Response{}, providers.Permanent("bad_payload", "headers: %v", err)
	}
	limit := cfg.MaxResponseBytes
	if limit <= 0 {
		limit = DefaultMaxResponseBytes
	}

	callCtx := ctx
	if pl.TimeoutMS > 0 {
		var cancel context.CancelFunc
		callCtx, cancel = context.WithTimeout(ctx, time.Duration(pl.TimeoutMS)*time.Millisecond)
		defer cancel()
	}
	// Query strings often carry tokens, so messages name the URL without one.
	where := method + " " + target.Scheme + "://" + target.Host + target.Path
	credentials, err := egress.Check("http "+where, target)
	if err != nil {
		return providers.Response{}, err
	}
	hreq, err := nethttp.NewRequestWithContext(callCtx, method, target.String(), body)
	if err != nil {
		return providers.Response{}, providers.Permanent("bad_payload", "building the request: %v", err)
	}
	if credentials {
		for k, v := range cfg.Headers {
			hreq.Header.Set(k, v)
		}
	}
	for k, v := range pl.Headers {
		hreq.Header.Set(k, v)
	}
	if contentType != "" && hreq.Header.Get("Content-Type") == "" {
		hreq.Header.Set("Content-Type", contentType)
	}
	if req.DedupKey != "" {
		hreq.Header.Set("Idempotency-Key", req.DedupKey)
	}

	client := p.Net.Client(apicall.Policy{Egress: egress, FollowRedirects: cfg.FollowRedirects, Credentials: slices.Collect(maps.Keys(cfg.Headers)), DenyPrivate: cfg.DenyPrivateNetworks})
	resp, err := client.Do(hreq)
	if err != nil {
		if r := apicall.Refused(where, err); r != nil {
			return providers.Response{}, r
		}
		return providers.Response{}, requestError(ctx, callCtx, where, pl.TimeoutMS, err)
	}
	defer resp.Body.Close()
	// The status first: an error answer is classed by its status whatever
	// its size, and only a snippet of it is read for the message.
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		snippet, _ := io.ReadAll(io.LimitReader(resp.Body, snippetBytes))
		return providers.Response{}, statusError(where, resp, snippet)
	}
	if resp.ContentLength > limit {
		return providers.Response{}, tooLarge(where, limit)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return providers.Response{}, requestError(ctx, callCtx, where, pl.TimeoutMS, fmt.Errorf("reading the response: %w", err))
	}
	if int64(len(data)) > limit {
		return providers.Response{}, tooLarge(where, limit)
	}

	res := result{Status: resp.StatusCode, Headers: make(map[string]string, len(resp.Header)), Body: responseBody(resp.Header.Get("Content-Type"), data)}
	for k, v := range resp.Header {
		res.Headers[strings.ToLower(k)] = strings.Join(v, ", ")
	}
	out, err := jsonx.Marshal(res)
	if err != nil {
		return providers.Response{}, providers.Permanent("bad_response", "%s: encoding the result: %v", where, err)
	}
	return providers.Response{Body: out}, nil
}

// resolveURL appends a relative url to base_url (rather than resolving it
// per RFC 3986, which would drop the last segment of a base without a
// trailing slash, surprising anyone who writes base_url = ".../v1").
func resolveURL(base, ref string) (*url.URL, error) {
	if ref == "" {
		return nil, errors.New("url is required")
	}
	u, err := url.Parse(ref)
	if err != nil {
		return nil, fmt.Errorf("parsing url %q: %w", apicall.WithoutQuery(ref), apicall.InnerURLError(err))
	}
	if !u.IsAbs() {
		if base == "" {
			return nil, fmt.Errorf("url %q is relative and no base_url is configured", apicall.WithoutQuery(ref))
		}
		if u, err = url.Parse(strings.TrimRight(base, "/") + "/" + strings.TrimLeft(ref, "/")); err != nil {
			return nil, fmt.Errorf("joining base_url and url: %w", apicall.InnerURLError(err))
		}
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("url %q is not an http or https URL with a host", apicall.WithoutQuery(u.Redacted()))
	}
	return u, nil
}

func chooseMethod(explicit, actionType string) (string, error) {
	if explicit != "" {
		if m := strings.ToUpper(explicit); isMethod(m) {
			return m, nil
		}
		return "", fmt.Errorf("method %q is not one of GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS", explicit)
	}
	if m := strings.ToUpper(actionType); isMethod(m) {
		return m, nil
	}
	return nethttp.MethodGet, nil
}

func isMethod(m string) bool {
	switch m {
	case nethttp.MethodGet, nethttp.MethodHead, nethttp.MethodPost, nethttp.MethodPut,
		nethttp.MethodPatch, nethttp.MethodDelete, nethttp.MethodOptions:
		return true
	}
	return false
}

func requestBody(raw json.RawMessage) (io.Reader, string, error) {
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return nil, "", nil
	case raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, "", fmt.Errorf("decoding body: %w", err)
		}
		return strings.NewReader(s), "", nil
	default:
		return bytes.NewReader(raw), "application/json", nil
	}
}

// responseBody keeps a JSON answer as JSON, so that later steps can address
// its fields, and turns anything else into a string.
func responseBody(contentType string, data []byte) json.RawMessage {
	if len(data) == 0 {
		return json.RawMessage("null")
	}
	if mt, _, err := mime.ParseMediaType(contentType); err == nil &&
		(mt == "application/json" || strings.HasSuffix(mt, "+json")) && json.Valid(data) {
		return data
	}
	s, _ := json.Marshal(string(data)) // cannot fail for a string
	return s
}

func requestError(ctx, callCtx context.Context, where string, timeoutMS int64, err error) error {
	err = apicall.InnerURLError(err)
	var certErr *tls.CertificateVerificationError
	switch {
	case ctx.Err() != nil:
		// The gateway gave up on the call; its own error says why.
		return fmt.Errorf("%s: %w", where, ctx.Err())
	case errors.Is(callCtx.Err(), context.DeadlineExceeded):
		return &providers.Error{Retryable: true, Code: "timeout", Message: fmt.Sprintf("%s: no complete response within timeout_ms=%d", where, timeoutMS), Err: err}
	case errors.As(err, &certErr):
		return &providers.Error{Code: "tls", Message: fmt.Sprintf("%s: %v", where, err), Err: err}
	default:
		return &providers.Error{Retryable: true, Code: "network", Message: fmt.Sprintf("%s: %v", where, err), Err: err}
	}
}

func tooLarge(where string, limit int64) error {
	return providers.Permanent("response_too_large", "%s: response body is larger than max_response_bytes=%d", where, limit)
}

func statusError(where string, resp *nethttp.Response, data []byte) error {
	snippet := data[:min(len(data), snippetBytes)]
	msg := fmt.Sprintf("%s: HTTP %s", where, resp.Status)
	if s := strings.TrimSpace(strings.ToValidUTF8(string(snippet), "\uFFFD")); s != "" {
		msg += ": " + s
	}
	if resp.StatusCode >= 300 && resp.StatusCode <= 399 {
		msg += " (redirects are followed only with follow_redirects = true, and only where requests may go)"
	}
	return &providers.Error{
		Retryable: resp.StatusCode >= 500 || resp.StatusCode == nethttp.StatusTooManyRequests,
		Code:      fmt.Sprintf("http_%d", resp.StatusCode),
		Message:   msg,
	}
}
