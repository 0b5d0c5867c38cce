// Package webhook is the webhook provider: it POSTs a step's payload as
// JSON to a configured URL, signed so that the receiver can check that the
// gateway sent it, unchanged and recently.
//
// Config: url (required), secret (the HMAC key; a credential; without it
// requests are not signed), headers (sent with every request).
//
// Every request carries Content-Type: application/json, Idempotency-Key
// (the step's dedup key, the same on every attempt, so the receiver can
// drop a repeat) and, with a secret, X-Chaingate-Timestamp (Unix seconds
// when the attempt was sent) and X-Chaingate-Signature: v1=<hex
// HMAC-SHA256 of "<timestamp>.<body>" keyed with the secret>. Receivers
// written in Go check them with Verify.
//
// It is the gateway's own package, with no compatibility promise.
package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/chaingate/gateway/internal/jsonx"
	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/internal/apicall"
)

// Post is the action type.
const Post = "post"

// The signature headers.
const (
	TimestampHeader = "X-Chaingate-Timestamp"
	SignatureHeader = "X-Chaingate-Signature"
)

// DefaultTolerance is how far a request's timestamp may be from the
// receiver's clock when Verify is given no tolerance.
const DefaultTolerance = 5 * time.Minute

// Errors Verify returns, wrapped with detail.
var (
	ErrMalformed         = errors.New("webhook signature or timestamp is missing or malformed")
	ErrSignatureMismatch = errors.New("webhook signature does not match the body")
	ErrStale             = errors.New("webhook timestamp is outside the tolerance")
)

// reserved are the headers the provider sets itself; a config that sets
// one is refused rather than silently overridden.
var reserved = []string{"Content-Type", "Idempotency-Key", "User-Agent", TimestampHeader, SignatureHeader}

const configSchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "title": "webhook provider config",
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "url": {"type": "string", "minLength": 1, "description": "where requests are POSTed"},
    "secret": {"type": "string", "minLength": 1, "x-secret": true,
      "description": "HMAC-SHA256 key that signs every request"},
    "headers": {"type": "object", "additionalProperties": {"type": "string"},
      "description": "headers sent with every request"},
    "deny_private_networks": {"type": "boolean",
      "description": "refuse to connect to loopback, private and link-local addresses"}
  },
  "required": ["url"]
}`

// Provider is the webhook provider.
type Provider struct {
	Net *apicall.Net
	// Now is the clock that timestamps requests; nil means time.Now.
	Now func() time.Time
}

// New returns a webhook provider with its own connection pool.
func New() providers.Provider { return &Provider{Net: apicall.NewNet()} }

type config struct {
	URL                 string            `json:"url"`
	Secret              string            `json:"secret"`
	Headers             map[string]string `json:"headers"`
	DenyPrivateNetworks bool              `json:"deny_private_networks"`
}

// CheckConfig implements providers.ConfigChecker.
func (p *Provider) CheckConfig(_ context.Context, raw json.RawMessage) error {
	var cfg config
	if err := apicall.DecodeStrict(raw, &cfg); err != nil {
		return fmt.Errorf("decoding webhook config: %w", err)
	}
	_, err := checkConfig(cfg)
	return err
}

type result struct {
	Status int             `json:"status"`
	Body   json.RawMessage `json:"body"`
}

func (p *Provider) Describe(context.Context) (providers.Info, error) {
	return providers.Info{Name: "webhook", Version: "1", ActionTypes: []string{Post}, ConfigSchema: json.RawMessage(configSchema)}, nil
}

func (p *Provider) Execute(ctx context.Context, req providers.Request) (providers.Response, error) {
	var cfg config
	if err := apicall.DecodeStrict(req.Config, &cfg); err != nil {
		return providers.Response{}, providers.Permanent("bad_config", "decoding webhook config: %v", err)
	}
	target, err := checkConfig(cfg)
	if err != nil {
		return providers.Response{}, err
	}
	if req.ActionType != Post {
		return providers.Response{}, providers.Permanent("bad_action_type", "webhook: unknown action type %q; want %s", req.ActionType, Post)
	}
	body := bytes.TrimSpace(req.Payload)
	if len(body) == 0 {
		body = []byte("{}")
	}
	if !json.Valid(body) {
		return providers.Response{}, providers.Permanent("bad_payload", "webhook: the payload is not valid JSON")
	}

	header := http.Header{}
	for k, v := range cfg.Headers {
		header.Set(k, v)
	}
	header.Set("Content-Type", "application/json")
	if req.DedupKey != "" {
		header.Set("Idempotency-Key", req.DedupKey)
	}
	if cfg.Secret != "" {
		now := time.Now
		if p.Now != nil {
			now = p.Now
		}
		ts := now().Unix()
		header.Set(TimestampHeader, strconv.FormatInt(ts, 10))
		header.Set(SignatureHeader, Sign([]byte(cfg.Secret), ts, body))
	}

	// Query strings often carry tokens, so messages name the URL without one.
	where := "webhook POST " + target.Scheme + "://" + target.Host + target.EscapedPath()
	hide := []string{cfg.Secret, target.RawQuery}
	for _, v := range cfg.Headers {
		// Short values would blank ordinary words; they are never quoted anyway.
		if len(v) >= 4 {
			hide = append(hide, v)
		}
	}
	a, err := apicall.Post(ctx, p.Net.Client(apicall.Policy{DenyPrivate: cfg.DenyPrivateNetworks}), apicall.Request{URL: target.String(), Where: where, Header: header, Body: body, Hide: hide})
	if err != nil {
		return providers.Response{}, err
	}
	if !a.OK() {
		return providers.Response{}, apicall.StatusError(fmt.Sprintf("webhook_http_%d", a.Status), where, a, "", hide...)
	}
	out, err := jsonx.Marshal(result{Status: a.Status, Body: apicall.BodyValue(a.Header.Get("Content-Type"), a.Body)})
	if err != nil {
		return providers.Response{}, providers.Permanent("bad_response", "%s: encoding the result: %v", where, err)
	}
	return providers.Response{Body: out}, nil
}

func checkConfig(cfg config) (*url.URL, error) {
	if cfg.URL == "" {
		return nil, providers.Permanent("bad_config", "webhook: the config has no url")
	}
	u, err := url.Parse(cfg.URL)
	if err != nil {
		return nil, providers.Permanent("bad_config", "webhook: parsing url %q: %v", apicall.WithoutQuery(cfg.URL), apicall.InnerURLError(err))
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, providers.Permanent("bad_config", "webhook: url %q is not an http or https URL with a host", apicall.WithoutQuery(u.Redacted()))
	}
	if err := apicall.CheckHeaders(cfg.Headers); err != nil {
		return nil, providers.Permanent("bad_config", "webhook config headers: %v", err)
	}
	for k := range cfg.Headers {
		for _, r := range reserved {
			if strings.EqualFold(k, r) {
				return nil, providers.Permanent("bad_config", "webhook config headers: %s is set by the provider", r)
			}
		}
	}
	return u, nil
}

// Sign returns the X-Chaingate-Signature value for body sent at timestamp
// (Unix seconds): "v1=" and the hex HMAC-SHA256, keyed with secret, of the
// timestamp in decimal, ".", and the body.
func Sign(secret []byte, timestamp int64, body []byte) string {
	return "v1=" + hex.EncodeToString(mac(secret, strconv.FormatInt(timestamp, 10), body))
}

func mac(secret []byte, timestamp string, body []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(timestamp))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// Verify checks a request the webhook provider sent: timestampHeader and
// signatureHeader are its X-Chaingate-Timestamp and X-Chaingate-Signature
// values, body its raw body, exactly as received. It returns nil if the
// signature is secret's over the timestamp and body, and the timestamp is
// within tolerance of now (DefaultTolerance when tolerance is not
// positive), which bounds how long a captured request can be replayed.
// Errors wrap ErrMalformed, ErrSignatureMismatch or ErrStale.
func Verify(secret []byte, timestampHeader, signatureHeader string, body []byte, tolerance time.Duration, now time.Time) error {
	if len(secret) == 0 {
		return errors.New("verifying a webhook signature: the secret is empty")
	}
	ts, err := strconv.ParseInt(timestampHeader, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: timestamp %q is not Unix seconds", ErrMalformed, apicall.TruncateBytes(timestampHeader, 32))
	}
	hexSig, ok := strings.CutPrefix(signatureHeader, "v1=")
	if !ok {
		return fmt.Errorf("%w: signature does not start with v1=", ErrMalformed)
	}
	sig, err := hex.DecodeString(hexSig)
	if err != nil || len(sig) != sha256.Size {
		return fmt.Errorf("%w: signature is not a hex HMAC-SHA256", ErrMalformed)
	}
	if !hmac.Equal(sig, mac(secret, timestampHeader, body)) {
		return ErrSignatureMismatch
	}
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	if age := now.Sub(time.Unix(ts, 0)); age > tolerance || age < -tolerance {
		return fmt.Errorf("%w: signed at %s, %s from now, tolerance %s", ErrStale, time.Unix(ts, 0).UTC().Format(time.RFC3339), age.Round(time.Second), tolerance)
	}
	return nil
}
