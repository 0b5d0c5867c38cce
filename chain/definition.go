package chain

import (
	"bytes"
	"fmt"
	"maps"

	"github.com/BurntSushi/toml"
)

// Definition returns a self-contained config document holding the named
// chain, every chain it calls through sub_chain, and the providers they use.
// A run stores it when it starts, so that it can resume on the same
// definition after the config has changed.
func (c *Config) Definition(name string) ([]byte, error) {
	if ch := c.Chains[name]; ch != nil && ch.definition != nil {
		return bytes.Clone(ch.definition), nil
	}
	return c.definition(name, true)
}

// Outline is Definition for showing to people: each provider's config
// table is left out, since it may hold a credential written in plain text.
func (c *Config) Outline(name string) ([]byte, error) {
	return c.definition(name, false)
}

// ProvidersUsed lists, in definition order, the providers a run of the
// named chain may call, through its sub-chains too.
func (c *Config) ProvidersUsed(name string) []string {
	if ch := c.Chains[name]; ch != nil && ch.providers != nil {
		return ch.providers
	}
	_, provs := c.closure(name)
	out := []string{}
	for _, n := range c.ProviderNames {
		if provs[n] {
			out = append(out, n)
		}
	}
	return out
}

// closure returns the chain and every chain it calls through sub_chain,
// and the providers their steps name.
func (c *Config) closure(name string) ([]*Chain, map[string]bool) {
	var chains []*Chain
	provs := map[string]bool{}
	seen := map[string]bool{}
	var visit func(*Chain)
	visit = func(ch *Chain) {
		if seen[ch.Name] {
			return
		}
		seen[ch.Name] = true
		chains = append(chains, ch)
		ch.WalkChain(func(s *Step) {
			for _, call := range s.Calls() {
				provs[call.Provider] = true
			}
			if sub := c.Chains[s.SubChain]; sub != nil {
				visit(sub)
			}
		})
	}
	if root := c.Chains[name]; root != nil {
		visit(root)
	}
	return chains, provs
}

func (c *Config) definition(name string, providerConfig bool) ([]byte, error) {
	if c.Chains[name] == nil {
		return nil, fmt.Errorf("encoding definition: unknown chain %q", name)
	}
	called, provs := c.closure(name)
	chains := make([]map[string]any, len(called))
	for i, ch := range called {
		chains[i] = ch.Raw
	}
	var providers []map[string]any
	for _, n := range c.ProviderNames {
		p := c.Providers[n]
		if !provs[n] {
			continue
		}
		raw := maps.Clone(p.Raw)
		if p.Plugin != "" {
			// Relative plugin paths were relative to the file they came from.
			raw["plugin"] = p.Plugin
		}
		for _, k := range ProviderLimitKeys {
			delete(raw, k)
		}
		if !providerConfig {
			delete(raw, "config")
		}
		providers = append(providers, raw)
	}
	doc := map[string]any{"chains": chains}
	if len(providers) > 0 {
		doc["providers"] = providers
	}
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(doc); err != nil {
		return nil, fmt.Errorf("encoding definition of chain %q: %w", name, err)
	}
	return buf.Bytes(), nil
}
