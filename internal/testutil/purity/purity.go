// Package purity checks that brisk's decision core stays pure: the
// policies, the reconciler and the simulator do no I/O, read no ambient
// clock and draw from no global random source, so the same code decides
// alike in the control plane, the data plane, the tests and the simulator.
// A single import of a network package or a call of time.Now would quietly
// break that; these checks make it a test failure. (The negative
// dependency check is modelled on tailscale's tstest/deptest.)
package purity

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

// Banned is one forbidden dependency: the path itself and, if Subtree,
// every package below it. Direct bans only the packages' own imports
// (a data package they use may link it). Except lists packages of the
// subtree that are allowed (a pure part of an impure component).
type Banned struct {
	Path    string
	Subtree bool
	Direct  bool
	Except  []string
	Why     string
}

func (b Banned) matches(path string) bool {
	if slices.Contains(b.Except, path) {
		return false
	}
	return path == b.Path || b.Subtree && strings.HasPrefix(path, b.Path+"/")
}

// Package is the part of `go list -json` output the checks read.
type Package struct {
	ImportPath string
	Imports    []string
	Deps       []string
	Error      *struct{ Err string }
	DepsErrors []*struct{ Err string }
}

// Violations returns one message per (checked package, banned dependency),
// with the import chain that pulls the dependency in. checked says which
// of pkgs are under the rules.
func Violations(pkgs []Package, checked func(path string) bool, banned []Banned) []string {
	imports := map[string][]string{}
	for _, p := range pkgs {
		imports[p.ImportPath] = p.Imports
	}
	var out []string
	for _, p := range pkgs {
		if !checked(p.ImportPath) {
			continue
		}
		for _, b := range banned {
			deps := p.Deps
			if b.Direct {
				deps = p.Imports
			}
			for _, dep := range deps {
				if b.matches(dep) {
					out = append(out, fmt.Sprintf("%s imports %s (%s): %s",
						p.ImportPath, dep, strings.Join(importChain(imports, p.ImportPath, dep), " -> "), b.Why))
				}
			}
		}
	}
	slices.Sort(out)
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

// List runs `go list -deps` on patterns from the module root. Packages go
// list cannot load fail the test: their import set is unknown, which must
// not pass as clean.
func List(t *testing.T, root string, patterns ...string) []Package {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-e", "-deps", "-json=ImportPath,Imports,Deps,Error,DepsErrors"}, patterns...)...)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	var pkgs []Package
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var p Package
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("decoding go list output: %v", err)
		}
		if p.Error != nil {
			t.Errorf("%s: %s", p.ImportPath, p.Error.Err)
		}
		for _, e := range p.DepsErrors {
			t.Errorf("%s: dependency error: %s", p.ImportPath, e.Err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
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

// ScanSource reports uses of ambient time or randomness in one Go file. It
// resolves import names (aliases included) but not scopes: a local variable
// that shadows the package name is reported too, which is a naming smell in
// the core anyway.
func ScanSource(filename string, src []byte) ([]string, error) {
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
				report(sel.Pos(), name, "the core takes now as a parameter and never waits")
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

// ScanTree runs ScanSource over every non-test Go file under dir (below
// the module root), as the go tool sees them, and fails the test on each
// finding. It returns the number of files scanned.
func ScanTree(t *testing.T, root, dir string) int {
	t.Helper()
	base := filepath.Join(root, dir)
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
		findings, err := ScanSource(rel, src)
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
	return files
}

// ModuleRoot walks up from the working directory (the package directory
// under go test) to go.mod and returns its directory and module path.
func ModuleRoot(t *testing.T) (dir, module string) {
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
