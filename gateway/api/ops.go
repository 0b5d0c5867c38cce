package api

import (
	"context"
	"encoding/json"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
)

// StartResponse answers a POST that started, or found, a run.
type StartResponse struct {
	ID     string `json:"id"`
	Chain  string `json:"chain"`
	Status string `json:"status"`
	// Replayed is set when an Idempotency-Key matched an earlier request.
	Replayed bool              `json:"replayed,omitempty"`
	Links    map[string]string `json:"links"`
	// Run is the finished run, when ?wait= saw it finish.
	Run *RunView `json:"run,omitempty"`
}

// Bounds of the parameters the API takes; the command line checks its
// flags against them too.
const (
	// MaxPageLimit bounds a listing of runs or dead-letter entries.
	MaxPageLimit = 1000
	// DefaultAuditLimit is a listing of the audit log's page without a limit.
	DefaultAuditLimit = 100
	// MaxBulkLimit bounds a bulk replay or purge.
	MaxBulkLimit = 100000
	// MaxConcurrency bounds a bulk replay's replays at a time.
	MaxConcurrency = 64
)

// What a redrive runs again: a split's failed items, or its failed and
// skipped ones.
const (
	RedriveFailed           = "failed"
	RedriveFailedAndSkipped = "failed_and_skipped"
)

// PruneBody is the body of POST /v1/runs/prune.
type PruneBody struct {
	OlderThan string `json:"older_than"`
	Chain     string `json:"chain,omitempty"`
	Status    string `json:"status,omitempty"`
	DryRun    bool   `json:"dry_run,omitempty"`
}

// Ops are what operators do with runs and the dead-letter queue. The HTTP
// API serves them, the web console (gateway/console) acts through them, and
// the command line runs them either through the API (Client) or straight on
// a store (Local).
type Ops interface {
	// StartRun starts a run of a chain with a payload (one JSON value;
	// empty means {}), as POST /v1/chains/{name}/runs does: the run is
	// started by "api", and who started it is the context's actor, in the
	// gateway's log. A start under an idempotency key an earlier start
	// took returns that start's run rather than starting another.
	StartRun(ctx context.Context, chainName string, payload json.RawMessage, opts StartOptions) (*Run, error)
	ListRuns(ctx context.Context, f store.RunFilter) (RunPage, error)
	Run(ctx context.Context, id string, items bool) (*RunView, error)
	// RunHeader reads a run without its origin or its steps: what it is
	// and where it stands, for following a run whose payload may be tens
	// of MB.
	RunHeader(ctx context.Context, id string) (*Run, error)
	// Step reads one step record of a run, a step inside a split's item
	// too, without reading the others; store.ErrNotFound when the run has
	// none under key (it has not started, or there is no such step).
	Step(ctx context.Context, id, key string) (*Step, error)
	// CancelRun cancels a run, whichever gateway sharing the store
	// advances it: that gateway ends it.
	CancelRun(ctx context.Context, id string) error
	// DeleteRun removes a run that has ended, and its dead-letter entries.
	DeleteRun(ctx context.Context, id string) (*DeleteResult, error)
	// PruneRuns removes the runs that ended before opts.OlderThan, as
	// retention would: keeping those with a dead-letter entry, a parent
	// or an idempotency key still there.
	PruneRuns(ctx context.Context, opts PruneOptions) (*PruneResult, error)
	// Signal answers a waiting approval step: approve or reject, with a
	// comment; who answers is the context's actor.
	Signal(ctx context.Context, id, step, decision, comment string) (*engine.Decision, error)
	// ReplayRun runs a run that ended without success again, from the step
	// it stopped at or from the start, whether or not its failure was
	// dead-lettered.
	ReplayRun(ctx context.Context, id string, opts engine.ReplayOptions) (*Run, error)
	// RedriveSplit runs again the failed (or failed and skipped) items of a
	// top-level split of a run that ended, keeping the others' results,
	// then the steps after it.
	RedriveSplit(ctx context.Context, id, step string, opts engine.RedriveOptions) (*Run, error)
	// Events calls fn with the run's events after the given sequence
	// number; with follow, it goes on with new ones until the run ends or
	// ctx is done.
	Events(ctx context.Context, id string, after uint64, follow bool, fn func(Event) error) error
	DAG(ctx context.Context, id string) (*DAG, error)
	// SplitItems pages through the finished items of the split whose
	// record key is split, those with status only when status is set.
	SplitItems(ctx context.Context, id, split, status string, offset, limit int) (*ItemPage, error)
	// ListDLQ lists a page of the entries f selects, those after f.After
	// when it is set; ListAllDLQ reads on, page after page.
	ListDLQ(ctx context.Context, f store.DLQFilter) ([]*DLQEntry, error)
	// Pause pauses a trigger or schedule (kind PauseTrigger or
	// PauseSchedule) on every gateway sharing the store; Resume lifts the
	// pause (nil when there was none); Pauses lists them.
	Pause(ctx context.Context, kind, name, reason string) (*Pause, error)
	Resume(ctx context.Context, kind, name string) (*Pause, error)
	Pauses(ctx context.Context) ([]*Pause, error)
	DLQEntry(ctx context.Context, id string) (*DLQEntry, error)
	// Replay runs a dead-letter entry again, and returns the run carrying
	// on: for a delivery, the run its first alert started or found, one
	// without an ID when each of its alerts was skipped.
	Replay(ctx context.Context, id string, opts engine.ReplayOptions) (*Run, error)
	ReplayMany(ctx context.Context, f store.DLQFilter, opts engine.ReplayOptions, concurrency int) (*BulkReplay, error)
	DeleteDLQ(ctx context.Context, id string) error
	// ListAudit lists a page of the audit log, newest first; ExportAudit
	// calls fn with every entry f selects, oldest first.
	ListAudit(ctx context.Context, f AuditFilter) (AuditPage, error)
	ExportAudit(ctx context.Context, f AuditFilter, fn func(*AuditEntry) error) error
	PurgeDLQ(ctx context.Context, f store.DLQFilter) (int, error)
}

// StartOptions are what a run is started with besides its chain and
// payload.
type StartOptions struct {
	// Labels say what the run is about.
	Labels map[string]string
	// IdempotencyKey is the Idempotency-Key POST /v1/chains/{name}/runs
	// takes: the starts of a chain that carry the same key within
	// ops.IdempotencyTTL start one run, however many are sent at once. Empty
	// starts a run each time.
	IdempotencyKey string
}

// RunView is a run with its step records.
type RunView struct {
	*Run
	Steps map[string]*Step `json:"steps"`
	// DistributedSplits are the keys of the run's splits whose items were
	// handed to workers.
	DistributedSplits []string `json:"distributed_splits"`
}

// DistributedSplit reports whether rec is a split handed to workers.
func DistributedSplit(rec *store.StepRecord) bool {
	return rec.Split != nil && rec.Split.Distributed && !store.IsItemKey(rec.Key)
}

// BulkReplay reports a replay of many dead-letter entries.
type BulkReplay struct {
	Replayed []ReplayedEntry `json:"replayed"`
	Failed   []FailedEntry   `json:"failed"`
}

// ReplayedEntry is one entry that was replayed, and the run carrying on.
type ReplayedEntry struct {
	Entry string `json:"entry"`
	Run   string `json:"run"`
}

// FailedEntry is one entry that could not be replayed, and why.
type FailedEntry struct {
	Entry string `json:"entry"`
	Error string `json:"error"`
}

// DAG is a run's steps with their status, shaped as its chain is.
type DAG struct {
	Run   string       `json:"run"`
	Chain string       `json:"chain"`
	Nodes []*DAGNode   `json:"nodes"`
	Edges []chain.Edge `json:"edges"`
	// Handlers are the chain's on_failure and finally lists.
	Handlers []*DAGHandler `json:"handlers,omitempty"`
}

// DAGHandler is one of a chain's handler lists in a DAG.
type DAGHandler struct {
	Phase string       `json:"phase"`
	Nodes []*DAGNode   `json:"nodes"`
	Edges []chain.Edge `json:"edges"`
}

// DAGNode is one step of a DAG.
type DAGNode struct {
	Name     string     `json:"name"`
	Kind     string     `json:"kind"`
	Provider string     `json:"provider,omitempty"`
	Status   string     `json:"status"`
	Attempts int        `json:"attempts,omitempty"`
	Error    *ErrorInfo `json:"error,omitempty"`
	Join     string     `json:"join,omitempty"`
	Split    *Split     `json:"split,omitempty"`
	ChildRun string     `json:"child_run,omitempty"`
	Children []*DAGNode `json:"children,omitempty"`
}

// DeleteResult says what deleting a run removed.
type DeleteResult struct {
	Run string `json:"run"`
	// DeadLetters are the run's dead-letter entries, removed with it.
	DeadLetters []string `json:"dead_letters"`
	Freed       Freed    `json:"freed"`
}

// DAG is the run's steps with their status, shaped as def, the chain the
// run started with, is. It reads the step records the view holds, so that
// a page showing a run and its graph reads them once.
func (v *RunView) DAG(def *chain.Chain) *DAG {
	g := def.Graph()
	d := &DAG{Run: v.ID, Chain: v.Chain, Nodes: DAGNodes(g.Nodes, "", v.Steps), Edges: g.Edges}
	for _, h := range g.Handlers {
		d.Handlers = append(d.Handlers, &DAGHandler{Phase: h.Phase, Nodes: DAGNodes(h.Nodes, "", v.Steps), Edges: h.Edges})
	}
	return d
}

func DAGNodes(nodes []*chain.Node, prefix string, steps map[string]*Step) []*DAGNode {
	out := make([]*DAGNode, 0, len(nodes))
	for _, n := range nodes {
		d := &DAGNode{Name: n.Name, Kind: n.Kind, Provider: n.Provider, Join: n.Join, Status: "not_started"}
		if st := steps[prefix+n.Name]; st != nil {
			d.Status, d.Attempts, d.Error, d.Split, d.ChildRun = st.Status, st.Attempts, st.Error, st.Split, st.Child
		}
		if n.Kind == "parallel" {
			d.Children = DAGNodes(n.Children, prefix+n.Name+"/", steps)
		}
		out = append(out, d)
	}
	return out
}

// ListAllDLQ lists every entry a filter selects through ops, up to f.Limit
// when it is set: a page is at most MaxPageLimit entries, wherever ops
// reads them.
func ListAllDLQ(ctx context.Context, ops Ops, f store.DLQFilter) ([]*DLQEntry, error) {
	return AllPages(f, func(f store.DLQFilter) ([]*DLQEntry, error) { return ops.ListDLQ(ctx, f) },
		func(e *DLQEntry) string { return e.ID })
}

// AllPages lists every entry f selects with list, a page at a time, each
// page after the last entry of the one before (id says an entry's id).
func AllPages[E any](f store.DLQFilter, list func(store.DLQFilter) ([]E, error), id func(E) string) ([]E, error) {
	limit := f.Limit
	var out []E
	for {
		f.Limit = DLQPage
		if limit > 0 {
			f.Limit = min(DLQPage, limit-len(out))
		}
		page, err := list(f)
		if err != nil {
			return nil, err
		}
		out = append(out, page...)
		if len(page) < f.Limit || (limit > 0 && len(out) == limit) {
			return out, nil
		}
		f.After = id(page[len(page)-1])
	}
}

// DLQPage is how many entries a bulk operation reads at a time: as many
// as the API lists at once.
const DLQPage = MaxPageLimit

// PruneOptions select what a prune by hand removes.
type PruneOptions struct {
	// OlderThan selects the runs that ended longer ago than it, whatever
	// retention says.
	OlderThan time.Duration
	// Chain and Status narrow the runs to one chain and one outcome.
	Chain  string
	Status store.RunStatus
	// DryRun removes nothing and lists what it would remove.
	DryRun bool
}

// PruneResult says what a prune removed, or would remove, and what it
// kept that it would have removed but for a reason that still holds.
type PruneResult struct {
	// Runs counts the runs removed, by status.
	Runs map[string]int `json:"runs"`
	// IDs lists them, up to the first 1,000.
	IDs         []string `json:"ids"`
	DeadLetters int      `json:"dead_letters"`
	// Freed is what the store gave back: records (the embedded store's
	// records, Redis's keys) and bytes.
	Freed  Freed     `json:"freed"`
	Kept   PruneKept `json:"kept"`
	DryRun bool      `json:"dry_run,omitempty"`
	// OldestKept is when the oldest run kept ended.
	OldestKept time.Time `json:"oldest_kept,omitzero"`
}

// Freed is what deleting took out of the store.
type Freed struct {
	Records int   `json:"records"`
	Bytes   int64 `json:"bytes"`
}

// PruneKept counts the runs past their time that were kept, by reason.
type PruneKept struct {
	DeadLetter int `json:"dead_letter"`
	Key        int `json:"idempotency_key"`
	Parent     int `json:"parent"`
}

// ScheduleInfo is a schedule as GET /v1/schedules and gateway schedules
// list show it: what it starts, its next ticks, and its latest one's run.
type ScheduleInfo struct {
	Name     string      `json:"name"`
	Chain    string      `json:"chain"`
	Cron     string      `json:"cron,omitempty"`
	Every    string      `json:"every,omitempty"`
	Timezone string      `json:"timezone"`
	CatchUp  bool        `json:"catch_up"`
	Next     []time.Time `json:"next"`
	// LastTick is the latest tick at or before now, and LastRun the run it
	// started, if it started one.
	LastTick time.Time `json:"last_tick,omitzero"`
	LastRun  string    `json:"last_run,omitempty"`
}

// ReadRunView reads a run and its step records from st, those of split
// items too with items.
func ReadRunView(ctx context.Context, st store.Store, id string, items bool) (*RunView, error) {
	run, err := st.Run(ctx, id)
	if err != nil {
		return nil, err
	}
	v := &RunView{Run: RunOf(run), Steps: map[string]*Step{}, DistributedSplits: []string{}}
	err = st.ForEachStep(ctx, id, store.StepScan{SkipItems: !items}, func(rec *store.StepRecord) error {
		v.Steps[rec.Key] = StepOf(rec)
		if DistributedSplit(rec) {
			v.DistributedSplits = append(v.DistributedSplits, rec.Key)
		}
		return nil
	})
	return v, err
}
