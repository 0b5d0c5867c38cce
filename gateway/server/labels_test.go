package server_test

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/chaingate/gateway/gateway/api"
)

// listByLabel lists the runs carrying the labels, as ?label= takes them.
func listByLabel(t *testing.T, env *apiEnv, labels ...string) []string {
	t.Helper()
	q := url.Values{"label": labels}
	var page api.RunPage
	if code, _, raw := env.call("GET", "/v1/runs?"+q.Encode(), "", nil, &page); code != http.StatusOK {
		t.Fatalf("listing by %v: %d %s", labels, code, raw)
	}
	var ids []string
	for _, r := range page.Runs {
		ids = append(ids, r.ID)
	}
	return ids
}

// TestRunLabels: a run started by an alert carries the alert's labels (a
// group's common labels, or what the trigger's labels mapping makes), one
// started through the API the labels it was given, and the runs list finds
// them by any of them.
func TestRunLabels(t *testing.T) {
	t.Setenv("CHAINGATE_SECRET_AM_TOKEN", "am-secret-token")
	t.Setenv("CHAINGATE_SECRET_HOOK_SECRET", "hook-hmac-key")
	env := newAPI(t, triggerConfig+`
[[triggers]]
name = "mapped"
type = "alertmanager"
chain = "page"
labels = { host = "<<alert.labels.instance>>", team = "storage", fingerprint = "<<alert.fingerprint>>" }
payload = { host = "<<alert.labels.instance>>" }
`)
	env.token = "full-tok"
	firing := triggerFixture(t, "alertmanager-firing.json")
	_, res, raw := fire(t, env, "alertmanager", firing, map[string]string{"Authorization": "Bearer am-secret-token"})
	if len(res.Results) != 2 || res.Results[0].Run == "" {
		t.Fatalf("firing: %s", raw)
	}
	alertRun := res.Results[0].Run
	v := waitRunEnd(t, env, alertRun)
	if want := map[string]string{"alertname": "DiskFull", "instance": "db-1:9100", "job": "node", "severity": "critical"}; fmt.Sprint(v.Labels) != fmt.Sprint(want) {
		t.Errorf("an alert's run's labels: %v, want %v", v.Labels, want)
	}

	var group api.TriggerResponse
	env.call("POST", "/v1/triggers/am-groups", firing, nil, &group)
	groupRun := group.Results[0].Run
	if v := waitRunEnd(t, env, groupRun); fmt.Sprint(v.Labels) != fmt.Sprint(map[string]string{"alertname": "DiskFull", "job": "node"}) {
		t.Errorf("a group's run's labels: %v", v.Labels)
	}

	var mapped api.TriggerResponse
	env.call("POST", "/v1/triggers/mapped", firing, nil, &mapped)
	mappedRun := mapped.Results[0].Run
	if v := waitRunEnd(t, env, mappedRun); fmt.Sprint(v.Labels) != fmt.Sprint(map[string]string{"fingerprint": "4c5b3c1a9e2d7f10", "host": "db-1:9100", "team": "storage"}) {
		t.Errorf("a mapped run's labels: %v", v.Labels)
	}

	var started api.StartResponse
	if code, _, raw := env.call("POST", "/v1/chains/page/runs?label=ticket%3DINC-42&label=env%3Dprod", `{"host": "web-1"}`, nil, &started); code != http.StatusAccepted {
		t.Fatalf("starting with labels: %d %s", code, raw)
	}
	if v := waitRunEnd(t, env, started.ID); v.Labels["ticket"] != "INC-42" || v.Labels["env"] != "prod" {
		t.Errorf("an API run's labels: %v", v.Labels)
	}

	for _, tc := range []struct {
		labels []string
		want   []string
	}{
		{[]string{"instance=db-1:9100"}, []string{alertRun}},
		{[]string{"alertname=DiskFull"}, []string{groupRun, alertRun}},
		{[]string{"alertname=DiskFull", "severity=critical"}, []string{alertRun}},
		{[]string{"team", "host=db-1:9100"}, []string{mappedRun}},
		{[]string{"ticket=INC-42"}, []string{started.ID}},
		{[]string{"ticket=INC-43"}, nil},
	} {
		if got := listByLabel(t, env, tc.labels...); strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("runs with %v: %v, want %v", tc.labels, got, tc.want)
		}
	}
	for _, bad := range []string{"/v1/runs?label=%3Dx", "/v1/chains/page/runs?label=nokey"} {
		method := "GET"
		if strings.HasPrefix(bad, "/v1/chains") {
			method = "POST"
		}
		if code, _, raw := env.call(method, bad, `{}`, nil, nil); code != http.StatusBadRequest || !strings.Contains(raw, "KEY=VALUE") {
			t.Errorf("%s %s: %d %s", method, bad, code, raw)
		}
	}
}
