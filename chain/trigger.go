package chain

import (
	"github.com/chaingate/gateway/chain/internal/condition"
	"github.com/chaingate/gateway/templates"
)

// TriggerType says what shape of request a trigger takes.
type TriggerType string

const (
	// TriggerAlertmanager takes Prometheus Alertmanager's webhook: a group
	// of alerts, each firing or resolved.
	TriggerAlertmanager TriggerType = "alertmanager"
	// TriggerGrafana takes Grafana alerting's webhook, Alertmanager's shape
	// with Grafana's additions.
	TriggerGrafana TriggerType = "grafana"
	// TriggerWebhook takes any JSON body.
	TriggerWebhook TriggerType = "webhook"
)

// Alerts reports whether the trigger takes a group of alerts.
func (t TriggerType) Alerts() bool { return t == TriggerAlertmanager || t == TriggerGrafana }

// TriggerPer says how many runs an alert group starts.
type TriggerPer string

const (
	PerAlert TriggerPer = "alert"
	PerGroup TriggerPer = "group"
)

// Signature schemes a webhook trigger verifies.
const (
	// SignatureHub is X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>.
	SignatureHub = "hub"
	// SignatureChaingate is the webhook provider's X-Chaingate-Timestamp and
	// X-Chaingate-Signature, which also bound a captured request's replay.
	SignatureChaingate = "chaingate"
)

// Trigger is one [[triggers]] entry: an inbound request that starts a
// chain, served at POST /v1/triggers/{name}.
type Trigger struct {
	Name  string
	Type  TriggerType
	Chain string
	// ResolveChain runs when an alert the trigger started a run for is
	// resolved; empty when resolved alerts start nothing.
	ResolveChain string
	Per          TriggerPer
	// When selects the alerts (or bodies) that start a run.
	When *condition.Expr
	// Payload maps the request to the run's payload; nil passes the alert
	// (the group, the body) as it came.
	Payload *templates.Template
	// Labels maps the request to the run's labels, a table of strings;
	// nil gives an alert's own labels (a group's common labels), and a
	// webhook's runs none.
	Labels *templates.Template
	// ResolvePayload maps a resolved alert to the resolve chain's payload;
	// nil passes the alert with the firing run.
	ResolvePayload *templates.Template
	// IdempotencyKey, for a webhook, names what makes two requests the
	// same; nil uses the Idempotency-Key header.
	IdempotencyKey *templates.Template
	// Token and Secret are templates that read secrets: the bearer token
	// the trigger takes, and the HMAC key its signature uses.
	Token     *templates.Template
	Secret    *templates.Template
	Signature string
	// MaxAlerts bounds the alerts one delivery turns into runs; those
	// beyond it are parked in the dead-letter queue.
	MaxAlerts int
	// Retention is what the trigger's retention table sets for its runs;
	// nil without one.
	Retention *RetentionOverride
	Source    Source
}

// DefaultMaxAlerts is how many alerts of one delivery an alert trigger
// turns into runs when max_alerts is not set.
const DefaultMaxAlerts = 1000

// TriggerRoots are the names a trigger's templates and condition read.
func (t *Trigger) TriggerRoots() []string {
	switch {
	case !t.Type.Alerts():
		return []string{"body", "headers"}
	case t.Per == PerGroup:
		return []string{"group"}
	}
	return []string{"alert", "group"}
}
