// Package providers defines the contract between the gateway and the providers
// that carry out chain steps (Slack, email, PagerDuty, HTTP, and providers teams
// write themselves). Every provider, built-in or external, runs in a plugin
// subprocess; this package holds only the Go-level contract and error classes,
// so a plugin author depends on nothing but this package and package plugins.
package providers

import (
	"context"
	"encoding/json"
	"time"
)

// Provider is implemented by every provider.
type Provider interface {
	// Describe reports what the provider is and which actions it accepts.
	Describe(ctx context.Context) (Info, error)
	// Execute carries out one action. It must honour ctx: when the step is
	// cancelled or times out, ctx is done and Execute should return promptly.
	// A returned error should be an *Error (see Retryable and Permanent);
	// any other error is treated as permanent.
	Execute(ctx context.Context, req Request) (Response, error)
}

// ConfigChecker is implemented by providers that can tell, without calling
// anything, whether a config is usable beyond what ConfigSchema can say:
// an address that must parse, a mode that rules out another key. The
// gateway calls it when it loads a config, with secrets filled in, so that
// a config that cannot work stops the gateway from starting rather than
// failing a step after earlier ones have paged and posted. Built-in
// providers implement it; an external plugin's config is checked against
// its ConfigSchema.
type ConfigChecker interface {
	CheckConfig(ctx context.Context, config json.RawMessage) error
}

// CallChecker is implemented by providers whose config declares what a
// call may ask of them, such as exec and ssh, whose configs declare the
// commands a step may run and the arguments each takes. The gateway calls
// it when it loads a config, for every call the config makes of the
// provider (a step at any depth, an approval's notify and escalate), so
// that a call that cannot pass stops the config from loading rather than
// failing a step after earlier ones have acted; and "gateway test" calls
// it with each mocked call's rendered payload. The rules it checks must be
// those Execute enforces on every call, which stays the one place they
// are enforced: CheckCall only tells sooner.
type CallChecker interface {
	CheckCall(ctx context.Context, config json.RawMessage, call Call) error
}

// Call is a call of a provider as a config writes it, or as a test renders
// it.
type Call struct {
	// Name says who makes the call, for messages: a step's name, or
	// "NAME.notify" for an approval step's notification.
	Name string
	// ActionType is the call's action_type.
	ActionType string
	// Payload is the call's payload. When Written is true, it is the
	// payload as the config writes it: a value a template fills at run
	// time is null there (a config cannot write null), and the whole
	// payload is null when one template fills all of it.
	Payload json.RawMessage
	Written bool
	// Templates holds the text of each templated value of a written
	// payload, by its JSON Pointer ("/args/host"), for messages.
	Templates map[string]string
}

// Info describes a provider.
type Info struct {
	// Name is the provider's own name, such as "http".
	Name string
	// Version is free-form and shown to operators.
	Version string
	// ActionTypes lists the action types Execute accepts; empty means any.
	ActionTypes []string
	// ConfigSchema is an optional JSON Schema for the [providers.config] table.
	ConfigSchema json.RawMessage
}

// Request is one call of a provider by a chain step.
type Request struct {
	// ActionType is the step's action_type.
	ActionType string
	// Payload is the step's rendered payload_template as JSON.
	Payload json.RawMessage
	// Config is the provider's [providers.config] table as JSON.
	Config json.RawMessage
	// DedupKey identifies the step within its run and is stable across
	// retries and gateway restarts; providers pass it on as an idempotency
	// key (HTTP Idempotency-Key, PagerDuty dedup_key, email Message-ID).
	DedupKey string
	// Attempt is 1 for the first call of a step and grows with each retry.
	Attempt int
	// Deadline is when the gateway stops waiting for this call; zero if none.
	// The same deadline is set on Execute's context.
	Deadline time.Time
	// RunID and Step say which run and step made the call, for logging.
	RunID string
	Step  string
}

// Response is a provider's successful answer.
type Response struct {
	// Body is the JSON result that later steps read as steps.NAME.body.
	// Empty means null.
	Body json.RawMessage
}
