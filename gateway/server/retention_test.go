package server_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/gateway/api"
	"golang.org/x/net/html"
)

// TestPruneAndDeleteByHand prunes and deletes runs through the API, on
// both stores: what retention must keep is kept and said, a dry run
// removes nothing, a running run cannot be deleted.
func TestPruneAndDeleteByHand(t *testing.T) {
	t.Parallel()
	onEachStore(t, func(t *testing.T, state string) {
		env := newAPIOn(t, "", state)
		var plain []string
		for range 3 {
			plain = append(plain, startWait(t, env, "hello", `{}`))
		}
		keyed := startKeyedWait(t, env, "hello", "k-1")
		broken := startWait(t, env, "breaks", `{}`)
		var running api.StartResponse
		env.call("POST", "/v1/chains/hello/runs", `{"sleep_ms": 4000}`, nil, &running)
		time.Sleep(1100 * time.Millisecond) // so that the runs ended over a second ago

		var dry api.PruneResult
		code, _, raw := env.call("POST", "/v1/runs/prune", `{"older_than": "1s", "dry_run": true}`, nil, &dry)
		if code != http.StatusOK || !dry.DryRun || dry.Runs["succeeded"] != 3 || len(dry.IDs) != 3 || dry.Kept.DeadLetter != 1 || dry.Kept.Key != 1 {
			t.Fatalf("a dry run: %d %s", code, raw)
		}
		for _, id := range plain {
			if code, _, _ := env.call("GET", "/v1/runs/"+id, "", nil, nil); code != http.StatusOK {
				t.Errorf("a dry run removed run %s: %d", id, code)
			}
		}
		var res api.PruneResult
		code, _, raw = env.call("POST", "/v1/runs/prune", `{"older_than": "1s", "chain": "hello"}`, nil, &res)
		if code != http.StatusOK || res.Runs["succeeded"] != 3 || res.Freed.Records == 0 || res.Kept.Key != 1 {
			t.Fatalf("a prune: %d %s", code, raw)
		}
		for _, id := range plain {
			if code, _, _ := env.call("GET", "/v1/runs/"+id, "", nil, nil); code != http.StatusNotFound {
				t.Errorf("pruned run %s: %d", id, code)
			}
		}
		for _, id := range []string{keyed, broken, running.ID} {
			if code, _, _ := env.call("GET", "/v1/runs/"+id, "", nil, nil); code != http.StatusOK {
				t.Errorf("kept run %s: %d", id, code)
			}
		}
		for _, tc := range []struct{ body, says string }{
			{`{}`, "older_than"},
			{`{"older_than": "soon"}`, "older_than"},
			{`{"older_than": "1h", "status": "running"}`, "not one a run ends with"},
		} {
			if code, _, raw := env.call("POST", "/v1/runs/prune", tc.body, nil, nil); code != http.StatusBadRequest || !strings.Contains(raw, tc.says) {
				t.Errorf("prune %s: %d %s", tc.body, code, raw)
			}
		}

		if code, _, raw := env.call("DELETE", "/v1/runs/"+running.ID, "", nil, nil); code != http.StatusConflict || !strings.Contains(raw, "cancel it first") {
			t.Errorf("deleting a running run: %d %s", code, raw)
		}
		var del api.DeleteResult
		code, _, raw = env.call("DELETE", "/v1/runs/"+broken, "", nil, &del)
		if code != http.StatusOK || len(del.DeadLetters) != 1 || del.Freed.Records == 0 {
			t.Fatalf("deleting a failed run: %d %s", code, raw)
		}
		if code, _, _ := env.call("GET", "/v1/dlq/"+del.DeadLetters[0], "", nil, nil); code != http.StatusNotFound {
			t.Errorf("the deleted run's dead-letter entry: %d", code)
		}
		if code, _, _ := env.call("DELETE", "/v1/runs/"+broken, "", nil, nil); code != http.StatusNotFound {
			t.Errorf("deleting it again: %d", code)
		}
		waitRunEnd(t, env, running.ID)
	})
}

// TestRetentionPrunes serves a config whose succeeded runs are kept a
// second: the gateway prunes them by itself, counts them and says so,
// and keeps a failed run, kept for a month by default.
func TestRetentionPrunes(t *testing.T) {
	t.Parallel()
	onEachStore(t, func(t *testing.T, state string) {
		env := newAPIOn(t, "[gateway.retention]\nsucceeded = \"1s\"\ninterval = \"1s\"\n", state)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go env.srv.Retention().Run(ctx)
		ok := startWait(t, env, "hello", `{}`)
		failed := startWait(t, env, "breaks", `{}`)
		// The run is gone before its batch is counted and logged: wait for
		// all three.
		var pruned, counted, logged bool
		var metrics string
		for deadline := time.Now().Add(30 * time.Second); !(pruned && counted && logged); time.Sleep(50 * time.Millisecond) {
			code, _, _ := env.call("GET", "/v1/runs/"+ok, "", nil, nil)
			pruned = code == http.StatusNotFound
			_, _, metrics = env.call("GET", "/metrics", "", nil, nil)
			counted = strings.Contains(metrics, `chaingate_retention_runs_pruned_total{status="succeeded"} 1`) && strings.Contains(metrics, "chaingate_retention_oldest_kept_timestamp_seconds")
			logged = strings.Contains(env.logs.String(), `"msg":"retention pruned"`)
			if time.Now().After(deadline) {
				t.Fatalf("within 30 s: run pruned %v, counted %v, logged %v; the metrics:\n%s", pruned, counted, logged, grepLines(metrics, "retention"))
			}
		}
		if code, _, _ := env.call("GET", "/v1/runs/"+failed, "", nil, nil); code != http.StatusOK {
			t.Errorf("the failed run: %d", code)
		}
	})
}

// startKeyedWait starts a run under an Idempotency-Key and waits for it.
func startKeyedWait(t *testing.T, env *apiEnv, chainName, key string) string {
	t.Helper()
	var out api.StartResponse
	if code, _, raw := env.call("POST", "/v1/chains/"+chainName+"/runs?wait=20s", `{}`, map[string]string{"Idempotency-Key": key}, &out); code != http.StatusOK {
		t.Fatalf("starting a keyed run: %d %s", code, raw)
	}
	return out.ID
}

// TestConsoleDeletesRun deletes a run that ended from its page, once its
// id is typed; a running run's page offers no Delete.
func TestConsoleDeletesRun(t *testing.T) {
	t.Parallel()
	env := newAPI(t, "")
	id := startWait(t, env, "breaks", `{}`)
	b := newBrowser(t, env)
	code, doc, _ := b.get("/ui/runs/" + id)
	if code != http.StatusOK || find(doc, func(n *html.Node) bool { return attr(n, "id") == "run-delete" }) == nil {
		t.Fatalf("the run's page: %d, with no Delete", code)
	}
	if code, _, _ := b.post("/ui/runs/"+id+"/delete", url.Values{"confirm": {"not-it"}}); code != http.StatusBadRequest {
		t.Errorf("a delete confirmed with another id: %d", code)
	}
	code, loc, _ := b.post("/ui/runs/"+id+"/delete", url.Values{"confirm": {id}})
	if code != http.StatusSeeOther || !strings.HasSuffix(loc, "?done=run-deleted") {
		t.Fatalf("the delete: %d %s", code, loc)
	}
	if code, _, _ := env.call("GET", "/v1/runs/"+id, "", nil, nil); code != http.StatusNotFound {
		t.Errorf("the deleted run: %d", code)
	}
	var running api.StartResponse
	env.call("POST", "/v1/chains/hello/runs", `{"sleep_ms": 3000}`, nil, &running)
	if _, doc, _ := b.get("/ui/runs/" + running.ID); find(doc, func(n *html.Node) bool { return attr(n, "id") == "run-delete" }) != nil {
		t.Error("a running run's page offers Delete")
	}
	waitRunEnd(t, env, running.ID)
}
