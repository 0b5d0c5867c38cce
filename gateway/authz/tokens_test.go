package authz_test

import (
	"testing"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/gateway/authz"
)

func TestTokensLookup(t *testing.T) {
	cfg := &chain.Config{}
	cfg.Gateway.Auth.Tokens = []chain.Token{{Name: "ops", Value: "full-1"}, {Secret: "TOK"}}
	cfg.Gateway.Auth.ReadTokens = []chain.Token{{Name: "dash", Value: "read-1"}, {Name: "both", Value: "full-1"}}
	env := []string{
		authz.EnvTokens + "=env-a, env-b",
		authz.EnvReadTokenPrefix + "carol=carol:tok,with=separators",
		"UNRELATED=full-1",
	}
	toks := authz.LoadTokens(cfg, map[string]string{"TOK": "from-secret"}, env)
	tests := []struct {
		tok   string
		ok    bool
		name  string
		write bool
	}{
		{"full-1", true, "ops", true},
		{"read-1", true, "dash", false},
		{"from-secret", true, "token sha256:", true},
		{"env-b", true, "token sha256:", true},
		{"carol:tok,with=separators", true, "carol", false},
		{"carol:tok", false, "", false},
		{"", false, "", false},
		{"full-", false, "", false},
	}
	for _, tc := range tests {
		sub, ok := toks.Lookup(tc.tok)
		if ok != tc.ok || sub.Write != tc.write || (ok && sub.Kind != authz.Token) {
			t.Errorf("Lookup(%q) = %+v, %v", tc.tok, sub, ok)
			continue
		}
		if ok && len(sub.Name) < len(tc.name) || ok && sub.Name[:len(tc.name)] != tc.name {
			t.Errorf("Lookup(%q) named %q, want %q", tc.tok, sub.Name, tc.name)
		}
	}
	if n := toks.Len(); n != 7 {
		t.Errorf("Len() = %d, want 7", n)
	}
}
