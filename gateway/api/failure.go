package api

import "github.com/chaingate/gateway/chain/store"

// Failure is what failed in a run and what handled it, as the API shows
// it: the step and why, the step a catch route sent the failure to, and
// the on_failure and finally steps that ran.
type Failure struct {
	Step     string `json:"step,omitempty"`
	Class    string `json:"class"`
	Code     string `json:"code,omitempty"`
	Message  string `json:"message"`
	Attempts int    `json:"attempts,omitempty"`
	// Route is the step a catch entry routed the failure to; Recovered
	// says that entry let the run carry on as if nothing failed.
	Route     string `json:"route,omitempty"`
	Recovered bool   `json:"recovered,omitempty"`
	// Handlers are the handler steps that ran ("on_failure:page"), and
	// HandlerFailures those that failed, parked in the dead-letter queue.
	Handlers        []string `json:"handlers,omitempty"`
	HandlerFailures []string `json:"handler_failures,omitempty"`
}

func FailureOf(f *store.Failure) *Failure {
	if f == nil {
		return nil
	}
	return &Failure{Step: f.Step, Class: f.Class, Code: f.Code, Message: f.Message, Attempts: f.Attempts,
		Route: f.Route, Recovered: f.Recovered, Handlers: f.Handlers, HandlerFailures: f.HandlerFailures}
}
