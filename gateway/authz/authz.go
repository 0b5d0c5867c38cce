// Package authz decides whether a subject may act on a target. It is the
// one place that decides: the API's routes, the console's actions, Slack's
// interactions and trigger deliveries each say who is asking, for what, on
// what, and act only when Decide says yes.
//
// It is the gateway's own package, with no compatibility promise.
package authz

import (
	"errors"
	"fmt"
)

// Kind is how a subject proved who it is.
type Kind string

const (
	// Token is an API token, full or read-only, presented as a bearer token
	// or at the console's sign-in.
	Token Kind = "token"
	// Trigger is a trigger's own credential: its bearer token or a
	// signature made with its secret.
	Trigger Kind = "trigger"
	// Slack is a Slack user whose request carried the Slack app's
	// signature.
	Slack Kind = "slack"
	// Loopback is a client on this machine of a gateway that has no API
	// tokens: it may do anything, as whoever runs the gateway may.
	Loopback Kind = "loopback"
)

// Subject is who asks.
type Subject struct {
	Kind Kind
	// Name is what a run records the subject's actions under.
	Name string
	// Write is a full API token's: it may change things, not only read.
	Write bool
	// Trigger is the trigger whose credential a Trigger subject proved.
	Trigger string
}

// Action is what a subject asks to do.
type Action string

const (
	Read    Action = "read"    // list and show runs, chains, the DLQ, metrics
	Start   Action = "start"   // start a run of a chain
	Deliver Action = "deliver" // deliver an alert or a webhook to a trigger
	Approve Action = "approve" // answer an approval step
	Cancel  Action = "cancel"  // cancel a run
	Replay  Action = "replay"  // replay a run or a dead-letter entry
	Redrive Action = "redrive" // run a split's failed items again
	Pause   Action = "pause"   // pause or resume a trigger or a schedule
	Delete  Action = "delete"  // delete runs or dead-letter entries, prune
	Backup  Action = "backup"  // take a backup of the store
	Admin   Action = "admin"   // reload the config
)

// Actions lists every action, in the order above.
func Actions() []Action {
	return []Action{Read, Start, Deliver, Approve, Cancel, Replay, Redrive, Pause, Delete, Backup, Admin}
}

// Target is what an action is on: a chain, a run, a trigger, a schedule, a
// dead-letter entry, or the gateway itself.
type Target struct {
	Kind string
	Name string
}

// Target kinds.
const (
	OnGateway  = "gateway"
	OnChain    = "chain"
	OnRun      = "run"
	OnTrigger  = "trigger"
	OnSchedule = "schedule"
	OnDLQ      = "dlq"
)

func (t Target) String() string {
	if t.Name == "" {
		return t.Kind
	}
	return t.Kind + " " + t.Name
}

// ErrDenied marks every *Denied.
var ErrDenied = errors.New("not allowed")

// Denied is a refusal: who asked, for what, on what, and what was missing.
type Denied struct {
	Subject Subject
	Action  Action
	Target  Target
	// Missing says what the subject lacks, in words an operator can act on.
	Missing string
}

func (d *Denied) Error() string {
	return fmt.Sprintf("%s may not %s on %s: %s", d.Subject.Name, d.Action, d.Target, d.Missing)
}

func (d *Denied) Unwrap() error { return ErrDenied }

// Decide answers whether s may do a on t: nil, or a *Denied saying what is
// missing. The rules: a loopback client of a gateway without tokens may do
// anything; a full token anything; a read-only token only read; a
// trigger's credential only deliver to that trigger; a Slack user only
// answer an approval.
func Decide(s Subject, a Action, t Target) error {
	deny := func(missing string) error { return &Denied{Subject: s, Action: a, Target: t, Missing: missing} }
	switch s.Kind {
	case Loopback:
		return nil
	case Token:
		if a == Read || s.Write {
			return nil
		}
		return deny("this token may only read")
	case Trigger:
		if a == Deliver && t.Kind == OnTrigger && t.Name == s.Trigger {
			return nil
		}
		return deny(fmt.Sprintf("trigger %q's credential may only deliver to that trigger", s.Trigger))
	case Slack:
		if a == Approve && t.Kind == OnRun {
			return nil
		}
		return deny("a Slack user may only answer approvals")
	}
	return deny("the subject proved no identity")
}
