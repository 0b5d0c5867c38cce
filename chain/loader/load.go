// Package loader reads chain config files into the model of package chain:
// strict TOML decoding, validation with file, line, column and key path on
// every problem, and the templates and conditions compiled once. The model
// keeps plain key positions, so a problem found after loading still points
// at its key.
//
// It is the gateway's own package, with no compatibility promise.
package loader

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/templates"
)

// Options tunes loading.
type Options struct {
	// ProviderTypes are the built-in types a [[providers]] entry may name.
	ProviderTypes []string
	// Stored says the document is a definition a run stored when it
	// started: it has no [gateway] table, so what depends on the gateway
	// (a distributed split's broker) is checked when the run gets there.
	Stored bool
}

// Load reads every path (a file, or a directory whose *.toml files are read
// in name order, but for the *_test.toml files of `gateway test`) as one
// config. A config with errors returns a *ConfigError
// listing all of them.
func Load(paths []string, opts Options) (*chain.Config, error) {
	files, err := expandPaths(paths)
	if err != nil {
		return nil, err
	}
	l := newLoader(opts)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("reading config file: %w", err)
		}
		l.file(f, string(data))
	}
	return l.finish()
}

// LoadBytes loads a single file's content; name is used in messages.
func LoadBytes(name string, data []byte, opts Options) (*chain.Config, error) {
	l := newLoader(opts)
	l.file(name, string(data))
	return l.finish()
}

func expandPaths(paths []string) ([]string, error) {
	if len(paths) == 0 {
		return nil, errors.New("loading config: no config path given")
	}
	var files []string
	for _, p := range paths {
		info, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("loading config: %w", err)
		}
		if !info.IsDir() {
			files = append(files, p)
			continue
		}
		matches, err := filepath.Glob(filepath.Join(p, "*.toml"))
		if err != nil {
			return nil, fmt.Errorf("listing config directory %s: %w", p, err)
		}
		matches = slices.DeleteFunc(matches, func(f string) bool { return strings.HasSuffix(f, "_test.toml") })
		if len(matches) == 0 {
			return nil, fmt.Errorf("loading config: directory %s holds no *.toml file", p)
		}
		sort.Strings(matches)
		files = append(files, matches...)
	}
	return files, nil
}

type loader struct {
	opts   Options
	diags  diagnostics
	cfg    *chain.Config
	gwSeen *chain.Source
	// later holds checks that need every file loaded: references between
	// chains and providers.
	later []func()
	// runURLReads are the templates and conditions that read run.url.
	runURLReads []runURLRead
}

func newLoader(opts Options) *loader {
	return &loader{opts: opts, cfg: &chain.Config{
		Providers: map[string]*chain.Provider{},
		Chains:    map[string]*chain.Chain{},
		Gateway: chain.Gateway{Limits: chain.Limits{
			MaxSplitItems: chain.DefaultMaxSplitItems, MaxBodyBytes: chain.DefaultMaxBodyBytes, MaxRequestBytes: chain.DefaultMaxRequestBytes,
			MaxConnections: chain.DefaultMaxConnections, MaxConnectionsPerAddress: chain.DefaultMaxConnsPerAddr, RequestTimeoutSeconds: chain.DefaultRequestTimeout, IdleTimeoutSeconds: chain.DefaultIdleTimeout,
		}, Retention: chain.DefaultRetention()},
	}}
}

func (l *loader) finish() (*chain.Config, error) {
	for _, f := range l.later {
		f()
	}
	l.checkRunURL()
	l.checkSubChainCycles()
	all := l.diags.sorted()
	var errs []chain.Diagnostic
	for _, d := range all {
		if d.Severity == chain.SeverityError {
			errs = append(errs, d)
		} else {
			l.cfg.Warnings = append(l.cfg.Warnings, d)
		}
	}
	if len(errs) > 0 {
		return nil, &chain.ConfigError{Diagnostics: all}
	}
	if err := l.cfg.Seal(); err != nil {
		return nil, err
	}
	return l.cfg, nil
}

var topLevelKeys = []string{"gateway", "providers", "chains", "triggers", "schedules"}

func (l *loader) file(name, src string) {
	var root map[string]any
	if _, err := toml.Decode(src, &root); err != nil {
		d := chain.Diagnostic{File: name, Message: err.Error()}
		var pe toml.ParseError
		if errors.As(err, &pe) {
			d.Line, d.Col = pe.Position.Line, pe.Position.Col
			d.Message = "invalid TOML: " + pe.Message
			d.Path = pe.LastKey
		}
		l.diags.add(d)
		return
	}
	d := &fileDecoder{file: name, pos: scanPositions(src), diags: &l.diags}
	top := &table{d: d, m: root}
	if gw, ok := top.sub("gateway"); ok {
		l.gateway(gw)
	}
	if ps, ok := top.tables("providers"); ok {
		for _, p := range ps {
			l.provider(p, filepath.Dir(name))
		}
	}
	if cs, ok := top.tables("chains"); ok {
		for _, c := range cs {
			l.chain(c)
		}
	}
	if ts, ok := top.tables("triggers"); ok {
		for _, t := range ts {
			l.trigger(t)
		}
	}
	if ss, ok := top.tables("schedules"); ok {
		for _, s := range ss {
			l.schedule(s)
		}
	}
	top.finish(topLevelKeys)
}

func (l *loader) gateway(t *table) {
	src := t.d.source(t.path)
	if l.gwSeen != nil {
		t.d.errorf(t.path, "[gateway] is already defined at %s: [gateway] and its sub-tables ([gateway.auth], [gateway.limits], ...) go in one file", where(*l.gwSeen))
		return
	}
	l.gwSeen = &src
	l.cfg.Gateway.Source = src
	l.cfg.Gateway.Listen = t.str("listen")
	l.cfg.Gateway.State = t.str("state")
	l.cfg.Gateway.ExternalURL = t.externalURL("external_url")
	if l.cfg.Gateway.State != "" {
		t.d.urlSecrets(t.path.Key("state"), l.cfg.Gateway.State)
	}
	if lt, ok := t.sub("limits"); ok {
		lim := &l.cfg.Gateway.Limits
		lim.MaxSplitItems, _ = lt.bounded("max_split_items", "items", 1, 0, lim.MaxSplitItems)
		lim.MaxBodyBytes, _ = lt.bounded("max_body_bytes", "bytes", 1024, 0, lim.MaxBodyBytes)
		lim.MaxRequestBytes, _ = lt.bounded("max_request_bytes", "bytes", 1024, 0, lim.MaxRequestBytes)
		lim.MaxConnections, _ = lt.bounded("max_connections", "connections", 1, 0, lim.MaxConnections)
		lim.MaxConnectionsPerAddress, _ = lt.bounded("max_connections_per_address", "connections", 1, 0, lim.MaxConnectionsPerAddress)
		lim.RequestTimeoutSeconds, _ = lt.bounded("request_timeout_seconds", "seconds", 1, 3600, lim.RequestTimeoutSeconds)
		lim.IdleTimeoutSeconds, _ = lt.bounded("idle_timeout_seconds", "seconds", 1, 3600, lim.IdleTimeoutSeconds)
		lt.finish([]string{"max_split_items", "max_body_bytes", "max_request_bytes", "max_connections", "max_connections_per_address", "request_timeout_seconds", "idle_timeout_seconds"})
	}
	if ft, ok := t.sub("fanout"); ok {
		l.cfg.Gateway.Fanout = decodeFanout(ft)
	}
	if ut, ok := t.sub("ui"); ok {
		l.cfg.Gateway.UI = decodeUI(ut)
		if l.cfg.Gateway.UI.OIDC != nil && l.cfg.Gateway.ExternalURL == "" {
			t.d.errorf(ut.path.Key("oidc"), `needs [gateway] external_url, the address people reach the gateway at: the provider sends them back to it, at EXTERNAL_URL%s/auth/callback`, cmp.Or(l.cfg.Gateway.UI.BasePath, chain.DefaultUIBasePath))
		}
	}
	if st, ok := t.sub("slack"); ok {
		l.cfg.Gateway.Slack = decodeSlack(st)
	}
	if rt, ok := t.sub("retention"); ok {
		decodeRetention(rt, &l.cfg.Gateway.Retention)
	}
	if at, ok := t.sub("auth"); ok {
		l.cfg.Gateway.Auth = l.auth(at)
	}
	if a := l.cfg.Gateway.Auth; l.cfg.Gateway.UI.OIDC != nil && len(a.Users)+len(a.Groups) == 0 {
		t.d.errorf(t.path.Key("ui").Key("oidc"), "signs people in, but [gateway.auth] gives no person or group a role, so whoever signs in may do nothing: give them roles, e.g.\n%s", authExample)
	}
	if f := t.str("secrets_file"); f != "" {
		if !filepath.IsAbs(f) {
			f = filepath.Join(filepath.Dir(t.d.file), f)
		}
		l.cfg.Gateway.SecretsFile = f
	}
	l.cfg.Gateway.LeaseTTLSeconds = t.count("lease_ttl_seconds", "seconds")
	l.cfg.Gateway.ShutdownGraceSeconds = t.count("shutdown_grace_seconds", "seconds")
	t.finish([]string{"listen", "state", "external_url", "limits", "fanout", "ui", "slack", "auth", "retention", "secrets_file", "lease_ttl_seconds", "shutdown_grace_seconds"})
}

// tokens reads an array of API tokens: each a string, or a table
// { name = "...", token = "...", roles = [...] } that names its holder and
// what it may do; either may be "<<secrets.NAME>>", a secret that holds
// the token.
func (t *table) tokens(k string) []chain.Token {
	v, ok := t.value(k)
	if !ok {
		return nil
	}
	arr, ok := v.([]any)
	if !ok {
		t.d.errorf(t.path.Key(k), "must be an array of tokens, got %s", describe(v))
		return nil
	}
	var out []chain.Token
	for i, e := range arr {
		at := t.path.Key(k).Elem(i, "")
		switch x := e.(type) {
		case string:
			if x == "" {
				t.d.errorf(at, "must be a non-empty token")
				continue
			}
			if tok, ok := t.d.token(at, x); ok {
				out = append(out, tok)
			}
		case map[string]any:
			tt := &table{d: t.d, path: at, m: x}
			name, val := tt.requiredStr("name"), tt.requiredStr("token")
			roles := tt.strings("roles")
			if r, given := x["roles"].([]any); given && len(r) == 0 {
				tt.d.errorf(at.Key("roles"), `gives no role: name at least one, or leave roles out for what a token of this kind may do by default`)
			}
			tt.finish([]string{"name", "token", "roles"})
			if name == "" || val == "" {
				continue
			}
			if tok, ok := t.d.token(at.Key("token"), val); ok {
				tok.Name, tok.Roles = name, roles
				out = append(out, tok)
			}
		default:
			t.d.errorf(at, "must be a token, or a table { name = \"...\", token = \"...\" }, got %s", describe(e))
		}
	}
	return out
}

// token reads one API token written at p: the token itself, or
// "<<secrets.NAME>>" alone, which reads it from a secret. Anything else
// that holds << is refused: a token built from text and a secret would
// put part of it in the config, and one with a ?? default the whole of it.
func (d *fileDecoder) token(p chain.KeyPath, s string) (chain.Token, bool) {
	tok := chain.Token{Source: d.source(p)}
	if !strings.Contains(s, "<<") {
		tok.Value = s
		return tok, true
	}
	const want = `want the token itself, or "<<secrets.NAME>>" alone to read it from a secret`
	tpl, err := templates.CompileString(s)
	if err != nil {
		var ce *templates.CompileError
		if errors.As(err, &ce) {
			err = errors.New(ce.Msg)
		}
		d.errorf(p, "is not a valid template (%v): %s", err, want)
		return tok, false
	}
	if r, ok := tpl.SinglePath(); ok && r.Root == "secrets" && len(r.Path) == 1 {
		tok.Secret = r.Path[0]
		return tok, true
	}
	for _, r := range tpl.Refs() {
		switch {
		case r.Root != "secrets":
			d.errorf(p, "<<%s>>: a token may read only a secret: %s", r.Text, want)
		case r.HasDefault:
			d.errorf(p, "<<%s>>: a token takes no ?? default, which would be a token written in the config: %s", r.Text, want)
		case len(r.Path) != 1:
			d.errorf(p, "<<%s>>: a secret is read whole, as <<secrets.NAME>>: %s", r.Text, want)
		default:
			continue
		}
		return tok, false
	}
	if tpl.Defaulted() {
		// <<"..." ?? secrets.NAME>>: the literal always wins.
		d.errorf(p, "takes no ?? default, which would be a token written in the config: %s", want)
		return tok, false
	}
	if len(tpl.Refs()) > 1 {
		d.errorf(p, "reads more than one secret: %s", want)
	} else {
		d.errorf(p, "holds text besides <<secrets.NAME>>, which would be part of the token written in the config: %s", want)
	}
	return tok, false
}

var uiBasePathRE = regexp.MustCompile(`^(/[A-Za-z0-9._~-]+)+$`)

// decodeUI decodes [gateway.ui].
func decodeUI(t *table) chain.UI {
	ui := chain.UI{Disabled: !t.boolean("enabled", true), ReadOnly: t.boolean("read_only", false)}
	if p := t.str("base_path"); p != "" {
		if !uiBasePathRE.MatchString(p) {
			t.d.errorf(t.path.Key("base_path"), "must be a path such as \"/ui\" or \"/ops/console\": a leading slash, no trailing one, letters, digits and ._~- between slashes; got %q", p)
		}
		ui.BasePath = p
	}
	if ot, ok := t.sub("oidc"); ok {
		ui.OIDC = decodeOIDC(ot)
	}
	t.finish([]string{"enabled", "base_path", "read_only", "oidc"})
	return ui
}

// decodeOIDC decodes [gateway.ui.oidc].
func decodeOIDC(t *table) *chain.OIDC {
	o := &chain.OIDC{Source: t.d.source(t.path), UsernameClaim: chain.DefaultUsernameClaim, GroupsClaim: chain.DefaultGroupsClaim, SessionTTL: chain.DefaultSessionTTL}
	o.Issuer = t.requiredStr("issuer")
	if o.Issuer != "" {
		if u, err := url.Parse(o.Issuer); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
			t.d.errorf(t.path.Key("issuer"), `must be the OpenID Provider's issuer URL, such as "https://sso.example.com/realms/ops", got %q`, o.Issuer)
		}
	}
	o.ClientID = t.requiredStr("client_id")
	if !t.has("client_secret") {
		t.d.errorf(t.path, `missing required key "client_secret": the client's secret, read from a secret, e.g. client_secret = "<<secrets.OIDC_CLIENT_SECRET>>"`)
	} else if v := t.nonEmpty("client_secret"); v != "" {
		o.ClientSecret = t.d.secretName(t.path.Key("client_secret"), v)
	}
	o.Scopes = chain.DefaultOIDCScopes
	if t.has("scopes") {
		o.Scopes = t.strings("scopes")
		if !slices.Contains(o.Scopes, "openid") {
			t.d.errorf(t.path.Key("scopes"), `must include "openid", which makes the request an OpenID Connect one`)
		}
	}
	if v := t.str("username_claim"); v != "" {
		o.UsernameClaim = v
	}
	if v := t.str("groups_claim"); v != "" {
		o.GroupsClaim = v
	}
	if t.has("session_ttl") {
		if d, ok := t.duration("session_ttl"); ok {
			if d < time.Second || d > 30*24*time.Hour {
				t.d.errorf(t.path.Key("session_ttl"), "must be from 1s to 30d, got %s", d)
			} else {
				o.SessionTTL = d
			}
		}
	}
	o.AllowTokens = t.boolean("allow_tokens", false)
	t.finish([]string{"issuer", "client_id", "client_secret", "scopes", "username_claim", "groups_claim", "session_ttl", "allow_tokens"})
	return o
}

var (
	fanoutKeys = []string{
		"rabbitmq_url", "redis_url", "prefix", "threshold", "batch_size", "max_in_flight", "item_timeout_seconds",
		"max_redeliveries", "prefetch", "worker_concurrency", "claim_ttl_seconds",
	}
	fanoutPrefixRE = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,64}$`)
)

// decodeFanout decodes [gateway.fanout]. It returns a Fanout even when the
// table has errors, so that a distributed split is not also reported as
// having no broker.
func decodeFanout(t *table) *chain.Fanout {
	f := &chain.Fanout{
		RabbitMQURL: t.brokerURL("rabbitmq_url", "the broker that hands split items to workers",
			[]string{"amqp", "amqps"}, "amqp://guest:guest@127.0.0.1:5672/"),
		RedisURL: t.brokerURL("redis_url", "where workers commit item results",
			[]string{"redis", "rediss"}, "redis://127.0.0.1:6379/0"),
		Prefix: chain.DefaultFanoutPrefix,
	}
	if t.has("prefix") {
		if p := t.str("prefix"); fanoutPrefixRE.MatchString(p) {
			f.Prefix = p
		} else if t.isString("prefix") {
			t.d.errorf(t.path.Key("prefix"), "must be 1 to 64 letters, digits, '.', '_', ':' or '-', got %q", p)
		}
	}
	f.Threshold, _ = t.bounded("threshold", "items", 1, 0, chain.DefaultFanoutThreshold)
	var batchOK, inFlightOK bool
	f.BatchSize, batchOK = t.bounded("batch_size", "items", 1, 10_000, chain.DefaultFanoutBatchSize)
	f.MaxInFlight, inFlightOK = t.bounded("max_in_flight", "items", 1, 0, chain.DefaultFanoutMaxInFlight)
	// Items are published a whole batch at a time, so a smaller window
	// would never let one out.
	if batchOK && inFlightOK && f.MaxInFlight < f.BatchSize {
		t.d.errorf(t.path.Key("max_in_flight"), "is smaller than batch_size (%d < %d); a split must be able to publish one whole batch", f.MaxInFlight, f.BatchSize)
	}
	f.ItemTimeoutSeconds, _ = t.bounded("item_timeout_seconds", "seconds", 1, 0, chain.DefaultFanoutItemTimeoutSeconds)
	f.MaxRedeliveries, _ = t.bounded("max_redeliveries", "redeliveries", 1, 0, chain.DefaultFanoutMaxRedeliveries)
	f.Prefetch, _ = t.bounded("prefetch", "messages", 1, 1000, chain.DefaultFanoutPrefetch)
	f.WorkerConcurrency, _ = t.bounded("worker_concurrency", "items", 1, 10_000, chain.DefaultFanoutWorkerConcurrency)
	f.ClaimTTLSeconds, _ = t.bounded("claim_ttl_seconds", "seconds", 1, 600, chain.DefaultFanoutClaimTTLSeconds)
	t.finish(fanoutKeys)
	return f
}

// bounded reads a count from least to most (no upper bound when most is 0).
// It returns def when the key is absent, and def and false when it is wrong.
func (t *table) bounded(k, unit string, least, most, def int) (int, bool) {
	if !t.has(k) {
		return def, true
	}
	if n, isInt := t.m[k].(int64); isInt {
		switch {
		case n < int64(least):
			t.d.errorf(t.path.Key(k), "must be at least %d, got %d", least, n)
			return def, false
		case most > 0 && n > int64(most):
			t.d.errorf(t.path.Key(k), "must be at most %d, got %d", most, n)
			return def, false
		}
	}
	if n := t.count(k, unit); n >= least {
		return n, true
	}
	return def, false
}

// brokerURL reads a required URL that names a host and has one of schemes.
// Messages show the URL only as url.URL.Redacted writes it, without its
// query, which may carry a password too. A password that was not
// percent-encoded would show through url.Parse's error, or land past the
// host; then the URL is not shown at all.
func (t *table) brokerURL(k, what string, schemes []string, example string) string {
	if !t.has(k) {
		t.d.errorf(t.path, "missing required key %q: %s, e.g. %s = %q", k, what, k, example)
		return ""
	}
	raw := t.nonEmpty(k)
	if raw == "" {
		return ""
	}
	check, ok := t.d.urlSecrets(t.path.Key(k), raw)
	if !ok || check == "" {
		return raw
	}
	u, err := url.Parse(check)
	if err != nil {
		t.d.errorf(t.path.Key(k), "is not a valid URL (percent-encode reserved characters in the user name and password), e.g. %s", example)
		return ""
	}
	if strings.Contains(u.Opaque+u.EscapedPath()+u.RawQuery+u.EscapedFragment(), "@") {
		t.d.errorf(t.path.Key(k), "holds an '@' past its host; percent-encode reserved characters in the user name and password ('/' as %%2F, '@' as %%40), e.g. %s", example)
		return ""
	}
	if !contains(schemes, u.Scheme) || u.Host == "" {
		t.d.errorf(t.path.Key(k), "%q is not a URL with a host and scheme %s, e.g. %s", withoutQuery(u.Redacted()), strings.Join(schemes, " or "), example)
		return ""
	}
	return raw
}

// urlSecretStandIn is what a secret read inside a URL is checked as.
const urlSecretStandIn = "secret"

var placeholderRE = regexp.MustCompile(`<<.*?>>`)

// urlSecrets checks the secrets a URL written at p reads, a password most
// often ("amqps://gateway:<<secrets.MQ_PASSWORD>>@mq:5671/"): each must be
// <<secrets.NAME>>, with no default, which would put the credential back
// in the file. It returns the URL with each secret replaced by a stand-in,
// for the rest of it to be checked, or "" when the URL is one secret alone
// and can be checked only once read.
func (d *fileDecoder) urlSecrets(p chain.KeyPath, s string) (string, bool) {
	if !strings.Contains(s, "<<") {
		return s, true
	}
	tpl, err := templates.CompileString(s)
	if err != nil {
		var ce *templates.CompileError
		if errors.As(err, &ce) {
			err = errors.New(ce.Msg)
		}
		d.errorf(p, "is not a valid template (%v): a URL may read secrets as <<secrets.NAME>>", err)
		return "", false
	}
	for _, r := range tpl.Refs() {
		if r.Root != "secrets" || len(r.Path) != 1 || r.HasDefault {
			d.errorf(p, "<<%s>>: a URL may read only secrets, each as <<secrets.NAME>> with no ?? default", r.Text)
			return "", false
		}
	}
	if tpl.Defaulted() {
		// <<"..." ?? secrets.NAME>>: the literal, a password, always wins.
		d.errorf(p, "takes no ?? default, which would be a password written in the config: a URL may read only secrets, each as <<secrets.NAME>>")
		return "", false
	}
	if _, ok := tpl.SinglePath(); ok {
		return "", true
	}
	return placeholderRE.ReplaceAllString(s, urlSecretStandIn), true
}

// withoutQuery cuts a URL before its query string or fragment.
func withoutQuery(u string) string {
	if i := strings.IndexAny(u, "?#"); i >= 0 {
		return u[:i]
	}
	return u
}

func where(s chain.Source) string {
	if s.Line > 0 {
		return fmt.Sprintf("%s:%d", s.File, s.Line)
	}
	return s.File
}

var (
	nameRE   = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_-]*$`)
	sha256RE = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

func (l *loader) checkName(t *table, kind string) string {
	name := t.requiredStr("name")
	if name != "" && !nameRE.MatchString(name) {
		t.d.errorf(t.path.Key("name"), "%s name %q may hold only letters, digits, '_' and '-', and must not start with '-'", kind, name)
	}
	return name
}

var providerKeys = append([]string{"name", "type", "plugin", "sha256", "timeout_seconds", "config"}, chain.ProviderLimitKeys...)

func (l *loader) provider(t *table, dir string) {
	p := &chain.Provider{Name: l.checkName(t, "provider"), Source: t.d.source(t.path), Raw: t.m}
	p.Type = t.nonEmpty("type")
	p.Plugin = t.nonEmpty("plugin")
	p.SHA256 = strings.ToLower(t.str("sha256"))
	p.TimeoutSeconds = t.count("timeout_seconds", "seconds")
	if rt, ok := t.sub("rate_limit"); ok {
		p.RateLimit = decodeRateLimit(rt)
	}
	p.MaxConcurrency, _ = t.bounded("max_concurrency", "calls", 1, 0, 0)
	if bt, ok := t.sub("circuit_breaker"); ok {
		p.CircuitBreaker = decodeCircuitBreaker(bt)
	}
	switch {
	case t.has("type") && t.has("plugin"):
		t.d.errorf(t.path, "sets both type and plugin; a provider is either a built-in type or an external plugin")
	case !t.has("type") && !t.has("plugin"):
		t.d.errorf(t.path, "sets neither type nor plugin; name a built-in type (%s) or a plugin binary", strings.Join(l.opts.ProviderTypes, ", "))
	case p.Type != "" && !contains(l.opts.ProviderTypes, p.Type):
		t.d.errorf(t.path.Key("type"), "unknown provider type %q; built-in types are %s", p.Type, quoteList(l.opts.ProviderTypes))
	case p.Plugin != "":
		if !filepath.IsAbs(p.Plugin) {
			p.Plugin = filepath.Join(dir, p.Plugin)
		}
		if info, err := os.Stat(p.Plugin); err != nil {
			t.d.errorf(t.path.Key("plugin"), "plugin binary: %v", err)
		} else if info.IsDir() || info.Mode()&0o111 == 0 {
			t.d.errorf(t.path.Key("plugin"), "plugin binary %s is not an executable file", p.Plugin)
		}
	}
	if t.has("sha256") {
		if p.Plugin == "" && t.has("type") {
			t.d.errorf(t.path.Key("sha256"), "only an external plugin can be pinned by sha256")
		} else if !sha256RE.MatchString(p.SHA256) {
			t.d.errorf(t.path.Key("sha256"), "must be 64 hexadecimal digits")
		} else if sum, err := fileSHA256(p.Plugin); err == nil && sum != p.SHA256 {
			// Caught here rather than when the first run reaches the provider.
			t.d.errorf(t.path.Key("sha256"), "plugin binary %s has sha256 %s, not the pinned %s; rebuild the plugin or update the pin (sha256sum %s)", p.Plugin, sum, p.SHA256, p.Plugin)
		}
	}
	if v, ok := t.value("config"); ok {
		if _, isTable := v.(map[string]any); !isTable {
			t.d.errorf(t.path.Key("config"), "must be a table, got %s", describe(v))
		} else if data, err := json.Marshal(v); err != nil {
			t.d.errorf(t.path.Key("config"), "cannot be encoded as JSON: %v", err)
		} else {
			p.Config = data
			l.providerConfigTemplate(t, p, v)
		}
	}
	t.finish(providerKeys)
	if p.Name == "" {
		return
	}
	if prev, ok := l.cfg.Providers[p.Name]; ok {
		t.d.errorf(t.path.Key("name"), "provider %q is already defined at %s", p.Name, where(prev.Source))
		return
	}
	l.cfg.Providers[p.Name] = p
	l.cfg.ProviderNames = append(l.cfg.ProviderNames, p.Name)
}

// providerConfigTemplate compiles a provider config that reads secrets.
// Nothing else is known when a provider is configured, so secrets are the
// only root it may read.
func (l *loader) providerConfigTemplate(t *table, p *chain.Provider, v any) {
	tpl, err := templates.Compile(v)
	if err != nil {
		t.d.errorf(t.path.Key("config"), "%v", err)
		return
	}
	if tpl.Static() {
		return
	}
	for _, r := range tpl.Refs() {
		if r.Root != "secrets" {
			t.d.errorf(t.path.Key("config"), "<<%s>>: a provider's config may only read secrets.NAME", r.Text)
			return
		}
	}
	t.d.checkRefs(t.path.Key("config"), secretShapes, templateRefs(tpl))
	p.ConfigTemplate = tpl
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

var chainKeys = []string{"name", "timeout_seconds", "input", "retention", "steps", "concurrency",
	"on_failure", "finally", "finally_on_cancel", "handlers_timeout_seconds"}

func (l *loader) chain(t *table) {
	c := &chain.Chain{Name: l.checkName(t, "chain"), Source: t.d.source(t.path), Raw: t.m}
	if t.has("retention") {
		c.Retention = t.retentionOverride(true)
		// How long runs are kept is not what they run: the definition a
		// run keeps, and its hash, leave it out.
		c.Raw = maps.Clone(t.m)
		delete(c.Raw, "retention")
	}
	c.TimeoutSeconds = t.count("timeout_seconds", "seconds")
	// A stored definition's run has started: its input was checked then.
	if it, ok := t.sub("input"); ok && !l.opts.Stored {
		c.Input = decodeInput(it)
	}
	b := &chainBuild{l: l, c: c, d: t.d, sources: map[string]chain.Source{}, byName: map[string]*chain.Step{}}
	top := &scope{names: map[string]bool{}}
	c.Concurrency = t.concurrency(func(p chain.KeyPath, v any) *templates.Template {
		return compileRoots(t.d, p, v, chainConcurrencyRoots)
	}, false)
	if steps, ok := t.tables("steps"); ok {
		if len(steps) == 0 {
			t.d.errorf(t.path.Key("steps"), "a chain needs at least one step")
		}
		c.Steps = b.steps(steps, nil, top)
	} else if !t.has("steps") {
		t.d.errorf(t.path, "missing required key %q: a chain needs at least one step ([[chains.steps]])", "steps")
	}
	b.handlers(t, top)
	t.finish(chainKeys)
	for _, f := range b.checks {
		f()
	}
	if c.Name == "" {
		return
	}
	if prev, ok := l.cfg.Chains[c.Name]; ok {
		t.d.errorf(t.path.Key("name"), "chain %q is already defined at %s", c.Name, where(prev.Source))
		return
	}
	l.cfg.Chains[c.Name] = c
	l.cfg.ChainNames = append(l.cfg.ChainNames, c.Name)
}

// checkSubChainCycles rejects chains that call themselves through sub_chain,
// directly or through others.
func (l *loader) checkSubChainCycles() {
	const (
		unvisited = iota
		active
		done
	)
	state := map[string]int{}
	var stack []string
	var visit func(name string)
	visit = func(name string) {
		c := l.cfg.Chains[name]
		if c == nil || state[name] == done {
			return
		}
		state[name] = active
		stack = append(stack, name)
		c.WalkChain(func(s *chain.Step) {
			if s.Kind != chain.KindSubChain {
				return
			}
			switch state[s.SubChain] {
			case active:
				i := indexOf(stack, s.SubChain)
				cycle := append(append([]string(nil), stack[i:]...), s.SubChain)
				l.diags.add(s.Source.Key("sub_chain").Errorf("sub-chain cycle: %s", strings.Join(cycle, " → ")))
			case unvisited:
				visit(s.SubChain)
			}
		})
		stack = stack[:len(stack)-1]
		state[name] = done
	}
	for _, name := range l.cfg.ChainNames {
		visit(name)
	}
}

func indexOf(list []string, s string) int {
	for i, v := range list {
		if v == s {
			return i
		}
	}
	return -1
}

// fileSHA256 is the hex SHA-256 of the file at path.
func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
