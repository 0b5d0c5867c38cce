package ssh

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// remoteCommand is what runs on the host, every part of it the config's own.
type remoteCommand struct {
	argv  []string          // program and arguments; a script command is already [shell, "-c", script, "chaingate:"+step]
	dir   string            // working directory on the host; "" = the login directory
	env   map[string]string // every variable to set, the gateway's CHAINGATE_* included; names are checked identifiers
	stdin string            // literal text for the command's standard input ("" = empty input)
	lock  string            // the step's dedup key; the lock below is named after a hash of it
	grace time.Duration     // kill grace
}

// Lines the remote side writes to stderr before the command's own output,
// each on a line of its own.
const (
	// pidMarker starts the line the login shell writes before anything
	// else: its PID, which is also its process group's, since sshd makes
	// each session's shell the leader of a session of its own, and which
	// the wrapper keeps, since the shell becomes it.
	pidMarker = "chaingate-pid:"
	// waitMarker starts the line the wrapper writes when the step's lock
	// is held by the live process group it names: an earlier attempt still
	// being stopped.
	waitMarker = "chaingate-wait:"
	// runMarker is the line the wrapper writes as the command starts.
	runMarker = "chaingate-run:"
)

// envPrefix names the variables that carry the command's environment to
// the wrapper, which sets them for the command alone: the wrapper itself
// runs with the login's PATH, HOME and IFS, whatever the step sets.
const envPrefix = "CHAINGATE_ENV_"

// wrapper is the POSIX sh script every command runs under, the same for
// every call: what varies reaches it as its positional parameters (the
// lock's hash, the grace in whole seconds, the length of the standard
// input, the working directory, the number of variables, then the
// command) and as CHAINGATE_ENV_<i>="NAME=value".
//
// It keeps the channel's stdin as fd 3 and its stderr as fd 5 (its own
// stderr is /dev/null, so that no shell's "Killed" notice reaches the
// command's output), then:
//   - reads the command's standard input, the first bytes of the channel,
//     into a file of its private directory, opened and unlinked at once,
//     so that nothing the command does or leaves unread can hold up the
//     watchdog;
//   - starts the watchdog, which reads the channel to its end. sshd ends
//     it when the client's connection ends, however it ends; the gateway
//     never does while the command runs. Then TERM goes to the session's
//     process group (the wrapper's $$), and KILL once the wrapper has
//     exited or after the grace. The watchdog ignores TERM, and so does
//     its sleep, and nothing else;
//   - takes the lock, a hard link named after the dedup key's hash to a
//     file holding its process group: the link is made or fails whole. A
//     lock whose group still runs a process that is not a zombie belongs
//     to an earlier attempt being stopped, and is waited for; one whose
//     group is gone is moved aside (a rename, which one waiter alone can
//     do to a given lock) and, if what was moved turns out to be a lock
//     taken since, put back;
//   - runs the command in the foreground, in the group, through env(1),
//     with its input and the channel's stdout and stderr, and the TERM
//     trap reset. A TERM to the wrapper waits for the command: the
//     wrapper's life is the command's;
//   - releases the lock and exits with the command's status, unless it was
//     told to stop: then the lock is left to the group, whose end frees it
//     for the next attempt; and it sweeps away other steps' locks whose
//     group is gone, so that a step stopped for good leaves nothing.
//
// A lock stays held while its group has a process that is not a zombie:
// where PID 1 reaps no orphans, a stopped group's processes stay zombies
// in it for good.
const wrapper = `cg_hash=$1 cg_grace=$2 cg_size=$3 cg_dir=$4 cg_nenv=$5
shift 5
exec 3<&0 5>&2 2>/dev/null </dev/null
cg_stopped=
trap cg_stopped=1 TERM
cg_fail() {
	printf "chaingate: %s\n" "$1" >&5
	exit 125
}
cg_runs() {
	kill -0 "$1" || return 1
	read -r cg_s </proc/"$1"/stat || return 0
	cg_s=${cg_s##*) }
	case $cg_s in Z*|X*) return 1 ;; esac
}
cg_group_runs() {
	kill -0 -"$1" || return 1
	[ -r /proc/self/stat ] || return 0
	cg_g=$1
	for cg_f in /proc/[0-9]*/stat; do
		read -r cg_s <"$cg_f" || continue
		cg_s=${cg_s##*) }
		set -- $cg_s
		[ "$3" = "$cg_g" ] && [ "$1" != Z ] && [ "$1" != X ] && return 0
	done
	return 1
}
cg_private() {
	set -- $(ls -ldn "$1")
	case $1 in d????-??-*) [ "$3" = "$(id -u)" ] ;; *) return 1 ;; esac
}
cg_break() {
	mv -f "$1" "$cg_mine.stale" || return
	cg_was=
	read -r cg_was <"$cg_mine.stale"
	[ "$cg_was" = "$2" ] || ln "$cg_mine.stale" "$1"
	rm -f "$cg_mine.stale"
}
cg_sweep() {
	for cg_f in "$cg_base"/*.lock; do
		cg_held=
		read -r cg_held <"$cg_f" || continue
		case $cg_held in ""|*[!0-9]*|0|1) continue ;; esac
		kill -0 -"$cg_held" || cg_break "$cg_f" "$cg_held"
	done
}
cg_base=$HOME/.chaingate
if [ -n "$cg_hash" ] || [ "$cg_size" -gt 0 ]; then
	case $HOME in /?*) ;; *) cg_fail "HOME is not an absolute path: no directory to keep the step's lock and input in" ;; esac
	[ -d "$cg_base" ] || (umask 077 && mkdir "$cg_base") 2>&5 || [ -d "$cg_base" ] || cg_fail "cannot make $cg_base, to keep the step's lock and input in"
	cg_private "$cg_base" || cg_fail "$cg_base must be a directory of the user's own that no one else may write to"
fi
exec 4</dev/null
if [ "$cg_size" -gt 0 ]; then
	cg_in=$cg_base/stdin.$$
	(umask 077 && exec head -c "$cg_size" >"$cg_in") <&3 2>&5 || cg_fail "cannot keep the standard input in $cg_in"
	if [ "$(($(wc -c <"$cg_in")))" -ne "$cg_size" ]; then
		rm -f "$cg_in"
		exit 125
	fi
	exec 4<"$cg_in"
	rm -f "$cg_in"
fi
(
	trap "" TERM
	while read -r cg_line; do :; done
	kill -TERM -$$
	cg_i=0
	while [ "$cg_i" -lt "$cg_grace" ] && cg_runs $$; do
		sleep 1
		cg_i=$((cg_i + 1))
	done
	kill -KILL -$$
) <&3 >/dev/null 4<&- 5>&- &
cg_watch=$!
if [ -n "$cg_hash" ]; then
	cg_lock=$cg_base/$cg_hash.lock
	cg_mine=$cg_base/$cg_hash.$$
	printf "%s\n" $$ >"$cg_mine" || cg_fail "cannot write $cg_mine"
	cg_said= cg_gone=0
	until ln "$cg_mine" "$cg_lock"; do
		[ -z "$cg_stopped" ] || { rm -f "$cg_mine"; exit 143; }
		cg_held=
		read -r cg_held <"$cg_lock"
		if [ -z "$cg_held" ] && [ ! -e "$cg_lock" ]; then
			cg_gone=$((cg_gone + 1))
			[ "$cg_gone" -lt 5 ] || { rm -f "$cg_mine"; cg_fail "cannot make the lock $cg_lock"; }
			continue
		fi
		case $cg_held in
		""|*[!0-9]*|0|1) ;;
		*)
			if cg_group_runs "$cg_held"; then
				[ -n "$cg_said" ] || printf "chaingate-wait:%s\n" "$cg_held" >&5
				cg_said=1
				sleep 1
				continue
			fi ;;
		esac
		cg_break "$cg_lock" "$cg_held"
	done
	rm -f "$cg_mine"
fi
[ -z "$cg_stopped" ] || exit 143
printf "chaingate-run:\n" >&5
(
	if [ -n "$cg_dir" ]; then
		case $cg_dir in /*) ;; *) cg_dir=./$cg_dir ;; esac
		cd "$cg_dir" 2>&5 || exit 125
	fi
	cg_i=$cg_nenv
	while [ "$cg_i" -gt 0 ]; do
		cg_i=$((cg_i - 1))
		eval "set -- \"\$CHAINGATE_ENV_$cg_i\" \"\$@\"; unset CHAINGATE_ENV_$cg_i"
	done
	exec env -- "$@" 2>&5 5>&-
) <&4 3<&- 4<&-
cg_status=$?
if [ -z "$cg_stopped" ]; then
	kill -KILL "$cg_watch"
	if [ -n "$cg_hash" ]; then
		cg_held=
		read -r cg_held <"$cg_lock"
		[ "$cg_held" != $$ ] || rm -f "$cg_lock"
		cg_sweep
	fi
fi
exit "$cg_status"
`

// quote makes s one word for a POSIX shell, whatever it holds. Inside
// single quotes nothing is special but the closing quote, so each quote
// in s ends the quoting, is written escaped, and starts it again.
func quote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// lockName is the name of a dedup key's lock: a hash, so that any key
// makes a file name, and the key itself stays off the host's disk.
func lockName(key string) string {
	if key == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:16])
}

// remoteLine is the command line sshd hands the remote login shell: the
// shell reports its PID, then becomes env(1), which sets the variables
// that carry the command's, and becomes sh running the wrapper. Exec keeps
// the PID, so the wrapper leads the process group the PID names. The login
// shell parses the line alone: every value is quoted, and names are
// checked identifiers.
func remoteLine(c remoteCommand) (string, error) {
	if len(c.argv) == 0 || c.argv[0] == "" {
		return "", errors.New("the command names no program")
	}
	if strings.Contains(c.argv[0], "=") {
		return "", fmt.Errorf("the program %q holds '=', which env(1) on the host would take for a variable; name the program without one", c.argv[0])
	}
	for i, a := range c.argv {
		if strings.ContainsRune(a, 0) {
			return "", fmt.Errorf("argument %d holds a NUL byte, which no argument can carry", i)
		}
	}
	if strings.ContainsRune(c.dir, 0) {
		return "", errors.New("the working directory holds a NUL byte")
	}
	var b strings.Builder
	b.WriteString(`printf '` + pidMarker + `%s\n' "$$" >&2; exec env`)
	names := slices.Sorted(maps.Keys(c.env))
	for i, k := range names {
		if !envName.MatchString(k) {
			return "", fmt.Errorf("%q is not a variable name", k)
		}
		if strings.ContainsRune(c.env[k], 0) {
			return "", fmt.Errorf("the variable %s holds a NUL byte, which no variable can carry", k)
		}
		fmt.Fprintf(&b, " %s%d=%s", envPrefix, i, quote(k+"="+c.env[k]))
	}
	grace := int(math.Ceil(c.grace.Seconds()))
	b.WriteString(" sh -c " + quote(wrapper) + " chaingate")
	for _, a := range append([]string{lockName(c.lock), strconv.Itoa(grace), strconv.Itoa(len(c.stdin)), c.dir, strconv.Itoa(len(names))}, c.argv...) {
		b.WriteString(" " + quote(a))
	}
	return b.String(), nil
}

// maxPreamble is how much stderr is searched for the PID line, and then
// for the wrapper's: a login script may print before them, but not much.
const maxPreamble = 4096

// pidWriter passes a command's stderr on without the lines the login
// shell and the wrapper write before the command starts, and keeps what
// they say.
type pidWriter struct {
	out     io.Writer
	pending []byte // an unfinished line, while searching
	passed  int    // bytes passed on while searching
	done    bool   // the run line was found, or the search given up
	pid     int
	known   chan struct{} // closed once pid is set
	// holder is the process group of an earlier attempt that held the
	// step's lock, from when it was reported; ran says the command
	// started, waited how long after that report.
	holder    int
	waitSince time.Time
	waited    time.Duration
	ran       bool
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
		if w.control(string(w.pending[:i])) {
			w.pending = w.pending[i+1:]
			if w.done {
				_, _ = w.out.Write(w.pending)
				w.pending = nil
			}
			continue
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

// control takes in a line the remote side wrote for the gateway, and
// says whether it was one. Before the PID line, only that line is; after
// it, the wrapper's, until the command starts.
func (w *pidWriter) control(line string) bool {
	if w.pid == 0 {
		// Signalling group -1 would reach every process the user may
		// signal; no session's shell has a PID that low.
		n, err := strconv.Atoi(strings.TrimPrefix(line, pidMarker))
		if !strings.HasPrefix(line, pidMarker) || err != nil || n <= 1 {
			return false
		}
		w.pid, w.passed = n, 0
		close(w.known)
		return true
	}
	switch {
	case line == runMarker:
		w.ran, w.done = true, true
		if w.holder != 0 {
			w.waited = time.Since(w.waitSince)
		}
		return true
	case strings.HasPrefix(line, waitMarker):
		n, err := strconv.Atoi(strings.TrimPrefix(line, waitMarker))
		if err != nil || w.holder != 0 {
			return false
		}
		w.holder, w.waitSince = n, time.Now()
		return true
	}
	return false
}

// flush passes on what is held back and stops searching.
func (w *pidWriter) flush() {
	if !w.done {
		_, _ = w.out.Write(w.pending)
		w.pending, w.done = nil, true
	}
}
