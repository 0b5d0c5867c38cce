package loader_test

import (
	"testing"

	"github.com/chaingate/gateway/chain/loader"
)

// TestPathsThatMayResolve loads paths that each have a way to resolve at
// run time: free-form values (a provider's body, labels, a webhook's body,
// an item), defaults with ??, indexes and computed keys. testdata/errors
// holds the paths that cannot.
func TestPathsThatMayResolve(t *testing.T) {
	const chains = `
[[providers]]
name = "p"
type = "echo"

[[chains]]
name = "c"
[[chains.steps]]
name = "check"
provider = "p"
[[chains.steps]]
name = "ask"
approval = { message = "Restart <<steps.check.body.host ?? \"it\">>?", on_reject = "continue" }
[[chains.steps.branches]]
when = 'result.body.decision == "approve" && !result.body.timed_out && (result.body.comment ?? "") != ""'
target = "notify"
[[chains.steps.branches]]
field = "body.decision"
operator = "eq"
value = "reject"
target = "notify"
[[chains.steps]]
name = "notify"
[chains.steps.parallel]
[[chains.steps.parallel.steps]]
name = "slack"
provider = "p"
payload_template = { by = "<<steps.ask.body.by>>", at = "<<steps.ask.body.at ?? null>>", prev = "<<prev.body.anything.below>>" }
[[chains.steps]]
name = "loop"
[chains.steps.split]
items = "<<steps.check.body.hosts>>"
[[chains.steps.split.steps]]
name = "one"
provider = "p"
payload_template = { host = "<<item.host.name>>", i = "<<item_index>>", first = "<<steps.check.body.hosts[0].name>>" }
[[chains.steps]]
name = "report"
provider = "p"
when = 'steps.notify.body.slack.ok ?? true'
payload_template = { ok = "<<steps.notify.body.slack.ok>>", n = "<<steps.loop.body.total>>", r = "<<steps.loop.body.results[0].anything>>", k = "<<secrets.API_KEY ?? \"none\">>", m = "<<origin.metadata.trigger.x>>" }
[[chains.steps.branches]]
when = 'len(steps.loop.body.results) > steps.loop.body.failed && steps.ask?.body?.decision == "approve" && steps["check"].body[origin.payload.key] != nil'
target = "end"
`
	tests := []struct{ name, config string }{
		{"steps", chains},
		{"alertmanager", chains + `
[[triggers]]
name = "am"
type = "alertmanager"
chain = "c"
when = '(alert.labels.team ?? "none") != "db" && any(group.alerts, {.labels.severity == "critical"}) && group.alerts[0].annotations["summary"] != ""'
payload = { sev = "<<alert.labels.severity ?? \"warning\">>", n = "<<group.truncatedAlerts>>", first = "<<group.alerts[0].labels.instance>>" }
resolve_chain = "c"
resolve_payload = { incident = "<<firing_run.steps.check.body.id ?? null>>", decision = "<<firing_run.steps.ask.body.decision ?? \"none\">>", run = "<<firing_run.id ?? null>>", body = "<<firing_run.body.anything>>" }
`},
		{"grafana per group", chains + `
[[triggers]]
name = "grafana"
type = "grafana"
per = "group"
chain = "c"
when = 'group.title != "" && group.alerts[0].values.B > 1 && group.orgId == 1'
`},
		{"webhook", chains + `
[[triggers]]
name = "hook"
type = "webhook"
chain = "c"
when = 'headers.x-github-event == "push" && body.repository.name in ["a", "b"]'
idempotency_key = "<<body.delivery.id ?? headers.x-request-id>>"
payload = { repo = "<<body.repository.full_name>>" }
token = "<<secrets.HOOK_TOKEN>>"
`},
		{"schedule", chains + `
[[schedules]]
name = "leap-day"
chain = "c"
cron = "0 0 29 2 *"
payload = { at = "<<schedule.tick>>", zone = "<<schedule.timezone>>" }
`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := loader.LoadBytes("c.toml", []byte(tc.config), loadOpts); err != nil {
				t.Errorf("%v", err)
			}
		})
	}
}
