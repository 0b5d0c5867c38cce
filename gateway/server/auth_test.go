package server_test

import (
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/gateway/authz"
	"github.com/chaingate/gateway/gateway/server"
)

// TestAPITokensFromSecretsAndEnvironment gives the API tokens every way
// that keeps them out of config files, names and all: [gateway.auth]
// entries that read secrets, a variable per named token whose value holds
// the list's separators, and the plain list. Each works with its access,
// an approval records the name, and the placeholder is no token.
func TestAPITokensFromSecretsAndEnvironment(t *testing.T) {
	t.Setenv("CHAINGATE_SECRET_ALICE_TOKEN", "alice-from-a-secret")
	t.Setenv("CHAINGATE_SECRET_VIEWER_TOKEN", "viewer-from-a-secret")
	t.Setenv(authz.EnvTokens, "plain:with-colon, plain-two")
	t.Setenv(authz.EnvTokenPrefix+"carol", "carol:tok,with=separators")
	t.Setenv(authz.EnvReadTokenPrefix+"dave", "dave-reads")
	env := newAPI(t, strings.Replace(approvalConfig, `[gateway.auth]
tokens = [{ name = "alice", token = "alice-tok" }, { name = "bob", token = "bob-tok" }]
read_tokens = ["read-tok"]`, `[gateway.auth]
tokens = [{ name = "alice", token = "<<secrets.ALICE_TOKEN>>" }]
read_tokens = ["<<secrets.VIEWER_TOKEN>>"]`, 1))

	tests := []struct {
		token, method, path string
		status              int
	}{
		{"alice-from-a-secret", "GET", "/v1/runs", 200},
		{"<<secrets.ALICE_TOKEN>>", "GET", "/v1/runs", 401},
		{"viewer-from-a-secret", "GET", "/v1/runs", 200},
		{"viewer-from-a-secret", "POST", "/v1/chains/hello/runs", 403},
		{"carol:tok,with=separators", "POST", "/v1/chains/hello/runs", 202},
		{"carol:tok", "GET", "/v1/runs", 401},
		{"dave-reads", "GET", "/v1/runs", 200},
		{"dave-reads", "POST", "/v1/chains/hello/runs", 403},
		{"plain:with-colon", "POST", "/v1/chains/hello/runs", 202},
		{"plain-two", "GET", "/v1/runs", 200},
		{"plain", "GET", "/v1/runs", 401},
	}
	for _, tc := range tests {
		env.token = tc.token
		if code, _, body := env.call(tc.method, tc.path, "{}", nil, nil); code != tc.status {
			t.Errorf("%q %s %s: %d %s, want %d", tc.token, tc.method, tc.path, code, body, tc.status)
		}
	}

	for _, tc := range []struct{ token, by string }{
		{"alice-from-a-secret", "alice (API)"},
		{"carol:tok,with=separators", "carol (API)"},
	} {
		env.token = tc.token
		id := startRun(t, env, "restart-db", `{"host": "db-1"}`)
		waitAsking(t, env, id, "ask")
		if code, _, body := env.call("POST", "/v1/runs/"+id+"/signals/ask", `{"decision": "approve", "comment": "window open"}`, nil, nil); code != http.StatusAccepted {
			t.Fatalf("approving: %d %s", code, body)
		}
		if v := waitRunEnd(t, env, id); !strings.Contains(string(v.Body), `"by":"`+tc.by+`"`) {
			t.Errorf("the approval with %q is recorded as %s, want by %s", tc.token, v.Body, tc.by)
		}
	}
	if strings.Contains(env.logs.String(), "alice-from-a-secret") {
		t.Errorf("a token read from a secret was logged:\n%s", env.logs.String())
	}
}

// TestAPITokenSecretMissing: a token that reads a secret the gateway lacks,
// or one that is empty, stops it from opening, at the token's key, naming
// the variable to set.
func TestAPITokenSecretMissing(t *testing.T) {
	t.Setenv("CHAINGATE_SECRET_EMPTY_TOKEN", " ")
	_, dir, err := openWithSecrets(t, `[gateway.auth]
tokens = ["<<secrets.ADMIN_TOKEN>>"]
read_tokens = [{ name = "bob", token = "<<secrets.EMPTY_TOKEN>>" }]

[[providers]]
name = "echo"
type = "echo"

[[chains]]
name = "c"
[[chains.steps]]
name = "s"
provider = "echo"
`, "OTHER=x\n")
	var ce *chain.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("open: %v", err)
	}
	got := ce.Error()
	for _, want := range []string{
		"gw.toml:4:11: gateway.auth.tokens[0]: <<secrets.ADMIN_TOKEN>>: no secret ADMIN_TOKEN for this API token: add ADMIN_TOKEN=VALUE to " + filepath.Join(dir, "secrets.env") + " or set CHAINGATE_SECRET_ADMIN_TOKEN",
		"gw.toml:5:32: gateway.auth.read_tokens[0].token: <<secrets.EMPTY_TOKEN>>: the secret EMPTY_TOKEN is empty",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("error does not say %q:\n%s", want, got)
		}
	}
	cfg, err := gateway.LoadConfig([]string{filepath.Join(dir, "gw.toml")})
	if err != nil {
		t.Fatal(err)
	}
	if !server.AuthConfigured(cfg) {
		t.Error("a config whose tokens read secrets counts as having none")
	}
}
