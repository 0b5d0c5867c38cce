package chain

import "github.com/chaingate/gateway/templates"

// OnBusy is what a run (or a step) does when its concurrency key's slots
// are all held.
type OnBusy string

const (
	// OnBusyQueue waits in the key's durable FIFO queue.
	OnBusyQueue OnBusy = "queue"
	// OnBusySkip ends the run skipped (a step: skips it).
	OnBusySkip OnBusy = "skip"
	// OnBusyCancel cancels the runs holding the key and takes it once
	// they have ended.
	OnBusyCancel OnBusy = "cancel"
)

// Defaults of a concurrency table.
const (
	DefaultConcurrencyLimit        = 1
	DefaultConcurrencyQueueLimit   = 100
	DefaultConcurrencyQueueTimeout = 3600
)

// Concurrency is a chain's or a step's concurrency table: at most Limit
// runs (or steps) holding one rendered Key at once, across every gateway
// sharing the store.
type Concurrency struct {
	// Key renders the key from the run's input (a step's from its scope,
	// item included inside a split); it must render to a non-empty
	// string or number.
	Key    *templates.Template
	Limit  int
	OnBusy OnBusy
	// QueueLimit bounds the runs waiting for one key; a run that finds
	// it full ends skipped.
	QueueLimit int
	// QueueTimeoutSeconds bounds how long a run waits in the queue; it
	// then ends failed, code "queue_timeout".
	QueueTimeoutSeconds int
	Source              Source
}
