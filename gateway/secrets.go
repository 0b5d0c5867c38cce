package gateway

import (
	"context"
	"fmt"
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
	check := func(src chain.Source, key string, tpl *templates.Template) {
		if tpl == nil {
			return
		}
		for _, r := range tpl.Refs() {
			if r.Root != "secrets" || r.HasDefault || len(r.Path) == 0 {
				continue
			}
			if _, ok := vals[r.Path[0]]; ok {
				continue
			}
			fix := "set " + secrets.EnvPrefix + r.Path[0]
			if f := cfg.Gateway.SecretsFile; f != "" {
				fix = "add " + r.Path[0] + "=VALUE to " + f + " or " + fix
			}
			diags = append(diags, src.Key(joinKey(key, r.Key)).Errorf("<<%s>>: no secret %s: %s, or give a default with ??", r.Text, r.Path[0], fix))
		}
	}
	for _, name := range cfg.ProviderNames {
		p := cfg.Providers[name]
		check(p.Source, "config", p.ConfigTemplate)
	}
	var steps func([]*chain.Step)
	steps = func(list []*chain.Step) {
		for _, s := range list {
			check(s.Source, "payload_template", s.Payload)
			check(s.Source, "input", s.Input)
			if s.Approval != nil {
				check(s.Source, "approval.message", s.Approval.Message)
			}
			if s.Parallel != nil {
				steps(s.Parallel.Steps)
			}
			if s.Split != nil {
				check(s.Source, "split.items", s.Split.Items)
				steps(s.Split.Steps)
			}
		}
	}
	for _, name := range cfg.ChainNames {
		steps(cfg.Chains[name].Steps)
	}
	for _, name := range cfg.TriggerNames {
		tr := cfg.Triggers[name]
		check(tr.Source, "token", tr.Token)
		check(tr.Source, "secret", tr.Secret)
	}
	if len(diags) > 0 {
		return nil, &chain.ConfigError{Diagnostics: diags}
	}
	return vals, nil
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

// checkReloadSecrets refuses a config whose secrets the running gateway
// cannot give its runs: one a template reads that is missing, or values
// other than those it started with, which the engine takes only at start.
// Refusing keeps runs from going on with a value the operator replaced.
func (g *Gateway) checkReloadSecrets(cfg *chain.Config) error {
	vals, err := loadSecrets(cfg)
	if err != nil {
		return err
	}
	var changed []string
	for name, v := range vals {
		if old, ok := g.secrets[name]; !ok || old != v {
			changed = append(changed, name)
		}
	}
	if len(changed) == 0 {
		if diags := checkResolvedBuiltins(context.Background(), cfg, g.secrets, g.Redactor); len(diags) > 0 {
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
