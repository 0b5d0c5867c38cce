// Command extplugin is an external provider plugin used by the tests of
// package host: it is built with go build and launched by path.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/chaingate/gateway/plugins"
	"github.com/chaingate/gateway/providers"
)

type provider struct {
	log *slog.Logger
}

func (provider) Describe(context.Context) (providers.Info, error) {
	return providers.Info{Name: "ext", Version: "test", ActionTypes: []string{"inspect", "panic", "wait", "sized"}}, nil
}

func (p provider) Execute(ctx context.Context, req providers.Request) (providers.Response, error) {
	switch req.ActionType {
	case "inspect":
		p.log.Warn("inspecting", "dedup_key", req.DedupKey)
		fmt.Fprintln(os.Stderr, "plain stderr line")
		var deadline int64
		if !req.Deadline.IsZero() {
			deadline = req.Deadline.UnixNano()
		}
		ctxDeadline, _ := ctx.Deadline()
		body, err := json.Marshal(map[string]any{
			"action_type":  req.ActionType,
			"payload":      req.Payload,
			"config":       req.Config,
			"dedup_key":    req.DedupKey,
			"attempt":      req.Attempt,
			"deadline":     deadline,
			"ctx_deadline": ctxDeadline.UnixNano(),
			"run_id":       req.RunID,
			"step":         req.Step,
			"args":         os.Args[1:],
		})
		return providers.Response{Body: body}, err
	case "panic":
		panic("provider bug")
	case "sized":
		// Answers with a JSON string of exactly size bytes.
		var pl struct {
			Size int `json:"size"`
		}
		if err := json.Unmarshal(req.Payload, &pl); err != nil || pl.Size < 2 {
			return providers.Response{}, providers.Permanent("bad_payload", "want {\"size\": N}, N ≥ 2")
		}
		return providers.Response{Body: json.RawMessage(`"` + strings.Repeat("x", pl.Size-2) + `"`)}, nil
	case "wait":
		// Records how the call's context ended, so a test can see that the
		// gateway's cancellation reached this process.
		var pl struct {
			Marker string `json:"marker"`
		}
		if err := json.Unmarshal(req.Payload, &pl); err != nil {
			return providers.Response{}, providers.Permanent("bad_payload", "%v", err)
		}
		if err := os.WriteFile(pl.Marker+".started", nil, 0o644); err != nil {
			return providers.Response{}, err
		}
		<-ctx.Done()
		if err := os.WriteFile(pl.Marker, []byte(ctx.Err().Error()), 0o644); err != nil {
			return providers.Response{}, err
		}
		return providers.Response{}, ctx.Err()
	}
	return providers.Response{}, providers.Permanent("unknown_action", "unknown action type %q", req.ActionType)
}

func main() {
	plugins.Serve(provider{log: plugins.NewLogger(slog.LevelDebug)})
}
