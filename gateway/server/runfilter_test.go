package server_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway/api"
)

// TestListRunsByHowStarted lists runs started by a trigger and through the
// API, through the client, so the filters are seen to reach the store both
// as the client sends them and as the API reads them.
func TestListRunsByHowStarted(t *testing.T) {
	env := newTriggerAPI(t)
	code, res, raw := fire(t, env, "alertmanager", triggerFixture(t, "alertmanager-firing.json"), map[string]string{"Authorization": "Bearer am-secret-token"})
	if code != http.StatusAccepted || res.Results[0].Run == "" {
		t.Fatalf("firing: %d %s", code, raw)
	}
	byTrigger := res.Results[0].Run
	var page, resolved api.StartResponse
	for _, st := range []struct {
		chain string
		out   *api.StartResponse
	}{{"page", &page}, {"resolved", &resolved}} {
		if code, _, body := env.call("POST", "/v1/chains/"+st.chain+"/runs", `{"host": "db-1"}`, nil, st.out); code != http.StatusAccepted {
			t.Fatalf("starting %s: %d %s", st.chain, code, body)
		}
	}
	for _, id := range []string{byTrigger, page.ID, resolved.ID} {
		waitRunEnd(t, env, id)
	}

	client := api.NewClient(env.url, "full-tok")
	tests := []struct {
		name string
		f    store.RunFilter
		want []string
	}{
		{"a kind", store.RunFilter{StartedBy: "trigger"}, []string{byTrigger}},
		{"a trigger by name", store.RunFilter{StartedBy: "trigger:alertmanager"}, []string{byTrigger}},
		{"another trigger", store.RunFilter{StartedBy: "trigger:grafana"}, nil},
		{"no schedule", store.RunFilter{StartedBy: "schedule"}, nil},
		{"the API's", store.RunFilter{StartedBy: "api"}, []string{resolved.ID, page.ID}},
		{"the API's but one chain", store.RunFilter{StartedBy: "api", HideChains: []string{"resolved"}}, []string{page.ID}},
		{"two chains hidden", store.RunFilter{HideChains: []string{"page", "resolved"}}, nil},
		{"one chain hidden", store.RunFilter{HideChains: []string{"resolved"}}, []string{page.ID, byTrigger}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := client.ListRuns(context.Background(), tc.f)
			if err != nil {
				t.Fatal(err)
			}
			var ids, how []string
			for _, r := range got.Runs {
				ids, how = append(ids, r.ID), append(how, r.StartedBy)
			}
			if !slices.Equal(ids, tc.want) {
				t.Errorf("runs %v (started by %v), want %v", ids, how, tc.want)
			}
		})
	}
}

// TestListRunsFilterErrors checks that a filter no run can match is
// refused saying what would be taken.
func TestListRunsFilterErrors(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	tests := []struct {
		query, want string
	}{
		{"started_by=door", `started_by "door" is not one of trigger, schedule, api, cli, replay, sub_chain`},
		{"started_by=Trigger", `started_by "Trigger" is not one of`},
		{"started_by=api:ops", `only trigger and schedule take a name; api runs are listed by "api"`},
		{"started_by=schedule:", `started_by "schedule:" names no schedule: give schedule or schedule:NAME`},
		{"hide_chain=hello,breaks", `hide_chain "hello,breaks" is not a chain name: repeat hide_chain for each chain to hide`},
		{"hide_chain=hello&hide_chain=", "hide_chain is empty"},
	}
	for _, tc := range tests {
		var e apiErr
		code, _, body := env.call("GET", "/v1/runs?"+tc.query, "", nil, &e)
		if code != http.StatusBadRequest || e.Error.Code != "invalid_parameter" || !strings.Contains(e.Error.Message, tc.want) {
			t.Errorf("%s: %d %s, want 400 invalid_parameter saying %s", tc.query, code, body, tc.want)
		}
	}
}
