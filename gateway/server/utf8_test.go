package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway/api"
)

// utf8Config has a trigger of each kind, and a chain that asks.
const utf8Config = `
[gateway.auth]
tokens = ["full-tok"]

[[triggers]]
name = "hook"
type = "webhook"
chain = "hello"

[[triggers]]
name = "hook-mapped"
type = "webhook"
chain = "hello"
payload = { who = "<<body.who>>", all = "<<body>>" }

[[triggers]]
name = "am"
type = "alertmanager"
chain = "hello"

[[triggers]]
name = "am-groups"
type = "alertmanager"
chain = "hello"
per = "group"

[[triggers]]
name = "grafana"
type = "grafana"
chain = "hello"

[[triggers]]
name = "paused"
type = "webhook"
chain = "hello"

[[chains]]
name = "ask"
[[chains.steps]]
name = "ask"
approval = { message = "Go?" }
[[chains.steps]]
name = "told"
provider = "echo"
payload_template = "<<steps.ask.body>>"
`

// bad is what breaks strict JSON parsers: bytes that are not UTF-8, and
// escapes of lone surrogates, in values and in keys.
const bad = "a\xff\xfeb \\ud800 c\\udc00"

// TestAnswersAreStrictJSON sends bytes that are not UTF-8, and escapes of
// lone surrogates, through every way in (a run's start, its labels and
// metadata, every kind of trigger, a paused trigger's dead letter, an
// approval's answer, a pause's reason), and finds a run and a dead letter
// holding them already, as an older gateway stored them: every answer the
// API gives about them parses with a strict parser.
func TestAnswersAreStrictJSON(t *testing.T) {
	t.Parallel()
	onEachStore(t, func(t *testing.T, state string) {
		if state == "" {
			t.Parallel()
		}
		env := newAPIOn(t, utf8Config, state)
		env.token = "full-tok"
		doc := `{"who":"` + bad + `","k` + bad + `":1,"id":"ID"}`
		alerts := func(id string) string {
			return `{"version":"4","groupKey":"g-` + id + `","status":"firing","alerts":[{"status":"firing","fingerprint":"` + id + `","startsAt":"2026-11-25T03:12:00Z","labels":{"alertname":"` + bad + `"},"annotations":{"s` + bad + `":"` + bad + `"}}]}`
		}
		strict(t, "a pause's answer", env, "POST", "/v1/pauses/trigger/paused", `{"reason":"`+bad+`"}`, http.StatusCreated)
		var run api.StartResponse
		code, _, raw := env.call("POST", "/v1/chains/hello/runs?label=env%3D%FF%FE&label=k%FF%3Dv", doc, map[string]string{"X-Chaingate-Meta-Note": "n\xff"}, &run)
		if code != http.StatusAccepted {
			t.Fatalf("start: %d %s", code, raw)
		}
		checkStrict(t, "a start's answer", []byte(raw))
		for _, in := range []struct{ path, body string }{
			{"/v1/triggers/hook", doc},
			{"/v1/triggers/hook-mapped", doc},
			{"/v1/triggers/am", alerts("a1")},
			{"/v1/triggers/am-groups", alerts("a2")},
			{"/v1/triggers/grafana", alerts("a3")},
			{"/v1/triggers/paused", doc},
		} {
			strict(t, in.path, env, "POST", in.path, in.body, http.StatusAccepted)
		}
		var asked api.StartResponse
		env.call("POST", "/v1/chains/ask/runs", doc, nil, &asked)
		waitStatus(t, env, asked.ID, "waiting")
		strict(t, "an answer's answer", env, "POST", "/v1/runs/"+asked.ID+"/signals/ask", `{"decision":"approve","comment":"`+bad+`"}`, http.StatusAccepted)
		waitRunEnd(t, env, asked.ID)
		waitRunEnd(t, env, run.ID)
		storedRaw(t, env)

		strict(t, "the pauses", env, "GET", "/v1/pauses", "", http.StatusOK)
		var page api.RunPage
		strict(t, "the runs", env, "GET", "/v1/runs?limit=100", "", http.StatusOK)
		env.call("GET", "/v1/runs?limit=100", "", nil, &page)
		if len(page.Runs) < 8 {
			t.Fatalf("%d runs", len(page.Runs))
		}
		for _, r := range page.Runs {
			strict(t, "run "+r.ID, env, "GET", "/v1/runs/"+r.ID, "", http.StatusOK)
			strict(t, "run "+r.ID+" with its items", env, "GET", "/v1/runs/"+r.ID+"?items=true", "", http.StatusOK)
			strictEvents(t, env, r.ID)
		}
		var dlq struct {
			Entries []api.DLQEntry `json:"entries"`
		}
		strict(t, "the dead letters", env, "GET", "/v1/dlq", "", http.StatusOK)
		env.call("GET", "/v1/dlq", "", nil, &dlq)
		if len(dlq.Entries) != 2 {
			t.Fatalf("%d dead letters", len(dlq.Entries))
		}
		for _, e := range dlq.Entries {
			strict(t, "dead letter "+e.ID, env, "GET", "/v1/dlq/"+e.ID, "", http.StatusOK)
		}
		// What the gateway stores is UTF-8 whatever came in: the run's
		// payload reads back as the replacement character where bytes
		// were not.
		got, err := env.gw.Store.Run(context.Background(), run.ID)
		if err != nil {
			t.Fatal(err)
		}
		if err := strictText(got.Origin.Payload); err != nil || !strings.Contains(string(got.Origin.Payload), "a\uFFFD\uFFFDb") {
			t.Errorf("the stored payload: %v %s", err, got.Origin.Payload)
		}
	})
}

// storedRaw stores a run and a dead letter holding what an older gateway
// kept as it came.
func storedRaw(t *testing.T, env *apiEnv) {
	t.Helper()
	ctx := context.Background()
	raw := json.RawMessage(`{"x":"` + bad + `"}`)
	now := time.Now().UTC()
	run := &store.Run{ID: store.NewID(), Chain: "hello", Status: store.RunSucceeded, Path: []string{}, CreatedAt: now, UpdatedAt: now, FinishedAt: now,
		Origin: store.Origin{ID: "o", Payload: raw, Metadata: raw, ReceivedAt: now}, Body: raw, Seq: 1}
	ev := store.Event{RunID: run.ID, Chain: "hello", Seq: 1, Time: now, Type: store.EventRunSucceeded, Data: raw}
	step := &store.StepRecord{Key: "greet", Name: "greet", Status: store.StepSucceeded, Body: raw, Attempts: 1}
	if err := env.gw.Store.Commit(ctx, &store.Batch{Run: run, Create: true, Events: []store.Event{ev}, Steps: []*store.StepRecord{step}}); err != nil {
		t.Fatal(err)
	}
	if err := env.gw.Store.AddDLQ(ctx, &store.DLQEntry{ID: store.NewID(), Chain: "hello", Step: "greet", RunID: run.ID, Payload: raw, Metadata: raw, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
}

// strict makes a request and checks its answer's status, and that the
// answer parses strictly.
func strict(t *testing.T, what string, env *apiEnv, method, path, body string, want int) {
	t.Helper()
	code, _, raw := env.call(method, path, body, nil, nil)
	if code != want {
		t.Errorf("%s: %d, want %d: %s", what, code, want, raw)
	}
	if err := strictText([]byte(raw)); err != nil {
		t.Errorf("%s: %v: %q", what, err, raw)
	}
}

func checkStrict(t *testing.T, what string, data []byte) {
	t.Helper()
	if err := strictText(data); err != nil {
		t.Errorf("%s: %v: %q", what, err, data)
	}
}

// strictEvents reads a run's event log and checks each event's data.
func strictEvents(t *testing.T, env *apiEnv, id string) {
	t.Helper()
	req, _ := http.NewRequest("GET", env.url+"/v1/runs/"+url.PathEscape(id)+"/events?follow=false", nil)
	req.Header.Set("Authorization", "Bearer "+env.token)
	resp, err := env.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	n := 0
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			n++
			checkStrict(t, fmt.Sprintf("run %s's event %d", id, n), []byte(data))
		}
	}
	if n == 0 {
		t.Errorf("run %s has no events", id)
	}
}

// strictText is what a strict parser says of a JSON text: it must be one
// valid JSON value, in UTF-8, with no escape of a lone surrogate.
func strictText(data []byte) error {
	if !json.Valid(data) {
		return errors.New("not JSON")
	}
	if !utf8.Valid(data) {
		return errors.New("not UTF-8")
	}
	for i := 0; i < len(data); i++ {
		if data[i] != '\\' {
			continue
		}
		i++
		if data[i] != 'u' {
			continue
		}
		var r rune
		fmt.Sscanf(string(data[i+1:i+5]), "%04x", &r)
		i += 4
		switch {
		case r >= 0xdc00 && r < 0xe000:
			return fmt.Errorf("a lone low surrogate at %d", i)
		case r >= 0xd800 && r < 0xdc00:
			var low rune
			if i+6 < len(data) && data[i+1] == '\\' && data[i+2] == 'u' {
				fmt.Sscanf(string(data[i+3:i+7]), "%04x", &low)
			}
			if low < 0xdc00 || low >= 0xe000 {
				return fmt.Errorf("a lone high surrogate at %d", i)
			}
			i += 6
		}
	}
	return nil
}
