package command

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/chaingate/gateway/providers"
)

// ArgEnvPrefix starts the name of the variable each argument is set in:
// an argument log_dir reaches the command as CHAINGATE_ARG_LOG_DIR. No
// program or shell reads a variable of the gateway's own prefix unless
// told to, so an argument is data wherever it lands: unlike BASH_ENV,
// ENV, PATH, IFS or LD_PRELOAD, no name an argument can have changes
// what runs.
const ArgEnvPrefix = "CHAINGATE_ARG_"

// Command is one command a provider's config declares, under the name a
// step gives as its action_type. Everything that decides what runs is
// here, in the provider's config, which no template but a secret can
// reach: the program and its arguments or the script, the shell, the
// directory, the environment, the standard input. A step only picks a
// command and fills the arguments it declares.
type Command struct {
	// Argv is the program and its arguments; Script is shell text run
	// with Shell instead. Exactly one is set.
	Argv   []string `json:"argv"`
	Script string   `json:"script"`
	Shell  string   `json:"shell"`
	// Dir is the working directory; empty for the provider's default.
	Dir string `json:"dir"`
	// Env is set in the command's environment, over the provider's.
	Env map[string]string `json:"env"`
	// Stdin is written to the command's standard input.
	Stdin          string  `json:"stdin"`
	TimeoutSeconds float64 `json:"timeout_seconds"`
	// User is, for ssh, the user to log in as, over the config's.
	User        string `json:"user"`
	Description string `json:"description"`
	// Args are the arguments a call may fill, by name.
	Args map[string]*Arg `json:"args"`
}

// commandKeys are the keys of a command's table.
var commandKeys = []string{"argv", "script", "shell", "dir", "env", "stdin", "timeout_seconds", "user", "description", "args"}

// Timeout is the command's own timeout; zero when it sets none.
func (c *Command) Timeout() time.Duration {
	return time.Duration(c.TimeoutSeconds * float64(time.Second))
}

// Commands are a config's commands, by name.
type Commands map[string]*Command

// Where says where a provider runs its commands, which decides what a
// command's table may hold.
type Where int

const (
	// Local commands run on the gateway's machine: a shell is named by
	// its absolute path, and there is no user to log in as.
	Local Where = iota
	// Remote commands run on another host, where the shell is looked up
	// in the login user's PATH.
	Remote
)

var (
	commandName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)
	argName     = regexp.MustCompile(`^[a-z][a-z0-9_]{0,62}$`)
	envName     = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// DecodeCommands decodes the commands table of a provider's config JSON,
// every key exactly as written, and checks each command.
func DecodeCommands(raw json.RawMessage, where Where) (Commands, error) {
	var cfg struct {
		Commands map[string]json.RawMessage `json:"commands"`
	}
	if len(bytes.TrimSpace(raw)) > 0 {
		if err := json.Unmarshal(raw, &cfg); err != nil {
			return nil, fmt.Errorf("decoding the config's commands: %w", err)
		}
	}
	cmds := make(Commands, len(cfg.Commands))
	for _, name := range slices.Sorted(maps.Keys(cfg.Commands)) {
		var c Command
		if err := DecodeExact(cfg.Commands[name], commandKeys, &c); err != nil {
			return nil, fmt.Errorf("commands.%s: %w", name, err)
		}
		if err := c.check(name, where); err != nil {
			return nil, fmt.Errorf("commands.%s: %w", name, err)
		}
		cmds[name] = &c
	}
	return cmds, nil
}

// DecodeExact decodes a JSON object into v, refusing any key that is not
// exactly one of keys: encoding/json alone takes "Argv" for "argv".
func DecodeExact(raw json.RawMessage, keys []string, v any) error {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return fmt.Errorf("must be a table: %w", err)
	}
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		if !slices.Contains(keys, k) {
			return fmt.Errorf("unknown key %q; the keys are %s", k, strings.Join(keys, ", "))
		}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// check says what is wrong with a command declared as name, if anything,
// and compiles its arguments' rules.
func (c *Command) check(name string, where Where) error {
	switch {
	case !commandName.MatchString(name):
		return fmt.Errorf("%q is not a command name: letters, digits, '_', '.' and '-', up to 64, starting with a letter or digit", name)
	case strings.HasPrefix(name, providers.ReservedActionPrefix):
		return fmt.Errorf("the %q prefix is the gateway's own", providers.ReservedActionPrefix)
	case len(c.Argv) > 0 && c.Script != "":
		return errors.New("give argv or script, not both")
	case len(c.Argv) == 0 && strings.TrimSpace(c.Script) == "":
		return errors.New("give argv = [program, args...] or a script")
	case len(c.Argv) > 0 && c.Argv[0] == "":
		return errors.New("argv[0], the program, is empty")
	case c.Shell != "" && c.Script == "":
		return errors.New("shell runs a script; a command with argv names its program in argv[0]")
	case c.Shell != "" && where == Local && !path.IsAbs(c.Shell):
		return fmt.Errorf("shell %q must be an absolute path", c.Shell)
	case c.Dir != "" && !path.IsAbs(c.Dir):
		return fmt.Errorf("dir %q must be an absolute path", c.Dir)
	case where == Remote && len(c.Argv) > 0 && strings.Contains(c.Argv[0], "="):
		return fmt.Errorf("argv[0] %q holds '=', which env(1) on the host would take for a variable; name the program without one", c.Argv[0])
	case where == Remote && strings.Contains(c.Shell, "="):
		return fmt.Errorf("shell %q holds '=', which env(1) on the host would take for a variable", c.Shell)
	case c.User != "" && where == Local:
		return errors.New("user is for commands run over ssh; a local command runs as the gateway's user")
	case c.TimeoutSeconds < 0:
		return errors.New("timeout_seconds must not be negative")
	}
	if c.User != "" {
		if err := ValidUser(c.User); err != nil {
			return err
		}
	}
	texts := map[string]string{"script": c.Script, "shell": c.Shell, "dir": c.Dir, "stdin": c.Stdin}
	for i, a := range c.Argv {
		texts[fmt.Sprintf("argv[%d]", i)] = a
	}
	for _, k := range slices.Sorted(maps.Keys(texts)) {
		if strings.ContainsRune(texts[k], 0) {
			return fmt.Errorf("%s holds a NUL byte, which no program can be given", k)
		}
	}
	if err := CheckEnv(c.Env); err != nil {
		return err
	}
	for _, n := range slices.Sorted(maps.Keys(c.Args)) {
		if !argName.MatchString(n) {
			return fmt.Errorf("args.%s: an argument's name is lower-case letters, digits and '_', starting with a letter (it is set as %s%s)", n, ArgEnvPrefix, strings.ToUpper(n))
		}
		a := c.Args[n]
		if a == nil {
			return fmt.Errorf("args.%s: declare it as a table, { type = \"string\", pattern = \"...\" }", n)
		}
		if err := a.compile(); err != nil {
			return fmt.Errorf("args.%s: %w", n, err)
		}
	}
	return nil
}

// CheckEnv checks the names and values of an environment table written
// in a config.
func CheckEnv(env map[string]string) error {
	for _, k := range slices.Sorted(maps.Keys(env)) {
		switch {
		case !envName.MatchString(k):
			return fmt.Errorf("env name %q is not a valid variable name (letters, digits and _, not starting with a digit)", k)
		case strings.HasPrefix(k, "CHAINGATE_"):
			return fmt.Errorf("env name %q: the CHAINGATE_ prefix is the gateway's own (%s, %s... and the arguments)", k, EnvDedupKey, ArgEnvPrefix)
		case strings.ContainsRune(env[k], 0):
			return fmt.Errorf("env %s holds a NUL byte, which no variable can carry", k)
		}
	}
	return nil
}

// ValidUser says what is wrong with a user name, if anything: it goes to
// a server as it is, so it must at least be a plausible name.
func ValidUser(u string) error {
	if u == "" || strings.HasPrefix(u, "-") || strings.ContainsFunc(u, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return fmt.Errorf("user %q is not a user name", u)
	}
	return nil
}

// names lists the declared commands, quoted, for messages.
func (cs Commands) names() string {
	if len(cs) == 0 {
		return "none: the config declares no commands"
	}
	var q []string
	for _, n := range slices.Sorted(maps.Keys(cs)) {
		q = append(q, fmt.Sprintf("%q", n))
	}
	return strings.Join(q, ", ")
}

// CommandsSchema is the JSON Schema of a config's commands table, for the
// providers' config schemas; user is allowed where commands run remotely.
func CommandsSchema(where Where) string {
	user := ""
	if where == Remote {
		user = `
          "user": {"type": "string", "minLength": 1, "description": "the user to log in as, over the config's"},`
	}
	return `
    "commands": {
      "type": "object",
      "description": "the commands a step may run, by the name its action_type gives",
      "additionalProperties": {
        "type": "object",
        "additionalProperties": false,
        "properties": {
          "argv": {"type": "array", "minItems": 1, "items": {"type": "string"}},
          "script": {"type": "string", "minLength": 1},
          "shell": {"type": "string", "minLength": 1},
          "dir": {"type": "string", "minLength": 1},
          "env": {"type": "object", "additionalProperties": {"type": "string"}},
          "stdin": {"type": "string"},
          "timeout_seconds": {"type": "number", "minimum": 0},` + user + `
          "description": {"type": "string"},
          "args": {
            "type": "object",
            "additionalProperties": {
              "type": "object",
              "additionalProperties": false,
              "required": ["type"],
              "properties": {
                "type": {"enum": ["string", "integer", "boolean", "hostname", "path"]},
                "description": {"type": "string"},
                "required": {"type": "boolean"},
                "default": {"type": ["string", "integer", "boolean"]},
                "secret": {"type": "boolean"},
                "pattern": {"type": "string", "minLength": 1},
                "enum": {"type": "array", "minItems": 1, "items": {"type": "string"}},
                "min_length": {"type": "integer", "minimum": 0},
                "max_length": {"type": "integer", "minimum": 1},
                "allow_leading_dash": {"type": "boolean"},
                "min": {"type": "integer"},
                "max": {"type": "integer"},
                "roots": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}}
              }
            }
          }
        }
      }
    },`
}
