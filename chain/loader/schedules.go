package loader

import (
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/templates"
)

var scheduleKeys = []string{"name", "chain", "cron", "every", "timezone", "catch_up", "payload", "retention"}

// cronParser reads the five standard fields, and @hourly, @daily and the
// like; "@every" is written as every = "15m".
var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// minEvery keeps an interval schedule from starting runs faster than a
// store claim per tick can sensibly serve.
const minEvery = time.Second

func (l *loader) schedule(t *table) {
	s := &chain.Schedule{Name: l.checkName(t, "schedule"), Source: t.d.source(t.path), Location: time.UTC}
	s.Chain = t.requiredStr("chain")
	expr, every := t.nonEmpty("cron"), t.nonEmpty("every")
	switch {
	case t.has("cron") && t.has("every"):
		t.d.errorf(t.path, "sets both cron and every; a schedule has one of them")
	case !t.has("cron") && !t.has("every"):
		t.d.errorf(t.path, `missing required key "cron" (e.g. "0 3 * * *") or "every" (e.g. "15m")`)
	}
	if tz := t.nonEmpty("timezone"); tz != "" {
		loc, err := time.LoadLocation(tz)
		if err != nil {
			t.d.errorf(t.path.Key("timezone"), "unknown time zone %q: want an IANA name such as \"Europe/Paris\" or \"UTC\"", tz)
		} else {
			s.Location = loc
		}
		if t.has("every") {
			t.d.errorf(t.path.Key("timezone"), "an every schedule ticks on whole intervals since the Unix epoch; timezone applies to cron")
		}
	}
	if strings.HasPrefix(expr, "@every") {
		t.d.errorf(t.path.Key("cron"), "write an interval as every = %q: ticks of an @every cron count from when each gateway started, so gateways sharing a store would not agree on them", strings.TrimSpace(strings.TrimPrefix(expr, "@every")))
		expr = ""
	}
	if expr != "" {
		spec, err := cronParser.Parse(expr)
		switch {
		case err != nil:
			t.d.errorf(t.path.Key("cron"), "invalid cron expression %q: %v (minute hour day-of-month month day-of-week, or @hourly, @daily, @weekly, @monthly)", expr, err)
		case spec.Next(time.Now().In(s.Location)).IsZero():
			// The parser takes each field alone, so "0 0 30 2 *" parses;
			// Next finds no tick in the five years it looks ahead.
			t.d.errorf(t.path.Key("cron"), "cron expression %q never fires: no time in the next five years matches it; check the day of month against the month (February has at most 29 days; April, June, September and November 30)", expr)
		default:
			s.Cron = expr
			s.SetNext(spec.Next)
		}
	}
	if every != "" {
		d, err := time.ParseDuration(every)
		switch {
		case err != nil:
			t.d.errorf(t.path.Key("every"), "invalid duration %q: write it as 30s, 15m or 6h", every)
		case d < minEvery || d%time.Second != 0:
			t.d.errorf(t.path.Key("every"), "must be a whole number of seconds, at least %s, got %s", minEvery, every)
		default:
			s.Every = d
		}
	}
	s.CatchUp = t.boolean("catch_up", false)
	if v, ok := t.value("payload"); ok {
		s.Payload = scheduleTemplate(t, v)
	}
	if t.has("retention") {
		s.Retention = t.retentionOverride(false)
	}
	t.finish(scheduleKeys)
	if s.Name == "" {
		return
	}
	if prev, ok := l.cfg.Schedules[s.Name]; ok {
		t.d.errorf(t.path.Key("name"), "schedule %q is already defined at %s", s.Name, where(prev.Source))
		return
	}
	if l.cfg.Schedules == nil {
		l.cfg.Schedules = map[string]*chain.Schedule{}
	}
	l.cfg.Schedules[s.Name] = s
	l.cfg.ScheduleNames = append(l.cfg.ScheduleNames, s.Name)
	l.later = append(l.later, func() {
		if s.Chain != "" && l.cfg.Chains[s.Chain] == nil {
			t.d.errorf(t.path.Key("chain"), "schedule %q starts chain %q, which is not defined%s", s.Name, s.Chain, l.cfg.ChainHint(s.Chain))
		}
	})
}

// scheduleTemplate compiles a schedule's payload, which reads the tick.
func scheduleTemplate(t *table, v any) *templates.Template {
	p := t.path.Key("payload")
	tpl := compileRoots(t.d, p, v, chain.ScheduleRoots)
	if tpl != nil {
		t.d.checkRefs(p, scheduleShapes, templateRefs(tpl))
	}
	return tpl
}
