package spec

import (
	"errors"
	"strings"
	"testing"
)

func TestParseTraffic(t *testing.T) {
	ts, err := ParseTraffic(" rev-3=90, latest=10% ")
	if err != nil || len(ts) != 2 || ts[0] != (TrafficTarget{Revision: 3, Percent: 90}) || ts[1] != (TrafficTarget{Percent: 10}) {
		t.Fatalf("ParseTraffic: %+v %v", ts, err)
	}
	if got := FormatTraffic(ts); got != "rev-3=90,latest=10" {
		t.Fatalf("FormatTraffic: %q", got)
	}
	for in, want := range map[string]string{
		"":                    "no targets",
		"rev-3":               "REVISION=PERCENT",
		"rev-3=x":             "not a whole number",
		"rev-0=100":           "not rev-N",
		"foo=100":             "not rev-N",
		"rev-3=50":            "add up to 50",
		"3=50,rev-3=50":       "twice",
		"rev-3=101,latest=-1": "out of range",
		"1=10,2=10,3=10,4=10,5=10,6=10,7=10,8=10,latest=20": "at most 8",
	} {
		if _, err := ParseTraffic(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseTraffic(%q): %v, want an error with %q", in, err, want)
		}
	}
}

func TestNormalizeTrafficAndNames(t *testing.T) {
	if got := NormalizeTraffic([]TrafficTarget{{Revision: 0, Percent: 100}, {Revision: 4, Percent: 0}}); got != nil {
		t.Fatalf("all to latest: %+v, want nil", got)
	}
	got := NormalizeTraffic([]TrafficTarget{{Revision: 7, Percent: 60}, {Revision: 0, Percent: 40}})
	if len(got) != 2 || got[0].Revision != 0 || got[1].Revision != 7 {
		t.Fatalf("order: %+v", got)
	}
	// A pin of one revision alone stays a split: the next update must not
	// take its calls.
	if got := NormalizeTraffic([]TrafficTarget{{Revision: 7, Percent: 100}}); len(got) != 1 {
		t.Fatalf("pinned alone: %+v", got)
	}
	name := RevisionFunction("web", 12)
	if fn, rev, ok := SplitOf(name); !ok || fn != "web" || rev != 12 {
		t.Fatalf("SplitOf(%q) = %q %d %v", name, fn, rev, ok)
	}
	if _, _, ok := SplitOf("web-r12"); ok {
		t.Fatal("a user name taken for a revision function")
	}
	f := &Function{Name: name, Builtin: "trace"}
	f.ApplyDefaults()
	if err := f.Validate(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a user could name a function %q: %v", name, err)
	}
}
