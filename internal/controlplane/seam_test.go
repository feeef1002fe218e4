package controlplane

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
)

// TestAdminSurfaceUsesTheClusterQueries keeps the seam between the admin
// surface and the cluster: the files of adminAPI's methods read and change
// the cluster only through its methods (query.go and the rest), never its
// lock, reconciler, links or maps, and declare no Cluster methods
// themselves. The admin surface can then move to a package of its own
// without a change of behaviour. The dashboard's call counts (dash), which
// keep their own lock, and the clock (clk), set once, are allowed.
func TestAdminSurfaceUsesTheClusterQueries(t *testing.T) {
	fset := token.NewFileSet()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]*ast.File{}
	for _, e := range entries {
		if n := e.Name(); strings.HasSuffix(n, ".go") && !strings.HasSuffix(n, "_test.go") {
			f, err := parser.ParseFile(fset, n, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			files[n] = f
		}
	}
	fields := map[string]bool{} // the Cluster struct's fields
	admin := map[string]bool{}  // files with adminAPI methods
	for name, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.TypeSpec:
				if st, ok := x.Type.(*ast.StructType); ok && x.Name.Name == "Cluster" {
					for _, fl := range st.Fields.List {
						for _, id := range fl.Names {
							fields[id.Name] = true
						}
					}
				}
			case *ast.FuncDecl:
				if receiverType(x) == "adminAPI" {
					admin[name] = true
				}
			}
			return true
		})
	}
	if !fields["mu"] || !fields["r"] || len(admin) < 5 {
		t.Fatalf("found Cluster fields %v and admin files %v: the test would check nothing", fields, admin)
	}
	allowed := map[string]bool{"dash": true, "clk": true}
	for name := range admin {
		for _, d := range files[name].Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			if receiverType(fd) == "Cluster" {
				t.Errorf("%s: Cluster.%s is declared in an admin-surface file: it belongs with the cluster", name, fd.Name.Name)
			}
			if fd.Body == nil {
				continue
			}
			// Names bound to the cluster in this function (c := srv.cluster).
			bound := map[string]bool{}
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				if as, ok := n.(*ast.AssignStmt); ok && len(as.Lhs) == 1 && len(as.Rhs) == 1 && isClusterExpr(as.Rhs[0], nil) {
					if id, ok := as.Lhs[0].(*ast.Ident); ok {
						bound[id.Name] = true
					}
				}
				return true
			})
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if ok && fields[sel.Sel.Name] && !allowed[sel.Sel.Name] && isClusterExpr(sel.X, bound) {
					t.Errorf("%s: %s reaches into the cluster's %s: add a Cluster method (query.go) instead",
						fset.Position(sel.Pos()), fd.Name.Name, sel.Sel.Name)
				}
				return true
			})
		}
	}
}

func receiverType(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return ""
	}
	t := fd.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// isClusterExpr: e is srv.cluster (any receiver's cluster field), or a name
// bound to it.
func isClusterExpr(e ast.Expr, bound map[string]bool) bool {
	switch x := e.(type) {
	case *ast.SelectorExpr:
		return x.Sel.Name == "cluster"
	case *ast.Ident:
		return bound[x.Name]
	}
	return false
}
