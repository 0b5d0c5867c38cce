package audit

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/memory"
	"github.com/chaingate/gateway/gateway/authz"
)

type failingStore struct{ store.Store }

func (failingStore) AppendAudit(context.Context, *store.AuditEntry) error {
	return errors.New("disk full")
}

// TestRecordLost: an entry the store cannot keep is logged as an error and
// counted, never dropped in silence.
func TestRecordLost(t *testing.T) {
	var logs bytes.Buffer
	l := New(failingStore{memory.New()}, slog.New(slog.NewTextHandler(&logs, nil)))
	lost := 0
	l.Failed = func() { lost++ }
	ctx, _ := WithNote(WithOrigin(context.Background(), Origin{EntryPoint: ViaAPI, Route: "POST /v1/runs/{id}/cancel"}))
	l.Record(ctx, Attempt{Subject: authz.Subject{Kind: authz.Token, Name: "alice"}, Action: authz.Cancel, Target: authz.Target{Kind: authz.OnRun, Name: "r1"}}, store.AuditOK, 202, "")
	if lost != 1 || !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "disk full") || !strings.Contains(logs.String(), "subject=alice") {
		t.Errorf("lost %d; logged:\n%s", lost, logs.String())
	}
}

// TestRecordTakesTheNote: the run an action noted, and its origin, are in
// its entry.
func TestRecordTakesTheNote(t *testing.T) {
	st := memory.New()
	l := New(st, slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)))
	ctx, _ := WithNote(WithOrigin(context.Background(), Origin{EntryPoint: ViaConsole, Route: "POST /ui/chains/{name}/run", Address: "10.0.0.7"}))
	NoteRun(ctx, "run-9")
	NoteDetail(ctx, "started")
	l.Record(ctx, Attempt{Subject: authz.Subject{Kind: authz.Person, Name: "bob", Groups: []string{"sre"}}, Roles: []string{"oncall"}, Action: authz.Start, Target: authz.Target{Kind: authz.OnChain, Name: "deploy"}}, Outcome(303), 303, "")
	var got *store.AuditEntry
	_ = st.WalkAudit(context.Background(), store.AuditScan{}, func(e *store.AuditEntry) (bool, error) { got = e; return false, nil })
	if got == nil || got.Run != "run-9" || got.Detail != "started" || got.Chain != "deploy" || got.EntryPoint != "console" || got.Address != "10.0.0.7" || got.Outcome != store.AuditOK || got.Groups[0] != "sre" {
		t.Errorf("recorded %+v", got)
	}
	if Outcome(403) != store.AuditDenied || Outcome(404) != store.AuditFailed || Outcome(200) != store.AuditOK {
		t.Error("Outcome reads statuses wrongly")
	}
}
