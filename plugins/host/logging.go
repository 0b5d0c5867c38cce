package host

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log"
	"log/slog"
	"slices"
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/chaingate/gateway/plugins/internal/wire"
)

// hclogAdapter is the hclog.Logger that go-plugin writes to on the host side,
// including every log line the plugin process writes to stderr. It forwards
// to slog; the level filter is the slog handler's.
type hclogAdapter struct {
	l       *slog.Logger
	name    string
	implied []any
}

func newHCLogger(l *slog.Logger) hclog.Logger { return &hclogAdapter{l: l} }

func (a *hclogAdapter) Log(level hclog.Level, msg string, args ...any) {
	lvl := wire.SlogLevel(level)
	ctx := context.Background()
	if !a.l.Enabled(ctx, lvl) {
		return
	}
	all := make([]any, 0, 2+len(a.implied)+len(args))
	if a.name != "" {
		all = append(all, "logger", a.name)
	}
	all = append(all, a.implied...)
	all = append(all, args...)
	a.l.Log(ctx, lvl, msg, all...)
}

func (a *hclogAdapter) Trace(msg string, args ...any) { a.Log(hclog.Trace, msg, args...) }
func (a *hclogAdapter) Debug(msg string, args ...any) { a.Log(hclog.Debug, msg, args...) }
func (a *hclogAdapter) Info(msg string, args ...any)  { a.Log(hclog.Info, msg, args...) }
func (a *hclogAdapter) Warn(msg string, args ...any)  { a.Log(hclog.Warn, msg, args...) }
func (a *hclogAdapter) Error(msg string, args ...any) { a.Log(hclog.Error, msg, args...) }

func (a *hclogAdapter) enabled(l hclog.Level) bool {
	return a.l.Enabled(context.Background(), wire.SlogLevel(l))
}

func (a *hclogAdapter) IsTrace() bool { return a.enabled(hclog.Trace) }
func (a *hclogAdapter) IsDebug() bool { return a.enabled(hclog.Debug) }
func (a *hclogAdapter) IsInfo() bool  { return a.enabled(hclog.Info) }
func (a *hclogAdapter) IsWarn() bool  { return a.enabled(hclog.Warn) }
func (a *hclogAdapter) IsError() bool { return a.enabled(hclog.Error) }

func (a *hclogAdapter) ImpliedArgs() []any { return a.implied }

func (a *hclogAdapter) With(args ...any) hclog.Logger {
	return &hclogAdapter{l: a.l, name: a.name, implied: append(slices.Clip(a.implied), args...)}
}

func (a *hclogAdapter) Name() string { return a.name }

func (a *hclogAdapter) Named(name string) hclog.Logger {
	if a.name != "" {
		name = a.name + "." + name
	}
	return a.ResetNamed(name)
}

func (a *hclogAdapter) ResetNamed(name string) hclog.Logger {
	return &hclogAdapter{l: a.l, name: name, implied: a.implied}
}

// SetLevel does nothing: the level belongs to the injected slog handler.
func (a *hclogAdapter) SetLevel(hclog.Level) {}

// GetLevel reports the lowest level the slog handler accepts; go-plugin uses
// it to skip parsing plugin log lines that would be dropped anyway.
func (a *hclogAdapter) GetLevel() hclog.Level {
	for _, l := range []hclog.Level{hclog.Trace, hclog.Debug, hclog.Info, hclog.Warn, hclog.Error} {
		if a.enabled(l) {
			return l
		}
	}
	return hclog.Off
}

func (a *hclogAdapter) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	level := slog.LevelInfo
	if opts != nil && opts.ForceLevel != hclog.NoLevel {
		level = wire.SlogLevel(opts.ForceLevel)
	}
	return slog.NewLogLogger(a.l.Handler(), level)
}

func (a *hclogAdapter) StandardWriter(opts *hclog.StandardLoggerOptions) io.Writer {
	return a.StandardLogger(opts).Writer()
}

// maxLogLine bounds how much of an unterminated line is buffered.
const maxLogLine = 64 << 10

// lineLogger logs each line written to it. go-plugin streams the plugin's
// os.Stdout and os.Stderr to the host apart from its log channel; this puts
// them in the gateway's log too.
type lineLogger struct {
	l   *slog.Logger
	mu  sync.Mutex
	buf []byte
}

func (w *lineLogger) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	rest := w.buf
	for {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			break
		}
		logPluginLine(w.l, rest[:i])
		rest = rest[i+1:]
	}
	if len(rest) > maxLogLine {
		logPluginLine(w.l, rest)
		rest = nil
	}
	w.buf = append(w.buf[:0], rest...)
	return len(p), nil
}

// logPluginLine logs one line of plugin output, keeping the level and
// attributes of a line in hclog's JSON form (see NewLogger).
func logPluginLine(l *slog.Logger, line []byte) {
	line = bytes.TrimRight(line, "\r")
	if len(line) == 0 {
		return
	}
	var m map[string]any
	if line[0] == '{' && json.Unmarshal(line, &m) == nil {
		if msg, ok := m["@message"].(string); ok {
			level, _ := m["@level"].(string)
			delete(m, "@message")
			delete(m, "@level")
			delete(m, "@timestamp")
			keys := make([]string, 0, len(m))
			for k := range m {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			attrs := make([]any, 0, 2*len(keys))
			for _, k := range keys {
				attrs = append(attrs, k, m[k])
			}
			l.Log(context.Background(), wire.SlogLevel(hclog.LevelFromString(level)), msg, attrs...)
			return
		}
	}
	l.Info(string(line))
}
