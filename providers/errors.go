package providers

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Error is a provider failure together with whether retrying may help.
// The class travels over the plugin wire unchanged.
type Error struct {
	// Retryable is true when the same request may succeed later
	// (a timeout, a 5xx or 429 answer, a provider that crashed).
	Retryable bool
	// Code is an optional short machine-readable reason, such as "http_503".
	Code string
	// Message is the human-readable reason.
	Message string
	// RetryAfter, when positive on a retryable error, is the earliest the
	// service will take the request again (a 429's Retry-After); the gateway
	// waits at least this long before the next attempt, whatever the step's
	// backoff says.
	RetryAfter time.Duration
	// Err is the underlying error, if any; it does not cross the plugin wire.
	Err error
}

func (e *Error) Error() string {
	msg := e.Message
	if msg == "" && e.Err != nil {
		msg = e.Err.Error()
	}
	if e.Code != "" {
		return e.Code + ": " + msg
	}
	return msg
}

func (e *Error) Unwrap() error { return e.Err }

// Retryable returns a retryable *Error with a formatted message.
func Retryable(code, format string, args ...any) *Error {
	return &Error{Retryable: true, Code: code, Message: fmt.Sprintf(format, args...)}
}

// Permanent returns a permanent *Error with a formatted message.
func Permanent(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// IsRetryable reports whether err may succeed if the call is made again.
// Errors that are not an *Error are permanent, except a context deadline,
// which is a timeout and so retryable.
func IsRetryable(err error) bool {
	if err == nil {
		return false
	}
	var pe *Error
	if errors.As(err, &pe) {
		return pe.Retryable
	}
	return errors.Is(err, context.DeadlineExceeded)
}
