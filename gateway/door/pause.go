package door

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/internal/jsonx"
)

// A trigger or schedule is paused by a key in the store, so that every
// gateway sharing it sees the pause, and it outlives restarts. A paused
// trigger's deliveries are answered and kept in the dead-letter queue
// (code trigger_paused), each alert (or group notification, or body with
// a key) once, to be replayed once it is unpaused (the door, keepPaused);
// a paused schedule's ticks start nothing.

// pauseTTL keeps a pause until it is lifted, in practice.
const pauseTTL = 10 * 365 * 24 * time.Hour

func ReasonText(reason string) string {
	if reason == "" {
		return ""
	}
	return ": " + reason
}

func pauseKey(kind, name string) string { return "pause/" + kind + "/" + keyPart(name) }

// ErrUnknownPausable is returned for a trigger or schedule the config does
// not have.
var ErrUnknownPausable = errors.New("no such trigger or schedule")

func (gw *Door) checkPausable(kind, name string) error {
	switch {
	case kind == api.PauseTrigger && gw.Config.Triggers[name] != nil,
		kind == api.PauseSchedule && gw.Config.Schedules[name] != nil:
		return nil
	case kind != api.PauseTrigger && kind != api.PauseSchedule:
		return api.BadRequest("invalid_parameter", "%q is not trigger or schedule", kind)
	}
	return fmt.Errorf("%w: the config has no %s %q", store.ErrNotFound, kind, name)
}

// Paused returns the pause of a trigger or schedule, or nil.
func (gw *Door) Paused(ctx context.Context, kind, name string) (*api.Pause, error) {
	v, err := gw.Store.KeyRun(ctx, pauseKey(kind, name))
	if err != nil || v == "" {
		return nil, err
	}
	var p api.Pause
	if err := json.Unmarshal([]byte(v), &p); err != nil {
		return nil, fmt.Errorf("reading the pause of %s %q: %w", kind, name, err)
	}
	return &p, nil
}

// Pause pauses a trigger or schedule; who pauses is the context's actor.
// Pausing what is paused already returns the first pause.
func (gw *Door) Pause(ctx context.Context, kind, name, reason string) (*api.Pause, error) {
	if err := gw.checkPausable(kind, name); err != nil {
		return nil, err
	}
	p := api.Pause{Kind: kind, Name: name, By: engine.Actor(ctx), At: time.Now().UTC(), Reason: reason}
	if p.By == "" {
		p.By = "unknown"
	}
	b, _ := jsonx.Marshal(p)
	bound, err := gw.Store.ClaimKey(ctx, pauseKey(kind, name), string(b), pauseTTL)
	if err != nil {
		return nil, fmt.Errorf("pausing %s %q: %w", kind, name, err)
	}
	if bound != "" {
		var first api.Pause
		if json.Unmarshal([]byte(bound), &first) == nil {
			return &first, nil
		}
	}
	gw.Log.Info("paused", "kind", kind, "name", name, "by", p.By, "reason", reason)
	return &p, nil
}

// Resume lifts a pause (unpause); it reports the pause lifted, nil when
// there was none. An unpaused trigger's kept deliveries wait in the
// dead-letter queue for a replay.
func (gw *Door) Resume(ctx context.Context, kind, name string) (*api.Pause, error) {
	if err := gw.checkPausable(kind, name); err != nil {
		return nil, err
	}
	key := pauseKey(kind, name)
	v, err := gw.Store.KeyRun(ctx, key)
	if err != nil || v == "" {
		return nil, err
	}
	if err := gw.Store.ReleaseKey(ctx, key, v); err != nil {
		return nil, fmt.Errorf("resuming %s %q: %w", kind, name, err)
	}
	var p api.Pause
	_ = json.Unmarshal([]byte(v), &p)
	gw.Log.Info("resumed", "kind", kind, "name", name, "by", engine.Actor(ctx), "paused_by", p.By, "paused_at", p.At)
	return &p, nil
}

// Pauses lists what the config can pause that is paused now.
func (gw *Door) Pauses(ctx context.Context) ([]*api.Pause, error) {
	out := []*api.Pause{}
	for _, kind := range []string{api.PauseTrigger, api.PauseSchedule} {
		names := gw.Config.TriggerNames
		if kind == api.PauseSchedule {
			names = gw.Config.ScheduleNames
		}
		for _, name := range names {
			p, err := gw.Paused(ctx, kind, name)
			if err != nil {
				return nil, err
			}
			if p != nil {
				out = append(out, p)
			}
		}
	}
	return out, nil
}
