package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/gateway/events"
	"github.com/chaingate/gateway/gateway/metrics"
	"github.com/chaingate/gateway/gateway/server"
)

// doorConfig has an alert trigger whose mapping needs a label.
const doorConfig = `
[[providers]]
name = "echo"
type = "echo"

[[triggers]]
name = "am"
type = "alertmanager"
chain = "page"
payload = { host = "HOST" }

[[chains]]
name = "page"
[[chains.steps]]
name = "call"
provider = "echo"
payload_template = "<<origin.payload>>"
`

// TestParkedDeliveryFromTheCommandLine parks an alert the trigger cannot
// map, then lists it and replays it with the operator's commands on the
// store file, once the config is fixed.
func TestParkedDeliveryFromTheCommandLine(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "gw.db")
	cfgFile := filepath.Join(dir, "gateway.toml")
	writeFile(t, cfgFile, strings.Replace(doorConfig, "HOST", "<<alert.labels.instance>>", 1))
	cfg, err := gateway.LoadConfig([]string{cfgFile})
	if err != nil {
		t.Fatal(err)
	}
	exe, _ := os.Executable()
	gw, err := gateway.Open(context.Background(), gateway.Options{Config: cfg, State: db, Executable: exe, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(server.NewServer(gw, events.NewHub(), metrics.NewMetrics(), []string{cfgFile}).Handler())
	alert := `{"version":"4","groupKey":"g","status":"firing","alerts":[{"status":"firing","labels":{"alertname":"A"},"startsAt":"T1","fingerprint":"fp1"}]}`
	resp, err := http.Post(srv.URL+"/v1/triggers/am", "application/json", strings.NewReader(alert))
	if err != nil {
		t.Fatal(err)
	}
	var answer api.TriggerResponse
	_ = json.NewDecoder(resp.Body).Decode(&answer)
	resp.Body.Close()
	srv.Close()
	if err := gw.Close(); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusAccepted || len(answer.Results) != 1 || answer.Results[0].Action != "parked" {
		t.Fatalf("the alert: %d %+v", resp.StatusCode, answer)
	}
	entry := answer.Results[0].DeadLetter

	code, out, errOut := runCLI(t, "dlq", "list", "--state", db)
	if code != exitOK || !strings.Contains(out, entry) || !strings.Contains(out, "(trigger am)") || !strings.Contains(out, "mapping the payload") {
		t.Fatalf("dlq list: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runCLI(t, "dlq", "replay", entry, "--config", cfgFile, "--state", db)
	if code == exitOK || !strings.Contains(errOut, "the entry is kept") {
		t.Errorf("a replay on the same config: exit %d\n%s%s", code, out, errOut)
	}
	writeFile(t, cfgFile, strings.Replace(doorConfig, "HOST", `<<alert.labels.instance ?? \"unknown\">>`, 1))
	code, out, errOut = runCLI(t, "dlq", "replay", entry, "--config", cfgFile, "--state", db)
	if code != exitOK || !strings.Contains(out, "replaying entry "+entry+" as run") || !strings.Contains(out, "succeeded") {
		t.Fatalf("the replay once fixed: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runCLI(t, "dlq", "list", "--state", db, "--output", "json")
	if code != exitOK || !strings.Contains(out, `"entries": []`) {
		t.Errorf("the queue after the replay: exit %d\n%s%s", code, out, errOut)
	}
}
