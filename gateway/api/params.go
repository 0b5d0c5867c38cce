package api

import (
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/internal/textx"
)

// CheckRunStatus refuses a status no run has; "" means any.
func CheckRunStatus(status store.RunStatus) error {
	if status == "" || slices.Contains(store.RunStatuses, status) {
		return nil
	}
	return BadRequest("invalid_parameter", "status %q is not one of %s", status, StatusList(store.RunStatuses))
}

// ParseLabels reads labels written KEY=VALUE, as the label parameter and
// --label take them; with values false a bare KEY (any value) is allowed
// too, as a filter.
func ParseLabels(name string, args []string, values bool) (map[string]string, error) {
	if len(args) == 0 {
		return nil, nil
	}
	if len(args) > MaxLabels {
		return nil, BadRequest("invalid_parameter", "%s: %d labels, at most %d", name, len(args), MaxLabels)
	}
	out := make(map[string]string, len(args))
	for _, a := range args {
		k, v, eq := strings.Cut(a, "=")
		switch {
		case k == "":
			return nil, BadRequest("invalid_parameter", "%s %q: a label is KEY=VALUE", name, a)
		case values && !eq:
			return nil, BadRequest("invalid_parameter", "%s %q: a label is KEY=VALUE", name, a)
		case len(k) > MaxLabelKeyBytes || len(v) > MaxLabelValueSize:
			return nil, BadRequest("invalid_parameter", "%s %q: a label's key is at most %d bytes and its value %d", name, textx.Short(a, 40), MaxLabelKeyBytes, MaxLabelValueSize)
		}
		out[k] = v
	}
	return out, nil
}

// CheckRange refuses a value of the named parameter outside 1 to max.
func CheckRange(name string, n, max int) error {
	if n < 1 || n > max {
		return BadRequest("invalid_parameter", "%s must be a number from 1 to %d", name, max)
	}
	return nil
}

// ParseSince reads an RFC 3339 time, or a duration meaning that long ago.
func ParseSince(v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return time.Now().Add(-d), nil
	}
	return time.Time{}, BadRequest("invalid_parameter", "since %q is neither an RFC 3339 time nor a duration such as 1h", v)
}

func ParseLimit(v string) (int, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, BadRequest("invalid_parameter", "limit must be a number from 1 to %d", MaxPageLimit)
	}
	return n, CheckRange("limit", n, MaxPageLimit)
}

// BulkTimeout bounds a replay or purge of many dead-letter entries.
const BulkTimeout = 30 * time.Minute

// MaxItemPage bounds a page of split items.
const MaxItemPage = 1000

// IntParam reads a whole-number query parameter from least to most; def
// when it is missing. The console reads its pages' parameters with it, so
// that it refuses what the API refuses, in the same words.
func IntParam(v, name string, def, least, most int) (int, error) {
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < least || n > most {
		return 0, BadRequest("invalid_parameter", "%s must be a number from %d to %d", name, least, most)
	}
	return n, nil
}

// ParseReplayOptions checks a replay's mode and definition and fills in
// their defaults, for the API's replays and the console's alike.
func ParseReplayOptions(mode, def string) (engine.ReplayOptions, error) {
	o := engine.ReplayOptions{Mode: engine.ReplayMode(mode), Definition: engine.ReplayDefinition(def)}
	switch o.Mode {
	case "", engine.ReplayResume:
		o.Mode = engine.ReplayResume
	case engine.ReplayRestart:
	default:
		return o, BadRequest("invalid_parameter", "mode %q is not resume or restart", mode)
	}
	switch o.Definition {
	case "":
		o.Definition = engine.ReplayCurrent
	case engine.ReplayCurrent, engine.ReplayPinned:
	default:
		return o, BadRequest("invalid_parameter", "definition %q is not current or pinned", def)
	}
	if err := o.Check(); err != nil {
		return o, BadRequest("invalid_parameter", "%s", strings.TrimPrefix(err.Error(), engine.ErrNotReplayable.Error()+": "))
	}
	return o, nil
}

// MaxComment bounds an answer's comment and a pause's reason, which are
// stored.
const MaxComment = 2000
