package chain

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Retention is the [gateway.retention] table: how long runs that ended
// and dead-letter entries are kept, counted from when a run ended or an
// entry was parked. Zero keeps them for ever.
type Retention struct {
	Succeeded, Failed, Cancelled, TimedOut time.Duration
	DeadLetters                            time.Duration
	// Interval is how often serve prunes what is past its time.
	Interval time.Duration
	Source   Source
	// Skipped is how long runs that ended skipped are kept (their
	// concurrency key was taken).
	Skipped time.Duration
	// Audit is how long the audit log's entries are kept.
	Audit time.Duration
}

// Retention's defaults, for a fresh install: a week of what went well, a
// month of what did not.
const (
	DefaultKeepSucceeded   = 7 * 24 * time.Hour
	DefaultKeepFailed      = 30 * 24 * time.Hour
	DefaultKeepCancelled   = 7 * 24 * time.Hour
	DefaultKeepTimedOut    = 30 * 24 * time.Hour
	DefaultKeepDeadLetters = 30 * 24 * time.Hour
	DefaultPruneInterval   = time.Minute
	DefaultKeepSkipped     = 7 * 24 * time.Hour
	// DefaultKeepAudit is a year: what a yearly access review reads.
	DefaultKeepAudit = 365 * 24 * time.Hour
)

// DefaultRetention is the retention of a config that sets none.
func DefaultRetention() Retention {
	return Retention{
		Succeeded: DefaultKeepSucceeded, Failed: DefaultKeepFailed, Cancelled: DefaultKeepCancelled, TimedOut: DefaultKeepTimedOut,
		DeadLetters: DefaultKeepDeadLetters, Interval: DefaultPruneInterval, Skipped: DefaultKeepSkipped, Audit: DefaultKeepAudit,
	}
}

// RetentionOverride is the retention table of a chain, a schedule or a
// trigger: what it sets for the runs it has or starts, over the gateway's.
type RetentionOverride struct {
	// Keep holds what the table sets, by outcome ("succeeded", "failed",
	// "cancelled", "timed_out") and, on a chain, "dead_letters".
	Keep   map[string]time.Duration
	Source Source
}

// RetentionKeys are the outcomes a retention table sets, as written.
var RetentionKeys = []string{"succeeded", "failed", "cancelled", "timed_out", "skipped"}

// Keep is how long a run that ended with status ("succeeded", ...) is
// kept: what the first override setting it says, else the gateway's.
func (r *Retention) Keep(status string, overrides ...*RetentionOverride) time.Duration {
	for _, o := range overrides {
		if o == nil {
			continue
		}
		if d, ok := o.Keep[status]; ok {
			return d
		}
	}
	switch status {
	case "succeeded":
		return r.Succeeded
	case "failed":
		return r.Failed
	case "cancelled":
		return r.Cancelled
	case "timed_out":
		return r.TimedOut
	case "dead_letters":
		return r.DeadLetters
	case "skipped":
		return r.Skipped
	}
	return 0
}

// ParseDuration is time.ParseDuration with days and weeks, for which a
// whole number comes alone ("7d", "2w"); "0" is zero.
func ParseDuration(s string) (time.Duration, error) {
	if s == "0" {
		return 0, nil
	}
	for unit, size := range map[string]time.Duration{"d": 24 * time.Hour, "w": 7 * 24 * time.Hour} {
		if n, ok := strings.CutSuffix(s, unit); ok {
			v, err := strconv.ParseUint(n, 10, 32)
			if err != nil {
				return 0, fmt.Errorf("%q is not a duration: a number of days or weeks is a whole number (\"7d\", \"2w\")", s)
			}
			return time.Duration(v) * size, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf(`%q is not a duration such as "90s", "15m", "36h", "7d" or "2w"`, s)
	}
	return d, nil
}
