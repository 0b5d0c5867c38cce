package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
)

// APIError is an error as the API reports it.
type APIError struct {
	Status  int      `json:"-"`
	Code    string   `json:"code"`
	Message string   `json:"message"`
	Details []string `json:"details,omitempty"`
}

func (e *APIError) Error() string { return e.Code + ": " + e.Message }

// AsAPIError maps an error to its status and code, in this one place: the
// API answers with it, and the console shows an operation's error with the
// status the API would give it.
func AsAPIError(err error) *APIError {
	var ae *APIError
	var ce *chain.ConfigError
	var ie *chain.InputError
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.Is(err, engine.ErrProviderConfig):
		var details []string
		if errors.As(err, &ce) {
			for _, d := range ce.Diagnostics {
				details = append(details, d.String())
			}
		}
		return &APIError{Status: http.StatusInternalServerError, Code: "provider_config", Message: "the run cannot start: a provider it calls cannot use its config; fix the config and reload", Details: details}
	case errors.Is(err, engine.ErrNestedTooDeep):
		return &APIError{Status: http.StatusBadRequest, Code: "payload_too_deep", Message: err.Error()}
	case errors.Is(err, engine.ErrConcurrencyKey):
		return &APIError{Status: http.StatusBadRequest, Code: "concurrency_key", Message: err.Error()}
	case errors.As(err, &ie):
		details := make([]string, len(ie.Problems))
		for i, p := range ie.Problems {
			field := p.Path
			if field == "" {
				field = "payload"
			}
			details[i] = field + ": " + p.Message
		}
		return &APIError{Status: http.StatusBadRequest, Code: "invalid_payload", Message: ie.Error(), Details: details}
	case errors.As(err, &ce):
		details := make([]string, len(ce.Diagnostics))
		for i, d := range ce.Diagnostics {
			details[i] = d.String()
		}
		return &APIError{Status: http.StatusBadRequest, Code: "invalid_config", Message: "the config has errors; the running config stays", Details: details}
	case errors.As(err, &mbe):
		return &APIError{Status: http.StatusRequestEntityTooLarge, Code: "payload_too_large", Message: fmt.Sprintf("request body is larger than %d bytes", mbe.Limit)}
	case errors.Is(err, store.ErrInvalid):
		return &APIError{Status: http.StatusBadRequest, Code: "invalid_parameter", Message: err.Error()}
	case errors.Is(err, store.ErrNotFound):
		return &APIError{Status: http.StatusNotFound, Code: "not_found", Message: err.Error()}
	case errors.Is(err, engine.ErrUnknownChain):
		return &APIError{Status: http.StatusNotFound, Code: "unknown_chain", Message: err.Error()}
	case errors.Is(err, store.ErrLeaseHeld), errors.Is(err, engine.ErrNotActive):
		return &APIError{Status: http.StatusConflict, Code: "run_elsewhere", Message: err.Error()}
	case errors.As(err, new(*engine.LateError)):
		return &APIError{Status: http.StatusConflict, Code: "past_deadline", Message: err.Error()}
	case errors.As(err, new(*engine.NotApproverError)):
		return &APIError{Status: http.StatusForbidden, Code: "not_an_approver", Message: err.Error()}
	case errors.As(err, new(*engine.AnsweredError)):
		return &APIError{Status: http.StatusConflict, Code: "already_answered", Message: err.Error()}
	case errors.Is(err, engine.ErrNotWaiting):
		return &APIError{Status: http.StatusConflict, Code: "not_waiting", Message: err.Error()}
	case errors.Is(err, store.ErrUnfinished):
		return &APIError{Status: http.StatusConflict, Code: "unfinished", Message: err.Error()}
	case errors.Is(err, engine.ErrNotReplayable), errors.Is(err, engine.ErrFinished):
		return &APIError{Status: http.StatusConflict, Code: "conflict", Message: err.Error()}
	case errors.Is(err, engine.ErrClosed):
		return &APIError{Status: http.StatusServiceUnavailable, Code: "shutting_down", Message: "the gateway is shutting down"}
	case errors.Is(err, context.DeadlineExceeded):
		return &APIError{Status: http.StatusGatewayTimeout, Code: "timeout", Message: err.Error()}
	}
	return &APIError{Status: http.StatusInternalServerError, Code: "internal", Message: err.Error()}
}

func BadRequest(code, format string, args ...any) error {
	return &APIError{Status: http.StatusBadRequest, Code: code, Message: fmt.Sprintf(format, args...)}
}
