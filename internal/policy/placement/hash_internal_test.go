package placement

import (
	"slices"
	"testing"

	"github.com/brisk-faas/brisk/internal/hashx"
)

// naiveCoprimeSteps transcribes OpenWhisk's pairwiseCoprimeNumbersUntil:
// (1 to x) folded, keeping cur when gcd(cur, x) == 1 and cur is coprime
// with every number kept so far; [1] when nothing is kept.
func naiveCoprimeSteps(x int) []int {
	gcd := func(a, b int) int {
		for b != 0 {
			a, b = b, a%b
		}
		return a
	}
	var kept []int
	for cur := 1; cur <= x; cur++ {
		ok := gcd(cur, x) == 1
		for _, k := range kept {
			ok = ok && gcd(k, cur) == 1
		}
		if ok {
			kept = append(kept, cur)
		}
	}
	if len(kept) == 0 {
		return []int{1}
	}
	return kept
}

func TestCoprimeStepsMatchOpenWhisk(t *testing.T) {
	if got := coprimeSteps(10); !slices.Equal(got, []int{1, 3, 7}) {
		t.Errorf("coprimeSteps(10) = %v, want [1 3 7] (OpenWhisk's example)", got)
	}
	for n := range 600 {
		if got, want := coprimeSteps(n), naiveCoprimeSteps(n); !slices.Equal(got, want) {
			t.Fatalf("coprimeSteps(%d) = %v, OpenWhisk's definition gives %v", n, got, want)
		}
	}
}

// Every step of the list walks all n indices in n steps.
func TestCoprimeStepsVisitEveryNode(t *testing.T) {
	for n := 1; n < 200; n++ {
		for _, step := range coprimeSteps(n) {
			seen := make([]bool, n)
			i := n / 3
			for range n {
				if seen[i] {
					t.Fatalf("n=%d step=%d revisits %d", n, step, i)
				}
				seen[i] = true
				i = (i + step) % n
			}
		}
	}
}

// The hash is fixed: the control plane, the simulator and later versions
// must agree on every function's home.
func TestHashKeyIsStable(t *testing.T) {
	if got := hashx.FNV1a(hashx.Offset64, "a"); got != 0xaf63dc4c8601ec8c { // the FNV-1a 64 test vector
		t.Errorf(`hashx.FNV1a("a") = %#x, want 0xaf63dc4c8601ec8c`, got)
	}
	if got := hashKey(""); got != hashx.Mix(hashx.Offset64) {
		t.Errorf(`hashKey("") = %#x`, got)
	}
	// Pinned values: changing the hash moves every function's home.
	for key, want := range map[string]uint64{
		"ns/fn-1":       0x6f0774061f90f394,
		"default/hello": 0xe1ffb916ce103941,
	} {
		if got := hashKey(key); got != want {
			t.Errorf("hashKey(%q) = %#x, want %#x", key, got, want)
		}
	}
}
