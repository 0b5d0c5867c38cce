package ssh_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	xssh "golang.org/x/crypto/ssh"

	"github.com/chaingate/gateway/internal/testutil/sshdtest"
	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/ssh"
)

func TestCheckConfig(t *testing.T) {
	key := sshdtest.NewKey(t)
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	block, err := xssh.MarshalPrivateKeyWithPassphrase(priv, "", []byte("sesame"))
	if err != nil {
		t.Fatal(err)
	}
	encrypted := string(pem.EncodeToMemory(block))
	dir := t.TempDir()
	knownHosts := filepath.Join(dir, "known_hosts")
	if err := os.WriteFile(knownHosts, []byte("web-1.prod.example.com "+key.Public+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	garbage := filepath.Join(dir, "garbage")
	if err := os.WriteFile(garbage, []byte("this is no known_hosts file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := map[string]any{"user": "ops", "private_key": key.Private, "known_hosts": knownHosts, "allowed_hosts": []string{"web-*.prod.example.com"}}
	with := func(over map[string]any) map[string]any {
		cfg := map[string]any{}
		for k, v := range base {
			cfg[k] = v
		}
		for k, v := range over {
			if v == nil {
				delete(cfg, k)
			} else {
				cfg[k] = v
			}
		}
		return cfg
	}
	for _, tc := range []struct {
		name string
		over map[string]any
		err  string // "" when the config is good
	}{
		{"known_hosts and a key", nil, ""},
		{"pinned keys", map[string]any{"known_hosts": nil, "host_keys": []string{key.Public}}, ""},
		{"a password", map[string]any{"private_key": nil, "password": "pw"}, ""},
		{"an encrypted key", map[string]any{"private_key": encrypted, "passphrase": "sesame"}, ""},
		{"insecure", map[string]any{"known_hosts": nil, "insecure_ignore_host_key": true}, ""},
		{"a jump host", map[string]any{"jump_host": "bastion.example.com:2222", "jump_user": "jump"}, ""},
		{"every option", map[string]any{"port": 2222, "connect_timeout_seconds": 2.5, "max_sessions_per_host": 2, "kill_grace_seconds": 1, "ok_exit_codes": []int{0, 1}, "max_output_bytes": 4096}, ""},

		{"no auth method", map[string]any{"private_key": nil}, "give private_key or password"},
		{"a passphrase alone", map[string]any{"private_key": nil, "password": "pw", "passphrase": "x"}, "passphrase is set without private_key"},
		{"an encrypted key without its passphrase", map[string]any{"private_key": encrypted}, "private_key is encrypted: give its passphrase"},
		{"the wrong passphrase", map[string]any{"private_key": encrypted, "passphrase": "open"}, "decrypting private_key"},
		{"a passphrase for a plain key", map[string]any{"passphrase": "sesame"}, "not encrypted"},
		{"a bad key", map[string]any{"private_key": "-----BEGIN OPENSSH PRIVATE KEY-----\nnope\n-----END OPENSSH PRIVATE KEY-----\n"}, "private_key is not a private key"},
		{"no host key source", map[string]any{"known_hosts": nil}, "give known_hosts"},
		{"insecure and known_hosts", map[string]any{"insecure_ignore_host_key": true}, "either check host keys or do not"},
		{"known_hosts missing", map[string]any{"known_hosts": filepath.Join(dir, "none")}, "reading known_hosts"},
		{"known_hosts unreadable as such", map[string]any{"known_hosts": garbage}, "reading known_hosts"},
		{"known_hosts relative", map[string]any{"known_hosts": "known_hosts"}, "absolute path"},
		{"a bad pinned key", map[string]any{"known_hosts": nil, "host_keys": []string{"ssh-ed25519 AAAAnotakey"}}, "host_keys[0]"},
		{"two keys on a pinned line", map[string]any{"known_hosts": nil, "host_keys": []string{key.Public + "\n" + key.Public}}, "one key a line"},
		{"no allowed_hosts", map[string]any{"allowed_hosts": nil}, "allowed_hosts is required"},
		{"empty allowed_hosts", map[string]any{"allowed_hosts": []string{}}, "allowed_hosts is required"},
		{"a bad pattern", map[string]any{"allowed_hosts": []string{"web-[1.example.com"}}, "allowed_hosts[0]"},
		{"a pattern with a port", map[string]any{"allowed_hosts": []string{"web-1:22"}}, "patterns match the host alone"},
		{"a pattern with a slash", map[string]any{"allowed_hosts": []string{"10.0.0.0/8"}}, "not a host pattern"},
		{"a bad jump host", map[string]any{"jump_host": "bastion:ssh"}, "jump_host"},
		{"jump_user alone", map[string]any{"jump_user": "jump"}, "jump_user is set without jump_host"},
		{"a bad user", map[string]any{"user": "ops; rm"}, "not a user name"},
		{"a bad port", map[string]any{"port": 70000}, "not a TCP port"},
		{"unknown key", map[string]any{"forward_agent": true}, "unknown field"},
		{"bad limits", map[string]any{"ok_exit_codes": []int{0}, "retryable_exit_codes": []int{0}}, "both in ok_exit_codes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw, _ := json.Marshal(with(tc.over))
			p := ssh.New()
			err := p.(providers.ConfigChecker).CheckConfig(context.Background(), raw)
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("err %v, want one saying %q", err, tc.err)
			}
			if err != nil && strings.Contains(err.Error(), "sesame") {
				t.Errorf("the error shows the passphrase: %v", err)
			}
		})
	}
}
