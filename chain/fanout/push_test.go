package fanout

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/internal/testutil/brokertest"
	"github.com/chaingate/gateway/internal/testutil/redistest"
)

// TestOwnerTakesPushedNews completes a small split with one commit while
// its owner sits idle: the owner tells the run it is complete, and hands
// the join every result, without reading the barrier.
func TestOwnerTakesPushedNews(t *testing.T) {
	amqpURL, prefix := brokertest.Open(t)
	redisURL, _, _ := strings.Cut(redistest.OpenPrefix(t, prefix), "?")
	f, err := Open(context.Background(), Options{Config: &chain.Fanout{RabbitMQURL: amqpURL, RedisURL: redisURL, Prefix: prefix, BatchSize: 500, MaxInFlight: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	const total = 3
	r := ref{Run: "pushed-" + strconv.FormatInt(time.Now().UnixNano(), 36), Split: "loop", Gen: 1}
	var mu sync.Mutex
	var got []engine.FanoutNews
	job := &engine.FanoutJob{Work: &engine.WorkSplit{Run: &store.Run{ID: r.Run}, Key: "loop", Step: "loop", Total: total}, Items: CountItems(total), Gen: 1}
	h := f.Attach(job, func(n *engine.FanoutNews) {
		mu.Lock()
		got = append(got, *n)
		mu.Unlock()
	})
	defer h.End(store.StepSucceeded)
	last := func() engine.FanoutNews {
		mu.Lock()
		defer mu.Unlock()
		if len(got) == 0 {
			return engine.FanoutNews{}
		}
		return got[len(got)-1]
	}
	// Once the owner has told the items are out, it waits for a notice.
	WaitUntil(t, "the items to be out", func() bool { return last().Published == total })
	// The news script, or the join's own read of the results.
	reads := &CommandCounter{Match: func(args []any) bool {
		return len(args) > 1 && (args[1] == newsScript.Hash() || args[0] == "hmget")
	}}
	f.Redis().AddHook(reads)
	batch := &store.Batch{}
	for i := range total {
		batch.Steps = append(batch.Steps, &store.StepRecord{Key: engine.ItemKey("loop", i, total), Name: "loop", Status: store.StepSucceeded, Body: json.RawMessage(strconv.Itoa(i))})
	}
	if _, _, err := newBarrier(f.Redis(), prefix, r).commit(context.Background(), batch, func(int) string { return "" }); err != nil {
		t.Fatal(err)
	}
	WaitUntil(t, "the split to be complete", func() bool { return last().State == engine.FanoutComplete })
	var bodies []string
	if err := h.Results(context.Background(), func(rec *store.StepRecord) error {
		bodies = append(bodies, string(rec.Body))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n := last(); n.Succeeded != total || strings.Join(bodies, ",") != "0,1,2" {
		t.Errorf("news %+v, results %v", n, bodies)
	}
	if n := reads.N.Load(); n != 0 {
		t.Errorf("the owner read the barrier %d times once the news was sent to it", n)
	}
}

// CountItems is a split's items 0 to n-1.
type CountItems int

func (c CountItems) Len() int                          { return int(c) }
func (CountItems) At(i int) any                        { return i }
func (CountItems) JSON(i int) (json.RawMessage, error) { return json.RawMessage(strconv.Itoa(i)), nil }

// WaitUntil waits for cond, failing t after a minute.
func WaitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// CommandCounter is a Redis hook that counts the commands Match picks,
// pipelined or not.
type CommandCounter struct {
	Match func(args []any) bool
	N     atomic.Int64
}

func (h *CommandCounter) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *CommandCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		for _, cmd := range cmds {
			h.count(cmd)
		}
		return next(ctx, cmds)
	}
}

func (h *CommandCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		h.count(cmd)
		return next(ctx, cmd)
	}
}

func (h *CommandCounter) count(cmd goredis.Cmder) {
	if h.Match(cmd.Args()) {
		h.N.Add(1)
	}
}
