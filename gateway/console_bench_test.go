package gateway_test

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
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
