package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/secrets"
	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/builtin"
	"github.com/chaingate/gateway/providers/configschema"
	"github.com/chaingate/gateway/templates"
)

// A provider's config is checked at load as written, placeholders and all.
// What its calls get is that config with the secrets filled in, and a
// secret can still make it unusable: empty, or not an address. So the
// filled-in config is checked too, before anything is called: a built-in
// provider's when the gateway opens or reloads (its schema and its own
// CheckConfig, in-process), an external plugin's when the first run that
// uses it starts (its schema, which needs the plugin started).

// resolvedConfig is a provider's config as its calls get it.
func resolvedConfig(p *chain.Provider, vals map[string]string) (json.RawMessage, error) {
	if p.ConfigTemplate == nil {
		return p.Config, nil
	}
	m := make(map[string]any, len(vals))
	for k, v := range vals {
		m[k] = v
	}
	return p.ConfigTemplate.AppendJSON(nil, templates.MapScope{"secrets": m})
}

// checkResolved checks a provider's filled-in config against what the
// provider declares: its schema (a built-in's config as written was checked
// at load, so only a templated one again) and, for a built-in, its own
// CheckConfig. Messages are redacted: a schema's complaint may quote the
// value, and the value may be a secret.
func checkResolved(ctx context.Context, p *chain.Provider, info providers.Info, impl providers.Provider, vals map[string]string, red *secrets.Redactor) []chain.Diagnostic {
	config, err := resolvedConfig(p, vals)
	if err != nil {
		return []chain.Diagnostic{p.Source.Key("config").Errorf("filling in its secrets: %s", red.String(err.Error()))}
	}
	var diags []chain.Diagnostic
	if (p.ConfigTemplate != nil || impl == nil) && len(info.ConfigSchema) > 0 {
		if schema, err := configschema.Compile(info.ConfigSchema); err == nil {
			for _, prob := range schema.Validate(config) {
				diags = append(diags, p.Source.Key(configKey(prob.Path)).Errorf("with its secrets filled in: %s", red.String(prob.Message)))
			}
		}
	}
	if c, ok := impl.(providers.ConfigChecker); ok && len(diags) == 0 {
		if err := c.CheckConfig(ctx, config); err != nil {
			diags = append(diags, p.Source.Key("config").Errorf("the %s provider cannot use this config with its secrets filled in: %s", info.Name, red.String(err.Error())))
		}
	}
	return diags
}

// checkResolvedBuiltins checks the filled-in config of every provider of a
// built-in type whose config reads secrets (the others were checked whole
// when the config loaded).
func checkResolvedBuiltins(ctx context.Context, cfg *chain.Config, vals map[string]string, red *secrets.Redactor) []chain.Diagnostic {
	var diags []chain.Diagnostic
	for _, name := range cfg.ProviderNames {
		p := cfg.Providers[name]
		impl, ok := builtin.New(p.Type)
		if p.Type == "" || !ok || p.ConfigTemplate == nil {
			continue
		}
		info, err := impl.Describe(ctx)
		if err != nil {
			continue // checkBuiltinProviders has reported it
		}
		diags = append(diags, checkResolved(ctx, p, info, impl, vals, red)...)
	}
	return SortDiagnostics(diags)
}

// pluginChecks remembers the external plugins whose filled-in config has
// been checked, by the config entry (a reload makes new ones), with what
// was found.
type pluginChecks struct {
	mu   sync.Mutex
	done map[*chain.Provider]error
}

// CheckProvider implements engine.ProviderChecker: before a run starts,
// each external plugin it may call has its filled-in config checked once
// against the schema the plugin declares, and the credentials it marks as
// written. A plugin that cannot be started to say is let through: its step
// fails, and is retried, as it always has.
func (r *resolver) CheckProvider(ctx context.Context, p *chain.Provider) error {
	if p.Plugin == "" {
		return nil // built-ins were checked when the config was loaded
	}
	r.checks.mu.Lock()
	err, ok := r.checks.done[p]
	r.checks.mu.Unlock()
	if ok {
		return err
	}
	info, derr := r.m.Provider(r.spec(p)).Describe(ctx)
	if derr != nil {
		return nil
	}
	diags := checkResolved(ctx, p, info, nil, r.secrets, r.redactor)
	// Only validate --plugins checks the config as written otherwise.
	if schema, cerr := configschema.Compile(info.ConfigSchema); len(info.ConfigSchema) > 0 && cerr == nil {
		diags = append(checkCredentials(p, schema), diags...)
	}
	if len(diags) > 0 {
		err = fmt.Errorf("%w: %w", engine.ErrProviderConfig, &chain.ConfigError{Diagnostics: diags})
	}
	r.checks.mu.Lock()
	if r.checks.done == nil {
		r.checks.done = map[*chain.Provider]error{}
	}
	r.checks.done[p] = err
	r.checks.mu.Unlock()
	return err
}
