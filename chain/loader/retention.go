package loader

import (
	"time"

	"github.com/chaingate/gateway/chain"
)

// Bounds of retention's durations and of how often it prunes.
const (
	minKeep          = time.Second
	minPruneInterval = time.Second
	maxPruneInterval = time.Hour
)

// decodeRetention reads [gateway.retention] over the defaults in r.
func decodeRetention(t *table, r *chain.Retention) {
	r.Source = t.d.source(t.path)
	for k, d := range map[string]*time.Duration{
		"succeeded": &r.Succeeded, "failed": &r.Failed, "cancelled": &r.Cancelled, "timed_out": &r.TimedOut, "dead_letters": &r.DeadLetters,
		"skipped": &r.Skipped, "audit": &r.Audit,
	} {
		if v, ok := t.keep(k); ok {
			*d = v
		}
	}
	if t.has("interval") {
		if v, ok := t.duration("interval"); ok {
			if v < minPruneInterval || v > maxPruneInterval {
				t.d.errorf(t.path.Key("interval"), "must be from %s to %s, got %s", minPruneInterval, maxPruneInterval, v)
			} else {
				r.Interval = v
			}
		}
	}
	t.finish(append(append([]string{}, chain.RetentionKeys...), "dead_letters", "audit", "interval"))
}

// retentionOverride reads the retention table of a chain (which may also
// set dead_letters), a schedule or a trigger.
func (t *table) retentionOverride(deadLetters bool) *chain.RetentionOverride {
	rt, ok := t.sub("retention")
	if !ok {
		return nil
	}
	o := &chain.RetentionOverride{Keep: map[string]time.Duration{}, Source: rt.d.source(rt.path)}
	keys := append([]string{}, chain.RetentionKeys...)
	if deadLetters {
		keys = append(keys, "dead_letters")
	}
	for _, k := range keys {
		if v, ok := rt.keep(k); ok {
			o.Keep[k] = v
		}
	}
	rt.finish(keys)
	return o
}

// keep reads how long something is kept: a duration of at least a second,
// or "0" for ever.
func (t *table) keep(k string) (time.Duration, bool) {
	if !t.has(k) {
		return 0, false
	}
	d, ok := t.duration(k)
	if !ok {
		return 0, false
	}
	if d != 0 && d < minKeep {
		t.d.errorf(t.path.Key(k), "must be at least %s, or \"0\" to keep for ever, got %s", minKeep, d)
		return 0, false
	}
	return d, true
}

// duration reads a duration written as a string with its unit: "90s",
// "15m", "36h", "7d", "2w", "1h30m", or "0".
func (t *table) duration(k string) (time.Duration, bool) {
	v, _ := t.value(k)
	s, isStr := v.(string)
	if !isStr {
		t.d.errorf(t.path.Key(k), `must be a duration in a string, with its unit ("90s", "15m", "36h", "7d", "2w"), or "0"; got %s`, describe(v))
		return 0, false
	}
	d, err := chain.ParseDuration(s)
	if err != nil {
		t.d.errorf(t.path.Key(k), "%v", err)
		return 0, false
	}
	return d, true
}
