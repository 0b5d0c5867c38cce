package gateway

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/secrets"
	"github.com/chaingate/gateway/templates"
)

// loadSecrets reads what <<secrets.NAME>> reads under cfg: the environment
// and cfg's secrets_file. A template that reads a secret neither holds,
// with no default, makes cfg a config error naming the template, so the
// config is refused up front rather than failing every run that reaches
// the step.
func loadSecrets(cfg *chain.Config) (map[string]string, error) {
	vals, err := secrets.Load(cfg.Gateway.SecretsFile)
	if err != nil {
		return nil, &chain.ConfigError{Diagnostics: []chain.Diagnostic{cfg.Gateway.Source.Key("secrets_file").Errorf("%v", err)}}
	}
	var diags []chain.Diagnostic
	secretTemplates(cfg, func(src chain.Source, key string, tpl *templates.Template, credential func(string) bool) {
		for _, r := range tpl.Refs() {
			if r.Root != "secrets" || r.HasDefault || len(r.Path) == 0 {
				continue
			}
			if _, ok := vals[r.Path[0]]; ok {
				continue
			}
			fix := secretFix(cfg, r.Path[0])
			if !credential(r.Key) {
				fix += ", or give a default with ??"
			}
			diags = append(diags, src.Key(joinKey(key, r.Key)).Errorf("<<%s>>: no secret %s: %s", r.Text, r.Path[0], fix))
		}
	})
	auth := cfg.Gateway.Auth
	for _, t := range append(slices.Clone(auth.Tokens), auth.ReadTokens...) {
		if t.Secret == "" {
			continue
		}
		switch v, ok := vals[t.Secret]; {
		case !ok:
			diags = append(diags, t.Source.Errorf("<<secrets.%s>>: no secret %s for this API token: %s", t.Secret, t.Secret, secretFix(cfg, t.Secret)))
		case strings.TrimSpace(v) == "":
			diags = append(diags, t.Source.Errorf("<<secrets.%s>>: the secret %s is empty, and an API token must not be", t.Secret, t.Secret))
		}
	}
	if sl := cfg.Gateway.Slack; sl != nil && sl.SigningSecret != "" {
		at := sl.Source.Key("signing_secret")
		switch v, ok := vals[sl.SigningSecret]; {
		case !ok:
			diags = append(diags, at.Errorf("<<secrets.%s>>: no secret %s for the Slack app's signing secret: %s", sl.SigningSecret, sl.SigningSecret, secretFix(cfg, sl.SigningSecret)))
		case strings.TrimSpace(v) == "":
			diags = append(diags, at.Errorf("<<secrets.%s>>: the secret %s is empty, and the Slack app's signing secret must not be", sl.SigningSecret, sl.SigningSecret))
		}
	}
	if o := cfg.Gateway.UI.OIDC; o != nil && o.ClientSecret != "" {
		at := o.Source.Key("client_secret")
		switch v, ok := vals[o.ClientSecret]; {
		case !ok:
			diags = append(diags, at.Errorf("<<secrets.%s>>: no secret %s for the OpenID client's secret: %s", o.ClientSecret, o.ClientSecret, secretFix(cfg, o.ClientSecret)))
		case strings.TrimSpace(v) == "":
			diags = append(diags, at.Errorf("<<secrets.%s>>: the secret %s is empty, and the OpenID client's secret must not be", o.ClientSecret, o.ClientSecret))
		}
	}
	urls := map[string]string{"state": cfg.Gateway.State}
	if f := cfg.Gateway.Fanout; f != nil {
		urls["fanout.rabbitmq_url"], urls["fanout.redis_url"] = f.RabbitMQURL, f.RedisURL
	}
	for _, key := range slices.Sorted(maps.Keys(urls)) {
		tpl, err := templates.CompileString(urls[key])
		if err != nil {
			continue // reported when the config loaded
		}
		for _, r := range tpl.Refs() {
			if r.Root != "secrets" || len(r.Path) != 1 {
				continue
			}
			if _, ok := vals[r.Path[0]]; !ok {
				diags = append(diags, cfg.Gateway.Source.Key(key).Errorf("<<%s>>: no secret %s: %s", r.Text, r.Path[0], secretFix(cfg, r.Path[0])))
			}
		}
	}
	if len(diags) > 0 {
		return nil, &chain.ConfigError{Diagnostics: diags}
	}
	return vals, nil
}

// secretTemplates calls fn with every template of cfg that may read a
// secret: providers' configs, steps' payloads, inputs, approval messages
// and split items, and triggers' tokens and secrets. credential says
// whether the string at a key of the template (Ref.Key) is a credential,
// where a ?? default is refused: a trigger's token or secret, a value a
// built-in provider's schema marks, and any value of an external plugin's
// config, whose schema is not known here.
func secretTemplates(cfg *chain.Config, fn func(src chain.Source, key string, tpl *templates.Template, credential func(string) bool)) {
	never := func(string) bool { return false }
	always := func(string) bool { return true }
	check := func(src chain.Source, key string, tpl *templates.Template, credential func(string) bool) {
		if tpl != nil {
			fn(src, key, tpl, credential)
		}
	}
	for _, name := range cfg.ProviderNames {
		p := cfg.Providers[name]
		if p.ConfigTemplate == nil {
			continue
		}
		credential := always
		if keys, known := credentialKeys(p); known {
			credential = func(k string) bool {
				return slices.ContainsFunc(keys, func(c string) bool {
					rest, under := strings.CutPrefix(k, c)
					return under && (c == "" || rest == "" || rest[0] == '.' || rest[0] == '[')
				})
			}
		}
		check(p.Source, "config", p.ConfigTemplate, credential)
	}
	var steps func([]*chain.Step)
	steps = func(list []*chain.Step) {
		for _, s := range list {
			check(s.Source, "payload_template", s.Payload, never)
			check(s.Source, "input", s.Input, never)
			if s.Approval != nil {
				check(s.Source, "approval.message", s.Approval.Message, never)
			}
			if s.Parallel != nil {
				steps(s.Parallel.Steps)
			}
			if s.Split != nil {
				check(s.Source, "split.items", s.Split.Items, never)
				steps(s.Split.Steps)
			}
		}
	}
	for _, name := range cfg.ChainNames {
		steps(cfg.Chains[name].Steps)
	}
	for _, name := range cfg.TriggerNames {
		tr := cfg.Triggers[name]
		check(tr.Source, "token", tr.Token, always)
		check(tr.Source, "secret", tr.Secret, always)
	}
}

// SecretNames lists the secrets cfg's templates read, in order.
func SecretNames(cfg *chain.Config) []string {
	seen := map[string]bool{}
	secretTemplates(cfg, func(_ chain.Source, _ string, tpl *templates.Template, _ func(string) bool) {
		for _, r := range tpl.Refs() {
			if r.Root == "secrets" && len(r.Path) > 0 {
				seen[r.Path[0]] = true
			}
		}
	})
	return slices.Sorted(maps.Keys(seen))
}

// openSecrets reads cfg's secrets and checks what serve, run and resume
// need of them before they open anything: every secret a template reads
// (loadSecrets), and each built-in provider's config with its secrets
// filled in. It returns the values and the redactor that hides them.
func openSecrets(ctx context.Context, cfg *chain.Config) (map[string]string, *secrets.Redactor, error) {
	vals, err := loadSecrets(cfg)
	if err != nil {
		return nil, nil, err
	}
	red := secrets.NewRedactor(vals)
	if diags := checkResolvedBuiltins(ctx, cfg, vals, red); len(diags) > 0 {
		return nil, nil, &chain.ConfigError{Diagnostics: diags}
	}
	return vals, red, nil
}

// CheckSecrets reports, as a *chain.ConfigError, what a gateway opened on
// cfg with this environment would be refused for in its secrets: a secret
// a template reads that neither the environment nor secrets_file holds,
// with the variable to set, or a built-in provider's config its secrets
// make unusable. validate checks this so that it agrees with serve.
func CheckSecrets(ctx context.Context, cfg *chain.Config) error {
	_, _, err := openSecrets(ctx, cfg)
	return err
}

// fillURL fills in the secrets a URL from the config reads: a secret that
// is the whole URL as it is, and one inside it (a password) percent-encoded,
// so that its value may hold any character.
func fillURL(raw string, vals map[string]string) (string, error) {
	if !strings.Contains(raw, "<<") {
		return raw, nil
	}
	tpl, err := templates.CompileString(raw)
	if err != nil {
		return "", err
	}
	_, whole := tpl.SinglePath()
	scope := make(map[string]any, len(vals))
	for k, v := range vals {
		if !whole {
			v = escapeURLPart(v)
		}
		scope[k] = v
	}
	v, err := tpl.Render(templates.MapScope{"secrets": scope})
	if err != nil {
		return "", err
	}
	s, _ := v.(string)
	return s, nil
}

// escapeURLPart percent-encodes every byte of s but the unreserved ones
// (RFC 3986), which read the same in any part of a URL.
func escapeURLPart(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '.', c == '_', c == '~':
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// filledFanout is f with the secrets its URLs read filled in.
func filledFanout(f *chain.Fanout, vals map[string]string) (*chain.Fanout, error) {
	out := *f
	var err error
	if out.RabbitMQURL, err = fillURL(f.RabbitMQURL, vals); err != nil {
		return nil, fmt.Errorf("filling in the secrets of [gateway.fanout] rabbitmq_url: %w", err)
	}
	if out.RedisURL, err = fillURL(f.RedisURL, vals); err != nil {
		return nil, fmt.Errorf("filling in the secrets of [gateway.fanout] redis_url: %w", err)
	}
	return &out, nil
}

// secretFix says how to give the gateway the secret name.
func secretFix(cfg *chain.Config, name string) string {
	fix := "set " + secrets.EnvPrefix + name
	if f := cfg.Gateway.SecretsFile; f != "" {
		fix = "add " + name + "=VALUE to " + f + " or " + fix
	}
	return fix
}

// CheckReloadSecrets refuses a config whose secrets the running gateway
// cannot give its runs: one a template reads that is missing, or values
// other than those it started with, which the engine takes only at start.
// Refusing keeps runs from going on with a value the operator replaced.
func (g *Gateway) CheckReloadSecrets(cfg *chain.Config) error {
	vals, err := loadSecrets(cfg)
	if err != nil {
		return err
	}
	var changed []string
	for name, v := range vals {
		if old, ok := g.SecretValues()[name]; !ok || old != v {
			changed = append(changed, name)
		}
	}
	if len(changed) == 0 {
		if diags := checkResolvedBuiltins(context.Background(), cfg, g.SecretValues(), g.Redactor); len(diags) > 0 {
			return &chain.ConfigError{Diagnostics: diags}
		}
		return nil
	}
	slices.Sort(changed)
	return &chain.ConfigError{Diagnostics: []chain.Diagnostic{{
		Path:    "gateway.secrets_file",
		Message: fmt.Sprintf("new or changed secret values (%s): the gateway takes secret values only when it starts; restart it to use them", strings.Join(changed, ", ")),
	}}}
}

// joinKey is rel below key, as Source.Key reads it.
func joinKey(key, rel string) string {
	if rel == "" || rel[0] == '[' {
		return key + rel
	}
	return key + "." + rel
}
