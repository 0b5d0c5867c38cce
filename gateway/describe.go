package gateway

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/secrets"
	"github.com/chaingate/gateway/internal/jsonx"
	"github.com/chaingate/gateway/plugins/host"
	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/builtin"
	"github.com/chaingate/gateway/providers/configschema"
	"github.com/chaingate/gateway/templates"
)

// What a provider accepts is checked against the config that uses it: each
// step's action_type against the action types the provider declares, and
// the provider's config table against its config schema. Built-in providers
// describe themselves in-process at no cost, so every load checks them;
// external plugins must be started to say, which only "validate --plugins"
// does.

// checkBuiltinProviders checks the providers of built-in types.
func checkBuiltinProviders(cfg *chain.Config) []chain.Diagnostic {
	var diags []chain.Diagnostic
	for _, name := range cfg.ProviderNames {
		p := cfg.Providers[name]
		if p.Type == "" {
			continue
		}
		impl, ok := builtin.New(p.Type)
		if !ok {
			continue // the loader has reported it
		}
		// A built-in's Describe does no I/O.
		info, err := impl.Describe(context.Background())
		if err != nil {
			diags = append(diags, p.Source.Key("type").Errorf("describing the built-in %s provider: %v", p.Type, err))
			continue
		}
		found := checkProvider(cfg, p, info)
		// A config with placeholders is checked whole once its secrets are
		// filled in, when the gateway opens.
		if c, ok := impl.(providers.ConfigChecker); ok && len(found) == 0 && p.ConfigTemplate == nil {
			if err := c.CheckConfig(context.Background(), p.Config); err != nil {
				found = append(found, p.Source.Key("config").Errorf("the %s provider cannot use this config: %v", info.Name, err))
			}
		}
		if c, ok := impl.(providers.CallChecker); ok && len(found) == 0 {
			found = append(found, checkCalls(cfg, p, c)...)
		}
		diags = append(diags, found...)
	}
	return SortDiagnostics(diags)
}

// ExternalProviders lists, in definition order, the providers served by an
// external plugin, whose action types and config only CheckPlugins checks.
func ExternalProviders(cfg *chain.Config) []string {
	var out []string
	for _, name := range cfg.ProviderNames {
		if cfg.Providers[name].Plugin != "" {
			out = append(out, name)
		}
	}
	return out
}

// PluginCheckOptions configures CheckPlugins.
type PluginCheckOptions struct {
	// Timeout bounds starting each plugin and reading its Describe;
	// default 15 s.
	Timeout time.Duration
	// Logger receives the plugins' logs; default discards.
	Logger *slog.Logger
}

// CheckPlugins starts every external plugin the config names, reads its
// Describe and checks the steps and config that use it as the loader
// checks built-in providers. It stops the plugins before it returns.
func CheckPlugins(ctx context.Context, cfg *chain.Config, opts PluginCheckOptions) []chain.Diagnostic {
	if opts.Timeout <= 0 {
		opts.Timeout = 15 * time.Second
	}
	pm := host.NewManager(host.Options{Logger: opts.Logger, StartTimeout: opts.Timeout})
	defer pm.Close()
	names := ExternalProviders(cfg)
	results := make([][]chain.Diagnostic, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		p := cfg.Providers[name]
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
			defer cancel()
			info, err := pm.Provider(host.Spec{Name: p.Name, Path: p.Plugin, SHA256: p.SHA256}).Describe(ctx)
			if err != nil {
				results[i] = []chain.Diagnostic{p.Source.Key("plugin").Errorf("starting the plugin to read what it accepts: %v", err)}
				return
			}
			results[i] = checkProvider(cfg, p, info)
		})
	}
	wg.Wait()
	return SortDiagnostics(slices.Concat(results...))
}

// checkProvider checks one provider's config and the steps that call it
// against what the provider says it accepts.
func checkProvider(cfg *chain.Config, p *chain.Provider, info providers.Info) []chain.Diagnostic {
	var diags []chain.Diagnostic
	if len(info.ActionTypes) > 0 {
		accepted := quoted(info.ActionTypes)
		for _, c := range cfg.Calls() {
			switch {
			case c.Provider != p.Name:
			case c.ActionType == "":
				diags = append(diags, c.Source.Key("action_type").Errorf("provider %q needs an action_type: one of %s", p.Name, accepted))
			case !slices.Contains(info.ActionTypes, c.ActionType):
				diags = append(diags, c.Source.Key("action_type").Errorf("provider %q does not accept action type %q; it accepts %s", p.Name, c.ActionType, accepted))
			}
		}
	}
	if len(info.ConfigSchema) == 0 {
		return diags
	}
	schema, err := configschema.Compile(info.ConfigSchema)
	if err != nil {
		return append(diags, p.Source.Errorf("the %s provider's own config schema is broken, so its config cannot be checked: %v", info.Name, err))
	}
	// Templated values are checked as the strings they are written as.
	for _, prob := range schema.Validate(p.Config) {
		diags = append(diags, p.Source.Key(configKey(prob.Path)).Errorf("%s", prob.Message))
	}
	return append(diags, checkCredentials(p, schema)...)
}

// checkCredentials checks the values of p's config that its schema marks
// as credentials: each must read a secret, with no ?? default, which would
// be the credential written into the config.
func checkCredentials(p *chain.Provider, schema *configschema.Schema) []chain.Diagnostic {
	var diags []chain.Diagnostic
	for _, v := range schema.Secrets(p.Config) {
		s, _ := v.Value.(string)
		tpl, err := templates.CompileString(s)
		switch {
		case err != nil || !slices.ContainsFunc(tpl.Refs(), func(r templates.Ref) bool { return r.Root == "secrets" }):
			diags = append(diags, p.Source.Key(configKey(v.Path)).Errorf(
				"is a credential, so it must come from a secret, never be written into the config: write \"<<secrets.NAME>>\" and set %sNAME in the environment or NAME=VALUE in [gateway].secrets_file", secrets.EnvPrefix))
		case tpl.Defaulted():
			// The default is not shown: it would be the credential itself.
			diags = append(diags, p.Source.Key(configKey(v.Path)).Errorf(
				"is a credential, so it takes no ?? default, which would be one written into the config: read it as \"<<secrets.NAME>>\" alone"))
		}
	}
	return diags
}

// credentialKeys lists where in a built-in provider's config its schema
// marks credentials, as template keys write them; known is false for a
// provider whose schema cannot be read here (an external plugin's).
func credentialKeys(p *chain.Provider) (keys []string, known bool) {
	impl, ok := builtin.New(p.Type)
	if p.Type == "" || !ok {
		return nil, false
	}
	// A built-in's Describe does no I/O.
	info, err := impl.Describe(context.Background())
	if err != nil {
		return nil, false
	}
	if len(info.ConfigSchema) == 0 {
		return nil, true
	}
	schema, err := configschema.Compile(info.ConfigSchema)
	if err != nil {
		return nil, false
	}
	for _, v := range schema.Secrets(p.Config) {
		keys = append(keys, v.Path)
	}
	return keys, true
}

func configKey(path string) string {
	if path == "" || strings.HasPrefix(path, "[") {
		return "config" + path
	}
	return "config." + path
}

// checkCalls has a provider whose config declares what its calls may ask
// check every call the config makes of it, as written: what the calls'
// templates fill is checked by the provider when each call is made.
func checkCalls(cfg *chain.Config, p *chain.Provider, checker providers.CallChecker) []chain.Diagnostic {
	var diags []chain.Diagnostic
	for _, c := range cfg.Calls() {
		if c.Provider != p.Name {
			continue
		}
		call, err := writtenCall(c)
		if err == nil {
			err = checker.CheckCall(context.Background(), p.Config, call)
		}
		if err == nil {
			continue
		}
		key := "payload_template"
		var pe *providers.Error
		if errors.As(err, &pe) && pe.Code == "unknown_command" {
			key = "action_type"
		}
		diags = append(diags, c.Source.Key(key).Errorf("provider %q refuses this call: %v", p.Name, err))
	}
	return diags
}

// writtenCall is a call as its config writes it, for a CallChecker.
func writtenCall(c chain.Call) (providers.Call, error) {
	call := providers.Call{Name: c.Name, ActionType: c.ActionType, Written: true}
	if c.Payload == nil {
		return call, nil
	}
	v, holes := c.Payload.Written()
	payload, err := jsonx.Marshal(v)
	if err != nil {
		return call, fmt.Errorf("encoding the payload as written: %w", err)
	}
	call.Payload, call.Templates = payload, holes
	return call, nil
}

func quoted(list []string) string {
	q := make([]string, len(list))
	for i, s := range list {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}

// SortDiagnostics orders diagnostics by file and position, as the loader does.
func SortDiagnostics(ds []chain.Diagnostic) []chain.Diagnostic {
	slices.SortStableFunc(ds, func(a, b chain.Diagnostic) int {
		return cmp.Or(cmp.Compare(a.File, b.File), cmp.Compare(a.Line, b.Line), cmp.Compare(a.Col, b.Col))
	})
	return ds
}
