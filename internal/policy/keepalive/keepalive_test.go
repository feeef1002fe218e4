package keepalive_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/policy/keepalive"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestNew(t *testing.T) {
	for _, name := range append(keepalive.Names(), "") {
		if p, err := keepalive.New(name, 0); err != nil || p == nil {
			t.Errorf("New(%q) = %v, %v", name, p, err)
		}
	}
	_, err := keepalive.New("lru", 0)
	if !errors.Is(err, keepalive.ErrUnknownPolicy) {
		t.Fatalf("New(lru) err = %v, want ErrUnknownPolicy", err)
	}
	for _, name := range keepalive.Names() {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error %q does not name %q", err, name)
		}
	}
	if p, _ := keepalive.New("", 0); p.(*keepalive.TTL).TTL != keepalive.DefaultTTL {
		t.Errorf("default policy is not a %v TTL", keepalive.DefaultTTL)
	}
}

func TestTTLExpiry(t *testing.T) {
	for _, tt := range []struct {
		ttl, want time.Duration
	}{{0, 10 * time.Minute}, {-time.Second, 10 * time.Minute}, {time.Minute, time.Minute}} {
		p, _ := keepalive.New(keepalive.NameTTL, tt.ttl)
		if p.Expired(t0.Add(tt.want-time.Nanosecond), t0) {
			t.Errorf("ttl %v: expired before %v", tt.ttl, tt.want)
		}
		if !p.Expired(t0.Add(tt.want), t0) {
			t.Errorf("ttl %v: not expired at %v", tt.ttl, tt.want)
		}
		p.Touch(t0.Add(tt.want), "f", 1) // no effect: the TTL counts from LastUsed
		if !p.Expired(t0.Add(tt.want), t0) {
			t.Errorf("ttl %v: Touch changed expiry", tt.ttl)
		}
	}
}

func TestTTLEvictsLeastRecentlyUsed(t *testing.T) {
	p := keepalive.NewTTL(0)
	cands := []keepalive.Candidate{
		{Key: "a", MemoryMB: 100, LastUsed: t0.Add(3 * time.Second)},
		{Key: "b", MemoryMB: 100, LastUsed: t0.Add(1 * time.Second)},
		{Key: "c", MemoryMB: 100, LastUsed: t0.Add(2 * time.Second)},
		{Key: "d", MemoryMB: 100, LastUsed: t0.Add(1 * time.Second)}, // ties b: lower index first
	}
	for _, tt := range []struct {
		need int64
		want []int
	}{
		{0, nil},
		{1, []int{1}},
		{100, []int{1}},
		{101, []int{1, 3}},
		{300, []int{1, 3, 2}},
		{1000, []int{1, 3, 2, 0}}, // not enough in all: all of them
	} {
		if got := p.Evict(t0, cands, tt.need); !slices.Equal(got, tt.want) {
			t.Errorf("need %d MB: Evict = %v, want %v", tt.need, got, tt.want)
		}
	}
}

func TestGDNeverExpiresUnlessConfigured(t *testing.T) {
	p, _ := keepalive.New(keepalive.NameGD, 0)
	if p.Expired(t0.Add(365*24*time.Hour), t0) {
		t.Error("gd without a TTL expired a sandbox")
	}
	p, _ = keepalive.New(keepalive.NameGD, time.Hour)
	if p.Expired(t0.Add(59*time.Minute), t0) || !p.Expired(t0.Add(time.Hour), t0) {
		t.Error("gd with a 1 h TTL does not expire at 1 h")
	}
}

func touch(p keepalive.Policy, key string, n int) {
	for range n {
		p.Touch(t0, key, 1)
	}
}

// The cheap, large, rarely used sandbox goes before the costly, small,
// frequently used one, whichever was used last.
func TestGDEvictsCheapLargeRareFirst(t *testing.T) {
	p := keepalive.NewGD(0)
	touch(p, "cheap-large-rare", 1)
	touch(p, "costly-small-frequent", 50)
	cands := []keepalive.Candidate{
		{Key: "costly-small-frequent", MemoryMB: 128, ColdStart: 3 * time.Second, Warm: 100 * time.Millisecond,
			LastUsed: t0},
		{Key: "cheap-large-rare", MemoryMB: 2048, ColdStart: 600 * time.Millisecond, Warm: 500 * time.Millisecond,
			LastUsed: t0.Add(time.Minute)}, // more recently used: LRU would keep it
	}
	if got := p.Evict(t0, cands, 1); !slices.Equal(got, []int{1}) {
		t.Errorf("Evict = %v, want [1] (the cheap, large, rare one)", got)
	}
	// Each factor alone decides too.
	touch(p, "x", 3)
	for _, tt := range []struct {
		label string
		a, b  keepalive.Candidate // a must go first
	}{
		{"larger goes first", keepalive.Candidate{Key: "x", MemoryMB: 1024, ColdStart: time.Second},
			keepalive.Candidate{Key: "x", MemoryMB: 128, ColdStart: time.Second}},
		{"cheaper cold start goes first", keepalive.Candidate{Key: "x", MemoryMB: 128, ColdStart: time.Second},
			keepalive.Candidate{Key: "x", MemoryMB: 128, ColdStart: 2 * time.Second}},
		{"rarer goes first", keepalive.Candidate{Key: "cheap-large-rare", MemoryMB: 128, ColdStart: time.Second},
			keepalive.Candidate{Key: "costly-small-frequent", MemoryMB: 128, ColdStart: time.Second}},
	} {
		if got := p.Evict(t0, []keepalive.Candidate{tt.b, tt.a}, 1); !slices.Equal(got, []int{1}) {
			t.Errorf("%s: Evict = %v, want [1]", tt.label, got)
		}
	}
}

// Clock aging: evictions raise the Clock to the victim's priority; a
// function invoked afterwards starts from that Clock, so an old favourite
// that is no longer invoked is eventually evicted before it.
func TestGDClockAging(t *testing.T) {
	p := keepalive.NewGD(0)
	cost := keepalive.Candidate{MemoryMB: 100, ColdStart: 2 * time.Second, Warm: time.Second} // 0.01 per use
	old, victim, fresh := cost, cost, cost
	old.Key, victim.Key, fresh.Key = "old-favourite", "victim", "fresh"
	touch(p, old.Key, 10)    // priority 0 + 10 × 0.01 = 0.1
	touch(p, victim.Key, 50) // 0.5
	if got := p.Clock(); got != 0 {
		t.Fatalf("Clock = %v before any eviction, want 0", got)
	}
	if got := p.Evict(t0, []keepalive.Candidate{victim}, 1); !slices.Equal(got, []int{0}) {
		t.Fatalf("Evict = %v, want [0]", got)
	}
	if got := p.Clock(); got < 0.5-1e-9 || got > 0.5+1e-9 {
		t.Fatalf("Clock = %v after evicting a priority-0.5 sandbox, want 0.5", got)
	}
	touch(p, fresh.Key, 1) // priority 0.5 + 0.01
	if got, want := p.Priority(fresh), 0.51; got < want-1e-9 || got > want+1e-9 {
		t.Errorf("fresh priority = %v, want %v", got, want)
	}
	if got := p.Evict(t0, []keepalive.Candidate{fresh, old}, 1); !slices.Equal(got, []int{1}) {
		t.Errorf("Evict = %v, want [1]: the old favourite (10 uses long ago) goes before the fresh function", got)
	}
	// The Clock never goes back: evicting the low-priority favourite
	// (0.1) leaves it at 0.5.
	if got := p.Clock(); got < 0.5-1e-9 {
		t.Errorf("Clock went back to %v", got)
	}
	// Touching the favourite again re-bases it on the current Clock.
	touch(p, old.Key, 1) // 0.5 + 11 × 0.01 = 0.61
	if got := p.Evict(t0, []keepalive.Candidate{old, fresh}, 1); !slices.Equal(got, []int{1}) {
		t.Errorf("after a new call the favourite outranks fresh again: Evict = %v, want [1]", got)
	}
}

func TestGDForgetAndUnknownKeys(t *testing.T) {
	p := keepalive.NewGD(0)
	c := keepalive.Candidate{Key: "f", MemoryMB: 100, ColdStart: 2 * time.Second, Warm: time.Second, Uses: 7}
	if got := p.Priority(c); got < 0.07-1e-9 || got > 0.07+1e-9 {
		t.Errorf("untouched function: priority %v, want Uses × cost = 0.07", got)
	}
	touch(p, "f", 3)
	if got := p.Priority(c); got < 0.03-1e-9 || got > 0.03+1e-9 {
		t.Errorf("touched 3 times: priority %v, want 0.03", got)
	}
	p.Forget("f")
	if got := p.Priority(c); got < 0.07-1e-9 || got > 0.07+1e-9 {
		t.Errorf("forgotten: priority %v, want 0.07 again", got)
	}
	// Degenerate inputs: negative cost and zero memory do not divide by zero.
	d := keepalive.Candidate{Key: "g", ColdStart: time.Second, Warm: 2 * time.Second}
	touch(p, "g", 1)
	if got := p.Priority(d); got != 0 {
		t.Errorf("negative cost: priority %v, want 0", got)
	}
}

// Property: for random candidates, every policy returns distinct valid
// indices, the shortest prefix of its order that frees needMB (or all of
// them), and GD returns them by ascending priority.
func TestEvictProperties(t *testing.T) {
	gen := rand.New(rand.NewPCG(1, 2))
	for iter := range 3000 {
		for _, name := range keepalive.Names() {
			p, _ := keepalive.New(name, 0)
			keys := 1 + gen.IntN(6)
			for range gen.IntN(30) {
				p.Touch(t0, fmt.Sprint(gen.IntN(keys)), 1)
			}
			cands := make([]keepalive.Candidate, gen.IntN(12))
			var total int64
			for i := range cands {
				cands[i] = keepalive.Candidate{
					Key:       fmt.Sprint(gen.IntN(keys)),
					MemoryMB:  64 * gen.Int64N(9),
					LastUsed:  t0.Add(time.Duration(gen.IntN(5)) * time.Second),
					Uses:      gen.Int64N(5),
					ColdStart: time.Duration(gen.IntN(3000)) * time.Millisecond,
					Warm:      time.Duration(gen.IntN(1000)) * time.Millisecond,
				}
				total += cands[i].MemoryMB
			}
			need := gen.Int64N(total + 200)
			var prio []float64
			if gd, ok := p.(*keepalive.GD); ok {
				for _, c := range cands {
					prio = append(prio, gd.Priority(c))
				}
			}
			got := p.Evict(t0, cands, need)
			if err := checkEviction(cands, need, got, prio); err != nil {
				t.Fatalf("iter %d %s: %v\ncands %+v need %d got %v", iter, name, err, cands, need, got)
			}
		}
	}
}

// checkEviction is the property TestEvictProperties checks; prio, if not
// nil, must be ascending along got.
func checkEviction(cands []keepalive.Candidate, need int64, got []int, prio []float64) error {
	seen := make(map[int]bool)
	var freed int64
	for k, i := range got {
		if i < 0 || i >= len(cands) || seen[i] {
			return fmt.Errorf("index %d invalid or repeated", i)
		}
		seen[i] = true
		if freed >= need {
			return fmt.Errorf("%d MB already freed before victim %d: not the shortest prefix", freed, k)
		}
		freed += cands[i].MemoryMB
		if prio != nil && k > 0 && prio[i] < prio[got[k-1]] {
			return fmt.Errorf("victim %d has priority %v below the previous %v", k, prio[i], prio[got[k-1]])
		}
	}
	if need > 0 && freed < need && len(got) != len(cands) {
		return fmt.Errorf("freed %d < %d MB with candidates left", freed, need)
	}
	return nil
}

func TestCheckEvictionCanFail(t *testing.T) {
	cands := []keepalive.Candidate{{MemoryMB: 100}, {MemoryMB: 100}, {MemoryMB: 100}}
	for _, tt := range []struct {
		label string
		need  int64
		got   []int
		prio  []float64
	}{
		{"repeated index", 300, []int{0, 0, 1}, nil},
		{"out of range", 100, []int{3}, nil},
		{"longer than needed", 100, []int{0, 1}, nil},
		{"not enough, candidates left", 300, []int{0, 1}, nil},
		{"priority order", 200, []int{0, 1}, []float64{2, 1, 3}},
	} {
		if checkEviction(cands, tt.need, tt.got, tt.prio) == nil {
			t.Errorf("%s: checkEviction accepted %v", tt.label, tt.got)
		}
	}
}
