package fanout

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/internal/jsonx"
	"github.com/chaingate/gateway/internal/testutil/redistest"
)

// testBarrier is a hand-off of run r1's split "loop" in the test Redis,
// under a prefix of its own.
func testBarrier(tb testing.TB, name string) (*goredis.Client, *barrier) {
	tb.Helper()
	prefix := "cgtest:" + name + ":" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
	u := redistest.OpenPrefix(tb, prefix)
	opts, err := goredis.ParseURL(strings.Split(u, "?")[0])
	if err != nil {
		tb.Fatal(err)
	}
	rdb := goredis.NewClient(opts)
	tb.Cleanup(func() { _ = rdb.Close() })
	return rdb, newBarrier(rdb, prefix, ref{Run: "r1", Split: "loop", Gen: 1})
}

// TestClaims runs the claim protocol against Redis: a live claim holds an
// item against another worker, the holder renews it, a lapsed one is taken
// over with a higher fence, and from then on the old holder can neither
// renew it nor write the item's records or result.
func TestClaims(t *testing.T) {
	ctx := context.Background()
	rdb, b := testBarrier(t, "claims")
	ws := &engine.WorkSplit{Key: "loop", Step: "loop", Total: 3}
	if state, _, _, err := b.init(ctx, ws, 0, false, time.Hour, 0, false, false); err != nil || state != "open" {
		t.Fatalf("init: %q %v", state, err)
	}
	const ttl = 300 * time.Millisecond

	_, mine, err := b.claim(ctx, "w1", ttl, true, []int{0, 1})
	if err != nil || len(mine) != 2 || mine[0].held || mine[0].claim == "" {
		t.Fatalf("w1 claims 0 and 1: %+v %v", mine, err)
	}
	w1 := map[int]string{0: mine[0].claim, 1: mine[1].claim}
	_, other, err := b.claim(ctx, "w2", ttl, true, []int{0, 1, 2})
	if err != nil || !other[0].held || !other[1].held || other[2].held || other[0].claim != "w1" {
		t.Fatalf("w2 while w1's claims are live: %+v %v", other, err)
	}
	// Renewed past the first ttl, w1's claims still hold.
	for range 3 {
		time.Sleep(ttl / 2)
		if lost, err := b.renew(ctx, ttl, w1); err != nil || len(lost) != 0 {
			t.Fatalf("w1 renews: lost %v, %v", lost, err)
		}
	}
	if _, other, _ = b.claim(ctx, "w2", ttl, true, []int{0}); !other[0].held {
		t.Fatalf("w2 took item 0 over while w1 renewed its claim: %+v", other)
	}
	// w1 stops renewing: its claims lapse and w2 takes item 0 over.
	time.Sleep(ttl + 100*time.Millisecond)
	_, other, err = b.claim(ctx, "w2", ttl, true, []int{0})
	if err != nil || other[0].held || other[0].claim == "" {
		t.Fatalf("w2 after w1's claim lapsed: %+v %v", other, err)
	}
	fence := func(c string) int { n, _ := strconv.Atoi(c[strings.LastIndexByte(c, '|')+1:]); return n }
	if fence(other[0].claim) <= fence(w1[0]) {
		t.Errorf("the takeover's fence %s is not above %s", other[0].claim, w1[0])
	}
	if lost, err := b.renew(ctx, ttl, w1); err != nil || !slices.Contains(lost, 0) || slices.Contains(lost, 1) {
		t.Errorf("w1 renews after the takeover: lost %v, %v; want item 0 lost, item 1 still its", lost, err)
	}

	// w1's writes for item 0 are refused; its writes for item 1 go in.
	batch := &store.Batch{Steps: []*store.StepRecord{
		{Key: "loop[0]/first", Name: "first", Status: store.StepSucceeded},
		{Key: "loop[0]", Name: "loop", Status: store.StepSucceeded},
		{Key: "loop[1]", Name: "loop", Status: store.StepSucceeded},
	}}
	state, lost, err := b.commit(ctx, batch, func(i int) string { return w1[i] })
	if err != nil || state != "open" || !slices.Equal(lost, []int{0}) {
		t.Fatalf("w1 commits after losing item 0: %q lost %v %v", state, lost, err)
	}
	_, rows, _ := b.claim(ctx, "w3", ttl, false, []int{0, 1})
	if rows[0].done || len(rows[0].records) != 0 || !rows[1].done {
		t.Errorf("after w1's commit: item 0 %+v (want not done, no records), item 1 done %v", rows[0], rows[1].done)
	}
	// w2, which holds item 0, records it.
	state, lost, err = b.commit(ctx, &store.Batch{Steps: []*store.StepRecord{{Key: "loop[0]", Name: "loop", Status: store.StepSucceeded}}}, func(int) string { return other[0].claim })
	if err != nil || len(lost) != 0 || state != "open" {
		t.Fatalf("w2 commits item 0: %q lost %v %v", state, lost, err)
	}
	if left, _ := rdb.HKeys(ctx, b.k.claims).Result(); !slices.Equal(left, []string{"2"}) {
		t.Errorf("claims left: %v, want only item 2's (claimed by w2, not done)", left)
	}
}

// TestHeldClaims: no item of a held hand-off is claimed until its
// release, which tells workers; a hand-off taken up again unheld, by a
// resumed run, is released with it.
func TestHeldClaims(t *testing.T) {
	ctx := context.Background()
	rdb, b := testBarrier(t, "held")
	ws := &engine.WorkSplit{Key: "loop", Step: "loop", Total: 2}
	if _, _, _, err := b.init(ctx, ws, 0, false, time.Hour, 1, true, true); err != nil {
		t.Fatal(err)
	}
	state, claims, err := b.claim(ctx, "w1", time.Minute, true, []int{0, 1})
	if err != nil || state != stateHeld || len(claims) != 0 {
		t.Fatalf("claim while held: %q %+v %v", state, claims, err)
	}
	if n, err := rdb.HLen(ctx, b.k.claims).Result(); err != nil || n != 0 {
		t.Fatalf("%d claims while held, %v", n, err)
	}
	if state, _, err := b.claim(ctx, "w1", time.Minute, false, []int{0}); err != nil || state != "open" {
		t.Errorf("reading while held: %q %v; want the state itself", state, err)
	}
	sub := rdb.Subscribe(ctx, b.channel)
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.release(ctx); err != nil {
		t.Fatal(err)
	}
	msg, err := sub.ReceiveMessage(ctx)
	if err != nil || msg.Payload != b.notice()+" open" {
		t.Fatalf("release notice %v, %v; want %q", msg, err, b.notice()+" open")
	}
	if state, _, err := b.claim(ctx, "w1", time.Minute, true, []int{0, 1}); err != nil || state != "open" {
		t.Fatalf("claim once released: %q %v", state, err)
	}
	if n, _ := rdb.HLen(ctx, b.k.claims).Result(); n != 2 {
		t.Errorf("%d items claimed once released, want 2", n)
	}

	// Held again by a decision that never became durable, then taken up
	// by a resumed run: released.
	if _, err := rdb.HSet(ctx, b.k.meta, "held", 1).Result(); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := b.init(ctx, ws, 0, false, time.Hour, 1, false, false); err != nil {
		t.Fatal(err)
	}
	if held, _ := rdb.HExists(ctx, b.k.meta, "held").Result(); held {
		t.Error("a hand-off taken up unheld is still held")
	}
}

// TestInitReplacesAnUndecidedHandOff creates a hand-off as a run does
// before its decision is durable: what a decision that never became
// durable left is replaced, unless a gateway with a later lease on the run
// created it, and a hand-off taken up after a restart is kept as it is.
func TestInitReplacesAnUndecidedHandOff(t *testing.T) {
	ctx := context.Background()
	_, b := testBarrier(t, "init")
	ws := func(prev string) *engine.WorkSplit {
		return &engine.WorkSplit{Key: "loop", Step: "loop", Total: 3, Prev: prev}
	}
	steps := []struct {
		name      string
		prev      string
		fence     uint64
		replace   bool
		state     string
		published int
		created   bool
		// ctx is the Prev the hand-off's context holds afterwards.
		ctx string
	}{
		{"a decision creates it", "first", 5, true, "open", 0, true, "first"},
		{"taken up after a restart, it is kept", "second", 5, false, "open", 2, false, "first"},
		{"a gateway that lost the run leaves it", "stale", 4, true, stateSuperseded, 0, false, "first"},
		{"a decision made again replaces it", "again", 6, true, "open", 0, true, "again"},
	}
	for i, st := range steps {
		state, published, created, err := b.init(ctx, ws(st.prev), 0, false, time.Hour, st.fence, st.replace, st.replace)
		if err != nil || state != st.state || published != st.published || created != st.created {
			t.Fatalf("%s: init gave %q, %d published, created %v, %v", st.name, state, published, created, err)
		}
		got, err := b.work(ctx)
		if err != nil || got == nil || got.Prev != st.ctx {
			t.Fatalf("%s: the context is %+v, %v; want the one from %q", st.name, got, err, st.ctx)
		}
		if i == 0 {
			// What the first decision's workers would have left, had it
			// been released.
			if err := b.setPublished(ctx, 2); err != nil {
				t.Fatal(err)
			}
			if err := b.release(ctx); err != nil {
				t.Fatal(err)
			}
			if _, _, err := b.claim(ctx, "w1", time.Hour, true, []int{0}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := b.release(ctx); err != nil {
		t.Fatal(err)
	}
	_, got, err := b.claim(ctx, "w2", time.Hour, true, []int{0})
	if err != nil || len(got) != 1 || got[0].held {
		t.Errorf("a claim of the replaced hand-off still holds its item: %+v %v", got, err)
	}
}

// TestCompletingCommitSendsTheNews completes splits with one commit each:
// the owner of a small one is sent its news, results in item order, on
// the hand-off's own channel; a split with a log entry the owner has yet
// to take in, or with more items than the news carries, is not.
func TestCompletingCommitSendsTheNews(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		total int
		event bool
		sent  bool
	}{
		{"small", 3, false, true},
		{"with an event to take in", 3, true, false},
		{"more items than the news carries", resultsPage + 1, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb, b := testBarrier(t, "push")
			ws := &engine.WorkSplit{Key: "loop", Step: "loop", Total: tc.total}
			if _, _, _, err := b.init(ctx, ws, tc.total, false, time.Hour, 0, false, false); err != nil {
				t.Fatal(err)
			}
			ps := rdb.Subscribe(ctx, b.newsChannel())
			defer ps.Close()
			if _, err := ps.Receive(ctx); err != nil {
				t.Fatal(err)
			}
			batch := &store.Batch{}
			for i := range tc.total {
				status := store.StepSucceeded
				if i == 1 {
					status = store.StepFailed
				}
				batch.Steps = append(batch.Steps, &store.StepRecord{Key: engine.ItemKey("loop", i, tc.total), Name: "loop", Status: status, Body: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))})
			}
			if tc.event {
				batch.Events = []store.Event{{Type: store.EventStepRetrying, Step: "loop[0]/a"}}
			}
			if state, _, err := b.commit(ctx, batch, func(int) string { return "" }); err != nil || state != "complete" {
				t.Fatalf("commit: %q %v", state, err)
			}
			// Published after the commit, this comes first unless the
			// commit sent news.
			if err := rdb.Publish(ctx, b.newsChannel(), "after").Err(); err != nil {
				t.Fatal(err)
			}
			msg, err := ps.ReceiveMessage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if !tc.sent {
				if msg.Payload != "after" {
					t.Errorf("news sent: %.200s", msg.Payload)
				}
				return
			}
			n, err := b.pushedNews(msg.Payload)
			if err != nil {
				t.Fatalf("%v: %.200s", err, msg.Payload)
			}
			if n.state != "complete" || n.done != 3 || n.succeeded != 2 || n.failed != 1 || len(n.results) != 3 {
				t.Fatalf("news %+v", n)
			}
			for i, r := range n.results {
				if want := fmt.Sprintf(`{"i":%d}`, i); string(r.Body) != want {
					t.Errorf("result %d: %s, want %s", i, r.Body, want)
				}
			}
		})
	}
}

// TestBarrierKeepsItemsApart commits items whose bits share bytes and
// straddle them, far apart and twice, with step records on the way: each
// item is done exactly once, its bit is the one the owner reads, and its
// records are there until its result is, then gone.
func TestBarrierKeepsItemsApart(t *testing.T) {
	ctx := context.Background()
	rdb, b := testBarrier(t, "bits")
	const total = 20_000
	ws := &engine.WorkSplit{Key: "loop", Step: "loop", Total: total}
	if _, _, _, err := b.init(ctx, ws, total, false, time.Hour, 0, false, false); err != nil {
		t.Fatal(err)
	}
	items := []int{0, 7, 8, 15, 16, 9_999, 19_999}
	_, mine, err := b.claim(ctx, "w1", time.Minute, true, items)
	if err != nil || len(mine) != len(items) {
		t.Fatalf("claim: %+v %v", mine, err)
	}
	claims := map[int]string{}
	for _, c := range mine {
		claims[c.index] = c.claim
	}
	claimOf := func(i int) string { return claims[i] }

	// Claimed again with an item it does not hold yet (a redelivery to the
	// same worker, say), w1 keeps its claims and fences and gets a new one
	// for the new item only.
	_, again, err := b.claim(ctx, "w1", time.Minute, true, []int{7, 1, 8})
	if err != nil || len(again) != 3 {
		t.Fatalf("claiming again: %+v %v", again, err)
	}
	if again[0].claim != claims[7] || again[2].claim != claims[8] || again[1].claim == claims[7] || again[1].claim == "" {
		t.Errorf("claims again: %+v; want items 7 and 8 to keep %q, item 1 a new one", again, claims[7])
	}
	if again[0].index != 7 || again[1].index != 1 || again[2].index != 8 {
		t.Errorf("rows out of the order asked: %+v", again)
	}
	if _, err := b.renew(ctx, 0, map[int]string{1: again[1].claim}); err != nil {
		t.Fatal(err)
	}

	// A worker's first message of the split reads the context and claims
	// in one round trip, also when Redis has yet to load the script: it
	// finds its own claims, and another's held.
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	for _, owner := range []string{"w1", "w2"} {
		work, state, got, err := b.workAndClaim(ctx, owner, time.Minute, []int{7, 2})
		if err != nil || work == nil || work.Total != total || state != "open" || len(got) != 2 {
			t.Fatalf("%s reads and claims: %+v %q %+v %v", owner, work, state, got, err)
		}
		switch {
		case owner == "w1":
			if got[0].claim != claims[7] || got[1].held || got[1].claim == "" {
				t.Errorf("w1 reads and claims: %+v", got)
			}
			claims[2] = got[1].claim
		case !got[0].held || !got[1].held:
			t.Errorf("w2 reads and claims what w1 holds: %+v", got)
		}
	}
	if _, err := b.renew(ctx, 0, map[int]string{2: claims[2]}); err != nil {
		t.Fatal(err)
	}

	// Records first: items 7 and 9,999 are part way through.
	recs := &store.Batch{Steps: []*store.StepRecord{
		{Key: "loop[7]/first", Name: "first", Status: store.StepSucceeded},
		{Key: "loop[7]/second", Name: "second", Status: store.StepFailed},
		{Key: "loop[9999]/first", Name: "first", Status: store.StepSucceeded},
	}}
	if _, lost, err := b.commit(ctx, recs, claimOf); err != nil || len(lost) != 0 {
		t.Fatalf("committing records: lost %v, %v", lost, err)
	}
	_, rows, err := b.claim(ctx, "w1", time.Minute, false, []int{7, 8, 9_999})
	if err != nil {
		t.Fatal(err)
	}
	if got := []int{len(rows[0].records), len(rows[1].records), len(rows[2].records)}; !slices.Equal(got, []int{2, 0, 1}) {
		t.Fatalf("records per item 7, 8, 9999: %v, want [2 0 1]", got)
	}
	keys, _, err := b.itemRecords(ctx, 7, "loop[7]/")
	if err != nil || !slices.Equal(keys, []string{"loop[7]/first", "loop[7]/second"}) {
		t.Fatalf("item 7's records: %v %v", keys, err)
	}

	// Results, one item twice: it counts once.
	slot := func(i int, st store.StepStatus) *store.StepRecord {
		return &store.StepRecord{Key: engine.ItemKey("loop", i, total), Name: "loop", Status: st}
	}
	var res store.Batch
	for _, i := range items {
		res.Steps = append(res.Steps, slot(i, store.StepSucceeded))
	}
	res.Steps = append(res.Steps, slot(8, store.StepFailed))
	if state, lost, err := b.commit(ctx, &res, claimOf); err != nil || state != "open" || len(lost) != 0 {
		t.Fatalf("committing results: %q lost %v, %v", state, lost, err)
	}
	bits, err := b.doneBits(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range total {
		if got, want := bitSet(bits, i), slices.Contains(items, i); got != want {
			t.Fatalf("item %d's bit is set: %v, want %v", i, got, want)
		}
	}
	meta, _ := rdb.HMGet(ctx, b.k.meta, "done", "succeeded", "failed").Result()
	if fmt.Sprint(meta) != fmt.Sprintf("[%d %d 0]", len(items), len(items)) {
		t.Errorf("done, succeeded, failed: %v", meta)
	}
	for _, k := range []string{b.k.partial, b.k.recs, b.k.claims} {
		if n, _ := rdb.HLen(ctx, k).Result(); n != 0 {
			t.Errorf("%s holds %d fields once every item it named is done", k, n)
		}
	}
	got, err := b.results(ctx, 0, total)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range got {
		if (r != nil) != slices.Contains(items, i) || (r != nil && r.Status != store.StepSucceeded) {
			t.Fatalf("result %d: %+v", i, r)
		}
	}
	if err := b.remove(ctx); err != nil {
		t.Fatal(err)
	}
	if n, _ := rdb.Exists(ctx, b.k.all()...).Result(); n != 0 {
		t.Errorf("%d keys left after remove", n)
	}
}

// TestEncodeResult keeps the hand-written result codec byte for byte and
// value for value what the general one does.
func TestEncodeResult(t *testing.T) {
	tests := []*store.StepRecord{
		{Status: store.StepSucceeded, Body: json.RawMessage(`{"i": {"name": "<host>", "ok": true}}`)},
		{Status: store.StepSucceeded, Body: json.RawMessage(`"a \u0026 b"`)},
		{Status: store.StepSkipped},
		{Status: store.StepFailed, Error: &store.ErrorInfo{Message: "x < y", Code: "bad"}},
		{Status: store.StepStatus("odd \"one\""), Body: json.RawMessage(`1`)},
	}
	for _, rec := range tests {
		want, err := jsonx.Marshal(result{Status: rec.Status, Body: rec.Body, Error: rec.Error})
		if err != nil {
			t.Fatal(err)
		}
		got, err := encodeResult(rec)
		if err != nil || string(got) != string(want) {
			t.Errorf("encodeResult(%+v) = %s, %v; want %s", rec, got, err, want)
		}
		back, err := decodeResult(string(got))
		if err != nil {
			t.Fatalf("decodeResult(%s): %v", got, err)
		}
		var slow result
		if err := jsonx.Unmarshal(got, &slow); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(back, &slow) {
			t.Errorf("decodeResult(%s) = %+v, want %+v", got, back, &slow)
		}
	}
	if _, err := encodeResult(&store.StepRecord{Status: store.StepSucceeded, Body: json.RawMessage(`{"a":`)}); err == nil {
		t.Error("a body that is not JSON was encoded")
	}
	// Shapes only the decoder's slow path reads, or refuses.
	for in, want := range map[string]*result{
		`{"s":"failed","b":{"a":1},"e":{"message":"x"}}`: {Status: store.StepFailed, Body: json.RawMessage(`{"a":1}`), Error: &store.ErrorInfo{Message: "x"}},
		`{"b":2,"s":"succeeded"}`:                        {Status: store.StepSucceeded, Body: json.RawMessage(`2`)},
		`{"s":"succeeded","b":[1,}`:                      nil,
		`{"s":"succeeded"`:                               nil,
	} {
		got, err := decodeResult(in)
		if (err != nil) != (want == nil) || (want != nil && !reflect.DeepEqual(got, want)) {
			t.Errorf("decodeResult(%s) = %+v, %v; want %+v", in, got, err, want)
		}
	}
}

func TestBatchSize(t *testing.T) {
	tests := []struct{ total, batch, limit, want int }{
		{10, 500, 20_000, 100},              // one message of the ten
		{1000, 500, 20_000, 100},            // ten messages, of the smallest size
		{10_000, 500, 20_000, 313},          // 32 messages
		{100_000, 500, 20_000, 500},         // batch_size bounds it
		{100_000, 50, 20_000, 50},           // a smaller batch_size too
		{100_000, 500, 200, 200},            // and max_in_flight
		{1_000_000, 10_000, 20_000, 10_000}, // however large the split
		{0, 500, 20_000, 100},
	}
	for _, tc := range tests {
		if got := batchSize(tc.total, tc.batch, tc.limit); got != tc.want {
			t.Errorf("batchSize(%d, %d, %d) = %d, want %d", tc.total, tc.batch, tc.limit, got, tc.want)
		}
	}
}

// BenchmarkBarrier claims and commits messages of 500 items, eight of
// them in flight, as a worker does, and reports the Redis server's CPU per
// item beside the rate.
func BenchmarkBarrier(b *testing.B) {
	ctx := context.Background()
	rdb, br := testBarrier(b, "bench")
	const size, ahead = 500, 8
	total := (b.N + ahead) * size
	ws := &engine.WorkSplit{Key: "loop", Step: "loop", Total: total}
	if _, _, _, err := br.init(ctx, ws, 0, false, time.Hour, 0, false, false); err != nil {
		b.Fatal(err)
	}
	body := json.RawMessage(`{"i":{"name":"host-0000001","status":"up","zone":"eu-west-1a"}}`)
	claims := make(map[int]string, (ahead+1)*size)
	claimMessage := func(n int) {
		indexes := make([]int, size)
		for j := range indexes {
			indexes[j] = n*size + j
		}
		_, got, err := br.claim(ctx, "w1", time.Minute, true, indexes)
		if err != nil {
			b.Fatal(err)
		}
		for _, c := range got {
			claims[c.index] = c.claim
		}
	}
	for n := range ahead {
		claimMessage(n)
	}
	cpu0 := redisCPU(b, rdb)
	b.ResetTimer()
	for n := range b.N {
		claimMessage(n + ahead)
		var batch store.Batch
		for i := n * size; i < (n+1)*size; i++ {
			batch.Steps = append(batch.Steps, &store.StepRecord{Key: engine.ItemKey("loop", i, total), Name: "loop", Status: store.StepSucceeded, Body: body})
		}
		if _, _, err := br.commit(ctx, &batch, func(i int) string { return claims[i] }); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "items/s")
	b.ReportMetric((redisCPU(b, rdb)-cpu0).Seconds()*1e6/float64(b.N*size), "redis-µs/item")
}

// redisCPU is the CPU the Redis server has used, user and system.
func redisCPU(tb testing.TB, rdb *goredis.Client) time.Duration {
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		tb.Fatal(err)
	}
	var sum float64
	for _, line := range strings.Split(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if k == "used_cpu_user" || k == "used_cpu_sys" {
			f, _ := strconv.ParseFloat(v, 64)
			sum += f
		}
	}
	return time.Duration(sum * float64(time.Second))
}

// FuzzDecodeResult holds the hand-written reading of a result to what the
// decoder reads, for any text.
func FuzzDecodeResult(f *testing.F) {
	for _, s := range []string{`{"s":"succeeded","b":{"i":1}}`, `{"s":"skipped"}`, `{"s":"failed","b":1,"e":{"message":"x"}}`, `{"s":"ok","b":"}"}`, `{"s":"ok","b":[1]} `} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := decodeResult(s)
		var want result
		werr := jsonx.Unmarshal([]byte(s), &want)
		if (err == nil) != (werr == nil) {
			t.Fatalf("decodeResult(%q): %v; the decoder: %v", s, err, werr)
		}
		if err == nil && !reflect.DeepEqual(got, &want) {
			t.Fatalf("decodeResult(%q) = %+v; the decoder reads %+v", s, got, &want)
		}
	})
}

// BenchmarkDecodeMessage decodes a message of 500 object items, as a worker
// does each delivery: with encoding/json, and with jsonx, which workers use.
func BenchmarkDecodeMessage(b *testing.B) {
	var m message
	for i := range 500 {
		m.Items = append(m.Items, messageItem{Index: i, Value: json.RawMessage(fmt.Sprintf(`{"name":"host-%07d","status":"up","zone":"eu-west-1a"}`, i))})
	}
	data, err := jsonx.Marshal(m)
	if err != nil {
		b.Fatal(err)
	}
	for name, decode := range map[string]func([]byte, any) error{"encoding-json": json.Unmarshal, "jsonx": jsonx.Unmarshal} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				var out message
				if err := decode(data, &out); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
