package plugins_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"testing"
	"time"

	"github.com/chaingate/gateway/plugins"
	"github.com/chaingate/gateway/providers"
)

// TestProbe calls the action Serve answers itself, through the gateway's
// own path; the conformance check relies on it.
func TestProbe(t *testing.T) {
	m, _ := newManager(t, plugins.Options{})
	p := m.Provider(plugins.Spec{Name: "probed", Builtin: "echo"})
	deadline := time.Now().Add(time.Minute)
	resp, err := p.Execute(context.Background(), providers.Request{
		ActionType: plugins.ProbeAction, Payload: json.RawMessage(`{"pad": "xyz"}`),
		DedupKey: "run-1/a", Attempt: 2, RunID: "run-1", Step: "a", Deadline: deadline,
	})
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(`{"pad": "xyz"}`))
	var reply plugins.ProbeReply
	if err := json.Unmarshal(resp.Body, &reply); err != nil {
		t.Fatalf("reply %s: %v", resp.Body, err)
	}
	want := plugins.ProbeReply{
		ActionType: plugins.ProbeAction, DedupKey: "run-1/a", Attempt: 2, RunID: "run-1", Step: "a",
		Deadline: deadline.UnixNano(), CtxDeadline: deadline.UnixNano(), PayloadBytes: 14,
		PayloadSHA256: hex.EncodeToString(sum[:]),
	}
	if reply != want {
		t.Errorf("reply = %+v\nwant    %+v", reply, want)
	}

	body := mustExecute(t, p, plugins.ProbeAction, `{"body_bytes": 10}`)
	if string(body) != `"xxxxxxxx"` {
		t.Errorf("body_bytes 10 gave %q", body)
	}
	for _, tc := range []struct{ action, payload string }{
		{plugins.ProbeAction, `{"body_bytes": 1}`},
		{plugins.ProbeAction, `"not a probe request"`},
		{"chaingate.unknown", `{}`},
	} {
		_, err := p.Execute(context.Background(), providers.Request{ActionType: tc.action, Payload: json.RawMessage(tc.payload)})
		if pe := providerError(t, err); pe.Retryable {
			t.Errorf("%s %s: retryable %v, want a permanent error", tc.action, tc.payload, pe)
		}
	}
}

func mustExecute(t *testing.T, p providers.Provider, action, payload string) json.RawMessage {
	t.Helper()
	resp, err := p.Execute(context.Background(), providers.Request{ActionType: action, Payload: json.RawMessage(payload)})
	if err != nil {
		t.Fatalf("%s %s: %v", action, payload, err)
	}
	return resp.Body
}
