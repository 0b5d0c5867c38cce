// Package api is the gateway's HTTP API as its clients see it: the types
// its answers carry, its errors and the statuses they map to, the Ops that
// every entry point offers (the API serves them, the console acts through
// them, the command line runs them through the API or on a store), and
// Client, which runs them against a gateway over HTTP.
//
// It is the gateway's own package, with no compatibility promise.
package api

import (
	"encoding/json"
	"time"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/internal/jsonx"
)

// The HTTP API's answers are these types, not the store's records: a field
// added to a stored record reaches the API only when it is added here too,
// and the golden files in testdata/api pin what the API says. The JSON
// values a record holds as they came (payloads, bodies) pass through
// ValidJSON here, so that every answer parses with a strict parser,
// whatever an older gateway or a provider stored.

// ValidJSON is a JSON value as strict parsers read it (jsonx.ValidUTF8).
func ValidJSON(raw json.RawMessage) json.RawMessage { return jsonx.ValidUTF8(raw) }

// Run is a run as the API shows it.
type Run struct {
	ID        string `json:"id"`
	Chain     string `json:"chain"`
	ChainHash string `json:"chain_hash"`
	Status    string `json:"status"`
	Origin    Origin `json:"origin,omitzero"`
	// Path lists the top-level steps taken, in order.
	Path []string `json:"path"`
	// Cursor is the top-level step being executed; empty once finished.
	Cursor     string     `json:"cursor,omitempty"`
	Deadline   time.Time  `json:"deadline,omitzero"`
	CreatedAt  time.Time  `json:"created_at"`
	UpdatedAt  time.Time  `json:"updated_at"`
	FinishedAt time.Time  `json:"finished_at,omitzero"`
	Error      *ErrorInfo `json:"error,omitempty"`
	ParentRun  string     `json:"parent_run,omitempty"`
	ParentStep string     `json:"parent_step,omitempty"`
	// Body is the run's result once it has succeeded.
	Body json.RawMessage `json:"body,omitempty"`
	// BodyStep, set instead of Body for a result above 64 KiB, names the
	// step whose body the result is.
	BodyStep string `json:"body_step,omitempty"`
	// Seq is the sequence number of the run's last event.
	Seq uint64 `json:"seq"`
	// StartedBy says how the run started: "trigger:NAME",
	// "schedule:NAME", "api", "cli", "replay" or "sub_chain".
	StartedBy string `json:"started_by,omitempty"`
	// KeyUntil is when the idempotency key the run started under lapses.
	KeyUntil time.Time `json:"key_until,omitzero"`
	// Labels say what the run is about (an alert's labels, say).
	Labels map[string]string `json:"labels,omitempty"`
	// Queue is where a queued run waits for its concurrency key.
	Queue *QueuePlace `json:"queue,omitempty"`
	// Phase is on_failure or finally while the run runs its chain's
	// handlers; Ending the status it ends with once they are done.
	Phase  string `json:"phase,omitempty"`
	Ending string `json:"ending,omitempty"`
	// Failure is what failed and what handled it.
	Failure *Failure `json:"failure,omitempty"`
}

// Final reports whether the run has ended.
func (r *Run) Final() bool { return r != nil && store.RunStatus(r.Status).Final() }

// Origin is what started a run.
type Origin struct {
	ID         string          `json:"id"`
	Payload    json.RawMessage `json:"payload,omitempty"`
	Metadata   json.RawMessage `json:"metadata,omitempty"`
	ReceivedAt time.Time       `json:"received_at"`
}

// ErrorInfo is a failure as shown to operators.
type ErrorInfo struct {
	Message   string `json:"message"`
	Code      string `json:"code,omitempty"`
	Retryable bool   `json:"retryable,omitempty"`
}

// Step is one step of a run; Key is its path in the run, "notify/slack"
// for a parallel sub-step, "fan[3]" for a split's item.
type Step struct {
	Key        string          `json:"key"`
	Name       string          `json:"name"`
	Status     string          `json:"status"`
	DedupKey   string          `json:"dedup_key,omitempty"`
	Attempts   int             `json:"attempts"`
	Body       json.RawMessage `json:"body,omitempty"`
	Error      *ErrorInfo      `json:"error,omitempty"`
	StartedAt  time.Time       `json:"started_at,omitzero"`
	FinishedAt time.Time       `json:"finished_at,omitzero"`
	// NotBefore is when a waiting step (delay, retry backoff) goes next.
	NotBefore time.Time `json:"not_before,omitzero"`
	Deadline  time.Time `json:"deadline,omitzero"`
	Split     *Split    `json:"split,omitempty"`
	// Child is the run a sub_chain step started.
	Child string `json:"child,omitempty"`
}

// Split is a split step's progress.
type Split struct {
	Total     int `json:"total"`
	Next      int `json:"next"`
	Succeeded int `json:"succeeded"`
	Failed    int `json:"failed"`
	Skipped   int `json:"skipped"`
	// Distributed is set once the items are handed to workers; Gen numbers
	// the hand-off and Imported counts the results taken in from it.
	Distributed bool `json:"distributed,omitempty"`
	Gen         int  `json:"gen,omitempty"`
	Imported    int  `json:"imported,omitempty"`
}

// Event is one entry of a run's log.
type Event struct {
	RunID   string          `json:"run_id"`
	Chain   string          `json:"chain,omitempty"`
	Seq     uint64          `json:"seq"`
	Time    time.Time       `json:"time"`
	Type    string          `json:"type"`
	Step    string          `json:"step,omitempty"`
	Attempt int             `json:"attempt,omitempty"`
	Message string          `json:"message,omitempty"`
	Data    json.RawMessage `json:"data,omitempty"`
}

// DLQEntry is a failure parked for an operator.
type DLQEntry struct {
	ID string `json:"id"`
	// Kind is "step" for a step's failure, "delivery" for a trigger
	// delivery no run could be started for.
	Kind     string    `json:"kind"`
	RunID    string    `json:"run_id"`
	Chain    string    `json:"chain"`
	Step     string    `json:"step"`
	Error    ErrorInfo `json:"error"`
	Attempts int       `json:"attempts"`
	// Payload is the rendered payload of the failed call; for a delivery,
	// the body it brought.
	Payload   json.RawMessage `json:"payload,omitempty"`
	CreatedAt time.Time       `json:"created_at"`
	// Trigger, Headers and Metadata are a delivery's: the trigger it came
	// to, its headers (credentials left out) and where it came from.
	Trigger  string            `json:"trigger,omitempty"`
	Headers  map[string]string `json:"headers,omitempty"`
	Metadata json.RawMessage   `json:"metadata,omitempty"`
	// Handler is set for the failure of a chain's on_failure or finally
	// step: the phase it failed in.
	Handler string `json:"handler,omitempty"`
}

// RunPage is one page of a run listing.
type RunPage struct {
	Runs []*Run `json:"runs"`
	// Next is the cursor for the following page; empty at the end.
	Next string `json:"next_cursor"`
	// Damaged names runs whose records cannot be read back.
	Damaged []DamagedRun `json:"damaged"`
}

// DamagedRun is a run whose record cannot be read back, and why.
type DamagedRun struct {
	ID    string `json:"id"`
	Error string `json:"error"`
}

func RunOf(r *store.Run) *Run {
	if r == nil {
		return nil
	}
	return &Run{
		ID: r.ID, Chain: r.Chain, ChainHash: r.ChainHash, Status: string(r.Status),
		Origin: Origin{ID: r.Origin.ID, Payload: ValidJSON(r.Origin.Payload), Metadata: ValidJSON(r.Origin.Metadata), ReceivedAt: r.Origin.ReceivedAt},
		Path:   r.Path, Cursor: r.Cursor, Deadline: r.Deadline, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, FinishedAt: r.FinishedAt,
		Error: ErrorInfoOf(r.Error), ParentRun: r.ParentRun, ParentStep: r.ParentStep, Body: ValidJSON(r.Body), BodyStep: r.BodyStep, Seq: r.Seq,
		StartedBy: r.StartedBy, KeyUntil: r.KeyUntil, Labels: r.Labels,
		Queue: QueuePlaceOf(r.Queue),
		Phase: r.Phase, Ending: string(r.Ending), Failure: FailureOf(r.Failure),
	}
}

func ErrorInfoOf(e *store.ErrorInfo) *ErrorInfo {
	if e == nil {
		return nil
	}
	return &ErrorInfo{Message: e.Message, Code: e.Code, Retryable: e.Retryable}
}

func StepOf(rec *store.StepRecord) *Step {
	return &Step{
		Key: rec.Key, Name: rec.Name, Status: string(rec.Status), DedupKey: rec.DedupKey, Attempts: rec.Attempts,
		Body: ValidJSON(rec.Body), Error: ErrorInfoOf(rec.Error), StartedAt: rec.StartedAt, FinishedAt: rec.FinishedAt,
		NotBefore: rec.NotBefore, Deadline: rec.Deadline, Split: SplitOf(rec.Split), Child: rec.Child,
	}
}

func SplitOf(s *store.SplitState) *Split {
	if s == nil {
		return nil
	}
	return &Split{Total: s.Total, Next: s.Next, Succeeded: s.Succeeded, Failed: s.Failed, Skipped: s.Skipped,
		Distributed: s.Distributed, Gen: s.Gen, Imported: s.Imported}
}

// EventOf is a stored event as the API shows it.
func EventOf(ev store.Event) Event {
	return Event{RunID: ev.RunID, Chain: ev.Chain, Seq: ev.Seq, Time: ev.Time, Type: string(ev.Type), Step: ev.Step,
		Attempt: ev.Attempt, Message: ev.Message, Data: ValidJSON(ev.Data)}
}

func DLQEntryOf(e *store.DLQEntry) *DLQEntry {
	kind := e.Kind
	if kind == "" {
		kind = "step"
	}
	return &DLQEntry{ID: e.ID, Kind: kind, RunID: e.RunID, Chain: e.Chain, Step: e.Step, Error: *ErrorInfoOf(&e.Error),
		Attempts: e.Attempts, Payload: ValidJSON(e.Payload), CreatedAt: e.CreatedAt, Trigger: e.Trigger, Headers: e.Headers, Metadata: ValidJSON(e.Metadata),
		Handler: e.Handler}
}

func RunPageOf(p store.RunPage) RunPage {
	out := RunPage{Runs: make([]*Run, len(p.Runs)), Next: p.Next, Damaged: make([]DamagedRun, len(p.Damaged))}
	for i, r := range p.Runs {
		out.Runs[i] = RunOf(r)
	}
	for i, d := range p.Damaged {
		out.Damaged[i] = DamagedRun{ID: d.ID, Error: d.Error}
	}
	return out
}

// ItemPage is one page of a split's items, filtered by status.
type ItemPage struct {
	Split string `json:"split"`
	// Total counts the split's items; Counts those with a slot record,
	// by status. Items without one have not finished.
	Total  int            `json:"total"`
	Counts map[string]int `json:"counts"`
	Status string         `json:"status,omitempty"`
	Offset int            `json:"offset"`
	// Matched counts the items the status selects.
	Matched int     `json:"matched"`
	Items   []*Item `json:"items"`
}

// Item is one finished item of a split: its input, its result or its
// error, and the most attempts any of its steps took.
type Item struct {
	Index  int    `json:"index"`
	Key    string `json:"key"`
	Status string `json:"status"`
	// Input is the item as the split's items template renders it from the
	// run; absent for a split inside another split's item.
	Input    json.RawMessage `json:"input,omitempty"`
	Body     json.RawMessage `json:"body,omitempty"`
	Error    *ErrorInfo      `json:"error,omitempty"`
	Attempts int             `json:"attempts"`
}
