package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/store"
	redisstore "github.com/chaingate/gateway/chain/store/redis"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/internal/testutil/redistest"
)

// stormConfig is an alert trigger whose runs take one step that a false
// condition skips: a run is its start, and little else.
const stormConfig = `
[gateway]
shutdown_grace_seconds = 10

[[providers]]
name = "echo"
type = "echo"

[[triggers]]
name = "am"
type = "alertmanager"
chain = "storm"

[[chains]]
name = "storm"
[[chains.steps]]
name = "noop"
provider = "echo"
when = 'origin.payload.fingerprint == ""'
`

// TestSIGTERMDuringAlertStorm posts notifications of many alerts at once
// and sends SIGTERM a moment after their answers, while the alerts kept
// past the answers are being started, then starts the gateway again, six
// times; the last time the gateway is killed instead. Each stop exits 0
// (or, killed, dies) without a panic, letting go of the kept alerts it
// was starting, and every alert is started once, never twice, never lost:
// those left kept are started after the restart.
func TestSIGTERMDuringAlertStorm(t *testing.T) {
	const (
		rounds        = 6
		notifications = 5
		alerts        = 200
	)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gateway.toml")
	writeFile(t, cfg, stormConfig)
	state := redistest.Open(t)
	st, err := redisstore.OpenURL(t.Context(), state, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()

	gw := startServe(t, cfg, state)
	for round := range rounds {
		kill := round == rounds-1
		began := time.Now().Add(-time.Second)
		var (
			wg     sync.WaitGroup
			mu     sync.Mutex
			resend []string
		)
		for n := range notifications {
			body := stormNotification(round, n, alerts)
			wg.Go(func() {
				code, res, err := postAlerts(gw.url, body)
				mu.Lock()
				defer mu.Unlock()

				if err != nil || (code != http.StatusAccepted && code != http.StatusOK) || failedAny(res) {
					// As Alertmanager does, the notification is sent again.
					resend = append(resend, body)
				}
			})
		}
		wg.Wait()
		if kill {
			if err := gw.cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			_, _ = gw.cmd.Process.Wait()
		} else {
			if err := gw.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			ps, err := gw.cmd.Process.Wait()
			if err != nil || ps.ExitCode() != 0 {
				t.Fatalf("round %d: the gateway stopped with %v %v:\n%s", round, ps, err, gw.logs)
			}
			// Stopped cleanly, it let go of what it was starting.
			err = st.ForEachKey(t.Context(), "inbox/", func(key, bound string) error {
				return fmt.Errorf("%s is still claimed by %s", key, bound)
			})
			if err != nil {
				t.Errorf("round %d: %v", round, err)
			}
		}
		if logs := gw.logs.String(); strings.Contains(logs, "panic") || strings.Contains(logs, "hit a bug") {
			t.Fatalf("round %d: the gateway met a bug:\n%s", round, logs)
		}

		gw = startServe(t, cfg, state)
		for _, body := range resend {
			if _, _, err := postAlerts(gw.url, body); err != nil {
				t.Fatalf("round %d: sending again: %v", round, err)
			}
		}
		// Killed, the gateway's claims on what it was starting lapse before
		// the restarted one takes it up: seconds, allowed minutes here.
		started := waitRoundStarted(t, st, round, began, notifications*alerts, 3*time.Minute)
		for fp, n := range started {
			if n != 1 {
				t.Errorf("round %d: alert %s started %d runs", round, fp, n)
			}
		}
		if t.Failed() {
			t.Fatalf("gateway log:\n%s", gw.logs)
		}
	}
}

// stormNotification is notification n of a round, holding its own alerts.
func stormNotification(round, n, alerts int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `{"version":"4","groupKey":"storm-%d-%d","status":"firing","alerts":[`, round, n)
	for i := range alerts {
		if i > 0 {
			b.WriteByte(',')
		}
		fp := fmt.Sprintf("r%d-n%d-a%d", round, n, i)
		fmt.Fprintf(&b, `{"status":"firing","fingerprint":%q,"startsAt":"2026-11-25T03:00:00Z","labels":{"alertname":"Storm","round":"%d","fp":%q}}`, fp, round, fp)
	}
	b.WriteString("]}")
	return b.String()
}

func postAlerts(url, body string) (int, api.TriggerResponse, error) {
	var res api.TriggerResponse
	resp, err := http.Post(url+"/v1/triggers/am", "application/json", strings.NewReader(body))
	if err != nil {
		return 0, res, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err == nil {
		err = json.NewDecoder(bytes.NewReader(raw)).Decode(&res)
	}
	return resp.StatusCode, res, err
}

func failedAny(res api.TriggerResponse) bool {
	for _, r := range res.Results {
		if r.Action == "failed" {
			return true
		}
	}
	return false
}

// waitRoundStarted waits until every alert of the round, which began at
// since, has started a run, and returns how many runs each started.
func waitRoundStarted(t *testing.T, st store.Store, round int, since time.Time, want int, patience time.Duration) map[string]int {
	t.Helper()
	for deadline := time.Now().Add(patience); ; time.Sleep(200 * time.Millisecond) {
		started := map[string]int{}
		f := store.RunFilter{Since: since, Limit: 1000, NoOrigins: true, Labels: map[string]string{"round": fmt.Sprint(round)}}
		for {
			page, err := st.ListRuns(context.Background(), f)
			if err != nil {
				t.Fatal(err)
			}
			for _, run := range page.Runs {
				started[run.Labels["fp"]]++
			}
			if f.Cursor = page.Next; f.Cursor == "" {
				break
			}
		}
		if len(started) >= want || time.Now().After(deadline) {
			if len(started) < want {
				t.Fatalf("round %d: %d of %d alerts started", round, len(started), want)
			}
			return started
		}
	}
}
