package purity

import (
	"slices"
	"strings"
	"testing"
)

// The checkers must be able to fail: run them on known-bad input.

func TestViolationsReportsBannedDependencies(t *testing.T) {
	const m = "example.com/brisk"
	pkgs := []Package{
		{ImportPath: m + "/internal/policy/good", Imports: []string{"net/netip", "sort"}, Deps: []string{"net/netip", "sort"}},
		{ImportPath: m + "/internal/policy/bad", Imports: []string{m + "/internal/x"},
			Deps: []string{m + "/internal/x", m + "/internal/clock", "net"}},
		{ImportPath: m + "/internal/x", Imports: []string{"net", m + "/internal/clock"}},
		{ImportPath: m + "/internal/policy/grpcuser", Deps: []string{"google.golang.org/grpc/codes", "github.com/containerdx/ok"}},
		{ImportPath: m + "/internal/dataplane", Deps: []string{"net/http"}}, // not a policy package
	}
	banned := []Banned{
		{Path: "net", Why: "no I/O"},
		{Path: "google.golang.org/grpc", Subtree: true, Why: "no I/O"},
		{Path: "github.com/containerd", Subtree: true, Why: "no I/O"},
		{Path: m + "/internal/clock", Subtree: true, Why: "time as a value"},
		{Path: "os/exec", Direct: true, Why: "no processes"},
	}
	pkgs = append(pkgs, Package{ImportPath: m + "/internal/policy/execer", Imports: []string{m + "/internal/x"}, Deps: []string{m + "/internal/x", "os/exec"}},
		Package{ImportPath: m + "/internal/policy/direct", Imports: []string{"os/exec"}, Deps: []string{"os/exec"}})
	got := Violations(pkgs, func(p string) bool { return strings.HasPrefix(p, m+"/internal/policy/") }, banned)
	want := []string{
		"example.com/brisk/internal/policy/bad imports example.com/brisk/internal/clock (example.com/brisk/internal/policy/bad -> example.com/brisk/internal/x -> example.com/brisk/internal/clock)",
		"example.com/brisk/internal/policy/bad imports net (example.com/brisk/internal/policy/bad -> example.com/brisk/internal/x -> net)",
		"example.com/brisk/internal/policy/direct imports os/exec (example.com/brisk/internal/policy/direct -> os/exec)",
		"example.com/brisk/internal/policy/grpcuser imports google.golang.org/grpc/codes",
	}
	if len(got) != len(want) {
		t.Fatalf("Violations found %d violations, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("violation %d = %q, want prefix %q", i, got[i], want[i])
		}
	}
}

func TestScanSourceReportsViolations(t *testing.T) {
	tests := []struct {
		label string
		src   string
		want  []string // "line:selector", in order
	}{
		{"time.Now call", `package p
import "time"
func f() time.Time { return time.Now() }`, []string{"3:time.Now"}},
		{"aliased time, func value", `package p
import clk "time"
var now = clk.Now
func g() { clk.Sleep(clk.Second) }`, []string{"3:clk.Now", "4:clk.Sleep"}},
		{"time values are fine", `package p
import "time"
// time.Now() in a comment is fine.
func f(now time.Time, d time.Duration) time.Duration { _ = "time.Now()"; return now.Sub(now) + d }`, nil},
		{"global math/rand/v2", `package p
import "math/rand/v2"
func f() int { return rand.IntN(3) + rand.N(4) }`, []string{"3:rand.IntN", "3:rand.N"}},
		{"global math/rand v1", `package p
import "math/rand"
func f() float64 { rand.Seed(1); return rand.Float64() }`, []string{"3:rand.Seed", "3:rand.Float64"}},
		{"injected rand is fine", `package p
import "math/rand/v2"
type s struct{ rng *rand.Rand }
func (x *s) f() int { r := rand.New(rand.NewPCG(1, 2)); return r.IntN(3) + x.rng.IntN(2) }`, nil},
		{"dot import", `package p
import . "time"
func f() { _ = Now() }`, []string{"2:dot import of time"}},
		{"crypto/rand", `package p
import crand "crypto/rand"
func f(b []byte) { crand.Read(b) }`, []string{"3:crand.Read"}},
	}
	for _, tt := range tests {
		t.Run(tt.label, func(t *testing.T) {
			findings, err := ScanSource("p.go", []byte(tt.src))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, f := range findings {
				// "p.go:3:29: time.Now: why" -> "3:time.Now"
				parts := strings.SplitN(f, ":", 5)
				got = append(got, parts[1]+":"+strings.TrimSpace(parts[3]))
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("findings %q, want %q\nfull: %q", got, tt.want, findings)
			}
		})
	}
}
