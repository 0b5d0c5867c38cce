// Package schedules starts the runs of the config's [[schedules]] at their
// ticks, once between the gateways sharing a store, and lists when each
// ticks next.
//
// It is the gateway's own package, with no compatibility promise.
package schedules

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/gateway/door"
	"github.com/chaingate/gateway/internal/jsonx"
	"github.com/chaingate/gateway/templates"
)

const (
	// scheduleWindow is how far back start-up looks for a missed tick.
	scheduleWindow = 7 * 24 * time.Hour
	// tickSlack is how long a tick's claim outlives the next tick: a
	// gateway starts only the latest tick by its clock, so once the next
	// one is due no gateway starts this one but one whose clock is behind,
	// or one that stalled between choosing the tick and claiming it.
	tickSlack = time.Minute
	// scheduleRecheck bounds a wait for the next tick, so a reload's new
	// schedules and a clock that jumped are seen soon.
	scheduleRecheck = time.Minute
)

// Scheduler starts the runs of the config's [[schedules]] at their ticks.
// Each tick is claimed in the store under the schedule's name and the
// tick's time before its run starts, so gateways sharing a store start it
// once between them, and a gateway that dies between claim and start
// leaves the start to the next one that looks.
type Scheduler struct {
	gw  *door.Door
	log *slog.Logger
	// draining reports that the gateway is shutting down: no tick starts
	// a run then.
	draining func() bool
	mu       sync.Mutex
	// last is, per schedule, the time up to which its ticks are handled.
	last map[string]time.Time
}

// NewScheduler returns the scheduler of gw's [[schedules]]; draining
// reports that the gateway is shutting down.
func NewScheduler(gw *door.Door, log *slog.Logger, draining func() bool) *Scheduler {
	return &Scheduler{gw: gw, log: log, draining: draining, last: map[string]time.Time{}}
}

// ScheduleFire is what one tick did.
type ScheduleFire struct {
	Schedule string    `json:"schedule"`
	Tick     time.Time `json:"tick"`
	// Action is started, replayed (another gateway started it), or failed.
	Action string `json:"action"`
	Run    string `json:"run,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// Run starts scheduled runs until ctx is done, waiting for each next tick.
func (sc *Scheduler) Run(ctx context.Context) {
	for {
		now := time.Now()
		sc.Due(ctx, now)
		wait := scheduleRecheck
		if next := sc.NextTick(now); !next.IsZero() {
			wait = min(wait, time.Until(next))
		}
		t := time.NewTimer(max(wait, 0))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// Due starts what is due at now. A schedule seen for the first time (at
// start-up, or added by a reload) owes its latest tick only if it catches
// up, or if a gateway claimed that tick and died before starting it; after
// that, each check starts the latest tick since the last one. Ticks that
// passed while the gateway was stalled are not started one by one: only
// the latest of them is.
func (sc *Scheduler) Due(ctx context.Context, now time.Time) []ScheduleFire {
	if sc.draining() {
		return nil
	}
	cfg := sc.gw.Engine.Config()
	sc.mu.Lock()
	defer sc.mu.Unlock()
	var fired []ScheduleFire
	for _, name := range cfg.ScheduleNames {
		s := cfg.Schedules[name]
		last, seen := sc.last[name]
		sc.last[name] = now
		if !seen {
			if tick := s.Latest(now, scheduleWindow); !tick.IsZero() {
				if f, ok := sc.fire(ctx, s, tick, !s.CatchUp, true); ok {
					fired = append(fired, f)
				}
			}
			continue
		}
		tick, skipped := time.Time{}, 0
		for at := s.Next(last); !at.IsZero() && !at.After(now); at = s.Next(at) {
			if !tick.IsZero() {
				skipped++
			}
			tick = at
			if s.Every > 0 {
				tick = now.Truncate(s.Every)
				skipped += int(tick.Sub(at) / s.Every)
				break
			}
		}
		if tick.IsZero() {
			continue
		}
		if skipped > 0 {
			sc.gw.Observer.Ticked(name, "missed", skipped)
			sc.log.Warn("schedule ticks passed while the gateway was not checking; starting the latest only", "schedule", name, "skipped", skipped, "tick", tick)
		}
		if f, ok := sc.fire(ctx, s, tick, false, false); ok {
			fired = append(fired, f)
		}
	}
	for name := range sc.last {
		if cfg.Schedules[name] == nil {
			delete(sc.last, name)
		}
	}
	return fired
}

// NextTick is the earliest tick of any schedule after now.
func (sc *Scheduler) NextTick(now time.Time) time.Time {
	var next time.Time
	cfg := sc.gw.Engine.Config()
	for _, name := range cfg.ScheduleNames {
		if at := cfg.Schedules[name].Next(now); !at.IsZero() && (next.IsZero() || at.Before(next)) {
			next = at
		}
	}
	return next
}

func tickKey(s *chain.Schedule, tick time.Time) string {
	return "schedule/" + s.Name + "/" + tick.UTC().Format(time.RFC3339)
}

// tickTTL is how long a tick's claim lasts: until tickSlack after the
// next tick, within which it is the latest one start-up may still start,
// and no longer than start-up looks back.
func tickTTL(s *chain.Schedule, tick time.Time) time.Duration {
	next := s.Next(tick)
	if next.IsZero() {
		return scheduleWindow + tickSlack
	}
	return min(next.Sub(tick), scheduleWindow) + tickSlack
}

// fire starts the run of one tick. With claimedOnly it starts only a tick
// a gateway claimed and never started, and reports nothing otherwise.
func (sc *Scheduler) fire(ctx context.Context, s *chain.Schedule, tick time.Time, claimedOnly, catchUp bool) (ScheduleFire, bool) {
	f := ScheduleFire{Schedule: s.Name, Tick: tick}
	key := tickKey(s, tick)
	log := sc.log.With("schedule", s.Name, "tick", tick)
	if claimedOnly {
		id, err := sc.gw.Store.KeyRun(ctx, key)
		if err != nil || id == "" {
			return f, false
		}
		if _, err := sc.gw.Store.RunHeader(ctx, id); !errors.Is(err, store.ErrNotFound) {
			return f, false
		}
	}
	if p, err := sc.gw.Paused(ctx, api.PauseSchedule, s.Name); err == nil && p != nil {
		f.Action, f.Reason = "paused", fmt.Sprintf("paused by %s at %s%s", p.By, p.At.Format(time.RFC3339), door.ReasonText(p.Reason))
		sc.gw.Observer.Ticked(s.Name, api.OutcomePaused, 1)
		log.Info("tick skipped: the schedule is paused", "paused_by", p.By)
		return f, true
	}
	in, err := ScheduleInput(s, tick)
	if err == nil {
		f.Run, _, f.Action, err = sc.start(ctx, s, tick, key, in)
	}
	if err != nil {
		f.Action, f.Reason = "failed", err.Error()
		sc.gw.Observer.Ticked(s.Name, api.OutcomeFailed, 1)
		log.Error("scheduled run could not start", "err", err)
		return f, true
	}
	switch {
	case f.Action != "started":
		sc.gw.Observer.Ticked(s.Name, api.OutcomeDeduplicated, 1)
		log.Debug("tick already started", "run", f.Run)
	case catchUp:
		sc.gw.Observer.Ticked(s.Name, "caught_up", 1)
		log.Info("scheduled run started for a tick missed while no gateway was checking", "run", f.Run, "chain", s.Chain)
	default:
		sc.gw.Observer.Ticked(s.Name, api.OutcomeStarted, 1)
		log.Info("scheduled run started", "run", f.Run, "chain", s.Chain)
	}
	return f, true
}

func (sc *Scheduler) start(ctx context.Context, s *chain.Schedule, tick time.Time, key string, in engine.Input) (id, status, action string, err error) {
	id, status, replayed, err := sc.gw.StartKeyed(engine.Acting(ctx, engine.Identity{Name: "schedule " + s.Name}, ""), s.Chain, "", key, tickTTL(s, tick), in)
	if err != nil {
		return "", "", "", err
	}
	if replayed {
		return id, status, "replayed", nil
	}
	return id, status, "started", nil
}

// ScheduleInput is a tick's run: its payload, and where it came from.
func ScheduleInput(s *chain.Schedule, tick time.Time) (engine.Input, error) {
	at := tick.In(s.Location).Format(time.RFC3339)
	scope := map[string]any{"name": s.Name, "tick": at, "timezone": s.Location.String()}
	var payload []byte
	var err error
	if s.Payload != nil {
		payload, err = s.Payload.AppendJSON(nil, templates.MapScope{"schedule": scope})
	} else {
		payload, err = jsonx.Marshal(map[string]any{"schedule": s.Name, "tick": at})
	}
	if err != nil {
		return engine.Input{}, err
	}
	meta, _ := jsonx.Marshal(map[string]string{"schedule": s.Name, "tick": at})
	return engine.Input{Payload: payload, Metadata: meta, StartedBy: store.StartedBySchedule + ":" + s.Name}, nil
}

// Schedules describes cfg's schedules at now; st, when set, says which
// run each one's latest tick started.
func Schedules(ctx context.Context, cfg *chain.Config, st store.Store, now time.Time) []api.ScheduleInfo {
	out := []api.ScheduleInfo{}
	for _, name := range cfg.ScheduleNames {
		s := cfg.Schedules[name]
		info := api.ScheduleInfo{Name: name, Chain: s.Chain, Cron: s.Cron, Timezone: s.Location.String(), CatchUp: s.CatchUp, Next: []time.Time{}}
		if s.Every > 0 {
			info.Every = s.Every.String()
		}
		for at := now; len(info.Next) < 3; {
			if at = s.Next(at); at.IsZero() {
				break
			}
			info.Next = append(info.Next, at.In(s.Location))
		}
		if last := s.Latest(now, scheduleWindow); !last.IsZero() {
			info.LastTick = last.In(s.Location)
			if st != nil {
				info.LastRun, _ = st.KeyRun(ctx, tickKey(s, last))
			}
		}
		out = append(out, info)
	}
	return out
}
