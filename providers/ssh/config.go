package ssh

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	xssh "golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/internal/apicall"
	"github.com/chaingate/gateway/providers/internal/command"
)

// settings is a config decoded, checked and made ready to connect with.
type settings struct {
	cfg config
	// fingerprint tells configs apart in the pool's keys.
	fingerprint    string
	auth           []xssh.AuthMethod
	pins           []xssh.PublicKey
	patterns       []string
	jumpAddr       string
	connectTimeout time.Duration
	maxSessions    int
	commands       command.Commands
}

func decodeConfig(raw json.RawMessage) (*settings, error) {
	var cfg config
	err := apicall.DecodeStrict(raw, &cfg)
	if err != nil {
		return nil, fmt.Errorf("decoding ssh config: %w", err)
	}
	if err := cfg.Limits.Check(); err != nil {
		return nil, err
	}
	// Connections are told apart by what they connect with: a config that
	// differs in its commands alone shares them.
	conn := cfg
	conn.Commands = nil
	connJSON, err := json.Marshal(conn)
	if err != nil {
		return nil, fmt.Errorf("encoding ssh config: %w", err)
	}
	sum := sha256.Sum256(connJSON)
	s := &settings{fingerprint: hex.EncodeToString(sum[:8])}

	if cfg.PrivateKey != "" {
		signer, err := parseKey(cfg.PrivateKey, cfg.Passphrase)
		if err != nil {
			return nil, err
		}
		s.auth = append(s.auth, xssh.PublicKeys(signer))
	} else if cfg.Passphrase != "" {
		return nil, errors.New("passphrase is set without private_key; it is the passphrase of an encrypted private_key")
	}
	if cfg.Password != "" {
		s.auth = append(s.auth, xssh.Password(cfg.Password))
	}
	if len(s.auth) == 0 {
		return nil, errors.New("give private_key or password (or both): with neither, no host lets the gateway in")
	}

	sources := cfg.KnownHosts != "" || len(cfg.HostKeys) > 0
	switch {
	case cfg.InsecureIgnoreHostKey && sources:
		return nil, errors.New("insecure_ignore_host_key = true with known_hosts or host_keys: either check host keys or do not; drop one")
	case !cfg.InsecureIgnoreHostKey && !sources:
		return nil, errors.New("give known_hosts (the path of a known_hosts file) or host_keys (pinned keys), so that the gateway knows the hosts it logs in to; insecure_ignore_host_key = true checks nothing")
	}
	if cfg.KnownHosts != "" {
		if !filepath.IsAbs(cfg.KnownHosts) {
			return nil, fmt.Errorf("known_hosts %q must be an absolute path", cfg.KnownHosts)
		}
		if _, err := knownhosts.New(cfg.KnownHosts); err != nil {
			return nil, fmt.Errorf("reading known_hosts: %w", err)
		}
	}
	for i, line := range cfg.HostKeys {
		key, _, _, rest, err := xssh.ParseAuthorizedKey([]byte(line))
		if err != nil {
			return nil, fmt.Errorf("host_keys[%d] is not a public key in authorized_keys form (\"ssh-ed25519 AAAA...\"): %w", i, err)
		}
		if len(strings.TrimSpace(string(rest))) > 0 {
			return nil, fmt.Errorf("host_keys[%d] holds more than one key; give one key a line", i)
		}
		s.pins = append(s.pins, key)
	}

	if s.patterns, err = patterns(cfg.AllowedHosts); err != nil {
		return nil, err
	}
	if s.commands, err = command.DecodeCommands(raw, command.Remote); err != nil {
		return nil, err
	}
	for _, name := range slices.Sorted(maps.Keys(s.commands)) {
		if s.commands[name].User == "" && cfg.User == "" {
			return nil, fmt.Errorf("commands.%s: no user to log in as: set user in the config, or in the command", name)
		}
	}

	if cfg.User != "" {
		if err := command.ValidUser(cfg.User); err != nil {
			return nil, err
		}
	}
	if cfg.JumpUser != "" {
		if err := command.ValidUser(cfg.JumpUser); err != nil {
			return nil, fmt.Errorf("jump_user: %w", err)
		}
	}
	switch {
	case cfg.Port == 0:
		cfg.Port = DefaultPort
	case cfg.Port < 1 || cfg.Port > 65535:
		return nil, fmt.Errorf("port %d is not a TCP port", cfg.Port)
	}
	switch {
	case cfg.JumpHost != "":
		host, port, err := splitHostPort(cfg.JumpHost, DefaultPort)
		if err != nil {
			return nil, fmt.Errorf("jump_host: %w", err)
		}
		s.jumpAddr = net.JoinHostPort(host, strconv.Itoa(port))
	case cfg.JumpUser != "":
		return nil, errors.New("jump_user is set without jump_host")
	}
	switch {
	case cfg.ConnectTimeoutSeconds < 0:
		return nil, errors.New("connect_timeout_seconds must not be negative")
	case cfg.ConnectTimeoutSeconds == 0:
		s.connectTimeout = DefaultConnectTimeout
	default:
		s.connectTimeout = time.Duration(cfg.ConnectTimeoutSeconds * float64(time.Second))
	}
	switch {
	case cfg.MaxSessionsPerHost < 0:
		return nil, errors.New("max_sessions_per_host must not be negative")
	case cfg.MaxSessionsPerHost == 0:
		s.maxSessions = DefaultMaxSessionsPerHost
	default:
		s.maxSessions = cfg.MaxSessionsPerHost
	}
	cfg.Limits = cfg.Limits.Defaulted()
	s.cfg = cfg
	return s, nil
}

// patterns checks allowed_hosts and returns the patterns as matched.
func patterns(allowed []string) ([]string, error) {
	if len(allowed) == 0 {
		return nil, errors.New("allowed_hosts is required: the patterns of the hosts a payload may name, such as \"web-*.prod.example.com\"")
	}
	var out []string
	for i, p := range allowed {
		p, err := checkPattern(p)
		if err != nil {
			return nil, fmt.Errorf("allowed_hosts[%d]: %w", i, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// hostSettings are the settings target reads (which hosts, which port,
// which user), decoded from a config whose other keys may still be
// placeholders for secrets.
func hostSettings(raw json.RawMessage) (*settings, error) {
	var cfg struct {
		AllowedHosts []string `json:"allowed_hosts"`
		User         string   `json:"user"`
		Port         int      `json:"port"`
		PayloadPort  bool     `json:"payload_port"`
	}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return nil, fmt.Errorf("decoding ssh config: %w", err)
	}
	pats, err := patterns(cfg.AllowedHosts)
	if err != nil {
		return nil, err
	}
	if cfg.Port == 0 {
		cfg.Port = DefaultPort
	}
	return &settings{cfg: config{AllowedHosts: cfg.AllowedHosts, User: cfg.User, Port: cfg.Port, PayloadPort: cfg.PayloadPort}, patterns: pats}, nil
}

// parseKey reads a private key, decrypting it with passphrase when it is
// encrypted.
func parseKey(pem, passphrase string) (xssh.Signer, error) {
	signer, err := xssh.ParsePrivateKey([]byte(pem))
	var missing *xssh.PassphraseMissingError
	switch {
	case errors.As(err, &missing) && passphrase == "":
		return nil, errors.New("private_key is encrypted: give its passphrase")
	case errors.As(err, &missing):
		signer, err = xssh.ParsePrivateKeyWithPassphrase([]byte(pem), []byte(passphrase))
		if err != nil {
			return nil, fmt.Errorf("decrypting private_key with passphrase: %w", err)
		}
		return signer, nil
	case err != nil:
		return nil, fmt.Errorf("private_key is not a private key in OpenSSH or PEM form: %w", err)
	case passphrase != "":
		return nil, errors.New("passphrase is set, but private_key is not encrypted; is it the right key?")
	}
	return signer, nil
}

// A pattern and a host are matched label by label: dots become slashes,
// which path.Match's wildcards do not cross.
var patternChars = regexp.MustCompile(`^[a-z0-9._:%*?\[\]^!-]+$`)

// checkPattern checks an allowed_hosts pattern and returns it as it is
// matched.
func checkPattern(p string) (string, error) {
	p = strings.ToLower(strings.TrimSpace(p))
	switch {
	case p == "*":
		return p, nil
	case !patternChars.MatchString(p):
		return "", fmt.Errorf("%q is not a host pattern: letters, digits, '.', '-', ':' and the wildcards *, ? and [...]", p)
	case strings.Count(p, ":") == 1:
		return "", fmt.Errorf("%q: patterns match the host alone; its port is the payload's or the config's port", p)
	}
	if _, err := path.Match(labels(p), ""); err != nil {
		return "", fmt.Errorf("%q is not a host pattern: %w", p, err)
	}
	return p, nil
}

func labels(s string) string { return strings.ReplaceAll(s, ".", "/") }

// addressPattern matches patterns written as addresses, "10.0.0.*" or
// "fd00::*": digits, wildcards and the separators alone.
var addressPattern = regexp.MustCompile(`^[0-9*?\[\]!^.-]+$|:`)

// allowed says whether host matches one of the patterns. A pattern written
// as an address matches addresses only: "10.0.0.*" must not let in
// "10.0.0.evil.example.com", which whoever sends the alert can point
// anywhere.
func (s *settings) allowed(host string) bool {
	_, err := netip.ParseAddr(host)
	isAddr := err == nil
	for _, p := range s.patterns {
		if p == "*" {
			return true
		}
		if addressPattern.MatchString(p) && !isAddr {
			continue
		}
		if ok, _ := path.Match(labels(p), labels(host)); ok {
			return true
		}
	}
	return false
}

// target is where a call's command runs.
type target struct {
	host string // as the payload names it, lower-cased
	addr string // host:port, as dialed
	user string
}

// target checks a payload's host and user against the config.
func (s *settings) target(host, user string) (target, error) {
	h, port, err := splitHostPort(host, s.cfg.Port)
	if err != nil {
		return target{}, providers.Permanent("bad_payload", "%v", err)
	}
	if !s.cfg.PayloadPort {
		// An alert's instance label names the exporter's port
		// (db-1:9100), not the SSH server's.
		port = s.cfg.Port
	}
	if !s.allowed(h) {
		return target{}, providers.Permanent("host_not_allowed", "host %q matches no allowed_hosts pattern (%s); the gateway did not connect to it", h, strings.Join(s.patterns, ", "))
	}
	if user == "" {
		user = s.cfg.User
	}
	if user == "" {
		return target{}, providers.Permanent("bad_payload", "no user to log in to %s as: set user in the config or the command", h)
	}
	if err := command.ValidUser(user); err != nil {
		return target{}, providers.Permanent("bad_payload", "%v", err)
	}
	return target{host: h, addr: net.JoinHostPort(h, strconv.Itoa(port)), user: user}, nil
}

var hostChars = regexp.MustCompile(`^[A-Za-z0-9._:%-]+$`)

// splitHostPort reads "host", "host:port", a bare IPv6 address or
// "[v6]:port".
func splitHostPort(s string, defaultPort int) (string, int, error) {
	host, port := s, ""
	var err error
	switch {
	case s == "":
		return "", 0, errors.New("host is empty")
	case strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]"):
		host = s[1 : len(s)-1]
	case strings.HasPrefix(s, "[") || strings.Count(s, ":") == 1:
		host, port, err = net.SplitHostPort(s)
	}
	if err != nil {
		return "", 0, fmt.Errorf("host %q is not a host or host:port: %w", s, err)
	}
	if !hostChars.MatchString(host) || strings.HasPrefix(host, "-") {
		return "", 0, fmt.Errorf("host %q is not a host name or address", s)
	}
	n := defaultPort
	if port != "" {
		if n, err = strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return "", 0, fmt.Errorf("host %q: %q is not a TCP port", s, port)
		}
	}
	return strings.ToLower(host), n, nil
}
