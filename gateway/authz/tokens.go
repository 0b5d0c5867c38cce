package authz

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"strings"

	"github.com/chaingate/gateway/chain"
)

// Token environment variables; they add to [gateway.auth]. EnvTokens and
// EnvReadTokens are comma-separated lists of unnamed tokens. Each variable
// EnvTokenPrefix+NAME (EnvReadTokenPrefix+NAME) holds one token, named
// NAME, its value whole: it may hold commas and any other character.
const (
	EnvTokens          = "CHAINGATE_API_TOKENS"
	EnvReadTokens      = "CHAINGATE_API_READ_TOKENS"
	EnvTokenPrefix     = "CHAINGATE_API_TOKEN_"
	EnvReadTokenPrefix = "CHAINGATE_API_READ_TOKEN_"
)

// Tokens are the API's bearer tokens, each with the subject it proves.
type Tokens struct {
	list []token
}

type token struct {
	value []byte
	sub   Subject
}

// LoadTokens gathers the tokens cfg, the secrets its tokens read (vals)
// and the environment (as os.Environ gives it) give the API. A name given
// to the same token twice is the first one.
func LoadTokens(cfg *chain.Config, vals map[string]string, environ []string) *Tokens {
	t := &Tokens{}
	names := map[string]string{}
	add := func(tok, name string, write bool, roles []string) {
		if tok = strings.TrimSpace(tok); tok == "" {
			return
		}
		if _, ok := names[tok]; !ok && name != "" {
			names[tok] = name
		}
		t.list = append(t.list, token{value: []byte(tok), sub: Subject{Kind: Token, Write: write, Roles: roles}})
	}
	for _, tok := range cfg.Gateway.Auth.Tokens {
		add(tokenValue(tok, vals), tok.Name, true, tok.Roles)
	}
	for _, tok := range cfg.Gateway.Auth.ReadTokens {
		add(tokenValue(tok, vals), tok.Name, false, tok.Roles)
	}
	env := map[string]string{}
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	for _, tok := range strings.Split(env[EnvTokens], ",") {
		add(tok, "", true, nil)
	}
	for _, tok := range strings.Split(env[EnvReadTokens], ",") {
		add(tok, "", false, nil)
	}
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		if name, ok := strings.CutPrefix(k, EnvTokenPrefix); ok && name != "" {
			add(v, name, true, nil)
		} else if name, ok := strings.CutPrefix(k, EnvReadTokenPrefix); ok && name != "" {
			add(v, name, false, nil)
		}
	}
	for i := range t.list {
		t.list[i].sub.Name = tokenName(string(t.list[i].value), names)
	}
	return t
}

// tokenValue is tok's value: as written, or the secret it reads.
func tokenValue(tok chain.Token, vals map[string]string) string {
	if tok.Secret != "" {
		return vals[tok.Secret]
	}
	return tok.Value
}

// tokenName is the name [gateway.auth] or the environment gives tok, or,
// for a token without one, the start of its SHA-256: enough to tell tokens
// apart in a run's events, nothing to replay it with.
func tokenName(tok string, names map[string]string) string {
	if name := names[tok]; name != "" {
		return name
	}
	sum := sha256.Sum256([]byte(tok))
	return "token sha256:" + hex.EncodeToString(sum[:4])
}

// Len is how many tokens there are; none leaves the API to loopback
// clients.
func (t *Tokens) Len() int { return len(t.list) }

// Lookup is the subject tok proves, if it is one of the tokens. Every
// token is compared in constant time, so the answer's timing tells nothing
// of which one matched or how closely; a token given as both full and
// read-only is full.
func (t *Tokens) Lookup(tok string) (Subject, bool) {
	var found Subject
	ok := false
	for _, c := range t.list {
		if subtle.ConstantTimeCompare([]byte(tok), c.value) == 1 && (!ok || c.sub.Write) {
			found, ok = c.sub, true
		}
	}
	return found, ok
}
