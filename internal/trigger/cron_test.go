package trigger

import (
	"strings"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/pkg/spec"
)

func mustSchedule(t *testing.T, expr, tz string) Schedule {
	t.Helper()
	s, err := spec.ParseSchedule(&spec.CronSource{Schedule: expr, TimeZone: tz})
	if err != nil {
		t.Fatalf("%q: %v", expr, err)
	}
	return s
}

func at(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

func TestPlanCron(t *testing.T) {
	for _, c := range []struct {
		name, expr, tz, catchUp string
		last, now               string
		fire, next              string // "" = none
		missed                  int
	}{
		{name: "before the first tick", expr: "*/5 * * * *", last: "2026-01-01T10:00:00Z", now: "2026-01-01T10:04:59Z", next: "2026-01-01T10:05:00Z"},
		{name: "at the tick", expr: "*/5 * * * *", last: "2026-01-01T10:00:00Z", now: "2026-01-01T10:05:00Z", fire: "2026-01-01T10:05:00Z", next: "2026-01-01T10:10:00Z"},
		{name: "a little late", expr: "*/5 * * * *", last: "2026-01-01T10:00:00Z", now: "2026-01-01T10:05:03Z", fire: "2026-01-01T10:05:00Z", next: "2026-01-01T10:10:00Z"},
		{name: "outage: the latest once", expr: "*/5 * * * *", last: "2026-01-01T10:00:00Z", now: "2026-01-01T10:17:00Z", fire: "2026-01-01T10:15:00Z", next: "2026-01-01T10:20:00Z", missed: 2},
		{name: "outage, skip", expr: "*/5 * * * *", catchUp: spec.CatchUpSkip, last: "2026-01-01T10:00:00Z", now: "2026-01-01T10:17:00Z", next: "2026-01-01T10:20:00Z", missed: 3},
		{name: "skip, on time", expr: "*/5 * * * *", catchUp: spec.CatchUpSkip, last: "2026-01-01T10:00:00Z", now: "2026-01-01T10:05:09Z", fire: "2026-01-01T10:05:00Z", next: "2026-01-01T10:10:00Z"},
		{name: "@every", expr: "@every 10s", last: "2026-01-01T10:00:00Z", now: "2026-01-01T10:00:10Z", fire: "2026-01-01T10:00:10Z", next: "2026-01-01T10:00:20Z"},
		{name: "@hourly", expr: "@hourly", last: "2026-01-01T10:20:00Z", now: "2026-01-01T11:00:00Z", fire: "2026-01-01T11:00:00Z", next: "2026-01-01T12:00:00Z"},
		// 02:00 in Berlin is 01:00 UTC in winter.
		{name: "time zone", expr: "0 2 * * *", tz: "Europe/Berlin", last: "2026-01-01T00:00:00Z", now: "2026-01-01T01:00:00Z", fire: "2026-01-01T01:00:00Z", next: "2026-01-02T01:00:00Z"},
		{name: "a week down: one firing, bounded work", expr: "@every 1s", last: "2026-01-01T00:00:00Z", now: "2026-01-08T00:00:00Z", fire: "2026-01-08T00:00:00Z", next: "2026-01-08T00:00:01Z", missed: 86399},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := PlanCron(mustSchedule(t, c.expr, c.tz), at(c.last), at(c.now), c.catchUp)
			var wantFire time.Time
			if c.fire != "" {
				wantFire = at(c.fire)
			}
			if !p.Fire.Equal(wantFire) || !p.Next.Equal(at(c.next)) || p.Missed != c.missed {
				t.Errorf("plan %+v; want fire %v next %v missed %d", p, wantFire, c.next, c.missed)
			}
			if !p.Fire.IsZero() && !p.Cursor.Equal(p.Fire) {
				t.Errorf("cursor %v after firing %v", p.Cursor, p.Fire)
			}
		})
	}
}

func TestScheduleErrors(t *testing.T) {
	for _, c := range []struct{ expr, tz, want string }{
		{"61 * * * *", "", "above maximum"},
		{"* * * *", "", "five fields"},
		{"@every 10ms", "", "at least 1s"},
		{"0 0 30 2 *", "", "never fires"},
		{"TZ=UTC * * * * *", "", "time_zone"},
		{"@hourly", "Mars/Olympus", "IANA"},
		{"", "", "required"},
	} {
		_, err := spec.ParseSchedule(&spec.CronSource{Schedule: c.expr, TimeZone: c.tz})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q (tz %q): %v, want an error saying %q", c.expr, c.tz, err, c.want)
		}
	}
}
