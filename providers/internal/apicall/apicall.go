// Package apicall is the plumbing the built-in providers for hosted APIs
// (slack, pagerduty, opsgenie, webhook) share: one JSON POST bound to the
// call's context, a bounded read of the answer, Retry-After, and the classing
// of failures as retryable or permanent without leaking credentials.
package apicall

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/chaingate/gateway/providers"
)

// MaxResponseBytes bounds the answer read from a service; the APIs these
// providers call answer with a few hundred bytes.
const MaxResponseBytes = 1 << 20

// SnippetBytes is how much of an answer's body an error message quotes.
const SnippetBytes = 512

// UserAgent names the gateway to the services it calls.
const UserAgent = "chaingate-gateway"

// Request is one POST.
type Request struct {
	// URL is the full URL.
	URL string
	// Where names the call in messages, such as "slack chat.postMessage";
	// it must hold no credential.
	Where string
	// Header is sent as is; Content-Type defaults to application/json.
	Header http.Header
	// Body is the request body.
	Body []byte
	// Hide lists credentials to blank out of any text quoted from the answer.
	Hide []string
}

// Answer is a service's answer.
type Answer struct {
	Status int
	Header http.Header
	// Body holds at most MaxResponseBytes; an error answer may be cut short.
	Body []byte
}

// OK reports whether the status is 2xx.
func (a *Answer) OK() bool { return a.Status >= 200 && a.Status <= 299 }

// Post sends r and reads the answer. Its errors are those of sending and
// reading: a network failure (retryable), a certificate the client refuses
// or an address deny_private_networks refuses (permanent), a 2xx answer
// larger than MaxResponseBytes (permanent), or,
// when ctx is done, ctx's own error, which the gateway classes itself.
// Statuses are left to the caller.
func Post(ctx context.Context, c *http.Client, r Request) (*Answer, error) {
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, r.URL, bytes.NewReader(r.Body))
	if err != nil {
		return nil, providers.Permanent("bad_config", "%s: building the request: %v", r.Where, InnerURLError(err))
	}
	for k, v := range r.Header {
		hreq.Header[k] = v
	}
	if hreq.Header.Get("Content-Type") == "" {
		hreq.Header.Set("Content-Type", "application/json")
	}
	hreq.Header.Set("User-Agent", UserAgent)
	resp, err := c.Do(hreq)
	if err != nil {
		return nil, sendError(ctx, r.Where, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxResponseBytes+1))
	a := &Answer{Status: resp.StatusCode, Header: resp.Header, Body: data}
	if !a.OK() {
		// An error answer is classed by its status; a cut or broken body
		// only shortens the quote in the message.
		a.Body = data[:min(len(data), MaxResponseBytes)]
		return a, nil
	}
	if err != nil {
		return nil, sendError(ctx, r.Where, fmt.Errorf("reading the answer: %w", err))
	}
	if len(data) > MaxResponseBytes {
		return nil, providers.Permanent("response_too_large", "%s: HTTP %d with a body larger than %d bytes", r.Where, a.Status, MaxResponseBytes)
	}
	return a, nil
}

func sendError(ctx context.Context, where string, err error) error {
	if r := Refused(where, err); r != nil {
		return r
	}
	err = InnerURLError(err)
	var certErr *tls.CertificateVerificationError
	switch {
	case ctx.Err() != nil:
		// The gateway gave up on the call; its own error says why.
		return fmt.Errorf("%s: %w", where, ctx.Err())
	case errors.As(err, &certErr):
		return &providers.Error{Code: "tls", Message: fmt.Sprintf("%s: %v", where, err), Err: err}
	default:
		return &providers.Error{Retryable: true, Code: "network", Message: fmt.Sprintf("%s: %v", where, err), Err: err}
	}
}

// InnerURLError drops the *url.Error wrapping, whose text holds the whole
// URL: query strings carry tokens, and a Slack webhook's path is its secret.
func InnerURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// StatusError classes a non-2xx answer: 429 and 5xx are retryable, with
// the answer's Retry-After, and any other status is permanent (3xx too:
// redirects are not followed). reason is the service's own explanation;
// when empty, the message quotes the start of the body instead.
func StatusError(code, where string, a *Answer, reason string, hide ...string) *providers.Error {
	msg := fmt.Sprintf("%s: HTTP %d %s", where, a.Status, http.StatusText(a.Status))
	if reason == "" {
		reason = Snippet(a.Body, hide...)
	}
	if reason != "" {
		msg += ": " + TruncateBytes(Redact(reason, hide...), SnippetBytes)
	}
	if a.Status >= 300 && a.Status <= 399 {
		msg += " (redirects are not followed: check the URL's scheme and host)"
	}
	e := &providers.Error{Code: code, Message: msg}
	if a.Status == http.StatusTooManyRequests || a.Status >= 500 {
		e.Retryable = true
		e.RetryAfter = RetryAfter(a.Header, time.Now())
	}
	return e
}

// RetryAfter reads a Retry-After header, given in seconds or as an HTTP
// date; absent, malformed or in the past, it is zero.
func RetryAfter(h http.Header, now time.Time) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs <= 0 {
			return 0
		}
		// Larger than any sensible wait; keeps the multiplication in range.
		return time.Duration(min(secs, int64(24*time.Hour/time.Second))) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// Snippet is the start of an answer's body, fit for a message: valid
// UTF-8, trimmed, at most SnippetBytes, with every hidden value blanked.
func Snippet(body []byte, hide ...string) string {
	s := strings.TrimSpace(strings.ToValidUTF8(string(body), "\uFFFD"))
	// Redact first: a cut could leave the start of a credential.
	return TruncateBytes(Redact(s, hide...), SnippetBytes)
}

// Redact replaces each non-empty value of hide in s.
func Redact(s string, hide ...string) string {
	for _, h := range hide {
		if h != "" {
			s = strings.ReplaceAll(s, h, "[REDACTED]")
		}
	}
	return s
}

// TruncateBytes cuts s to at most n bytes at a character boundary.
func TruncateBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Truncate cuts s to at most n characters, ending with "…" when cut, for
// text a service limits (an alert's title): a page that goes out with a
// shortened title beats one refused for its length.
func Truncate(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	cut := 0
	for range n - 1 {
		_, size := utf8.DecodeRuneInString(s[cut:])
		cut += size
	}
	return s[:cut] + "…"
}

// hashSuffixLen is the length of "~" and a hex SHA-256.
const hashSuffixLen = 1 + 2*sha256.Size

// ShortenKey makes an identifier fit a service's limit of max bytes (max
// must exceed hashSuffixLen). A longer key becomes its first bytes, cut at
// a character boundary, then "~" and the hex SHA-256 of the whole key: the
// same long key always gives the same short one, two different long keys
// almost surely give different ones, and the prefix keeps it readable.
func ShortenKey(key string, max int) string {
	if len(key) <= max {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return TruncateBytes(key, max-hashSuffixLen) + "~" + hex.EncodeToString(sum[:])
}

// DecodeStrict decodes a JSON object into v, rejecting unknown fields: a
// misspelt key in a chain's payload template must fail loudly rather than
// be ignored. Empty input and null leave v as it is.
func DecodeStrict(raw json.RawMessage, v any) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("unexpected data after the JSON value")
	}
	return nil
}

// BaseURL checks a configured base URL, or returns def when it is empty,
// without its trailing slash.
func BaseURL(configured, def string) (string, error) {
	if configured == "" {
		configured = def
	}
	u, err := url.Parse(configured)
	if err != nil {
		return "", fmt.Errorf("parsing base_url: %w", InnerURLError(err))
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("base_url %q is not an http or https URL with a host", WithoutQuery(u.Redacted()))
	}
	return strings.TrimRight(configured, "/"), nil
}

// WithoutQuery cuts a URL before its query string or fragment, which often
// carry tokens.
func WithoutQuery(u string) string {
	if i := strings.IndexAny(u, "?#"); i >= 0 {
		return u[:i]
	}
	return u
}

// CheckHeaders checks names and values as net/http would on sending,
// which would otherwise fail as a retryable network error although no
// attempt can succeed. A value is never shown: headers carry credentials.
func CheckHeaders(h map[string]string) error {
	names := make([]string, 0, len(h))
	for k := range h {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if !validHeaderName(k) {
			return fmt.Errorf("header name %q is not a valid HTTP token", k)
		}
		if !ValidHeaderValue(h[k]) {
			return fmt.Errorf("header %q has a value holding a control character such as CR or LF", k)
		}
	}
	return nil
}

// validHeaderName reports whether k is a token (RFC 9110, section 5.6.2).
func validHeaderName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// ValidHeaderValue rejects control characters other than tab.
func ValidHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// BodyValue keeps a JSON answer as JSON, so that later steps can address
// its fields, and turns anything else into a JSON string; empty is null.
func BodyValue(contentType string, data []byte) json.RawMessage {
	if len(bytes.TrimSpace(data)) == 0 {
		return json.RawMessage("null")
	}
	if mt, _, err := mime.ParseMediaType(contentType); err == nil &&
		(mt == "application/json" || strings.HasSuffix(mt, "+json")) && json.Valid(data) {
		return data
	}
	s, _ := json.Marshal(strings.ToValidUTF8(string(data), "\uFFFD")) // cannot fail for a string
	return s
}
