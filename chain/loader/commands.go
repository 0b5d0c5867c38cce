package loader

import (
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/templates"
)

// commandKeys are, for each built-in provider type whose steps run a
// command, the keys its payload takes, exactly as written: the provider
// refuses any other, "Command" included. What such a step runs is the
// config's to say: a payload may fill arguments and values, never the
// program, a script or the names of variables.
var commandKeys = map[string][]string{
	"exec": {"command", "shell", "script", "env", "stdin", "timeout_seconds"},
	"ssh":  {"command", "shell", "script", "env", "stdin", "timeout_seconds", "host", "user"},
}

// CommandPayloadKeys are the payload keys validate allows a step of the
// built-in provider type typ that runs a command; nil for other types.
func CommandPayloadKeys(typ string) []string { return slices.Clone(commandKeys[typ]) }

// shellName matches the names of shells, which read a script from -c, a
// file operand or their standard input.
var shellName = regexp.MustCompile(`^((ba|da|z|k|mk|a|r|po|y|lk|pdk|c|tc)?sh|fish)[0-9.]*$`)

// interpreters are programs that run code given in an argument after one of
// their flags, in their first operand, or on their standard input.
var interpreters = map[string][]string{
	"python": {"-c"}, "perl": {"-e", "-E"}, "ruby": {"-e"}, "node": {"-e", "--eval", "-p", "--print"},
	"php": {"-r"}, "lua": {"-e"}, "tclsh": nil, "awk": nil, "gawk": nil, "mawk": nil, "nawk": nil, "sed": {"-e", "--expression"},
}

// wrappers run the program named by one of their arguments; those before
// it may be options and their values.
var wrappers = map[string]bool{
	"sudo": true, "doas": true, "env": true, "timeout": true, "nice": true, "nohup": true, "ionice": true,
	"setsid": true, "stdbuf": true, "chroot": true, "flock": true, "xargs": true, "time": true, "unshare": true,
	"nsenter": true, "taskset": true, "chrt": true, "busybox": true,
}

// lineJoiners are programs that join their arguments into a line a shell
// reads (su and runuser -c, watch, ssh to its remote shell): no argument
// of theirs may hold a template.
var lineJoiners = map[string]bool{"su": true, "runuser": true, "watch": true, "ssh": true}

// checkCommandPayload refuses a command step's payload that lets a
// template choose what runs: the whole payload, a key the check does not
// know, the program, the shell switch, the names in env, or code — a
// script, a shell's or interpreter's -c/-e argument, a script file, a
// wrapper's program, or the standard input of one that reads its code
// from there.
func checkCommandPayload(d *fileDecoder, p chain.KeyPath, typ string, v any) {
	payload, ok := v.(map[string]any)
	if !ok {
		d.errorf(p, "must be a table written in the config, { command = [...] } or { shell = true, script = ... }; a template cannot make the whole of what runs")
		return
	}
	keys := commandKeys[typ]
	for _, k := range sortedKeys(payload) {
		if !slices.Contains(keys, k) {
			d.errorf(p.Key(k), "unknown key %q for the %s provider; its payload takes %s", k, typ, strings.Join(keys, ", "))
		}
	}
	if env, ok := payload["env"]; ok {
		if _, isTable := env.(map[string]any); !isTable {
			d.errorf(p.Key("env"), "must be a table written in the config, { NAME = \"<<...>>\" }: a template may fill values, not choose the names (PATH, LD_PRELOAD, BASH_ENV)")
		}
	}
	if s, ok := payload["shell"]; ok {
		if _, isBool := s.(bool); !isBool {
			d.errorf(p.Key("shell"), "must be true or false, written in the config")
		}
	}
	if s, ok := payload["script"]; ok && !literal(s) {
		d.errorf(p.Key("script"), "a script's text cannot hold a template: a value from an alert would be run as shell code. Pass it in env = { NAME = \"<<...>>\" } and read \"$NAME\" in the script")
	}
	cmd, ok := payload["command"]
	if !ok {
		return
	}
	args, isArray := cmd.([]any)
	if !isArray {
		d.errorf(p.Key("command"), "must be an array of strings written in the config, [program, args...]; a template cannot choose the command")
		return
	}
	if len(args) == 0 {
		d.errorf(p.Key("command"), "is empty; give the program and its arguments, [program, args...]")
		return
	}
	stdin, hasStdin := payload["stdin"]
	checkArgv(d, p.Key("command"), args, hasStdin && !literal(stdin), p.Key("stdin"))
}

// checkArgv walks an argument vector program by program: a wrapper's
// program, a shell's or interpreter's code, and the program itself must be
// literal.
func checkArgv(d *fileDecoder, p chain.KeyPath, args []any, templatedStdin bool, stdinPath chain.KeyPath) {
	refuse := func(i int, why string) {
		d.errorf(p.Elem(i, ""), "%s cannot come from a template: a value from an alert would choose what runs. Name it in the config, and pass values as arguments the program reads as data, or in env", why)
	}
	i := 0
	for i < len(args) {
		if !literal(args[i]) {
			refuse(i, "the program")
			return
		}
		prog, _ := args[i].(string)
		name := path.Base(prog)
		switch {
		case lineJoiners[name]:
			for j := i + 1; j < len(args); j++ {
				if !literal(args[j]) {
					refuse(j, "an argument of "+name+", which a shell reads as code,")
					return
				}
			}
		case wrappers[name]:
			i = wrapped(args, i+1, name, refuse)
			if i < 0 {
				return
			}
			continue
		case shellName.MatchString(name):
			codeArgs(args, i+1, []string{"c"}, true, templatedStdin, refuse, d, stdinPath, name)
		default:
			for base, flags := range interpreters {
				if strings.HasPrefix(name, base) && strings.Trim(strings.TrimPrefix(name, base), "0123456789.") == "" {
					codeArgs(args, i+1, flags, false, templatedStdin, refuse, d, stdinPath, name)
				}
			}
		}
		return
	}
}

// wrapped returns the index of the program a wrapper runs, or -1 when a
// template could choose it. Before the program, a wrapper takes options,
// their values and (env) assignments, all of which must be literal; the
// program is the first literal argument that is none of those. A value
// after an option may be that option's: the program is taken to be the
// next argument but one only when it, too, is literal.
func wrapped(args []any, i int, wrapper string, refuse func(int, string)) int {
	afterOption := false
	first := true
	for ; i < len(args); i++ {
		if !literal(args[i]) {
			refuse(i, "the program "+wrapper+" runs, or its options,")
			return -1
		}
		a, _ := args[i].(string)
		switch {
		case a == "--":
			afterOption = false
		case strings.HasPrefix(a, "-"):
			afterOption = !strings.Contains(a, "=")
		case wrapper == "env" && strings.Contains(a, "="):
		case (wrapper == "su" || wrapper == "runuser") && afterOption:
			afterOption = false
		case wrapper == "timeout" && first:
			first = false
		case afterOption:
			afterOption = false
			if i+1 < len(args) && !literal(args[i+1]) {
				refuse(i+1, "the program "+wrapper+" runs (the argument after an option's value)")
				return -1
			}
		default:
			return i
		}
	}
	return len(args)
}

// codeArgs checks the arguments of a program that runs code: the argument
// after a code flag (a flag holding one of flags' letters for a shell, one
// of flags exactly for an interpreter), the first operand when no code
// flag came (a script file, or awk's and sed's program), and a templated
// standard input when neither did.
func codeArgs(args []any, i int, flags []string, letters, templatedStdin bool, refuse func(int, string), d *fileDecoder, stdinPath chain.KeyPath, name string) {
	isCode := func(a string) bool {
		if letters {
			return strings.HasPrefix(a, "-") && !strings.HasPrefix(a, "--") && strings.ContainsAny(a[1:], strings.Join(trimDashes(flags), ""))
		}
		return slices.Contains(flags, a) || slices.ContainsFunc(flags, func(f string) bool { return strings.HasPrefix(a, f+"=") })
	}
	// A shell's -s reads the script from standard input, whatever follows.
	fromStdin := false
	for ; i < len(args); i++ {
		if !literal(args[i]) {
			refuse(i, "the code or an option of "+name)
			return
		}
		a, _ := args[i].(string)
		if letters && strings.HasPrefix(a, "-") && !strings.HasPrefix(a, "--") && strings.Contains(a[1:], "s") {
			fromStdin = true
		}
		switch {
		case isCode(a) && !strings.Contains(a, "="):
			if i+1 < len(args) && !literal(args[i+1]) {
				refuse(i+1, "the code "+name+" runs with "+a)
			}
			return
		case isCode(a):
			return
		case strings.HasPrefix(a, "-") || strings.HasPrefix(a, "+"):
		default:
			// A literal first operand: a script file, or awk's or sed's
			// program. What follows is data.
			if fromStdin && templatedStdin {
				d.errorf(stdinPath, "%s -s reads its script from standard input: a template in stdin would be run as code. Write the script in the command, and pass values in env", name)
			}
			return
		}
	}
	if templatedStdin {
		d.errorf(stdinPath, "%s reads its code from standard input when it is given none in the command: a template in stdin would be run as code. Write the code in the command, and pass values in env", name)
	}
}

func trimDashes(flags []string) []string {
	out := make([]string, len(flags))
	for i, f := range flags {
		out[i] = strings.TrimLeft(f, "-")
	}
	return out
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// literal reports whether v is written out in the config, with no
// template in it.
func literal(v any) bool {
	tpl, err := templates.Compile(v)
	return err == nil && tpl.Static()
}
