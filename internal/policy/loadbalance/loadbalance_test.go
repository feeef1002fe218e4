package loadbalance_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/brisk-faas/brisk/internal/policy/loadbalance"
)

// trackers builds endpoints with the given capacities and pre-reserved loads.
func trackers(caps, loads []int) []*loadbalance.Tracker {
	eps := make([]*loadbalance.Tracker, len(caps))
	for i, c := range caps {
		eps[i] = loadbalance.NewTracker(c)
		eps[i].ID = fmt.Sprint("ep", i)
		for range loads[i] {
			if !eps[i].TryReserve() {
				panic("test setup: load above capacity")
			}
		}
	}
	return eps
}

func loadsOf(eps []*loadbalance.Tracker) []int {
	out := make([]int, len(eps))
	for i, t := range eps {
		out[i] = t.InFlight()
	}
	return out
}

func reservable(t *loadbalance.Tracker) bool {
	return t.Capacity() == 0 || t.InFlight() < t.Capacity()
}

// policies returns a fresh instance of every named policy (knative with cc=0,
// i.e. power-of-two, is covered by its own name).
func policies(seed uint64) map[string]loadbalance.Policy {
	rnd := loadbalance.NewRand(seed)
	return map[string]loadbalance.Policy{
		loadbalance.NameLeastLoaded:    loadbalance.NewLeastLoaded(rnd),
		loadbalance.NameRoundRobin:     loadbalance.NewRoundRobin(),
		loadbalance.NameFirstAvailable: loadbalance.NewFirstAvailable(),
		loadbalance.NamePowerOfTwo:     loadbalance.NewPowerOfTwo(rnd),
		loadbalance.NameRandom:         loadbalance.NewRandom(rnd),
	}
}

func TestTracker(t *testing.T) {
	tr := loadbalance.NewTracker(2)
	if tr.Capacity() != 2 || tr.InFlight() != 0 {
		t.Fatalf("new tracker: capacity %d in-flight %d", tr.Capacity(), tr.InFlight())
	}
	if !tr.TryReserve() || !tr.TryReserve() {
		t.Fatal("could not reserve 2 slots of 2")
	}
	if tr.TryReserve() {
		t.Fatal("reserved a third slot of 2")
	}
	if tr.InFlight() != 2 {
		t.Fatalf("in-flight %d, want 2", tr.InFlight())
	}
	tr.Release()
	if !tr.TryReserve() {
		t.Fatal("could not reserve after a release")
	}

	unlimited := loadbalance.NewTracker(0)
	for range 1000 {
		if !unlimited.TryReserve() {
			t.Fatal("unlimited tracker refused a reservation")
		}
	}
	if unlimited.InFlight() != 1000 {
		t.Fatalf("unlimited in-flight %d, want 1000", unlimited.InFlight())
	}

	mustPanic(t, "Release without reservation", func() { loadbalance.NewTracker(1).Release() })
	mustPanic(t, "negative capacity", func() { loadbalance.NewTracker(-1) })
}

func mustPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Errorf("%s: did not panic", what)
		}
	}()
	f()
}

// TestPick is a behaviour table: want lists acceptable indices, nil means
// ok=false. Each case runs with several seeds.
func TestPick(t *testing.T) {
	tests := []struct {
		label  string
		policy string
		caps   []int
		loads  []int
		want   []int
	}{
		{"least-loaded picks the minimum", loadbalance.NameLeastLoaded, []int{0, 0, 0, 0}, []int{3, 4, 1, 2}, []int{2}},
		{"least-loaded skips a full minimum", loadbalance.NameLeastLoaded, []int{5, 1, 5}, []int{3, 1, 2}, []int{2}},
		{"least-loaded ties", loadbalance.NameLeastLoaded, []int{0, 0, 0}, []int{2, 1, 1}, []int{1, 2}},
		{"least-loaded all full", loadbalance.NameLeastLoaded, []int{1, 2}, []int{1, 2}, nil},
		{"least-loaded no endpoints", loadbalance.NameLeastLoaded, nil, nil, nil},

		{"first-available picks first free", loadbalance.NameFirstAvailable, []int{1, 1, 1, 1}, []int{1, 1, 0, 0}, []int{2}},
		{"first-available ignores load", loadbalance.NameFirstAvailable, []int{3, 3}, []int{2, 0}, []int{0}},
		{"first-available all full", loadbalance.NameFirstAvailable, []int{1, 1}, []int{1, 1}, nil},

		{"round-robin skips full", loadbalance.NameRoundRobin, []int{1, 1, 1}, []int{1, 1, 0}, []int{2}},
		{"round-robin all full", loadbalance.NameRoundRobin, []int{1, 1}, []int{1, 1}, nil},
		{"round-robin no endpoints", loadbalance.NameRoundRobin, nil, nil, nil},

		{"power-of-two picks the lower of two", loadbalance.NamePowerOfTwo, []int{0, 0}, []int{5, 1}, []int{1}},
		{"power-of-two never picks the unique max", loadbalance.NamePowerOfTwo, []int{0, 0, 0}, []int{3, 1, 2}, []int{1, 2}},
		{"power-of-two respects capacity", loadbalance.NamePowerOfTwo, []int{1, 9}, []int{0, 5}, []int{0}},
		{"power-of-two falls back past two full samples", loadbalance.NamePowerOfTwo, []int{1, 1, 1, 1}, []int{1, 1, 0, 1}, []int{2}},
		{"power-of-two single endpoint", loadbalance.NamePowerOfTwo, []int{0}, []int{7}, []int{0}},
		{"power-of-two single full endpoint", loadbalance.NamePowerOfTwo, []int{1}, []int{1}, nil},

		{"random only free endpoints", loadbalance.NameRandom, []int{1, 1, 1, 1}, []int{1, 0, 1, 1}, []int{1}},
		{"random all full", loadbalance.NameRandom, []int{1, 1}, []int{1, 1}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.label, func(t *testing.T) {
			for seed := range uint64(50) {
				eps := trackers(tt.caps, tt.loads)
				p := policies(seed)[tt.policy]
				idx, ok := p.Pick(eps)
				if tt.want == nil {
					if ok || idx != -1 {
						t.Fatalf("seed %d: Pick = %d, %v; want -1, false", seed, idx, ok)
					}
					if got := fmt.Sprint(loadsOf(eps)); got != fmt.Sprint(tt.loads) {
						t.Fatalf("seed %d: failed Pick changed loads to %s", seed, got)
					}
					continue
				}
				if !ok || !contains(tt.want, idx) {
					t.Fatalf("seed %d: Pick = %d, %v; want one of %v", seed, idx, ok, tt.want)
				}
				if eps[idx].InFlight() != tt.loads[idx]+1 {
					t.Fatalf("seed %d: Pick did not reserve: in-flight %d, was %d", seed, eps[idx].InFlight(), tt.loads[idx])
				}
			}
		})
	}
}

func contains(xs []int, x int) bool {
	for _, y := range xs {
		if x == y {
			return true
		}
	}
	return false
}

// pickRelease picks calls times, releasing each reservation at once so the
// loads stay as they are, and returns the indices (-1 for ok=false).
func pickRelease(p loadbalance.Policy, eps []*loadbalance.Tracker, calls int) []int {
	out := make([]int, calls)
	for i := range out {
		idx, ok := p.Pick(eps)
		if ok {
			eps[idx].Release()
		}
		out[i] = idx
	}
	return out
}

func TestRoundRobinRotates(t *testing.T) {
	p := loadbalance.NewRoundRobin()
	eps := trackers([]int{0, 0, 0}, []int{0, 0, 0})
	if got, want := fmt.Sprint(pickRelease(p, eps, 7)), "[0 1 2 0 1 2 0]"; got != want {
		t.Errorf("picks = %s, want %s", got, want)
	}

	// Endpoint 1 is full. Knative sets the cursor past the endpoint it
	// chose, so after skipping 1 for 2 the next pick starts at 3, not 2.
	p = loadbalance.NewRoundRobin()
	eps = trackers([]int{0, 1, 0, 0}, []int{0, 1, 0, 0})
	if got, want := fmt.Sprint(pickRelease(p, eps, 6)), "[0 2 3 0 2 3]"; got != want {
		t.Errorf("with endpoint 1 full: picks = %s, want %s", got, want)
	}

	// A failed pick leaves the rotation where it was.
	p = loadbalance.NewRoundRobin()
	eps = trackers([]int{1, 1, 1}, []int{0, 0, 0})
	if idx, ok := p.Pick(eps); !ok || idx != 0 {
		t.Fatalf("Pick = %d, %v; want 0", idx, ok)
	}
	full := trackers([]int{1, 1, 1}, []int{1, 1, 1})
	if _, ok := p.Pick(full); ok {
		t.Fatal("picked from a full set")
	}
	eps[0].Release()
	if got, want := fmt.Sprint(pickRelease(p, eps, 3)), "[1 2 0]"; got != want {
		t.Errorf("after a failed pick: picks = %s, want %s", got, want)
	}
}

func TestFirstAvailableFillsInOrder(t *testing.T) {
	p := loadbalance.NewFirstAvailable()
	eps := trackers([]int{2, 2, 2}, []int{0, 0, 0})
	var got []int
	for range 7 {
		idx, _ := p.Pick(eps) // no release: slots fill up
		got = append(got, idx)
	}
	if want := "[0 0 1 1 2 2 -1]"; fmt.Sprint(got) != want {
		t.Errorf("picks = %v, want %s", got, want)
	}
	eps[1].Release()
	if idx, ok := p.Pick(eps); !ok || idx != 1 {
		t.Errorf("after releasing endpoint 1: Pick = %d, %v; want 1", idx, ok)
	}
}

// frequencies counts the choices of calls picks with immediate release.
func frequencies(p loadbalance.Policy, eps []*loadbalance.Tracker, calls int) []int {
	count := make([]int, len(eps))
	for _, idx := range pickRelease(p, eps, calls) {
		if idx >= 0 {
			count[idx]++
		}
	}
	return count
}

func within(got, want, tol int) bool { return got >= want-tol && got <= want+tol }

func TestPowerOfTwoDistribution(t *testing.T) {
	// Loads 3,1,2: pairs {0,1}->1, {0,2}->2, {1,2}->1, each pair with
	// probability 1/3, so endpoint 1 gets 2/3 and endpoint 2 gets 1/3.
	p := loadbalance.NewPowerOfTwo(loadbalance.NewRand(1))
	c := frequencies(p, trackers([]int{0, 0, 0}, []int{3, 1, 2}), 6000)
	if c[0] != 0 || !within(c[1], 4000, 250) || !within(c[2], 2000, 250) {
		t.Errorf("choices %v, want about [0 4000 2000]", c)
	}
	// Equal loads: the coin flip splits evenly.
	c = frequencies(p, trackers([]int{0, 0}, []int{4, 4}), 6000)
	if !within(c[0], 3000, 250) {
		t.Errorf("tie choices %v, want about [3000 3000]", c)
	}
}

func TestLeastLoadedTiesUniform(t *testing.T) {
	p := loadbalance.NewLeastLoaded(loadbalance.NewRand(1))
	c := frequencies(p, trackers([]int{0, 0, 0, 0, 0}, []int{2, 2, 5, 2, 2}), 8000)
	for i, want := range []int{2000, 2000, 0, 2000, 2000} {
		if !within(c[i], want, 250) {
			t.Errorf("choices %v, want about [2000 2000 0 2000 2000]", c)
			break
		}
	}
}

func TestRandomUniform(t *testing.T) {
	p := loadbalance.NewRandom(loadbalance.NewRand(1))
	c := frequencies(p, trackers([]int{0, 0, 0, 0}, []int{0, 9, 3, 1}), 8000)
	for i := range c {
		if !within(c[i], 2000, 250) {
			t.Errorf("choices %v, want about 2000 each", c)
			break
		}
	}
}

func TestKnativeChoosesByContainerConcurrency(t *testing.T) {
	rnd := loadbalance.NewRand(3)
	// The same scenario tells the three policies apart: three endpoints of
	// capacity 4 (unlimited for cc=0) with loads 2, 0, 1, picked with release.
	tests := []struct {
		cc   int
		want string
	}{
		{0, ""},               // power-of-two: checked statistically below
		{1, "[0 0 0 0 0 0]"},  // first-available
		{3, "[0 0 0 0 0 0]"},  // first-available
		{4, "[0 1 2 0 1 2]"},  // round-robin
		{10, "[0 1 2 0 1 2]"}, // round-robin
	}
	for _, tt := range tests {
		capacity := 4
		if tt.cc == 0 {
			capacity = 0
		}
		eps := trackers([]int{capacity, capacity, capacity}, []int{2, 0, 1})
		got := pickRelease(loadbalance.NewKnative(tt.cc, rnd), eps, 6)
		if tt.cc == 0 {
			// Pairs {0,2} pick 2; check the weaker property on all picks.
			for _, idx := range got {
				if idx == 0 {
					t.Errorf("cc=0: picked the most loaded endpoint: %v", got)
				}
			}
			if c := frequencies(loadbalance.NewKnative(0, rnd), eps, 3000); !within(c[1], 2000, 200) {
				t.Errorf("cc=0: choices %v, want power-of-two's about [0 2000 1000]", c)
			}
			continue
		}
		if fmt.Sprint(got) != tt.want {
			t.Errorf("cc=%d: picks %v, want %s", tt.cc, got, tt.want)
		}
	}
	mustPanic(t, "negative cc", func() { loadbalance.NewKnative(-1, rnd) })
}

func TestNew(t *testing.T) {
	rnd := loadbalance.NewRand(1)
	for _, name := range append(loadbalance.Names(), "") {
		if p, err := loadbalance.New(name, 0, rnd); err != nil || p == nil {
			t.Errorf("New(%q) = %v, %v", name, p, err)
		}
	}
	_, err := loadbalance.New("weighted", 0, rnd)
	if !errors.Is(err, loadbalance.ErrUnknownPolicy) {
		t.Fatalf("New(weighted) err = %v, want ErrUnknownPolicy", err)
	}
	for _, name := range loadbalance.Names() {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error %q does not name allowed value %q", err, name)
		}
	}
	if _, err := loadbalance.New(loadbalance.NameKnative, -1, rnd); err == nil {
		t.Error("New with cc=-1 succeeded")
	}
	for _, tt := range []struct {
		name    string
		cc      int
		wantErr bool
	}{
		{"", 0, true}, {loadbalance.NamePowerOfTwo, 0, true}, {loadbalance.NameRandom, 0, true},
		{loadbalance.NameKnative, 0, true}, {loadbalance.NameKnative, 1, false},
		{loadbalance.NameRoundRobin, 0, false}, {loadbalance.NameFirstAvailable, 0, false},
	} {
		if _, err := loadbalance.New(tt.name, tt.cc, nil); (err != nil) != tt.wantErr {
			t.Errorf("New(%q, %d, nil rnd) err = %v, want error %v", tt.name, tt.cc, err, tt.wantErr)
		}
	}
	// "" is least-loaded: same decisions for the same seed.
	eps := trackers([]int{0, 0, 0, 0}, []int{1, 0, 0, 1})
	a, _ := loadbalance.New("", 0, loadbalance.NewRand(5))
	b := loadbalance.NewLeastLoaded(loadbalance.NewRand(5))
	if x, y := fmt.Sprint(pickRelease(a, eps, 30)), fmt.Sprint(pickRelease(b, eps, 30)); x != y {
		t.Errorf(`New("") picks %s, NewLeastLoaded picks %s`, x, y)
	}
}

func TestNewRand(t *testing.T) {
	// splitmix64's published first output for seed 0.
	if got := loadbalance.NewRand(0)(); got != 0xe220a8397b1dcdaf {
		t.Errorf("first value for seed 0 = %#x, want 0xe220a8397b1dcdaf", got)
	}
	a, b, c := loadbalance.NewRand(9), loadbalance.NewRand(9), loadbalance.NewRand(10)
	same, differ := true, false
	for range 100 {
		x, y, z := a(), b(), c()
		same = same && x == y
		differ = differ || x != z
	}
	if !same || !differ {
		t.Errorf("same seed equal: %v (want true); different seeds differ: %v (want true)", same, differ)
	}
}

func TestPickDoesNotAllocate(t *testing.T) {
	eps := trackers([]int{0, 4, 4, 0, 4, 4, 4, 4}, []int{3, 1, 2, 0, 4, 2, 1, 3})
	for name, p := range policies(1) {
		allocs := testing.AllocsPerRun(200, func() {
			if idx, ok := p.Pick(eps); ok {
				eps[idx].Release()
			}
		})
		if allocs != 0 {
			t.Errorf("%s: Pick allocates %.1f times per call, want 0", name, allocs)
		}
	}
}
