package gateway

import (
	"strings"
	"sync/atomic"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/store"
)

// An approval step that waits tells people so through its notify call,
// reminds them every notify.remind_every, and escalates once through its
// escalate call, escalate.after it asked. Each call is claimed in the
// store under the step's wait before it is made, so that gateways sharing
// the store make it once between them: a call is made at most once, and a
// gateway dying between the claim and the call loses that one call (a
// reminder follows). The run's events say what was sent, or why not.
//
// The approval loop follows the waits it hears of, as they happen: this
// gateway's runs through their events, other gateways' through the
// store's feed of status changes. Each wait's next call is timed on the
// engine's clock for when it is due, so the notification goes out as the
// step starts waiting and a reminder on the second it is due. A look at
// every waiting run when the loop starts, and every approvalResync, finds
// what it did not hear. When a wait ends, or its run does, the loop has
// the Slack messages that asked it settled (slackquestions.go).

// approvalNewsBuffer is how many runs to look at the loop may be behind
// on; past it, it looks at everything again at its next resync.
const approvalNewsBuffer = 1024

// ApprovalFeed carries what the gateway hears of approval steps to its
// approval loop, while one runs: the runs to look at again.
type ApprovalFeed struct {
	C chan string
	// On is set while a loop takes news; news is dropped otherwise.
	On atomic.Bool
	// Missed says news was dropped: the loop looks at everything again
	// at its next resync.
	Missed atomic.Bool
	// config is the config the engine runs.
	config func() *chain.Config
}

func newApprovalFeed() *ApprovalFeed {
	return &ApprovalFeed{C: make(chan string, approvalNewsBuffer)}
}

// look asks the loop to look at run id again.
func (f *ApprovalFeed) look(id string) {
	if !f.On.Load() {
		return
	}
	select {
	case f.C <- id:
	default:
		f.Missed.Store(true)
	}
}

// heard takes a run event: one that may start or end a wait, or end a
// question, has the loop look at its run.
func (f *ApprovalFeed) heard(ev store.Event) {
	if f.On.Load() && f.Concerns(ev) {
		f.look(ev.RunID)
	}
}

func (f *ApprovalFeed) Concerns(ev store.Event) bool {
	var c *chain.Chain
	if ev.Chain != "" {
		c = f.config().Chains[ev.Chain]
	}
	switch ev.Type {
	case store.EventRunWaiting:
		return true
	case store.EventRunSucceeded, store.EventRunFailed, store.EventRunCancelled, store.EventRunTimedOut, store.EventRunSkipped:
		// A chain the config no longer has may still have asked.
		return c == nil || hasApprovalStep(c)
	case store.EventStepSucceeded, store.EventStepFailed, store.EventStepTimedOut, store.EventStepCancelled, store.EventStepSkipped:
		if c == nil {
			return !strings.ContainsAny(ev.Step, "/[")
		}
		s := c.Step(ev.Step)
		return s != nil && s.Kind == chain.KindApproval
	}
	return false
}

func hasApprovalStep(c *chain.Chain) bool {
	for _, s := range c.Steps {
		if s.Kind == chain.KindApproval {
			return true
		}
	}
	return false
}
