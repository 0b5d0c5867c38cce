package api

import "time"

// TriggerResponse is the answer to POST /v1/triggers/{name}: what each
// alert (or the group, or the body) did.
type TriggerResponse struct {
	Trigger string          `json:"trigger"`
	Results []TriggerResult `json:"results"`
	// TruncatedAlerts counts the alerts beyond the trigger's max_alerts,
	// parked in the dead-letter queue rather than turned into runs.
	TruncatedAlerts int `json:"truncated_alerts,omitempty"`
}

// TriggerResult is what one alert, group or body did.
type TriggerResult struct {
	// Action is started, replayed (a run it started before, or the open
	// run of its group, which notes it), skipped, resolved (a resolution
	// that started no run, but applied on_resolve to the run its firing
	// started), parked (kept in the dead-letter queue: no run could be
	// started), queued (kept, and started after the answer) or failed
	// (nothing kept: send it again).
	Action string `json:"action"`
	Run    string `json:"run,omitempty"`
	Chain  string `json:"chain,omitempty"`
	Status string `json:"status,omitempty"`
	// Alert is the alert's fingerprint, for alert triggers.
	Alert string `json:"alert,omitempty"`
	// Group is the alert group's key, for triggers with per = "group".
	Group string `json:"group,omitempty"`
	// AlertStatus is firing or resolved.
	AlertStatus string `json:"alert_status,omitempty"`
	// FiringRun is the run a resolved alert's firing started.
	FiringRun string `json:"firing_run,omitempty"`
	// OnResolve is what a resolution did to the approval steps the run its
	// firing started waits at.
	OnResolve []ResolvedStep `json:"on_resolve,omitempty"`
	// DeadLetter is the dead-letter entry a parked delivery is kept in.
	DeadLetter string `json:"dead_letter,omitempty"`
	Reason     string `json:"reason,omitempty"`
}

// ResolvedStep is what a resolution did to one waiting approval step.
type ResolvedStep struct {
	Run  string `json:"run"`
	Step string `json:"step"`
	// OnResolve is the step's on_resolve: cancel, approve or reject.
	OnResolve string `json:"on_resolve"`
	// Outcome is cancelled (the run's cancel is recorded: it ends at once,
	// or, advanced by another gateway, within seconds there), approved,
	// rejected, or failed, with Reason.
	Outcome string `json:"outcome"`
	Reason  string `json:"reason,omitempty"`
}

// What can be paused.
const (
	PauseTrigger  = "trigger"
	PauseSchedule = "schedule"
)

// Pause is a trigger's or schedule's pause: who paused it, when and why.
type Pause struct {
	Kind   string    `json:"kind"`
	Name   string    `json:"name"`
	By     string    `json:"by"`
	At     time.Time `json:"at"`
	Reason string    `json:"reason,omitempty"`
}

// What the door did with one alert, group or body, as metrics name it.
const (
	OutcomeStarted      = "started"
	OutcomeDeduplicated = "deduplicated"
	OutcomeSkipped      = "skipped"
	// OutcomeResolved is a resolution that started no run but applied
	// on_resolve to the run its firing started.
	OutcomeResolved = "resolved"
	OutcomeParked   = "parked"
	OutcomeQueued   = "queued"
	OutcomeFailed   = "failed"
	OutcomeRefused  = "refused"
	// OutcomePaused is a schedule's tick skipped while the schedule is
	// paused (a paused trigger's deliveries are parked).
	OutcomePaused = "paused"
)

// Bounds on a run's labels: what is beyond them is left out.
const (
	MaxLabels         = 64
	MaxLabelKeyBytes  = 128
	MaxLabelValueSize = 1024
)
