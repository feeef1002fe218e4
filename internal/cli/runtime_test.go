package cli

import "testing"

func TestGoProcs(t *testing.T) {
	for cpus, want := range map[int]int{1: 4, 2: 4, 3: 4, 4: 5, 8: 9, 64: 65} {
		if got := goProcs(cpus); got != want {
			t.Errorf("goProcs(%d) = %d, want %d", cpus, got, want)
		}
	}
}
