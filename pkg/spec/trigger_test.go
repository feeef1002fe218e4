package spec

import (
	"strings"
	"testing"
	"time"
)

// OpenFaaS's connector annotations make triggers as its connectors read
// them; what they cannot make is refused at deploy.
func TestAnnotationTriggers(t *testing.T) {
	f := &Function{Name: "Report_Fn", Namespace: "team-a", Annotations: map[string]string{"topic": "cron-function, orders.created,orders.created", "schedule": "*/5 * * * *"}}
	ts, err := AnnotationTriggers(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 2 {
		t.Fatalf("%d triggers: %+v", len(ts), ts)
	}
	c, n := ts[0], ts[1]
	if c.Name != "report-fn-cron" || c.Cron == nil || c.Cron.Schedule != "*/5 * * * *" || c.Managed != ManagedByAnnotations || c.Function != "Report_Fn" {
		t.Errorf("cron: %+v", c)
	}
	if n.Name != "report-fn-topic-orders-created" || n.NATS == nil || n.NATS.Subject != "team-a.orders.created" || n.Namespace != "team-a" {
		t.Errorf("nats: %+v %+v", n, n.NATS)
	}
	if ts, err := AnnotationTriggers(&Function{Name: "x"}); err != nil || ts != nil {
		t.Errorf("no annotations: %v %v", ts, err)
	}
	long := strings.Repeat("a", 60)
	ts, err = AnnotationTriggers(&Function{Name: long, Annotations: map[string]string{"topic": "cron-function", "schedule": "@hourly"}})
	if err != nil || len(ts[0].Name) > 63 || !nameRE.MatchString(ts[0].Name) {
		t.Errorf("a long name: %v, %v", ts, err)
	}
	for _, c := range []struct {
		ann  map[string]string
		want string
	}{
		{map[string]string{"topic": "cron-function"}, "needs a schedule"},
		{map[string]string{"schedule": "@hourly"}, "without topic"},
		{map[string]string{"topic": "cron-function", "schedule": "61 * * * *"}, "above maximum"},
		{map[string]string{"topic": "a b"}, "white space"},
	} {
		_, err := AnnotationTriggers(&Function{Name: "f", Annotations: c.ann})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error saying %q", c.ann, err, c.want)
		}
	}
}

func TestTriggerValidate(t *testing.T) {
	ok := Trigger{Name: "t", Function: "f", Cron: &CronSource{Schedule: "@hourly"}}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		mod  func(*Trigger)
		want string
	}{
		{func(t *Trigger) { t.Name = "Bad_Name" }, "name"},
		{func(t *Trigger) { t.Function = "" }, "function: required"},
		{func(t *Trigger) { t.NATS = &NATSSource{Subject: "default.x"} }, "not both"},
		{func(t *Trigger) { t.Cron = nil }, "set cron"},
		{func(t *Trigger) { t.Cron.CatchUp = "all" }, "catch_up"},
		{func(t *Trigger) { t.Path = "no-slash" }, "path"},
		{func(t *Trigger) { t.Headers = map[string]string{"Authorization": "x"} }, "not the trigger's to set"},
		{func(t *Trigger) { t.Headers = map[string]string{"X-A": "a\r\nb"} }, "not a valid header"},
		{func(t *Trigger) { t.Cron, t.NATS = nil, &NATSSource{Subject: "x.>"} }, "under its namespace"},
		{func(t *Trigger) { t.Cron, t.NATS = nil, &NATSSource{Subject: "default.>.x"} }, "last token"},
		{func(t *Trigger) { t.Cron, t.NATS = nil, &NATSSource{Subject: "default.x", Stream: "BRISK_CALLS"} }, "brisk's own"},
		{func(t *Trigger) { t.Cron, t.NATS = nil, &NATSSource{Subject: "$JS.API.>", URL: "nats://a:4222"} }, "server's own"},
		{func(t *Trigger) { t.Cron, t.NATS = nil, &NATSSource{Subject: "x", URL: "http://a:4222"} }, "nats://host:port"},
		{func(t *Trigger) {
			t.Namespace = "brisk"
			t.Cron, t.NATS = nil, &NATSSource{Subject: "brisk.calls.>"}
		}, "brisk's own"},
		{func(t *Trigger) { t.Cron, t.NATS = nil, &NATSSource{Subject: "default.x", CredentialsSecret: "s"} }, "external server"},
	} {
		tr := ok
		cron := *ok.Cron
		tr.Cron = &cron
		c.mod(&tr)
		if err := tr.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error saying %q", tr, err, c.want)
		}
	}
}

// A start anchors "@every" ticks at start + k·D and holds other schedules
// back until it.
func TestScheduleStart(t *testing.T) {
	start := time.Date(2026, 12, 1, 3, 15, 0, 0, time.UTC)
	every, err := ParseSchedule(&CronSource{Schedule: "@every 6h", Start: start})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ at, next time.Time }{
		{start.Add(-48 * time.Hour), start},
		{start.Add(-time.Nanosecond), start},
		{start, start.Add(6 * time.Hour)},
		{start.Add(5 * time.Hour), start.Add(6 * time.Hour)},
		{start.Add(6*time.Hour + time.Second), start.Add(12 * time.Hour)},
	} {
		if got := every.Next(c.at); !got.Equal(c.next) {
			t.Errorf("@every 6h from %v: Next(%v) = %v, want %v", start, c.at, got, c.next)
		}
	}
	hourly, err := ParseSchedule(&CronSource{Schedule: "0 * * * *", Start: start})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := hourly.Next(start.Add(-72*time.Hour)), start.Add(45*time.Minute); !got.Equal(want) {
		t.Errorf("0 * * * * from %v: first tick %v, want %v", start, got, want)
	}
	if got, want := hourly.Next(start.Add(2*time.Hour)), start.Add(2*time.Hour+45*time.Minute); !got.Equal(want) {
		t.Errorf("0 * * * * after the start: %v, want %v", got, want)
	}
}
