package policy_test

// These tests keep internal/policy/... pure: no I/O, no ambient time, no
// ambient randomness. Policies must give the same decision for the same
// inputs in the control plane, the data plane, the tests and the simulator;
// a single import of net or call of time.Now would quietly break that.
// (The negative dependency test is modelled on tailscale's tstest/deptest.)

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// banned is one forbidden import: the path itself and, if subtree, every
// package below it.
type banned struct {
	path    string
	subtree bool
	why     string
}

func bannedDeps(module string) []banned {
	const noIO = "policies do no I/O; the caller does it and passes values in"
	const layer = "policies are the bottom layer; components import policies, not the reverse"
	return []banned{
		{"net", false, noIO},
		{"net/http", true, noIO},
		{"net/rpc", true, noIO},
		{"os/exec", false, noIO},
		{"google.golang.org/grpc", true, noIO},
		{"github.com/containerd", true, noIO},
		{"go.etcd.io/bbolt", true, noIO},
		{module + "/internal/controlplane", true, layer},
		{module + "/internal/dataplane", true, layer},
		{module + "/internal/worker", true, layer},
		{module + "/internal/clock", true, "policies take time as a value (now time.Time), not a clock"},
	}
}

func (b banned) matches(path string) bool {
	return path == b.path || b.subtree && strings.HasPrefix(path, b.path+"/")
}

// listedPackage is the part of `go list -json` output the test reads.
type listedPackage struct {
	ImportPath string
	Imports    []string
	Deps       []string
	Error      *struct{ Err string }
	DepsErrors []*struct{ Err string }
}

// checkDeps returns one message per (policy package, banned dependency),
// with the import chain that pulls the dependency in.
func checkDeps(pkgs []listedPackage, module string) []string {
	prefix := module + "/internal/policy"
	imports := map[string][]string{}
	for _, p := range pkgs {
		imports[p.ImportPath] = p.Imports
	}
	var out []string
	for _, p := range pkgs {
		if p.ImportPath != prefix && !strings.HasPrefix(p.ImportPath, prefix+"/") {
			continue
		}
		for _, dep := range p.Deps {
			for _, b := range bannedDeps(module) {
				if b.matches(dep) {
					out = append(out, fmt.Sprintf("%s imports %s (%s): %s",
						p.ImportPath, dep, strings.Join(importChain(imports, p.ImportPath, dep), " -> "), b.why))
				}
			}
		}
	}
	return out
}

// importChain finds a shortest import path from -> to (breadth first).
func importChain(imports map[string][]string, from, to string) []string {
	prev := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		if cur == to {
			var chain []string
			for p := to; p != ""; p = prev[p] {
				chain = append(chain, p)
			}
			slices.Reverse(chain)
			return chain
		}
		for _, next := range imports[cur] {
			if _, seen := prev[next]; !seen {
				prev[next] = cur
				queue = append(queue, next)
			}
		}
	}
	return []string{from, "?", to}
}

// Package-level functions that read ambient state. Selectors of these
// packages not listed are fine (time.Duration, time.Time.Sub, ...).
var bannedTime = map[string]bool{
	"Now": true, "Since": true, "Until": true, "Sleep": true, "After": true,
	"AfterFunc": true, "Tick": true, "NewTicker": true, "NewTimer": true,
}

// For math/rand and math/rand/v2, every package-level function draws from
// the global source except these constructors and types, which build the
// injected *rand.Rand.
var allowedRand = map[string]bool{
	"New": true, "NewSource": true, "NewPCG": true, "NewChaCha8": true, "NewZipf": true,
	"Rand": true, "Source": true, "Source64": true, "PCG": true, "ChaCha8": true, "Zipf": true,
}

// scanSource reports uses of ambient time or randomness in one Go file. It
// resolves import names (aliases included) but not scopes: a local variable
// that shadows the package name is reported too, which is a naming smell in
// a policy anyway.
func scanSource(filename string, src []byte) ([]string, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, filename, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	kind := map[string]string{} // local package name -> import path
	var out []string
	report := func(pos token.Pos, what, why string) {
		out = append(out, fmt.Sprintf("%s: %s: %s", fset.Position(pos), what, why))
	}
	for _, imp := range f.Imports {
		path, _ := strconv.Unquote(imp.Path.Value)
		switch path {
		case "time", "math/rand", "math/rand/v2", "crypto/rand":
		default:
			continue
		}
		name := filepath.Base(path)
		if path == "math/rand/v2" {
			name = "rand"
		}
		if imp.Name != nil {
			name = imp.Name.Name
		}
		if name == "." {
			report(imp.Pos(), "dot import of "+path, "hides ambient time/randomness calls; import it by name")
			continue
		}
		kind[name] = path
	}
	ast.Inspect(f, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		id, ok := sel.X.(*ast.Ident)
		if !ok {
			return true
		}
		name := id.Name + "." + sel.Sel.Name
		switch kind[id.Name] {
		case "time":
			if bannedTime[sel.Sel.Name] {
				report(sel.Pos(), name, "policies take now as a parameter and never wait")
			}
		case "math/rand", "math/rand/v2":
			if !allowedRand[sel.Sel.Name] {
				report(sel.Pos(), name, "global random source; use the injected *rand.Rand or func() uint64")
			}
		case "crypto/rand":
			report(sel.Pos(), name, "ambient randomness; use the injected source")
		}
		return true
	})
	return out, nil
}

// moduleRoot walks up from the working directory (the package directory
// under go test) to go.mod and returns its directory and module path.
func moduleRoot(t *testing.T) (dir, module string) {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil {
			sc := bufio.NewScanner(bytes.NewReader(data))
			for sc.Scan() {
				if rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
					return dir, strings.Trim(strings.TrimSpace(rest), `"`)
				}
			}
			t.Fatalf("%s/go.mod has no module line", dir)
		}
		if !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test directory")
		}
		dir = parent
	}
}

func TestPolicyDependencies(t *testing.T) {
	root, module := moduleRoot(t)
	cmd := exec.Command("go", "list", "-e", "-deps", "-json=ImportPath,Imports,Deps,Error,DepsErrors", "./internal/policy/...")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	var pkgs []listedPackage
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var p listedPackage
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("decoding go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}

	var policies []string
	for _, p := range pkgs {
		if !strings.HasPrefix(p.ImportPath, module+"/internal/policy") {
			continue
		}
		policies = append(policies, p.ImportPath)
		// A package go list cannot load has an unknown import set; that
		// must not pass as clean.
		if p.Error != nil {
			t.Errorf("%s: %s", p.ImportPath, p.Error.Err)
		}
		for _, e := range p.DepsErrors {
			t.Errorf("%s: dependency error: %s", p.ImportPath, e.Err)
		}
	}
	for _, want := range []string{"placement", "loadbalance"} {
		if !slices.Contains(policies, module+"/internal/policy/"+want) {
			t.Fatalf("go list did not report internal/policy/%s (got %v): the test would check nothing", want, policies)
		}
	}
	for _, v := range checkDeps(pkgs, module) {
		t.Error(v)
	}
	t.Logf("checked %d policy packages: %v", len(policies), policies)
}

func TestPolicySourcesAvoidAmbientTimeAndRandomness(t *testing.T) {
	root, _ := moduleRoot(t)
	base := filepath.Join(root, "internal", "policy")
	files := 0
	err := filepath.WalkDir(base, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != base && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir // the go tool ignores these too
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		findings, err := scanSource(rel, src)
		if err != nil {
			t.Errorf("parsing %s: %v", rel, err)
			return nil
		}
		files++
		for _, f := range findings {
			t.Error(f)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 3 {
		t.Fatalf("scanned only %d files under %s: the walk is broken", files, base)
	}
}

// The checkers must be able to fail: run them on known-bad input.

func TestCheckDepsReportsViolations(t *testing.T) {
	const m = "example.com/brisk"
	pkgs := []listedPackage{
		{ImportPath: m + "/internal/policy/good", Imports: []string{"net/netip", "sort"}, Deps: []string{"net/netip", "sort"}},
		{ImportPath: m + "/internal/policy/bad", Imports: []string{m + "/internal/x"},
			Deps: []string{m + "/internal/x", m + "/internal/clock", "net"}},
		{ImportPath: m + "/internal/x", Imports: []string{"net", m + "/internal/clock"}},
		{ImportPath: m + "/internal/policy/grpcuser", Deps: []string{"google.golang.org/grpc/codes", "github.com/containerdx/ok"}},
		{ImportPath: m + "/internal/dataplane", Deps: []string{"net/http"}}, // not a policy package
	}
	got := checkDeps(pkgs, m)
	want := []string{
		"example.com/brisk/internal/policy/bad imports example.com/brisk/internal/clock (example.com/brisk/internal/policy/bad -> example.com/brisk/internal/x -> example.com/brisk/internal/clock)",
		"example.com/brisk/internal/policy/bad imports net (example.com/brisk/internal/policy/bad -> example.com/brisk/internal/x -> net)",
		"example.com/brisk/internal/policy/grpcuser imports google.golang.org/grpc/codes",
	}
	if len(got) != len(want) {
		t.Fatalf("checkDeps found %d violations, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
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
			findings, err := scanSource("p.go", []byte(tt.src))
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
