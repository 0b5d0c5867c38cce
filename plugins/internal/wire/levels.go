package wire

import (
	"log/slog"

	"github.com/hashicorp/go-hclog"
)

// LevelTrace is hclog's trace level in slog's terms.
const LevelTrace = slog.LevelDebug - 4

// SlogLevel maps a plugin's hclog level to slog.
func SlogLevel(l hclog.Level) slog.Level {
	switch l {
	case hclog.Trace:
		return LevelTrace
	case hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	default:
		return slog.LevelInfo
	}
}

// HCLogLevel maps slog's level to the hclog level a plugin writes.
func HCLogLevel(l slog.Level) hclog.Level {
	switch {
	case l <= LevelTrace:
		return hclog.Trace
	case l < slog.LevelInfo:
		return hclog.Debug
	case l < slog.LevelWarn:
		return hclog.Info
	case l < slog.LevelError:
		return hclog.Warn
	default:
		return hclog.Error
	}
}
