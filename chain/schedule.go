package chain

import (
	"time"

	"github.com/chaingate/gateway/templates"
)

// Schedule is one [[schedules]] entry: a chain started at every tick of a
// cron expression or an interval.
type Schedule struct {
	Name  string
	Chain string
	// Cron is the expression as written; Every the interval. One is set.
	Cron  string
	Every time.Duration
	// Location is the time zone the cron expression reads.
	Location *time.Location
	// CatchUp runs, on start-up, the latest tick missed while no gateway
	// was running; without it that tick is skipped.
	CatchUp bool
	// Payload renders the run's payload from the tick; nil is {}.
	Payload *templates.Template
	// Retention is what the schedule's retention table sets for its runs;
	// nil without one.
	Retention *RetentionOverride
	Source    Source

	next func(time.Time) time.Time
}

// ScheduleRoots are the names a schedule's payload reads.
var ScheduleRoots = []string{"schedule"}

// SetNext gives the schedule the function that finds its next tick.
func (s *Schedule) SetNext(next func(time.Time) time.Time) { s.next = next }

// Next returns the schedule's first tick strictly after t. Interval ticks
// fall on whole multiples of the interval since the Unix epoch, so every
// gateway computes the same ones.
func (s *Schedule) Next(t time.Time) time.Time {
	if s.Every > 0 {
		return t.Truncate(s.Every).Add(s.Every)
	}
	return s.next(t.In(s.Location))
}

// Latest returns the schedule's last tick at or before t, looking back at
// most over window; zero when there is none in it.
func (s *Schedule) Latest(t time.Time, window time.Duration) time.Time {
	if s.Every > 0 {
		return t.Truncate(s.Every)
	}
	var last time.Time
	for at := s.Next(t.Add(-window)); !at.IsZero() && !at.After(t); at = s.Next(at) {
		last = at
	}
	return last
}
