// Package email is the email provider: its one action, send, submits one
// message to an SMTP relay (a mail submission agent such as Postfix, Amazon
// SES or Microsoft 365).
//
// Config: host and from (required), port (default 587, 465 or 25 by tls
// mode), tls ("starttls", the default; "implicit"; or "none", plain text),
// username and password (AUTH PLAIN, or LOGIN when the server offers only
// that), local_name (the EHLO name), ca_file and server_name (for relays
// with a private CA or a certificate for another name).
//
// The connection is never downgraded: in starttls mode a server that does
// not offer STARTTLS is an error, and credentials go in clear text only with
// tls = "none" to a loopback host.
//
// The step's dedup key becomes the Message-ID (see messageID), so every
// attempt of a step sends the same Message-ID. SMTP 4xx replies, network
// failures and timeouts are retryable; 5xx replies, TLS certificate failures
// and bad configs or payloads are permanent. docs/providers/email.md has the
// details.
//
// It is the gateway's own package, with no compatibility promise.
package email

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/mail"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/chaingate/gateway/internal/jsonx"
	"github.com/chaingate/gateway/providers"
)

// TLS modes.
const (
	tlsStartTLS = "starttls"
	tlsImplicit = "implicit"
	tlsNone     = "none"
)

const configSchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "additionalProperties": false,
  "required": ["host", "from"],
  "properties": {
    "host": {"type": "string", "minLength": 1},
    "port": {"type": "integer", "minimum": 1, "maximum": 65535},
    "tls": {"enum": ["starttls", "implicit", "none"]},
    "username": {"type": "string"},
    "password": {"type": "string", "x-secret": true},
    "from": {"type": "string", "minLength": 1},
    "local_name": {"type": "string"},
    "ca_file": {"type": "string"},
    "server_name": {"type": "string"}
  }
}`

// Provider is the email provider.
type Provider struct{}

// New returns the email provider.
func New() providers.Provider { return Provider{} }

type config struct {
	Host       string `json:"host"`
	Port       int    `json:"port"`
	TLS        string `json:"tls"`
	Username   string `json:"username"`
	Password   string `json:"password"`
	From       string `json:"from"`
	LocalName  string `json:"local_name"`
	CAFile     string `json:"ca_file"`
	ServerName string `json:"server_name"`
}

// settings is a checked config, ready to connect with.
type settings struct {
	host      string
	addr      string // host:port
	mode      string
	tls       *tls.Config // nil in mode none
	username  string
	password  string
	from      *mail.Address
	localName string // empty: chosen once connected, see helloName
}

type result struct {
	MessageID  string   `json:"message_id"`
	Recipients []string `json:"recipients"`
	Count      int      `json:"count"`
	Reply      string   `json:"reply"`
}

func (Provider) Describe(context.Context) (providers.Info, error) {
	return providers.Info{Name: "email", Version: "1", ActionTypes: []string{"send"}, ConfigSchema: json.RawMessage(configSchema)}, nil
}

func (Provider) Execute(ctx context.Context, req providers.Request) (providers.Response, error) {
	if req.ActionType != "send" {
		return providers.Response{}, providers.Permanent("bad_action", "action type %q is not supported; the email provider has only \"send\"", req.ActionType)
	}
	var cfg config
	if err := decodeStrict(req.Config, &cfg); err != nil {
		return providers.Response{}, providers.Permanent("bad_config", "decoding email config: %v", err)
	}
	set, err := checkConfig(cfg)
	if err != nil {
		return providers.Response{}, providers.Permanent("bad_config", "email config: %v", err)
	}
	var pl payload
	if err := decodeStrict(req.Payload, &pl); err != nil {
		return providers.Response{}, providers.Permanent("bad_payload", "decoding email payload: %v", err)
	}
	msg, err := buildMessage(set.from, pl, req.DedupKey, time.Now())
	if err != nil {
		return providers.Response{}, providers.Permanent("bad_payload", "%v", err)
	}
	reply, err := send(ctx, set, msg.envelope, msg.data)
	if err != nil {
		return providers.Response{}, err
	}
	out, err := jsonx.Marshal(result{MessageID: msg.id, Recipients: msg.envelope, Count: len(msg.envelope), Reply: reply})
	if err != nil {
		return providers.Response{}, providers.Permanent("bad_response", "encoding the result: %v", err)
	}
	return providers.Response{Body: out}, nil
}

// CheckConfig implements providers.ConfigChecker.
func (Provider) CheckConfig(_ context.Context, raw json.RawMessage) error {
	var cfg config
	if err := decodeStrict(raw, &cfg); err != nil {
		return fmt.Errorf("decoding email config: %w", err)
	}
	_, err := checkConfig(cfg)
	return err
}

// decodeStrict rejects unknown fields: a misspelt key in a chain's payload
// template must fail loudly rather than be silently ignored.
func decodeStrict(raw json.RawMessage, v any) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

func checkConfig(cfg config) (*settings, error) {
	if cfg.Host == "" {
		return nil, errors.New("host is required")
	}
	host := cfg.Host
	if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1] // an IPv6 literal, written as in a URL
	}
	if strings.ContainsAny(host, " \t\r\n/@[]") || strings.Contains(host, ":") && net.ParseIP(host) == nil {
		return nil, fmt.Errorf("host %q is not a host name or IP address (the port goes in port)", cfg.Host)
	}
	mode := cfg.TLS
	port := cfg.Port
	switch mode {
	case "", tlsStartTLS:
		mode, port = tlsStartTLS, cmp.Or(port, 587)
	case tlsImplicit:
		port = cmp.Or(port, 465)
	case tlsNone:
		port = cmp.Or(port, 25)
	default:
		return nil, fmt.Errorf("tls %q is not one of \"starttls\", \"implicit\", \"none\"", cfg.TLS)
	}
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("port %d is out of range", cfg.Port)
	}
	set := &settings{host: host, addr: net.JoinHostPort(host, strconv.Itoa(port)), mode: mode, username: cfg.Username, password: cfg.Password}

	if cfg.From == "" {
		return nil, errors.New("from is required")
	}
	from, err := parseAddress(cfg.From)
	if err != nil {
		return nil, fmt.Errorf("from: %w", err)
	}
	set.from = from

	if cfg.Password != "" && cfg.Username == "" {
		return nil, errors.New("password is set but username is not")
	}
	if cfg.Username != "" && cfg.Password == "" {
		return nil, errors.New("username is set but password is empty")
	}
	if strings.ContainsAny(cfg.Username, "\x00\r\n") {
		return nil, errors.New("username holds a NUL, CR or LF")
	}
	// Over tls = "none" a password would cross the network readable by anyone
	// on the path; a loopback relay is the one place it does not.
	if mode == tlsNone && cfg.Username != "" && !isLoopback(host) {
		return nil, fmt.Errorf("refusing to send credentials in clear text to %s: with tls = \"none\", username is allowed only for a loopback host", host)
	}

	if cfg.LocalName != "" && !validHelloName(cfg.LocalName) {
		return nil, fmt.Errorf("local_name %q is not a domain name or address literal", cfg.LocalName)
	}
	set.localName = cfg.LocalName

	if mode == tlsNone {
		if cfg.CAFile != "" || cfg.ServerName != "" {
			return nil, errors.New("ca_file and server_name need tls = \"starttls\" or \"implicit\"; tls = \"none\" never verifies a certificate")
		}
		return set, nil
	}
	set.tls = &tls.Config{ServerName: cmp.Or(cfg.ServerName, host), MinVersion: tls.VersionTLS12}
	if cfg.CAFile != "" {
		pool, err := loadCAs(cfg.CAFile)
		if err != nil {
			return nil, err
		}
		set.tls.RootCAs = pool
	}
	return set, nil
}

// loadCAs returns the system's roots plus those in file: a private relay's
// CA is added to what is trusted, not put in its place.
func loadCAs(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("reading ca_file: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("ca_file %s holds no PEM certificate", file)
	}
	return pool, nil
}

// isLoopback tells from the name alone, without resolving it: a resolver
// could be made to answer 127.0.0.1 for a remote name.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// validHelloName accepts a domain name or an address literal such as
// [192.0.2.1] or [IPv6:2001:db8::1] (RFC 5321, section 4.1.3).
func validHelloName(name string) bool {
	if strings.HasPrefix(name, "[") && strings.HasSuffix(name, "]") {
		lit := name[1 : len(name)-1]
		if v6, ok := strings.CutPrefix(lit, "IPv6:"); ok {
			ip := net.ParseIP(v6)
			return ip != nil && ip.To4() == nil
		}
		ip := net.ParseIP(lit)
		return ip != nil && ip.To4() != nil
	}
	if len(name) > 255 {
		return false
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}
