// Package faulty is a provider that misbehaves on request, for tests and
// demos of retries, timeouts, crashes and idempotency.
//
// The payload's fields drive it, applied in this order:
//
//	record         file path: append one JSON line {"dedup_key","attempt","action_type","payload"}
//	record_cancel  file path: append one such line if the call is cancelled while it
//	               sleeps or hangs, proving that cancellation reached the plugin
//	sleep_ms       sleep this long, or until the call is cancelled
//	crash          true: the plugin process exits at once with status 3
//	hang           true: never answer; return only when the call is cancelled
//	fail           permanent error with this message
//	fail_retryable retryable error with this message
//	fail_times     fail retryably while the attempt is at most this number
//	retry_after_ms on a retryable failure, ask the gateway to wait this long
//	raw            answer this text as the body, verbatim, JSON or not
//
// On success the body is the payload object plus "attempt". A payload that
// is not an object has no controls and gives {"payload": <it>, "attempt": n}.
//
// It is the gateway's own package, with no compatibility promise.
package faulty

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/chaingate/gateway/providers"
)

// Provider is the faulty provider.
type Provider struct{}

// New returns the faulty provider.
func New() providers.Provider { return Provider{} }

type controls struct {
	Record        string `json:"record"`
	RecordCancel  string `json:"record_cancel"`
	SleepMS       int64  `json:"sleep_ms"`
	Crash         bool   `json:"crash"`
	Hang          bool   `json:"hang"`
	Fail          string `json:"fail"`
	FailRetryable string `json:"fail_retryable"`
	FailTimes     int    `json:"fail_times"`
	RetryAfterMS  int64  `json:"retry_after_ms"`
	// Raw is answered as the body verbatim, JSON or not.
	Raw string `json:"raw"`
}

func (Provider) Describe(context.Context) (providers.Info, error) {
	return providers.Info{Name: "faulty", Version: "1"}, nil
}

func (Provider) Execute(ctx context.Context, req providers.Request) (providers.Response, error) {
	payload := bytes.TrimSpace(req.Payload)
	if len(payload) == 0 || payload[0] != '{' {
		return body(map[string]any{"payload": json.RawMessage(orNull(payload)), "attempt": req.Attempt})
	}
	var c controls
	if err := json.Unmarshal(payload, &c); err != nil {
		return providers.Response{}, providers.Permanent("bad_payload", "decoding faulty controls: %v", err)
	}
	if c.Record != "" {
		if err := record(c.Record, req, payload); err != nil {
			return providers.Response{}, err
		}
	}
	if c.SleepMS > 0 {
		if err := sleep(ctx, time.Duration(c.SleepMS)*time.Millisecond); err != nil {
			if ctx.Err() == nil {
				return providers.Response{}, providers.Permanent("sleep", "sleeping %d ms: %v", c.SleepMS, err)
			}
			return providers.Response{}, c.cancelled(req, payload, fmt.Errorf("sleeping %d ms: %w", c.SleepMS, err))
		}
	}
	if c.Crash {
		os.Exit(3)
	}
	if c.Hang {
		<-ctx.Done()
		return providers.Response{}, c.cancelled(req, payload, fmt.Errorf("hanging: %w", ctx.Err()))
	}
	switch {
	case c.Raw != "":
		return providers.Response{Body: []byte(c.Raw)}, nil
	case c.Fail != "":
		return providers.Response{}, &providers.Error{Code: "faulty", Message: c.Fail}
	case c.FailRetryable != "":
		return providers.Response{}, &providers.Error{Retryable: true, Code: "faulty", Message: c.FailRetryable, RetryAfter: c.retryAfter()}
	case req.Attempt <= c.FailTimes:
		err := providers.Retryable("faulty", "failing attempt %d of the first %d", req.Attempt, c.FailTimes)
		err.RetryAfter = c.retryAfter()
		return providers.Response{}, err
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(payload, &obj); err != nil {
		return providers.Response{}, providers.Permanent("bad_payload", "decoding payload: %v", err)
	}
	obj["attempt"] = json.RawMessage(fmt.Sprint(req.Attempt))
	return body(obj)
}

// cancelled notes a cancellation in record_cancel, if set, and returns err.
func (c controls) cancelled(req providers.Request, payload json.RawMessage, err error) error {
	if c.RecordCancel != "" {
		if rerr := record(c.RecordCancel, req, payload); rerr != nil {
			return errors.Join(err, rerr)
		}
	}
	return err
}

// record appends one line in a single write(2) on an O_APPEND file: the
// kernel keeps such writes whole, so concurrent callers and a kill right
// after never leave a torn or interleaved line.
func record(path string, req providers.Request, payload json.RawMessage) error {
	line, err := json.Marshal(struct {
		DedupKey   string          `json:"dedup_key"`
		Attempt    int             `json:"attempt"`
		ActionType string          `json:"action_type"`
		Payload    json.RawMessage `json:"payload"`
	}{req.DedupKey, req.Attempt, req.ActionType, payload})
	if err != nil {
		return providers.Permanent("record", "encoding the record: %v", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return providers.Permanent("record", "opening the record file: %v", err)
	}
	_, werr := f.Write(append(line, '\n'))
	cerr := f.Close()
	if werr != nil || cerr != nil {
		return providers.Permanent("record", "writing the record file: %v", errors.Join(werr, cerr))
	}
	return nil
}

func orNull(b []byte) []byte {
	if len(b) == 0 {
		return []byte("null")
	}
	return b
}

func body(v any) (providers.Response, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return providers.Response{}, providers.Permanent("bad_payload", "encoding the body: %v", err)
	}
	return providers.Response{Body: b}, nil
}

func (c controls) retryAfter() time.Duration { return time.Duration(c.RetryAfterMS) * time.Millisecond }
