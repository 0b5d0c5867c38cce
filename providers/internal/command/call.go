package command

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/chaingate/gateway/providers"
)

// Invocation is a declared command with its arguments checked: exactly
// what runs, nothing in it chosen by a call but the arguments' values.
type Invocation struct {
	// Name is the command's name, the call's action_type.
	Name string
	*Command
	// ArgEnv holds each argument given or defaulted, as the variable the
	// command gets: CHAINGATE_ARG_LOG_DIR = "/var/log/nginx".
	ArgEnv map[string]string
}

// Payload is what a call gives besides the command's name.
type Payload struct {
	// Args are the arguments' values, as JSON.
	Args map[string]json.RawMessage `json:"args"`
	// Host is where an ssh command runs.
	Host string `json:"host"`
}

// Payload keys of each provider's calls.
var (
	LocalPayloadKeys  = []string{"args"}
	RemotePayloadKeys = []string{"args", "host"}
)

// Resolve checks a call against the declared commands and returns what it
// runs. It is the one place a call's command and arguments are decided,
// for Execute and for CheckCall alike. A written call (call.Written) is
// checked as far as the config writes it: a value a template fills is
// null there, and is checked when the call is made. confine, when not
// nil, is asked about path arguments.
func (cs Commands) Resolve(call providers.Call, keys []string, confine Confiner) (*Invocation, Payload, error) {
	pl, err := decodePayload(call, keys)
	if err != nil {
		return nil, pl, err
	}
	if call.ActionType == "" {
		return nil, pl, providers.Permanent("unknown_command", "no action_type: a call names the command it runs, one of %s", cs.names())
	}
	c := cs[call.ActionType]
	if c == nil {
		return nil, pl, providers.Permanent("unknown_command", "the config declares no command %q; it declares %s", call.ActionType, cs.names())
	}
	inv := &Invocation{Name: call.ActionType, Command: c, ArgEnv: map[string]string{}}
	if call.Written && pl.Args == nil && argsTemplated(call) {
		return inv, pl, nil
	}
	var problems []string
	for _, n := range slices.Sorted(maps.Keys(pl.Args)) {
		if c.Args[n] == nil {
			problems = append(problems, fmt.Sprintf("argument %q is not one command %q declares (%s)", n, call.ActionType, argNames(c)))
		}
	}
	for _, n := range slices.Sorted(maps.Keys(c.Args)) {
		a := c.Args[n]
		v, given := pl.Args[n]
		switch {
		case given && call.Written && string(bytes.TrimSpace(v)) == "null":
			continue // a template fills it
		case !given && a.Default != nil:
			v = a.Default
		case !given && a.IsRequired():
			problems = append(problems, fmt.Sprintf("argument %q is required by command %q and not given", n, call.ActionType))
			continue
		case !given:
			continue
		}
		text, err := a.Value(v, confine)
		if err != nil {
			problems = append(problems, fmt.Sprintf("argument %q: %s %v", n, shown(v, a.Secret), err))
			continue
		}
		inv.ArgEnv[ArgEnvPrefix+strings.ToUpper(n)] = text
	}
	if len(problems) > 0 {
		return nil, pl, providers.Permanent("bad_argument", "%s", strings.Join(problems, "; "))
	}
	return inv, pl, nil
}

// argsTemplated reports whether one template fills a written call's args,
// or the whole payload.
func argsTemplated(call providers.Call) bool {
	_, whole := call.Templates[""]
	_, args := call.Templates["/args"]
	return whole || args
}

// decodePayload decodes a call's payload: an object of keys alone, or
// nothing. A payload written for the commands steps once gave whole is
// refused with the form that replaces it.
func decodePayload(call providers.Call, keys []string) (Payload, error) {
	var pl Payload
	raw := bytes.TrimSpace(call.Payload)
	if len(raw) == 0 || string(raw) == "null" {
		return pl, nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return pl, providers.Permanent("bad_payload", "the payload must be a table, { args = { NAME = value } }: %v", err)
	}
	if legacy := legacyKeys(fields); len(legacy) > 0 {
		return pl, providers.Permanent("bad_payload", "%s", migration(call, fields, legacy))
	}
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		if !slices.Contains(keys, k) {
			return pl, providers.Permanent("bad_payload", "unknown payload key %q; the payload takes %s", k, strings.Join(keys, ", "))
		}
	}
	if v, ok := fields["host"]; ok && !(call.Written && string(v) == "null") {
		if err := json.Unmarshal(v, &pl.Host); err != nil {
			return pl, providers.Permanent("bad_payload", "host must be a string: %v", err)
		}
	}
	if v, ok := fields["args"]; ok && string(bytes.TrimSpace(v)) != "null" {
		if err := json.Unmarshal(v, &pl.Args); err != nil {
			return pl, providers.Permanent("bad_payload", "args must be a table of NAME = value: %v", err)
		}
	}
	return pl, nil
}

// maxShown is how much of a refused value a message quotes.
const maxShown = 64

// shown is a value as a message quotes it: cut short when long, and only
// its size when secret.
func shown(v json.RawMessage, secret bool) string {
	if secret {
		return fmt.Sprintf("(a secret value of %d bytes)", len(v))
	}
	var s string
	if v = bytes.TrimSpace(v); v[0] != '"' || json.Unmarshal(v, &s) != nil {
		s = string(v)
		if len(s) > maxShown {
			return s[:maxShown] + "…"
		}
		return s
	}
	if utf8.RuneCountInString(s) > maxShown {
		cut := []rune(s)[:maxShown]
		return fmt.Sprintf("%q… (%d bytes)", string(cut), len(s))
	}
	return fmt.Sprintf("%q", s)
}

func argNames(c *Command) string {
	if len(c.Args) == 0 {
		return "it declares none"
	}
	return "it declares " + quoteList(slices.Sorted(maps.Keys(c.Args)))
}
