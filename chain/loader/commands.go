package loader

import (
	"path"
	"strings"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/templates"
)

// commandTypes are the built-in provider types whose steps run a command.
// What such a step runs is the config's to say: a payload may fill
// arguments and values, never the program or a script's text.
var commandTypes = map[string]bool{"exec": true, "ssh": true}

// shells are programs whose -c argument is a script.
var shells = map[string]bool{"sh": true, "bash": true, "dash": true, "zsh": true, "ksh": true, "mksh": true, "ash": true, "busybox": true}

// checkCommandPayload refuses a command step's payload that lets a
// template choose what runs: the whole payload, the program, the shell
// switch, the names in env, or the text of a script, whether given as
// script or as a shell's -c argument.
func checkCommandPayload(d *fileDecoder, p chain.KeyPath, v any) {
	payload, ok := v.(map[string]any)
	if !ok {
		d.errorf(p, "must be a table written in the config, { command = [...] } or { shell = true, script = ... }; a template cannot make the whole of what runs")
		return
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
		return
	}
	if !literal(args[0]) {
		d.errorf(p.Key("command").Elem(0, ""), "the program cannot come from a template; name it in the config and pass values as the arguments after it")
		return
	}
	program, _ := args[0].(string)
	if !shells[path.Base(program)] {
		return
	}
	for i := 1; i < len(args)-1; i++ {
		flag, _ := args[i].(string)
		if strings.HasPrefix(flag, "-") && !strings.HasPrefix(flag, "--") && strings.Contains(flag, "c") && !literal(args[i+1]) {
			d.errorf(p.Key("command").Elem(i+1, ""), "the script %s runs with %s cannot hold a template: a value from an alert would be run as shell code. Pass it in env and read \"$NAME\" in the script", program, flag)
			return
		}
	}
}

// literal reports whether v is written out in the config, with no
// template in it.
func literal(v any) bool {
	tpl, err := templates.Compile(v)
	return err == nil && tpl.Static()
}
