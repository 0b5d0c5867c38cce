package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/internal/testutil/brokertest"
	"github.com/chaingate/gateway/internal/testutil/redistest"
)

// TestExampleHeaders runs every command the comment at the top of each
// file in configs/ documents, as written, the way an operator would on a
// laptop: in a directory of its own, with configs/ in it, so the store is
// the default one there. A file's commands run in order on one store; a
// run that stops at an approval is stopped as the header says (Ctrl-C)
// once a later command answers it, and RUN_ID is the run it stopped.
// What cannot run here is skipped, saying why: a server, a request to
// one, a config that calls real services, brokers that are not running.
func TestExampleHeaders(t *testing.T) {
	configs, err := filepath.Abs("../../configs")
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	err = filepath.WalkDir(configs, func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".toml") {
			files = append(files, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	for _, file := range files {
		rel, _ := filepath.Rel(filepath.Dir(configs), file)
		cmds := headerCommands(t, file)
		if len(cmds) == 0 {
			continue
		}
		t.Run(rel, func(t *testing.T) {
			dir := t.TempDir()
			if prefix := fanoutPrefix(t, file); prefix != "" {
				isolateFanout(t, configs, filepath.Join(dir, "configs"), prefix)
			} else if err := os.Symlink(configs, filepath.Join(dir, "configs")); err != nil {
				t.Fatal(err)
			}
			t.Chdir(dir)
			var runID string
			for i, line := range cmds {
				t.Run(line, func(t *testing.T) {
					args, err := shellWords(line)
					if err != nil {
						t.Fatalf("%s: %v", rel, err)
					}
					if why := cannotRunHere(t, args); why != "" {
						t.Skipf("SKIP: %s", why)
					}
					args = args[1:] // the command's own name
					for j, a := range args {
						if a == "RUN_ID" {
							if runID == "" {
								t.Fatal("RUN_ID, and no command before this one left a run waiting")
							}
							args[j] = runID
						}
					}
					// A run that waits for an answer a later command gives is
					// stopped once it waits, as an operator would.
					answered := slices.ContainsFunc(cmds[i+1:], func(l string) bool {
						return strings.HasPrefix(l, "gateway runs approve ") || strings.HasPrefix(l, "gateway runs reject ")
					})
					ctx, cancel := context.WithCancel(t.Context())
					defer cancel()
					var stdout bytes.Buffer
					stderr := &lineWatcher{see: func(l string) {
						if answered && args[0] == "run" && strings.Contains(l, ": waiting for approval: ") {
							cancel()
						}
					}}
					code := run(ctx, args, &stdout, stderr)
					ran++
					want := exitOK
					if ctx.Err() != nil {
						want = exitInterrupt
						m := regexp.MustCompile(`run (\S+) is persisted`).FindStringSubmatch(stderr.String())
						if m == nil {
							t.Fatalf("stopped at its approval, the run names no run:\n%s", stderr)
						}
						runID = m[1]
					}
					if code != want {
						t.Errorf("%s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", rel, code, want, stdout.String(), stderr)
					}
				})
			}
		})
	}
	if ran < 10 {
		t.Errorf("ran %d commands of the examples' headers; they document more", ran)
	}
}

// fanoutPrefixLine is a config's [gateway.fanout] prefix.
var fanoutPrefixLine = regexp.MustCompile(`(?m)^prefix = "([^"]*)"`)

// fanoutPrefix is the queue and key prefix of file's [gateway.fanout], ""
// without one.
func fanoutPrefix(t *testing.T, file string) string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	_, fanout, ok := bytes.Cut(data, []byte("[gateway.fanout]"))
	if !ok {
		return ""
	}
	m := fanoutPrefixLine.FindSubmatch(fanout)
	if m == nil {
		t.Fatalf("%s: its [gateway.fanout] names no prefix, which the test replaces with one of its own", file)
	}
	return string(m[1])
}

// isolateFanout copies the configs to dst with the fan-out's prefix, as
// an operator's example has it, replaced by a prefix of the test's own:
// its RabbitMQ queues and Redis keys are the test's, and go when it ends.
func isolateFanout(t *testing.T, configs, dst, prefix string) {
	t.Helper()
	_, own := brokertest.Open(t)
	redistest.OpenPrefix(t, own)
	err := filepath.WalkDir(configs, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(configs, path)
		to := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(to, 0o755)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if strings.HasSuffix(path, ".toml") {
			data = bytes.ReplaceAll(data, []byte(`prefix = "`+prefix+`"`), []byte(`prefix = "`+own+`"`))
		}
		return os.WriteFile(to, data, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// headerCommands returns the gateway commands, and the requests to a
// gateway's API, that the comment at the top of file shows, indented or
// after a colon at the end of a sentence, each as one line: one continued with a backslash, or with a quote left open, is
// joined up, and a note after it ("  (the run's ID)", "  # ...") and a
// trailing & are cut.
func headerCommands(t *testing.T, file string) []string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	var cur string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		text, isComment := strings.CutPrefix(sc.Text(), "#")
		if !isComment {
			break
		}
		body := strings.TrimSpace(text)
		if cur != "" {
			cur = strings.TrimSuffix(cur, "\\") + " " + body
		} else if strings.HasPrefix(text, "   ") && regexp.MustCompile(`^(gateway|curl|POST|GET) `).MatchString(body) {
			cur = body
		} else if _, inline, ok := strings.Cut(body, ": gateway "); ok {
			cur = "gateway " + inline // "Tests of x.toml: gateway test configs/"
		} else {
			continue
		}
		cmd := cutNote(cur)
		if strings.HasSuffix(cmd, "\\") || strings.Count(cmd, "'")%2 == 1 {
			continue
		}
		out = append(out, cmd)
		cur = ""
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// cutNote cuts what follows a command on its line, outside quotes: a
// note in parentheses after two spaces or more, a # comment, a trailing &.
func cutNote(line string) string {
	quoted := false
	for i := 0; i < len(line); i++ {
		switch {
		case line[i] == '\'':
			quoted = !quoted
		case quoted:
		case line[i] == '#' && i > 0 && line[i-1] == ' ',
			strings.HasPrefix(line[i:], "  (") || strings.HasPrefix(line[i:], "\t("):
			line = line[:i]
		}
	}
	return strings.TrimSuffix(strings.TrimSpace(line), " &")
}

// shellWords splits a command line as a POSIX shell would, for the
// quoting the headers use: single quotes, double quotes, backslashes.
func shellWords(line string) ([]string, error) {
	var words []string
	var w strings.Builder
	inWord := false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == ' ' || c == '\t':
			if inWord {
				words, inWord = append(words, w.String()), false
				w.Reset()
			}
		case c == '\'':
			end := strings.IndexByte(line[i+1:], '\'')
			if end < 0 {
				return nil, errUnclosed
			}
			w.WriteString(line[i+1 : i+1+end])
			i, inWord = i+1+end, true
		case c == '"':
			i++
			for ; i < len(line) && line[i] != '"'; i++ {
				if line[i] == '\\' && i+1 < len(line) {
					i++
				}
				w.WriteByte(line[i])
			}
			if i >= len(line) {
				return nil, errUnclosed
			}
			inWord = true
		case c == '\\' && i+1 < len(line):
			i++
			w.WriteByte(line[i])
			inWord = true
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words, nil
}

var errUnclosed = errors.New("a quote is not closed")

// cannotRunHere says why a header's command cannot run in a test, or "".
func cannotRunHere(t *testing.T, args []string) string {
	t.Helper()
	if args[0] != "gateway" {
		return "a request to a serving gateway's API"
	}
	if len(args) < 2 {
		return ""
	}
	switch args[1] {
	case "serve", "worker":
		return "gateway " + args[1] + " serves until it is stopped"
	}
	var configs []string
	for i, a := range args {
		if a == "--server" {
			return "it goes through a serving gateway's API (--server)"
		}
		if a == "--config" && i+1 < len(args) {
			configs = append(configs, args[i+1])
		}
	}
	if (args[1] != "run" && args[1] != "resume") || slices.Contains(args, "--dry-run") || len(configs) == 0 {
		return ""
	}
	cfg, err := gateway.LoadConfig(configs)
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	// Only stand-ins answer here: nothing may page anyone or reach a host.
	var real []string
	for _, name := range cfg.ProviderNames {
		if p := cfg.Providers[name]; p.Type != "echo" && p.Type != "faulty" {
			real = append(real, name+" ("+p.Type+p.Plugin+")")
		}
	}
	if len(real) > 0 {
		return "its config calls real services, with their secrets: " + strings.Join(real, ", ")
	}
	if f := cfg.Gateway.Fanout; f != nil {
		for _, raw := range []string{f.RedisURL, f.RabbitMQURL} {
			u, err := url.Parse(raw)
			if err != nil {
				t.Fatalf("%v: %v", args, err)
			}
			conn, err := net.DialTimeout("tcp", u.Host, 2*time.Second)
			if err != nil {
				if os.Getenv("CI") == "true" {
					t.Fatalf("its [gateway.fanout] needs %s at %s, which is not running: %v", u.Scheme, u.Host, err)
				}
				return "its [gateway.fanout] needs " + u.Scheme + " at " + u.Host + ", which is not running"
			}
			_ = conn.Close()
		}
	}
	return ""
}

// lineWatcher is a command's stderr: it keeps what is written, and calls
// see with each line as it comes.
type lineWatcher struct {
	mu   sync.Mutex
	all  bytes.Buffer
	part []byte
	see  func(line string)
}

func (w *lineWatcher) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.all.Write(p)
	w.part = append(w.part, p...)
	for {
		i := bytes.IndexByte(w.part, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.see(string(w.part[:i]))
		w.part = w.part[i+1:]
	}
}

func (w *lineWatcher) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.all.String()
}

// TestReadmeListsEveryCommand: the README's list of commands names each
// command the gateway's own usage does, and each it names is one the
// gateway runs.
func TestReadmeListsEveryCommand(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, list, _ := strings.Cut(string(readme), "\n## Commands\n\n```\n")
	list, _, _ = strings.Cut(list, "```")
	listed := map[string]bool{}
	for line := range strings.Lines(list) {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "gateway" {
			for _, c := range strings.Split(f[1], "|") {
				listed[c] = true
			}
		}
	}
	if len(listed) < 10 {
		t.Fatalf("README.md's command list names %d commands", len(listed))
	}
	for _, m := range regexp.MustCompile(`(?m)^  gateway ([a-z|]+)`).FindAllStringSubmatch(usage, -1) {
		for _, c := range strings.Split(m[1], "|") {
			if !listed[c] {
				t.Errorf("README.md's command list lacks gateway %s", c)
			}
		}
	}
	for c := range listed {
		var stdout, stderr bytes.Buffer
		run(t.Context(), []string{c, "-h"}, &stdout, &stderr)
		if strings.Contains(stderr.String(), "unknown command") {
			t.Errorf("README.md lists gateway %s, which the gateway does not know", c)
		}
	}
}
