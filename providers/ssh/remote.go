package ssh

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/chaingate/gateway/providers/internal/command"
)

// pidMarker starts the line the remote shell writes to stderr before it
// runs the command: its PID, which is also its process group's, since
// sshd makes each session's shell the leader of a session of its own.
const pidMarker = "chaingate-pid:"

// quote makes s one word for a POSIX shell, whatever it holds. Inside
// single quotes nothing is special but the closing quote, so each quote
// in s ends the quoting, is written escaped, and starts it again.
func quote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// remoteLine is the command line sshd hands the remote login shell: the
// shell reports its PID, then becomes env(1), which sets the variables and
// becomes the program. Exec keeps the PID, so the program leads the
// process group the PID names. Every value is quoted; names are checked
// identifiers.
func remoteLine(spec command.Spec, env map[string]string, step string) (string, error) {
	argv := spec.Command
	if spec.Shell {
		// $0 names the step in ps and in the shell's own messages.
		argv = []string{"sh", "-c", spec.Script, "chaingate:" + step}
	} else if strings.Contains(argv[0], "=") {
		return "", fmt.Errorf("command[0] %q holds '=', which env(1) on the host would take for a variable; name the program without one", argv[0])
	}
	var b strings.Builder
	b.WriteString(`printf '` + pidMarker + `%s\n' "$$" >&2; exec env`)
	for _, k := range slices.Sorted(maps.Keys(env)) {
		b.WriteString(" " + k + "=" + quote(env[k]))
	}
	for _, a := range argv {
		b.WriteString(" " + quote(a))
	}
	return b.String(), nil
}

// maxPreamble is how much stderr is searched for the PID line: a login
// script may print before it, but not much.
const maxPreamble = 4096

// pidWriter passes a command's stderr on without the line that reports
// the remote shell's PID.
type pidWriter struct {
	out     io.Writer
	pending []byte // an unfinished line, while searching
	passed  int    // bytes passed on while searching
	done    bool   // the line was found, or the search given up
	pid     int
	known   chan struct{} // closed once pid is set
}

func newPIDWriter(out io.Writer) *pidWriter {
	return &pidWriter{out: out, known: make(chan struct{})}
}

// Write never fails, as command.Output does not.
func (w *pidWriter) Write(p []byte) (int, error) {
	if w.done {
		return w.out.Write(p)
	}
	w.pending = append(w.pending, p...)
	for !w.done {
		i := bytes.IndexByte(w.pending, '\n')
		if i < 0 {
			if w.passed+len(w.pending) > maxPreamble {
				w.flush()
			}
			break
		}
		if pid, ok := strings.CutPrefix(string(w.pending[:i]), pidMarker); ok {
			// Signalling group -1 would reach every process the user
			// may signal; no session's shell has a PID that low.
			if n, err := strconv.Atoi(pid); err == nil && n > 1 {
				w.pid, w.done = n, true
				close(w.known)
				_, _ = w.out.Write(w.pending[i+1:])
				w.pending = nil
				break
			}
		}
		_, _ = w.out.Write(w.pending[:i+1])
		w.passed += i + 1
		w.pending = w.pending[i+1:]
		if w.passed > maxPreamble {
			w.flush()
		}
	}
	return len(p), nil
}

// flush passes on what is held back and stops searching.
func (w *pidWriter) flush() {
	if !w.done {
		_, _ = w.out.Write(w.pending)
		w.pending, w.done = nil, true
	}
}
