package command_test

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/internal/command"
)

// TestHostileArgumentsInShells is a property test of the one rule that
// keeps an alert from choosing what runs: whatever value a call gives an
// argument of any type, either the provider refuses it, or a script that
// reads it as the docs say (quoted, "$CHAINGATE_ARG_NAME"; an integer in
// arithmetic) gets exactly the checked text and runs nothing of it. Every
// value tries to create a marker file, and the real sh, bash, dash and
// busybox sh run each script.
func TestHostileArgumentsInShells(t *testing.T) {
	shells := shellsHere(t)
	dir := t.TempDir()
	marker := filepath.Join(dir, "pwned")
	cmds, err := decl(t, command.Local, `{
		"string": {"script": "x", "args": {"v": {"type": "string", "allow_leading_dash": true, "min_length": 0}}},
		"plain": {"script": "x", "args": {"v": {"type": "string"}}},
		"pattern": {"script": "x", "args": {"v": {"type": "string", "pattern": "[A-Za-z0-9_][A-Za-z0-9._-]*"}}},
		"integer": {"script": "x", "args": {"v": {"type": "integer", "min": -1000000}}},
		"boolean": {"script": "x", "args": {"v": {"type": "boolean"}}},
		"hostname": {"script": "x", "args": {"v": {"type": "hostname"}}},
		"path": {"script": "x", "args": {"v": {"type": "path", "roots": [`+jsonText(dir)+`]}}}
	}`)
	if err != nil {
		t.Fatal(err)
	}
	// How each type is used, as docs/providers/exec.md shows; each prints
	// the value back.
	uses := map[string][]string{
		"text": {
			`printf '%s' "$CHAINGATE_ARG_V"`,
			`v=$CHAINGATE_ARG_V; printf '%s' "$v"`,
			`set -- "$CHAINGATE_ARG_V"; printf '%s' "$1"`,
			`case "$CHAINGATE_ARG_V" in *) printf '%s' "$CHAINGATE_ARG_V" ;; esac`,
			`[ -n "$CHAINGATE_ARG_V" ] || [ -z "$CHAINGATE_ARG_V" ]; printf '%s' "$CHAINGATE_ARG_V"`,
			`printf '%s' "${CHAINGATE_ARG_V}"`,
		},
		"integer": {
			`printf '%d' "$(( CHAINGATE_ARG_V + 0 ))"`,
			`printf '%d' "$(( $CHAINGATE_ARG_V ))"`,
			`[ "$CHAINGATE_ARG_V" -ge -1000000 ] && printf '%s' "$CHAINGATE_ARG_V"`,
		},
		"path": {
			`printf '%s' "$CHAINGATE_ARG_V"`,
			`find "$CHAINGATE_ARG_V" -prune -name '*.gz' -print 2>/dev/null; printf '%s' "$CHAINGATE_ARG_V"`,
			`ls -d "$CHAINGATE_ARG_V" >/dev/null 2>&1; printf '%s' "$CHAINGATE_ARG_V"`,
		},
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	gen := hostileValues{rng: rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)), marker: marker, root: dir}
	const perType = 300
	runs, refused := 0, 0
	for _, typ := range []string{"string", "plain", "pattern", "integer", "boolean", "hostname", "path"} {
		use := uses["text"]
		switch typ {
		case "integer":
			use = uses["integer"]
		case "path":
			use = uses["path"]
		}
		for range perType {
			value := gen.next(typ)
			raw, _ := json.Marshal(value)
			inv, _, err := cmds.Resolve(providers.Call{ActionType: typ, Payload: json.RawMessage(`{"args": {"v": ` + string(raw) + `}}`)}, command.LocalPayloadKeys, nil)
			if err != nil {
				refused++
				continue
			}
			want := inv.ArgEnv["CHAINGATE_ARG_V"]
			// Each value goes through one shell and one use, turn about,
			// so that every pair is met over the run.
			shell := shells[runs%len(shells)]
			script := use[(runs/len(shells))%len(use)]
			runs++
			got := runShell(t, shell, script, dir, inv.Environ(map[string]string{"PATH": os.Getenv("PATH")}, providers.Request{}))
			if typ == "integer" {
				want = strings.TrimPrefix(want, "+")
			}
			if got != want {
				t.Errorf("%s, %s %q: printed %q, want %q (seed %d)", typ, shell, script, got, want, seed)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Fatalf("%s, %s %q with %q created the marker (seed %d)", typ, shell, script, value, seed)
			}
		}
	}
	t.Logf("%d values ran in a shell, %d were refused", runs, refused)
	if runs < perType || refused < perType {
		t.Errorf("%d ran and %d were refused: the generator no longer tries both sides of the rule", runs, refused)
	}
}

// shellsHere are the POSIX shells the property runs in; with CI=true each
// must be here.
func shellsHere(t *testing.T) [][]string {
	var found [][]string
	for _, sh := range [][]string{{"sh"}, {"bash"}, {"dash"}, {"busybox", "sh"}} {
		if _, err := exec.LookPath(sh[0]); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is not installed; .ci/run installs it", sh[0])
			}
			t.Logf("skipping %s: not installed", sh[0])
			continue
		}
		found = append(found, sh)
	}
	if len(found) == 0 {
		t.Skip("no POSIX shell on this machine")
	}
	return found
}

func runShell(t *testing.T, shell []string, script, dir string, env map[string]string) string {
	t.Helper()
	cmd := exec.Command(shell[0], append(shell[1:], "-c", script, "chaingate:property")...)
	cmd.Dir = dir
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	_ = cmd.Run()
	return out.String()
}

func jsonText(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// hostileValues makes values meant to make a shell run the marker's touch,
// mixed so that some pass each type's rule and some do not.
type hostileValues struct {
	rng    *rand.Rand
	marker string
	root   string
}

func (g hostileValues) pick(list []string) string { return list[g.rng.IntN(len(list))] }

// attack is one piece of shell code, in a form a shell might run.
func (g hostileValues) attack() string {
	m := g.marker
	return g.pick([]string{
		"$(touch " + m + ")", "`touch " + m + "`", "; touch " + m, "| touch " + m, "&& touch " + m, "|| touch " + m,
		"\ntouch " + m, "'; touch " + m + "; '", `"; touch ` + m + ` #`, "${IFS}touch${IFS}" + m, "> " + m, ">>" + m,
		"$((`touch " + m + "`))", "a[$(touch " + m + ")]", "x[`touch " + m + "`]", "$(touch${IFS}" + m + ")",
		"-exec touch " + m + " ;", "-delete", "--help", "-o", "-c 'touch " + m + "'", "*", "../..", "~root", "$HOME",
		"\\$(touch " + m + ")", "$'\\x74ouch' " + m, "<(touch " + m + ")", "{touch," + m + "}", "\x00touch " + m,
		"\u202etouch " + m, "\r; touch " + m, "\ttouch " + m, "%s%n", strings.Repeat("A", 2000),
	})
}

func (g hostileValues) next(typ string) any {
	a := g.attack()
	switch typ {
	case "integer":
		return g.pick([]string{"1" + a, a, "42", "-7", "0x10", "1e3", "9223372036854775808", " 5", "5 "})
	case "boolean":
		return g.pick([]string{"true" + a, a, "true", "false", "TRUE", "1"})
	case "hostname":
		return g.pick([]string{"db-1.example.com" + a, a, "db-1.example.com", "10.0.0.1", "-oProxyCommand=touch " + g.marker, "a..b"})
	case "path":
		return g.pick([]string{g.root + "/" + a, g.root + "/logs/" + a + "/x", a, g.root + "/../" + a, g.root, g.root + "/a b/" + a})
	}
	return g.pick([]string{a, "x" + a, a + a, "ok-" + a + "-ok", "plain_value-1.2"})
}
