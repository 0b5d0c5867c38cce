package host_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"testing"
	"time"

	"github.com/chaingate/gateway/plugins/host"
	"github.com/chaingate/gateway/providers"
)

// TestProbe calls the action Serve answers itself, through the gateway's
// own path; the conformance check relies on it.
func TestProbe(t *testing.T) {
	m, _ := newManager(t, host.Options{})
	p := m.Provider(host.Spec{Name: "probed", Builtin: "echo"})
	deadline := time.Now().Add(time.Minute)
	resp, err := p.Execute(context.Background(), providers.Request{
		ActionType: host.ProbeAction, Payload: json.RawMessage(`{"pad": "xyz"}`),
		DedupKey: "run-1/a", Attempt: 2, RunID: "run-1", Step: "a", Deadline: deadline,
	})
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(`{"pad": "xyz"}`))
	var reply host.ProbeReply
	if err := json.Unmarshal(resp.Body, &reply); err != nil {
		t.Fatalf("reply %s: %v", resp.Body, err)
	}
	want := host.ProbeReply{
		ActionType: host.ProbeAction, DedupKey: "run-1/a", Attempt: 2, RunID: "run-1", Step: "a",
		Deadline: deadline.UnixNano(), CtxDeadline: deadline.UnixNano(), PayloadBytes: 14,
		PayloadSHA256: hex.EncodeToString(sum[:]),
	}
	if reply != want {
		t.Errorf("reply = %+v\nwant    %+v", reply, want)
	}

	body := mustExecute(t, p, host.ProbeAction, `{"body_bytes": 10}`)
	if string(body) != `"xxxxxxxx"` {
		t.Errorf("body_bytes 10 gave %q", body)
	}
	for _, tc := range []struct{ action, payload string }{
		{host.ProbeAction, `{"body_bytes": 1}`},
		{host.ProbeAction, `"not a probe request"`},
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
