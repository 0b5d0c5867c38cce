package server_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/internal/testutil/redistest"
)

// bigSplitConfig is a split over as many items as the payload holds, at
// the default concurrency.
const bigSplitConfig = `
[[chains]]
name = "big"
[[chains.steps]]
name = "check"
[chains.steps.split]
items = "<<origin.payload.hosts>>"
[[chains.steps.split.steps]]
name = "ping"
provider = "echo"
payload_template = { host = "<<item>>" }
`

// BenchmarkConsoleRunPage renders the run page of a run whose split went
// over 100,000 items, and the first page of its items; it reports the
// bytes of each, which do not grow with the item count.
func BenchmarkConsoleRunPage(b *testing.B) {
	env := newAPIOn(b, "", "")
	cfg, err := os.ReadFile(env.cfg)
	if err != nil {
		b.Fatal(err)
	}
	env.write(strings.Replace(string(cfg), "max_request_bytes = 2048", "max_request_bytes = 4194304", 1) + bigSplitConfig)
	if _, err := env.srv.Reload(); err != nil {
		b.Fatal(err)
	}
	hosts := make([]string, 100000)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("%q", fmt.Sprintf("host-%06d", i))
	}
	var res struct {
		ID string `json:"id"`
	}
	code, _, body := env.call("POST", "/v1/chains/big/runs?wait=60s", `{"hosts": [`+strings.Join(hosts, ",")+`]}`, nil, &res)
	if code != http.StatusOK {
		b.Fatalf("run: %d %.300s", code, body)
	}
	for _, page := range []struct{ name, path string }{{"run", "/ui/runs/" + res.ID}, {"items", "/ui/runs/" + res.ID + "/items/check?status=succeeded&offset=50000"}} {
		b.Run(page.name, func(b *testing.B) {
			n := 0
			for b.Loop() {
				resp, err := http.Get(env.url + page.path)
				if err != nil {
					b.Fatal(err)
				}
				data, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatalf("%s: %d", page.path, resp.StatusCode)
				}
				n = len(data)
			}
			b.ReportMetric(float64(n), "page-bytes")
		})
	}
}

// BenchmarkConsoleRunsList renders a filtered page of the runs list over
// a store holding 100,000 runs, on bbolt and on Redis. The runs are five
// chains' in turn; 90 % succeeded, 9 % failed, 1 % running; 1 % started
// by a trigger, 19 % by a schedule, the rest through the API.
func BenchmarkConsoleRunsList(b *testing.B) {
	for _, st := range []string{"bolt", "redis"} {
		b.Run("store="+st, func(b *testing.B) {
			state := ""
			if st == "redis" {
				state = redistest.Open(b)
			}
			env := newAPIOn(b, "", state)
			fillRuns(b, env.gw.Store, 100000)
			for _, f := range []string{"", "chain=c2", "chain=c2&status=failed", "status=running", "started_by=trigger",
				"hide_chain=c1&hide_chain=c2&hide_chain=c3&hide_chain=c4"} {
				b.Run("filter="+f, func(b *testing.B) {
					for b.Loop() {
						resp, err := http.Get(env.url + "/ui/runs?" + f)
						if err != nil {
							b.Fatal(err)
						}
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if resp.StatusCode != http.StatusOK {
							b.Fatalf("%d", resp.StatusCode)
						}
					}
				})
			}
		})
	}
}

// fillRuns writes n finished runs straight to st, many at a time.
func fillRuns(b *testing.B, st store.Store, n int) {
	b.Helper()
	start := time.Now().Add(-time.Duration(n) * time.Second)
	work := make(chan int)
	errs := make(chan error, 64)
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				status := store.RunSucceeded
				switch {
				case i%100 == 0:
					status = store.RunRunning
				case i%100 < 10:
					status = store.RunFailed
				}
				startedBy := "api"
				switch {
				case i%100 == 50:
					startedBy = "trigger:am"
				case i%5 == 0:
					startedBy = "schedule:nightly"
				}
				at := start.Add(time.Duration(i) * time.Second)
				run := &store.Run{ID: store.NewID(), Chain: fmt.Sprintf("c%d", i%5), ChainHash: "h", Status: status, Path: []string{"a"},
					CreatedAt: at, UpdatedAt: at, Origin: store.Origin{ID: "o", ReceivedAt: at, Payload: []byte(`{"host": "db-1"}`)}, StartedBy: startedBy}
				if status.Final() {
					run.FinishedAt = at.Add(time.Second)
				}
				if status == store.RunFailed {
					run.Error = &store.ErrorInfo{Message: "step \"a\" failed: host unreachable", Code: "step_failed"}
				}
				if err := st.Commit(context.Background(), &store.Batch{Run: run, Create: true}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for i := range n {
		select {
		case work <- i:
		case err := <-errs:
			b.Fatal(err)
		}
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
}
