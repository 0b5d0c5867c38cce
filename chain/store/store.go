// Package store defines how runs, their step records, event logs and
// dead-letter entries are persisted. Implementations live in sub-packages
// (bolt, the embedded default; redis, shared between gateways; memory, in
// the process, for `gateway test`) and all pass the conformance suite in
// package storetest.
//
// It is the gateway's own package, with no compatibility promise.
package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/chaingate/gateway/internal/jsonx"
)

var (
	// ErrNotFound is returned for a run, step or DLQ entry that does not exist.
	ErrNotFound = errors.New("not found")
	// ErrInvalid is returned for an argument the store cannot use, such as
	// a list cursor it did not hand out.
	ErrInvalid = errors.New("invalid argument")
	// ErrExists is returned when creating a run whose id is taken.
	ErrExists = errors.New("already exists")
	// ErrInUse is returned when another process holds the store.
	ErrInUse = errors.New("store is in use by another process")
	// ErrConflict is returned for a batch that does not follow the stored
	// state, such as events out of sequence; retrying it cannot help.
	ErrConflict = errors.New("conflicting write")
	// ErrClosed is returned by every method after Close.
	ErrClosed = errors.New("store is closed")
	// ErrLeaseHeld is returned when another gateway holds a run's lease.
	ErrLeaseHeld = errors.New("run is leased by another gateway")
	// ErrLeaseLost is returned for a commit or renewal under a lease that is
	// no longer the run's current one: it expired, or another gateway took
	// the run over. The gateway must stop advancing the run.
	ErrLeaseLost = errors.New("lease on the run was lost")
	// ErrUnfinished is returned when deleting a run that has not ended.
	ErrUnfinished = errors.New("run has not finished")
	// ErrDamaged is returned for a record the store holds but cannot read
	// back (a corrupted file, or a value an older version wrote that cannot
	// be decoded). It concerns that record only: the others stay readable,
	// listings leave it out and name it (RunPage.Damaged).
	ErrDamaged = errors.New("record cannot be read back")
)

// MaxNesting is how deeply the JSON values a run holds (its payload and
// metadata, step bodies, dead-letter payloads) may nest. Stores wrap each
// in a record or two, and the JSON they are written in cannot be read back
// past 10,000 levels; values are refused well before, when they arrive,
// so that nothing accepted becomes unreadable. Real alerts nest a few
// levels.
const MaxNesting = 1000

// Store persists runs. A Commit is atomic and durable when it returns.
type Store interface {
	// Commit writes one batch of changes to one run atomically.
	Commit(ctx context.Context, b *Batch) error
	// Run returns a run's record.
	Run(ctx context.Context, id string) (*Run, error)
	// RunHeader returns a run's record without its origin: its status and
	// result, without reading back a payload that may be megabytes.
	RunHeader(ctx context.Context, id string) (*Run, error)
	// Steps returns a run's step records whose key starts with prefix
	// ("" for all), ordered by key.
	Steps(ctx context.Context, runID, prefix string) ([]*StepRecord, error)
	// ForEachStep calls fn with each of a run's step records that scan
	// selects, in key order, one at a time, so that a split of a million
	// items can be read without holding it all. fn returning an error stops
	// the walk with that error.
	ForEachStep(ctx context.Context, runID string, scan StepScan, fn func(*StepRecord) error) error
	// Events returns up to limit events of a run with Seq > after, in order.
	// limit <= 0 means no limit.
	Events(ctx context.Context, runID string, after uint64, limit int) ([]Event, error)
	// ListRuns returns runs newest first.
	ListRuns(ctx context.Context, f RunFilter) (RunPage, error)
	// UnfinishedRuns returns the ids of every run that has not reached a
	// final status, oldest first, for resuming after a restart.
	UnfinishedRuns(ctx context.Context) ([]string, error)
	// Definition returns the chain definition stored under hash.
	Definition(ctx context.Context, hash string) ([]byte, error)
	// DLQ returns one dead-letter entry.
	DLQ(ctx context.Context, id string) (*DLQEntry, error)
	// ListDLQ returns dead-letter entries, oldest first.
	ListDLQ(ctx context.Context, f DLQFilter) ([]*DLQEntry, error)
	// DeleteDLQ removes a dead-letter entry.
	DeleteDLQ(ctx context.Context, id string) error
	// CountDLQ returns how many dead-letter entries there are.
	CountDLQ(ctx context.Context) (int, error)

	// AcquireLease claims the right to advance a run for ttl. It fails with
	// ErrLeaseHeld while another owner's lease is live. An owner acquiring
	// a run gets a fence higher than any earlier lease on that run; an
	// owner acquiring a lease it already holds renews it.
	AcquireLease(ctx context.Context, runID, owner string, ttl time.Duration) (Lease, error)
	// RenewLease extends a lease, or fails with ErrLeaseLost.
	RenewLease(ctx context.Context, l Lease, ttl time.Duration) (Lease, error)
	// ReleaseLease gives a lease up, if it is still the current one.
	ReleaseLease(ctx context.Context, l Lease) error

	// ClaimKey binds an idempotency key to a run id for ttl. If the key is
	// bound to another run, it returns that run's id and binds nothing; a
	// key bound to runID already counts as claimed, and is bound anew for
	// ttl from now, so a retried claim succeeds and a holder keeps a claim
	// for as long as it claims it again.
	ClaimKey(ctx context.Context, key, runID string, ttl time.Duration) (string, error)
	// KeyRun returns the run id an idempotency key is bound to, or "" when
	// it is bound to none or its binding has lapsed.
	KeyRun(ctx context.Context, key string) (string, error)
	// ReleaseKey unbinds a key bound to runID, so that the next claim of it
	// binds anew; a key bound to another run, or to none, is left as it is.
	ReleaseKey(ctx context.Context, key, runID string) error
	// ForEachKey calls fn with each key bound now whose name starts with
	// prefix, and what it is bound to, in no set order; fn returning an
	// error stops the walk with that error. It is for the few keys a
	// gateway must find again after a restart, not for the many: on Redis
	// it walks the whole keyspace.
	ForEachKey(ctx context.Context, prefix string, fn func(key, bound string) error) error

	// AddDLQ parks an entry that belongs to no run, such as a trigger
	// delivery no run could be started for.
	AddDLQ(ctx context.Context, d *DLQEntry) error

	// PutDelivery keeps a trigger delivery that was accepted and answered
	// before all of it was turned into runs.
	PutDelivery(ctx context.Context, d *Delivery) error
	// Deliveries returns up to limit kept deliveries (all of them when
	// limit <= 0), oldest first.
	Deliveries(ctx context.Context, limit int) ([]*Delivery, error)
	// DeleteDelivery removes a kept delivery; one already gone is no error.
	DeleteDelivery(ctx context.Context, id string) error

	// FinishedRuns calls fn with the header of each run that ended with
	// status, in the order they ended, oldest first, until fn returns false
	// or an error; it reads no run that has not ended.
	FinishedRuns(ctx context.Context, status RunStatus, fn func(*Run) (bool, error)) error
	// DeleteRun removes a run that has ended and everything of it: its
	// record, origin, step records (split items included), events and
	// index entries, without reading them into memory and without holding
	// up other runs' commits for long, however many it has. It fails with
	// ErrNotFound for a run that is not there and ErrUnfinished for one
	// that has not ended. Its dead-letter entries and the idempotency keys
	// bound to it are left to their own lifetimes.
	DeleteRun(ctx context.Context, id string) (Freed, error)

	// AppendAudit adds an entry to the audit log, durably when it returns.
	AppendAudit(ctx context.Context, e *AuditEntry) error
	// WalkAudit calls fn with each audit entry scan selects, in its order,
	// until fn returns false or an error.
	WalkAudit(ctx context.Context, scan AuditScan, fn func(*AuditEntry) (bool, error)) error
	// PruneAudit removes the audit entries made before t and says how many.
	PruneAudit(ctx context.Context, before time.Time) (int, error)

	// Close releases the store; it waits for commits under way.
	Close() error
}

// Freed is what deleting took out of a store.
type Freed struct {
	// Records counts the records removed: a run's header, origin, step
	// records and events (the embedded store), or its keys (Redis).
	Records int
	// Bytes is the size of what was removed, where the store knows it.
	Bytes int64
}

// Add adds f2 to f.
func (f *Freed) Add(f2 Freed) {
	f.Records += f2.Records
	f.Bytes += f2.Bytes
}

// RunFeed is implemented by a store that several gateways share: each
// commit announces the run status changes it makes durable (events whose
// type starts with "run_"), and every gateway following the feed hears
// them, whichever gateway committed them. A store one process holds has
// no feed: that process sees every commit itself.
type RunFeed interface {
	// FollowRuns calls fn with each announced event, in the order heard,
	// until ctx ends or the store closes. It calls fn with lost set (and a
	// zero event) each time following begins, the first time included:
	// announcements made while it was not following are not heard again.
	FollowRuns(ctx context.Context, fn func(ev Event, lost bool))
}

// IsRunChange reports whether an event is a run's status change, the kind
// a RunFeed announces.
func IsRunChange(t EventType) bool { return strings.HasPrefix(string(t), "run_") }

// StepScan selects step records for ForEachStep.
type StepScan struct {
	// Prefix keeps the records whose key starts with it; "" keeps all.
	Prefix string
	// SkipItems leaves out the records of split items (keys holding '['),
	// without reading them: a run's own steps, groups and splits' own
	// records, however many items its splits have.
	SkipItems bool
	// Exact keeps only the record whose key is Prefix itself (none when
	// Prefix is ""): one step read without going through the records of a
	// split's items.
	Exact bool
}

// IsItemKey reports whether a step record's key belongs to a split item.
func IsItemKey(key string) bool { return strings.IndexByte(key, '[') >= 0 }

// Lease is one gateway's claim on advancing a run. Commits carry it, and a
// store rejects a commit whose lease is no longer current, so a gateway
// that lost a run cannot write to it.
type Lease struct {
	RunID string `json:"run_id"`
	Owner string `json:"owner"`
	// Fence grows with every acquisition by a new owner.
	Fence   uint64    `json:"fence"`
	Expires time.Time `json:"expires"`
}

// Batch is one atomic change to one run.
type Batch struct {
	// Run is the run's record after the change. Required.
	Run *Run
	// Create makes the commit fail with ErrExists if the run already exists.
	Create bool
	// Steps are step records to write (insert or replace by key).
	Steps []*StepRecord
	// Events are appended to the run's log; their Seq must follow the
	// run's previous Seq without gaps, and Run.Seq must be the last one.
	Events []Event
	// DLQ entries to add.
	DLQ []*DLQEntry
	// Definition, when set, is stored under its hash unless one is there
	// already, so the run can resume on the definition it started with.
	Definition *Definition
	// Lease, when set, must be the run's current lease, or the commit fails
	// with ErrLeaseLost and writes nothing.
	Lease *Lease
	// DeleteSteps lists step records to remove, as a replay does for the
	// records of the steps it runs again.
	DeleteSteps []string
	// Claim, with Create, binds an idempotency key to the run as it is
	// created, as ClaimKey would: the run and its key are durable together
	// or not at all. A key bound to another run fails the commit with a
	// *KeyBoundError naming that run, and nothing is written.
	Claim *KeyClaim
}

// KeyClaim is an idempotency key a run is created under, bound for TTL.
type KeyClaim struct {
	Key string
	TTL time.Duration
}

// ErrKeyBound is returned by a commit whose Claim names a key bound to
// another run; the error is a *KeyBoundError.
var ErrKeyBound = errors.New("idempotency key is bound to another run")

// KeyBoundError says which run holds the key a create claimed. Run is ""
// when the binding lapsed before the store could read it back.
type KeyBoundError struct {
	Key string
	Run string
}

func (e *KeyBoundError) Error() string {
	return fmt.Sprintf("idempotency key %q is bound to run %s", e.Key, e.Run)
}

// Is makes a KeyBoundError match ErrKeyBound.
func (e *KeyBoundError) Is(target error) bool { return target == ErrKeyBound }

// MaxKeyBytes is the longest idempotency key a store binds. Keys are made
// of what requests bring (an Idempotency-Key header, an alert's
// fingerprint, a template's output): a longer one is refused before
// anything is written, rather than met by a store's own limit (bbolt's
// 32 KiB) part way through a commit.
const MaxKeyBytes = 16 << 10

// CheckKey checks an idempotency key before a store binds it.
func CheckKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("claiming idempotency key: the key is empty: %w", ErrInvalid)
	case len(key) > MaxKeyBytes:
		return fmt.Errorf("claiming idempotency key: the key is %d bytes, more than the %d a key may have: %w", len(key), MaxKeyBytes, ErrInvalid)
	}
	return nil
}

// CheckClaim checks a batch's claim: only a create claims, with a key
// CheckKey accepts and a ttl.
func CheckClaim(b *Batch) error {
	c := b.Claim
	switch {
	case c == nil:
		return nil
	case !b.Create:
		return fmt.Errorf("claiming idempotency key: only a run's creation claims a key: %w", ErrInvalid)
	case c.TTL <= 0:
		return fmt.Errorf("claiming idempotency key: ttl %s is not positive: %w", c.TTL, ErrInvalid)
	}
	return CheckKey(c.Key)
}

// Definition is a chain definition as started runs need it: a
// self-contained config document and the chain's hash.
type Definition struct {
	Hash   string
	Source []byte
}

// RunStatus is where a run stands.
type RunStatus string

const (
	RunRunning RunStatus = "running"
	// RunWaiting is a run waiting on a person: an approval step asked and
	// has no answer yet. It has not ended.
	RunWaiting   RunStatus = "waiting"
	RunSucceeded RunStatus = "succeeded"
	RunFailed    RunStatus = "failed"
	RunCancelled RunStatus = "cancelled"
	RunTimedOut  RunStatus = "timed_out"
)

// Final reports whether the status is terminal.
func (s RunStatus) Final() bool {
	return s != RunRunning && s != RunWaiting && s != RunQueued && s != ""
}

// StepStatus is where a step stands.
type StepStatus string

const (
	StepPending   StepStatus = "pending"
	StepRunning   StepStatus = "running"
	StepSucceeded StepStatus = "succeeded"
	StepFailed    StepStatus = "failed"
	StepSkipped   StepStatus = "skipped"
	StepTimedOut  StepStatus = "timed_out"
	StepCancelled StepStatus = "cancelled"
)

// Final reports whether the status is terminal.
func (s StepStatus) Final() bool {
	return s != StepPending && s != StepRunning && s != ""
}

// Origin is what started a run.
type Origin struct {
	ID         string          `json:"id"`
	Payload    json.RawMessage `json:"payload,omitempty"`
	Metadata   json.RawMessage `json:"metadata,omitempty"`
	ReceivedAt time.Time       `json:"received_at"`
	// Subject is who started the run, as the gateway proved them: a
	// token's or a person's name, "trigger NAME"; empty when no one did.
	Subject string `json:"subject,omitempty"`
}

// ErrorInfo is a failure as recorded and shown to operators.
type ErrorInfo struct {
	Message   string `json:"message"`
	Code      string `json:"code,omitempty"`
	Retryable bool   `json:"retryable,omitempty"`
}

// Run is a run's persisted record. Step results live in StepRecords.
type Run struct {
	ID        string    `json:"id"`
	Chain     string    `json:"chain"`
	ChainHash string    `json:"chain_hash"`
	Status    RunStatus `json:"status"`
	Origin    Origin    `json:"origin,omitzero"`
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
	// Body is the run's result once it has succeeded: the body of the last
	// step it took. A sub-chain's body becomes its parent step's body.
	Body json.RawMessage `json:"body,omitempty"`
	// BodyStep, set instead of Body when the result is large, is the key of
	// the step record whose body the result is. A split's results can be
	// tens of MB: the run's record, which every commit and every listing
	// reads, does not carry a second copy.
	BodyStep string `json:"body_step,omitempty"`
	// Seq is the sequence number of the run's last event.
	Seq uint64 `json:"seq"`
	// StartedBy says how the run started: "trigger:NAME",
	// "schedule:NAME", "api", "cli", "replay" or "sub_chain"; empty for a
	// run an older version started.
	StartedBy string `json:"started_by,omitempty"`
	// KeyUntil is when the idempotency key the run started under lapses;
	// until then a repeat of its start finds it, so it is kept.
	KeyUntil time.Time `json:"key_until,omitzero"`
	// Labels say what the run is about, to find it by: an alert's labels
	// (alertname, severity, instance) or what its trigger or starter gave.
	Labels map[string]string `json:"labels,omitempty"`
	// Queue is where a queued run waits for its concurrency key; nil
	// unless the run's status is queued.
	Queue *QueuePlace `json:"queue,omitempty"`

	// Phase is the handler list the run is in, PhaseOnFailure or
	// PhaseFinally, while it runs its chain's failure handlers; "" before
	// (and once the run has ended). Ending is the status the run ends with
	// once its handlers are done, set from when its outcome is known.
	Phase  string    `json:"phase,omitempty"`
	Ending RunStatus `json:"ending,omitempty"`
	// Failure is what failed and what handled it; nil while nothing has.
	Failure *Failure `json:"failure,omitempty"`
}

// How runs start, as StartedBy names them (a trigger's and a schedule's
// with ":NAME" after).
const (
	StartedByTrigger  = "trigger"
	StartedBySchedule = "schedule"
	StartedByAPI      = "api"
	StartedByCLI      = "cli"
	StartedByReplay   = "replay"
	StartedBySubChain = "sub_chain"
)

// StartedKind is how a run started without the trigger's or schedule's
// name: "trigger:am" is "trigger".
func StartedKind(startedBy string) string {
	kind, _, _ := strings.Cut(startedBy, ":")
	return kind
}

// StepRecord is one step's state within a run. Key is the step's path in
// the run: "check", "notify/slack" for a parallel sub-step.
type StepRecord struct {
	Key        string          `json:"key"`
	Name       string          `json:"name"`
	Status     StepStatus      `json:"status"`
	DedupKey   string          `json:"dedup_key,omitempty"`
	Attempts   int             `json:"attempts"`
	Body       json.RawMessage `json:"body,omitempty"`
	Error      *ErrorInfo      `json:"error,omitempty"`
	StartedAt  time.Time       `json:"started_at,omitzero"`
	FinishedAt time.Time       `json:"finished_at,omitzero"`
	// NotBefore is a persisted timer: the step is not to be (re)dispatched
	// before it (delay_seconds, retry backoff).
	NotBefore time.Time `json:"not_before,omitzero"`
	// Deadline bounds a group or split step as a whole.
	Deadline time.Time `json:"deadline,omitzero"`
	// Split is a split step's progress.
	Split *SplitState `json:"split,omitempty"`
	// Child is the run a sub_chain step started.
	Child string `json:"child,omitempty"`
}

// SplitState is a split step's progress. Items below Next may have been
// started; each finished item has a record of its own keyed STEP[INDEX].
type SplitState struct {
	Total     int `json:"total"`
	Next      int `json:"next"`
	Succeeded int `json:"succeeded"`
	Failed    int `json:"failed"`
	Skipped   int `json:"skipped"`
	// Distributed is set once the items are handed to workers. Gen numbers
	// the hand-off (a replay hands the unfinished items over again under
	// a new one), and Imported counts the results taken in from it.
	Distributed bool `json:"distributed,omitempty"`
	Gen         int  `json:"gen,omitempty"`
	Imported    int  `json:"imported,omitempty"`
}

// EventType names a state change.
type EventType string

const (
	EventRunStarted   EventType = "run_started"
	EventRunResumed   EventType = "run_resumed"
	EventRunReplayed  EventType = "run_replayed"
	EventRunSucceeded EventType = "run_succeeded"
	EventRunFailed    EventType = "run_failed"
	EventRunCancelled EventType = "run_cancelled"
	EventRunTimedOut  EventType = "run_timed_out"
	// EventRunWaiting is a run starting to wait on a person: its approval
	// step asks. Its step is the approval step.
	EventRunWaiting    EventType = "run_waiting"
	EventStepStarted   EventType = "step_started"
	EventStepSucceeded EventType = "step_succeeded"
	EventStepFailed    EventType = "step_failed"
	EventStepSkipped   EventType = "step_skipped"
	EventStepRetrying  EventType = "step_retrying"
	EventStepTimedOut  EventType = "step_timed_out"
	EventStepCancelled EventType = "step_cancelled"
	EventStepProgress  EventType = "step_progress"
	EventDeadLettered  EventType = "dead_lettered"
	// EventNote is something that happened to the run from outside its
	// steps, such as a later notification of the alert group it serves.
	EventNote EventType = "note"
	// A distributed split's hand-off: its items are being published to
	// workers, how many are out, and the moment every result is in.
	EventSplitFanoutStarted  EventType = "split_fanout_started"
	EventSplitItemsEnqueued  EventType = "split_items_enqueued"
	EventSplitFaninCompleted EventType = "split_fanin_completed"
)

// Event is one entry of a run's log.
type Event struct {
	RunID   string    `json:"run_id"`
	Chain   string    `json:"chain,omitempty"`
	Seq     uint64    `json:"seq"`
	Time    time.Time `json:"time"`
	Type    EventType `json:"type"`
	Step    string    `json:"step,omitempty"`
	Attempt int       `json:"attempt,omitempty"`
	Message string    `json:"message,omitempty"`
	// Data carries type-specific detail, such as progress counts.
	Data json.RawMessage `json:"data,omitempty"`
}

// DLQEntry is a failure parked for an operator.
type DLQEntry struct {
	ID string `json:"id"`
	// Kind is empty for a step's failure, DLQDelivery for a delivery.
	Kind     string    `json:"kind,omitempty"`
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
	// Handler is the handler phase (on_failure, finally) of the step
	// whose failure this is; empty for the chain's own steps.
	Handler string `json:"handler,omitempty"`
}

// DLQDelivery is the kind of a dead-letter entry that holds a trigger
// delivery the gateway could not turn into a run: replaying it delivers it
// again, through the trigger as configured then.
const DLQDelivery = "delivery"

// Delivery is a trigger request accepted and answered whose alerts are
// still to be turned into runs: the notification, narrowed to them.
type Delivery struct {
	ID         string          `json:"id"`
	Trigger    string          `json:"trigger"`
	Body       json.RawMessage `json:"body"`
	Metadata   json.RawMessage `json:"metadata,omitempty"`
	ReceivedAt time.Time       `json:"received_at"`
}

// RunFilter selects runs to list.
type RunFilter struct {
	Chain  string
	Status RunStatus
	Since  time.Time
	Limit  int
	// Cursor continues a listing where a RunPage's Next left off.
	Cursor string
	// NoOrigins leaves each run's Origin empty: a listing that shows no
	// payload need not read one of tens of MB.
	NoOrigins bool
	// StartedBy keeps the runs started that way: a kind ("trigger"), or a
	// kind and a name ("trigger:am").
	StartedBy string
	// HideChains leaves out the runs of these chains.
	HideChains []string
	// Labels keeps the runs that carry every one of these labels with
	// these values; a label given an empty value need only be there.
	Labels map[string]string
}

// Keeps reports whether the filter keeps a run, on what its header says
// (Since and the cursor are the listing's own).
func (f *RunFilter) Keeps(run *Run) bool {
	switch {
	case f.Chain != "" && run.Chain != f.Chain,
		f.Status != "" && run.Status != f.Status,
		f.StartedBy != "" && run.StartedBy != f.StartedBy && (strings.Contains(f.StartedBy, ":") || StartedKind(run.StartedBy) != f.StartedBy):
		return false
	}
	for _, c := range f.HideChains {
		if run.Chain == c {
			return false
		}
	}
	for k, v := range f.Labels {
		if got, ok := run.Labels[k]; !ok || (v != "" && got != v) {
			return false
		}
	}
	return true
}

// Filtered reports whether the filter leaves runs out on what their
// headers say, so that a listing reads past a page's worth to fill it.
func (f *RunFilter) Filtered() bool {
	return f.Chain != "" || f.Status != "" || f.StartedBy != "" || len(f.HideChains) > 0 || len(f.Labels) > 0
}

// RunPage is one page of a run listing.
type RunPage struct {
	Runs []*Run
	// Next is the cursor for the following page; empty at the end.
	Next string
	// Damaged names the runs the page passed over because their records
	// cannot be read back (ErrDamaged), whatever the filter.
	Damaged []DamagedRun
}

// DamagedRun is a run whose record cannot be read back, and why.
type DamagedRun struct {
	ID    string `json:"id"`
	Error string `json:"error"`
}

// DLQFilter selects dead-letter entries. Entries are listed in id order,
// which is the order they were parked in.
type DLQFilter struct {
	Chain string
	Step  string
	Since time.Time
	Limit int
	// After keeps the entries listed after the one with this id: the last
	// entry of the previous page.
	After string
}

// MarshalStep encodes a step record as the stores keep it. A body above
// 64 KiB (a split's results can be tens of MB) is checked and copied in
// once, into a buffer of the right size, where encoding/json would grow a
// buffer through several copies of it.
func MarshalStep(st *StepRecord) ([]byte, error) {
	if len(st.Body) <= spliceAbove {
		return marshalStep(st)
	}
	rest := *st
	rest.Body = nil
	return marshalSpliced(&rest, "body", st.Body)
}

// MarshalOrigin encodes a run's origin as the stores keep it, a payload
// above 64 KiB (the array of a split over a million hosts) copied in once.
func MarshalOrigin(o *Origin) ([]byte, error) {
	if len(o.Payload) <= spliceAbove {
		return jsonx.Marshal(o)
	}
	rest := *o
	rest.Payload = nil
	return marshalSpliced(&rest, "payload", o.Payload)
}

// spliceAbove is the size from which a raw JSON value is spliced into its
// record's encoding rather than encoded with it.
const spliceAbove = 64 << 10

// marshalSpliced encodes v, whose field is left empty, with raw as that
// field's value.
func marshalSpliced(v any, field string, raw json.RawMessage) ([]byte, error) {
	if !json.Valid(raw) {
		return nil, fmt.Errorf("encoding %s: it is not valid JSON", field)
	}
	head, err := jsonx.Marshal(v)
	if err != nil {
		return nil, err
	}
	key := `,"` + field + `":`
	out := make([]byte, 0, len(head)+len(key)+len(raw))
	out = append(out, head[:len(head)-1]...) // the object open: it has a key at least
	out = append(out, key...)
	out = append(out, raw...)
	return append(out, '}'), nil
}
