package autoscale

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// allowedImports is everything non-test code here may import: policies are pure, so no
// I/O, networking, process or brisk runtime packages.
var allowedImports = map[string]bool{"errors": true, "fmt": true, "math": true, "time": true}

// TestPolicyIsPure parses the package's non-test files and rejects imports outside
// allowedImports and any call of time.Now, time.Since or time.Sleep.
func TestPolicyIsPure(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			if path := strings.Trim(imp.Path.Value, `"`); !allowedImports[path] {
				t.Errorf("%s imports %q; policies may import only %v", name, path, allowedImports)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, isIdent := sel.X.(*ast.Ident); isIdent && x.Name == "time" {
				switch sel.Sel.Name {
				case "Now", "Since", "Until", "Sleep", "After", "Tick", "NewTimer", "NewTicker", "AfterFunc":
					t.Errorf("%s: uses time.%s; policies take now as an argument", fset.Position(sel.Pos()), sel.Sel.Name)
				}
			}
			return true
		})
	}
}
