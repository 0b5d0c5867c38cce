package command

import (
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/chaingate/gateway/internal/tomlx"
	"github.com/chaingate/gateway/providers"
)

// legacyPayloadKeys are the payload keys with which a step once gave its
// command whole. A config that still uses them is refused with the form
// that replaces them.
var legacyPayloadKeys = []string{"command", "shell", "script", "env", "stdin", "timeout_seconds", "user"}

func legacyKeys(fields map[string]json.RawMessage) []string {
	var found []string
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		if slices.Contains(legacyPayloadKeys, k) {
			found = append(found, k)
		}
	}
	return found
}

// migration says why a payload that gives its command whole is refused,
// and, for a call as the config writes it, shows the declaration and the
// call that replace it.
func migration(call providers.Call, fields map[string]json.RawMessage, legacy []string) string {
	msg := fmt.Sprintf("the payload gives %s, which a step no longer may: what runs is declared in the provider's config, under a name, and a step names it in action_type and fills its arguments in args, each checked by the rule its declaration gives", strings.Join(legacy, ", "))
	if !call.Written {
		return msg + `; declare the command as [providers.config.commands.NAME] and call it with action_type = "NAME", payload_template = { args = { ... } }`
	}
	m := migrator{call: call, argEnv: map[string]string{}}
	decl, problems := m.declaration(fields)
	var b strings.Builder
	b.WriteString(msg + ". For this call, declare in the provider's config\n\n")
	fmt.Fprintf(&b, "    [providers.config.commands.%s]\n", m.name())
	for _, line := range decl {
		b.WriteString("    " + strings.ReplaceAll(line, "\n", "\n    ") + "\n")
	}
	fmt.Fprintf(&b, "\nand call it with\n\n    action_type = %s\n", tomlx.String(m.name()))
	if pl := m.payload(fields); len(pl) > 0 {
		fmt.Fprintf(&b, "    payload_template = { %s }\n", strings.Join(pl, ", "))
	}
	if len(m.args) > 0 {
		b.WriteString("\nnarrowing each argument's rule to what its value may be: type = \"path\" with roots, \"hostname\", \"integer\", or a tighter pattern or an enum")
	}
	for _, p := range problems {
		b.WriteString("\n" + p)
	}
	return b.String()
}

// migrator builds the replacement of one legacy call.
type migrator struct {
	call providers.Call
	// args are the arguments made of templated values, in order, and
	// argEnv the variable each template's value now arrives in.
	args   []migratedArg
	argEnv map[string]string
}

type migratedArg struct {
	name, template string
}

var commandNameBad = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

func (m *migrator) name() string {
	n := strings.Trim(commandNameBad.ReplaceAllString(m.call.Name, "-"), "-._")
	if n == "" {
		return "run"
	}
	return n
}

// arg names the argument a templated value at ptr becomes, after the last
// key of the path it reads, and returns its variable.
func (m *migrator) arg(ptr, hint string) string {
	tpl := m.call.Templates[ptr]
	name := argFromTemplate(tpl)
	if name == "" {
		name = strings.ToLower(hint)
	}
	if !argName.MatchString(name) {
		name = "value"
	}
	base := name
	for i := 2; slices.ContainsFunc(m.args, func(a migratedArg) bool { return a.name == name }); i++ {
		name = base + "_" + strconv.Itoa(i)
	}
	m.args = append(m.args, migratedArg{name: name, template: tpl})
	return ArgEnvPrefix + strings.ToUpper(name)
}

var templatePath = regexp.MustCompile(`<<\s*[A-Za-z_]+((?:\.[A-Za-z0-9_-]+)*)`)

func argFromTemplate(tpl string) string {
	m := templatePath.FindStringSubmatch(tpl)
	if m == nil || m[1] == "" {
		return ""
	}
	segs := strings.Split(m[1], ".")
	return strings.ToLower(strings.ReplaceAll(segs[len(segs)-1], "-", "_"))
}

// program names the program of a legacy command, or the program a
// wrapper in front of it runs, as far as its first word tells.
func (m *migrator) program(argv []json.RawMessage) string {
	s, _ := literal(argv[0])
	return s
}

// declaration is the command's table, line by line, and what cannot be
// carried over.
func (m *migrator) declaration(fields map[string]json.RawMessage) ([]string, []string) {
	var lines, problems []string
	env := map[string]string{}
	var envOrder []string
	if raw, ok := fields["env"]; ok {
		var vals map[string]json.RawMessage
		if json.Unmarshal(raw, &vals) != nil {
			problems = append(problems, "env was one template; give each value as an argument instead")
		}
		for _, k := range slices.Sorted(maps.Keys(vals)) {
			if s, ok := literal(vals[k]); ok {
				env[k] = s
				envOrder = append(envOrder, k)
				continue
			}
			m.argEnv[k] = m.arg("/env/"+pointerToken(k), k)
		}
	}
	script, hasScript := literal(fields["script"])
	var argv []json.RawMessage
	_ = json.Unmarshal(fields["command"], &argv)
	switch {
	case hasScript:
		lines = append(lines, "script = "+tomlScript(m.renamed(script)))
	case len(argv) > 0 && string(argv[0]) == "null":
		problems = append(problems, "command[0], the program, came from a template ("+m.call.Templates["/command/0"]+"): a declaration names its program, so name the one this step should run")
	case len(argv) > 0:
		words, allLiteral := make([]string, len(argv)), true
		for i, a := range argv {
			if s, ok := literal(a); ok {
				words[i] = s
				continue
			}
			allLiteral = false
			v := m.arg("/command/"+strconv.Itoa(i), fmt.Sprintf("arg%d", i))
			words[i] = `"$` + v + `"`
			problems = append(problems, fmt.Sprintf(`"$%s" stands where command[%d] was: it is data only if %s takes it as data. Where it reads it as code (as a shell does after -c), write the code itself into the script, and pass only values`, v, i, m.program(argv)))
		}
		if allLiteral {
			lines = append(lines, "argv = "+tomlx.Strings(words))
		} else {
			for i, a := range argv {
				if s, ok := literal(a); ok {
					words[i] = shellQuote(s)
				}
			}
			lines = append(lines, "script = "+tomlScript(strings.Join(words, " ")))
		}
	default:
		problems = append(problems, "the script or command came from a template: write it in the declaration")
	}
	if len(envOrder) > 0 {
		var kv []string
		for _, k := range envOrder {
			kv = append(kv, k+" = "+tomlx.String(env[k]))
		}
		lines = append(lines, "env = { "+strings.Join(kv, ", ")+" }")
	}
	for _, k := range []string{"stdin", "timeout_seconds", "user"} {
		raw, ok := fields[k]
		if !ok {
			continue
		}
		if string(raw) == "null" {
			problems = append(problems, k+" came from a template, which a declaration cannot take; pass the value as an argument")
			continue
		}
		if s, ok := literal(raw); ok {
			lines = append(lines, k+" = "+tomlx.String(s))
		} else {
			lines = append(lines, k+" = "+string(raw))
		}
	}
	for _, a := range m.args {
		lines = append(lines, "args."+a.name+` = { type = "string", pattern = "[A-Za-z0-9_][A-Za-z0-9._-]*" }`)
	}
	return lines, problems
}

// renamed is a script whose variables that came from templates are read
// from the arguments' variables instead.
func (m *migrator) renamed(script string) string {
	for _, k := range slices.Sorted(maps.Keys(m.argEnv)) {
		re := regexp.MustCompile(`\$(\{` + regexp.QuoteMeta(k) + `\}|` + regexp.QuoteMeta(k) + `\b)`)
		script = re.ReplaceAllLiteralString(script, "${"+m.argEnv[k]+"}")
	}
	return script
}

// payload is the call's new payload_template, key by key.
func (m *migrator) payload(fields map[string]json.RawMessage) []string {
	var out []string
	if raw, ok := fields["host"]; ok {
		if tpl, ok := m.call.Templates["/host"]; ok {
			out = append(out, "host = "+tomlx.String(tpl))
		} else {
			out = append(out, "host = "+string(raw))
		}
	}
	if len(m.args) > 0 {
		var kv []string
		for _, a := range m.args {
			kv = append(kv, a.name+" = "+tomlx.String(a.template))
		}
		out = append(out, "args = { "+strings.Join(kv, ", ")+" }")
	}
	return out
}

// literal is a JSON string's value; a null, which stands for a template,
// is none.
func literal(raw json.RawMessage) (string, bool) {
	var s string
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

func pointerToken(k string) string {
	return strings.ReplaceAll(strings.ReplaceAll(k, "~", "~0"), "/", "~1")
}

// tomlScript writes a script as a multi-line literal string when it can.
func tomlScript(s string) string {
	if strings.Contains(s, "'''") || strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 && r != '\n' && r != '\t' || r == 0x7f }) {
		return tomlx.String(s)
	}
	if !strings.Contains(s, "\n") {
		if strings.Contains(s, "'") {
			return tomlx.String(s)
		}
		return "'" + s + "'"
	}
	return "'''\n" + strings.TrimRight(s, "\n") + "\n'''"
}

// shellQuote makes s one word for a POSIX shell.
func shellQuote(s string) string {
	if s != "" && !strings.ContainsFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:,+@%", r))
	}) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
