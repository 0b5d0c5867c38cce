package approvals

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/loader"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/memory"
	"github.com/chaingate/gateway/gateway"
)

// readCounter counts the reads of runs a store is asked for.
type readCounter struct {
	store.Store
	headers, lists atomic.Int64
}

func (c *readCounter) RunHeader(ctx context.Context, id string) (*store.Run, error) {
	c.headers.Add(1)
	return c.Store.RunHeader(ctx, id)
}

func (c *readCounter) Run(ctx context.Context, id string) (*store.Run, error) {
	c.headers.Add(1)
	return c.Store.Run(ctx, id)
}

func (c *readCounter) ListRuns(ctx context.Context, f store.RunFilter) (store.RunPage, error) {
	c.lists.Add(1)
	return c.Store.ListRuns(ctx, f)
}

// TestResyncReadsOnlyWhatWaits: over a store of thousands of runs that
// ended, the approval loop's resync reads no run at all; with one run
// waiting, it reads that one.
func TestResyncReadsOnlyWhatWaits(t *testing.T) {
	ctx := context.Background()
	mem := memory.New()
	ended := time.Now().Add(-time.Hour)
	for range 3000 {
		run := &store.Run{ID: store.NewID(), Chain: "ask", ChainHash: "h", Status: store.RunRunning, CreatedAt: ended, UpdatedAt: ended,
			Origin: store.Origin{ID: "o", Payload: json.RawMessage(`{}`), ReceivedAt: ended}, Seq: 1}
		if err := mem.Commit(ctx, &store.Batch{Run: run, Create: true, Events: []store.Event{{Seq: 1, Time: ended, Type: store.EventRunStarted}}}); err != nil {
			t.Fatal(err)
		}
		run.Status, run.FinishedAt, run.Seq = store.RunSucceeded, ended, 2
		if err := mem.Commit(ctx, &store.Batch{Run: run, Events: []store.Event{{Seq: 2, Time: ended, Type: store.EventRunSucceeded}}}); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := loader.LoadBytes("gateway.toml", []byte(`
[[chains]]
name = "ask"
[[chains.steps]]
name = "ok"
approval = { message = "ok?" }
`), loader.Options{})
	if err != nil {
		t.Fatal(err)
	}
	counter := &readCounter{Store: mem}
	gw, err := gateway.Open(ctx, gateway.Options{Config: cfg, Store: counter, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	l := &approvalLoop{gw: New(gw), ctx: ctx, clock: gw.Engine.Clock(), waits: map[string]*approvalWait{}, resolving: map[string]bool{}, retry: map[string]*questionRetry{}}
	l.resync()
	if h, n := counter.headers.Load(), counter.lists.Load(); h != 0 || n != 0 {
		t.Errorf("a resync with nothing waiting read %d runs and listed %d times over 3,000 that ended", h, n)
	}

	run, err := gw.Engine.Start(ctx, "ask", engine.Input{})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if r, _ := mem.RunHeader(ctx, run.ID); r != nil && r.Status == store.RunWaiting {
			break
		}
	}
	counter.headers.Store(0)
	l.resync()
	if h := counter.headers.Load(); h != 1 || len(l.waits) != 1 {
		t.Errorf("a resync with one run waiting read %d runs and follows %d waits", h, len(l.waits))
	}
}
