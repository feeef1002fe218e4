package spec

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// TrafficTarget is one share of a function's calls: Percent of them go to
// Revision (0: the current revision, whatever it is then). A client may
// name the revision by its generation (rev-3); the control plane stores
// the revision's id there and its generation in Generation.
type TrafficTarget struct {
	Revision   uint64 `json:"revision"`
	Generation uint64 `json:"generation,omitempty"`
	Percent    int    `json:"percent"`
}

// MaxTrafficTargets bounds a split: each pinned revision runs sandboxes of
// its own.
const MaxTrafficTargets = 8

// Latest names the current revision in a split (TrafficTarget.Revision 0).
const Latest = "latest"

// ValidateTraffic checks a split: at most MaxTrafficTargets targets, each
// revision once, percents in [0, 100] adding up to 100. An empty split is
// valid (everything to the current revision).
func ValidateTraffic(ts []TrafficTarget) error {
	if len(ts) == 0 {
		return nil
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: traffic: %s", ErrInvalid, fmt.Sprintf(format, args...))
	}
	if len(ts) > MaxTrafficTargets {
		return bad("%d targets, at most %d", len(ts), MaxTrafficTargets)
	}
	seen, sum := map[uint64]bool{}, 0
	for _, t := range ts {
		if t.Percent < 0 || t.Percent > 100 {
			return bad("%s: percent %d out of range [0, 100]", t.Name(), t.Percent)
		}
		if seen[t.Revision] {
			return bad("%s is listed twice", t.Name())
		}
		seen[t.Revision] = true
		sum += t.Percent
	}
	if sum != 100 {
		return bad("percents add up to %d, not 100", sum)
	}
	return nil
}

// Name is the target as the CLI writes it: rev-N (its generation where
// known), or latest.
func (t TrafficTarget) Name() string {
	switch {
	case t.Revision == 0:
		return Latest
	case t.Generation > 0:
		return "rev-" + strconv.FormatUint(t.Generation, 10)
	}
	return "rev-" + strconv.FormatUint(t.Revision, 10)
}

// ParseTraffic reads a split as the CLI takes it: "rev-3=90,latest=10"
// (a bare revision number works too: "3=90").
func ParseTraffic(s string) ([]TrafficTarget, error) {
	var out []TrafficTarget
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		k, v, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fmt.Errorf("traffic %q: want REVISION=PERCENT, e.g. rev-3=90,latest=10", part)
		}
		pct, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), "%"))
		if err != nil {
			return nil, fmt.Errorf("traffic %q: percent %q is not a whole number", part, v)
		}
		k = strings.TrimSpace(k)
		var rev uint64
		if k != Latest {
			rev, err = strconv.ParseUint(strings.TrimPrefix(k, "rev-"), 10, 64)
			if err != nil || rev == 0 {
				return nil, fmt.Errorf("traffic %q: %q is not rev-N, N or %s", part, k, Latest)
			}
		}
		out = append(out, TrafficTarget{Revision: rev, Percent: pct})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("traffic %q: no targets", s)
	}
	return out, ValidateTraffic(out)
}

// FormatTraffic writes a split as ParseTraffic reads it.
func FormatTraffic(ts []TrafficTarget) string {
	parts := make([]string, len(ts))
	for i, t := range ts {
		parts[i] = t.Name() + "=" + strconv.Itoa(t.Percent)
	}
	return strings.Join(parts, ",")
}

// NormalizeTraffic drops zero shares and orders a split by revision,
// latest first; a split that sends everything to the current revision,
// whatever it is, becomes nil. A target naming today's current revision
// stays pinned to it: after the next update it is served by that revision,
// not the new one (Knative's traffic semantics).
func NormalizeTraffic(ts []TrafficTarget) []TrafficTarget {
	var out []TrafficTarget
	for _, t := range ts {
		if t.Percent > 0 {
			out = append(out, t)
		}
	}
	if len(out) == 0 || (len(out) == 1 && out[0].Revision == 0) {
		return nil
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Revision < out[j].Revision })
	return out
}

// RevisionFunction names the function that serves a pinned revision of a
// split: NAME_rREV. User names cannot hold '_', so it never collides with
// one; the control plane runs it beside NAME with that revision's spec.
func RevisionFunction(name string, rev uint64) string {
	return name + "_r" + strconv.FormatUint(rev, 10)
}

// SplitOf reports whether name is a RevisionFunction and of which function.
func SplitOf(name string) (fn string, rev uint64, ok bool) {
	i := strings.LastIndex(name, "_r")
	if i <= 0 {
		return "", 0, false
	}
	rev, err := strconv.ParseUint(name[i+2:], 10, 64)
	if err != nil || rev == 0 {
		return "", 0, false
	}
	return name[:i], rev, true
}

// IsRevisionFunction reports whether name is a RevisionFunction: user names
// hold no '_', so any name with one is (cheap enough for the data plane's
// routing).
func IsRevisionFunction(name string) bool { return strings.IndexByte(name, '_') >= 0 }

// Pins reports whether t sends calls to a revision other than f's current
// one, which then runs as its RevisionFunction.
func (f *Function) Pins(t TrafficTarget) bool { return t.Revision != 0 && t.Revision != f.Revision }

// TrafficFunction names the function that serves t's share of f's calls:
// f itself, or the RevisionFunction of the revision t pins.
func (f *Function) TrafficFunction(t TrafficTarget) string {
	if f.Pins(t) {
		return RevisionFunction(f.Name, t.Revision)
	}
	return f.Name
}
