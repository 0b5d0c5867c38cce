package command_test

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/internal/command"
)

// FuzzResolve feeds arbitrary declarations and payloads to the one
// function that decides what a call runs: it never panics, and what it
// lets through is only declared arguments' values, as plain text.
func FuzzResolve(f *testing.F) {
	f.Add(`{"c": {"script": "x", "args": {"v": {"type": "string"}}}}`, `{"args": {"v": "a"}}`)
	f.Add(`{"c": {"argv": ["true"], "args": {"p": {"type": "path", "roots": ["/var/log"]}, "n": {"type": "integer", "min": -3, "max": 9}}}}`, `{"args": {"p": "/var/log/../x", "n": "-2"}}`)
	f.Add(`{"c": {"script": "x", "args": {"h": {"type": "hostname", "pattern": "[a-z]+", "enum": ["a"]}, "b": {"type": "boolean", "default": true}}}}`, `{"args": {"h": "a", "b": "false"}}`)
	f.Add(`{"c": {"script": "x"}}`, `{"command": ["sh", "-c", null], "env": {"A": null}}`)
	f.Fuzz(func(t *testing.T, decl, payload string) {
		cmds, err := command.DecodeCommands(json.RawMessage(`{"commands": `+decl+`}`), command.Remote)
		if err != nil {
			return
		}
		for _, written := range []bool{false, true} {
			inv, _, err := cmds.Resolve(providers.Call{Name: "s", ActionType: "c", Payload: json.RawMessage(payload), Written: written}, command.RemotePayloadKeys, nil)
			if err != nil || written {
				continue
			}
			for k, v := range inv.ArgEnv {
				name := strings.ToLower(strings.TrimPrefix(k, command.ArgEnvPrefix))
				if !strings.HasPrefix(k, command.ArgEnvPrefix) || inv.Args[name] == nil {
					t.Fatalf("%s is no declared argument's variable", k)
				}
				if !utf8.ValidString(v) || strings.ContainsFunc(v, unicode.IsControl) {
					t.Fatalf("%s = %q passed", k, v)
				}
			}
		}
	})
}
