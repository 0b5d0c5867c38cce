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
		return nil, &chain.ConfigError{Diagnostics: []chain.Diagnostic{{Path: "gateway.secrets_file", Message: err.Error()}}}
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
			diags = append(diags, src.Key(joinKey(key, r.Key)).Errorf("<<%s>>: no secret %s: %s, or give a default with ??", r.Text, r.Path[0], secretFix(cfg, r.Path[0])))
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
	if len(diags) > 0 {
		return nil, &chain.ConfigError{Diagnostics: diags}
	}
	return vals, nil
}

// secretFix says how to give the gateway the secret name.
func secretFix(cfg *chain.Config, name string) string {
	fix := "set " + secrets.EnvPrefix + name
	if f := cfg.Gateway.SecretsFile; f != "" {
		fix = "add " + name + "=VALUE to " + f + " or " + fix
	}
	return fix
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
