package server_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/gateway/ops"
)

// TestOpsReadsAlike reads what the console reads through Ops, on the
// gateway's own store and through the API, and finds the same: a run's
// header without its payload, one step record (a split item's too), a
// missing one refused, and the dead letters a page at a time.
func TestOpsReadsAlike(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	var run, split api.StartResponse
	env.call("POST", "/v1/chains/hello/runs?wait=20s", `{"who": "ops"}`, nil, &run)
	env.call("POST", "/v1/chains/many/runs?wait=20s", `{"hosts": [{"host": "a"}, {"host": "b"}]}`, nil, &split)
	var failed []string
	for range 3 {
		var done api.StartResponse
		env.call("POST", "/v1/chains/breaks/runs?wait=20s", `{}`, nil, &done)
		failed = append(failed, done.ID)
	}
	for _, id := range append([]string{run.ID, split.ID}, failed...) {
		waitRunEnd(t, env, id)
	}
	ctx := context.Background()
	for name, ops := range map[string]api.Ops{"local": &ops.Local{GW: env.gw}, "client": api.NewClient(env.url, "")} {
		h, err := ops.RunHeader(ctx, run.ID)
		if err != nil || h.ID != run.ID || h.Status != string(store.RunSucceeded) || len(h.Origin.Payload) != 0 {
			t.Errorf("%s: the run's header: %+v, %v", name, h, err)
		}
		if _, err := ops.RunHeader(ctx, "no-such-run"); err == nil {
			t.Errorf("%s: a run there is not has a header", name)
		}
		if st, err := ops.Step(ctx, run.ID, "notify/a"); err != nil || st.Key != "notify/a" || st.Status != string(store.StepSucceeded) {
			t.Errorf("%s: a group's sub-step: %+v, %v", name, st, err)
		}
		if st, err := ops.Step(ctx, split.ID, "check[1]"); err != nil || st.Key != "check[1]" || st.Status != string(store.StepSucceeded) {
			t.Errorf("%s: a split's item: %+v, %v", name, st, err)
		}
		_, err = ops.Step(ctx, run.ID, "nothing")
		var ae *api.APIError
		if !errors.Is(err, store.ErrNotFound) && !(errors.As(err, &ae) && ae.Status == http.StatusNotFound) {
			t.Errorf("%s: a step there is not: %v", name, err)
		}

		first, err := ops.ListDLQ(ctx, store.DLQFilter{Chain: "breaks", Limit: 2})
		if err != nil || len(first) != 2 {
			t.Fatalf("%s: the first page of dead letters: %v, %v", name, first, err)
		}
		rest, err := ops.ListDLQ(ctx, store.DLQFilter{Chain: "breaks", Limit: 2, After: first[1].ID})
		if err != nil || len(rest) != 1 || rest[0].ID == first[0].ID || rest[0].ID == first[1].ID {
			t.Errorf("%s: the page after %s: %v, %v", name, first[1].ID, rest, err)
		}
		all, err := api.ListAllDLQ(ctx, ops, store.DLQFilter{Chain: "breaks"})
		if err != nil || len(all) != 3 {
			t.Errorf("%s: every dead letter: %d, %v", name, len(all), err)
		}
	}
}
