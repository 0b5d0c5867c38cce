// Package authz decides whether a subject may act on a target. It is the
// one place that decides: the API's routes, the console's actions, Slack's
// interactions and trigger deliveries each say who is asking, for what, on
// what, and act only when a Policy's Decide says yes. A Policy is the
// config's [gateway.auth]: roles granting actions on chains, triggers and
// schedules by name pattern, given to tokens, people and sign-in groups.
//
// It is the gateway's own package, with no compatibility promise.
package authz

import (
	"errors"
	"fmt"
	"slices"

	"github.com/chaingate/gateway/chain"
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
	// Person is someone signed in to the console through the OpenID
	// Provider the config names.
	Person Kind = "person"
	// CLI is the user of this machine working straight on a store file,
	// with no gateway between them and it: recorded, not asked.
	CLI Kind = "cli"
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
	// Roles are a token's own roles, from the config.
	Roles []string
	// Groups are a person's groups, as the OpenID Provider says.
	Groups []string
}

// Action is what a subject asks to do: one of chain.Actions.
type Action = chain.Action

// The actions, as the config names them.
const (
	Read    = chain.ActionRead
	Start   = chain.ActionStart
	Deliver = chain.ActionDeliver
	Approve = chain.ActionApprove
	Cancel  = chain.ActionCancel
	Replay  = chain.ActionReplay
	Redrive = chain.ActionRedrive
	Pause   = chain.ActionPause
	Delete  = chain.ActionDelete
	Backup  = chain.ActionBackup
	Admin   = chain.ActionAdmin
)

// Actions lists every action.
func Actions() []Action { return slices.Clone(chain.Actions) }

// Target is what an action is on: a chain, a run, a trigger, a schedule, a
// dead-letter entry, or the gateway itself. A target with no name is every
// one of its kind: listing runs, pruning, replaying dead letters in bulk.
type Target struct {
	Kind string
	Name string
	// Chain is the chain of a run or a dead-letter entry, found by who asks
	// (Server.Authorize reads it from the store); empty when it has none or
	// was not found, which only a grant on every chain covers.
	Chain string
	// Trigger is the trigger of a dead-letter entry that holds a delivery
	// no run was started for.
	Trigger string
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
