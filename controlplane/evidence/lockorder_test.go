package evidence

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
)

// The one lock order, a registry transaction and then a cell, holds by
// construction: a cell's lock is taken only by cell's own methods
// (cell.go), and those reach nothing that could take another lock: of the
// registry they use only the Worker record and the pure Stands rule, they
// take no function value (no callback), and the cell holds none. This test
// fails when code elsewhere locks a cell, or cell.go reaches further.
func TestACellsLockIsALeaf(t *testing.T) {
	fset := token.NewFileSet()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				if n.Sel.Name == "lock" && name != "cell.go" {
					t.Errorf("%s: a cell's lock taken outside cell.go", fset.Position(n.Pos()))
				}
				if x, ok := n.X.(*ast.Ident); ok && x.Name == "registry" && name == "cell.go" &&
					n.Sel.Name != "Worker" && n.Sel.Name != "Stands" {
					t.Errorf("%s: cell.go uses registry.%s (only Worker and Stands: nothing that locks)", fset.Position(n.Pos()), n.Sel.Name)
				}
			case *ast.FuncType:
				if name == "cell.go" && n.Params != nil {
					for _, p := range n.Params.List {
						if _, ok := p.Type.(*ast.FuncType); ok {
							t.Errorf("%s: a cell method takes a function: it could run anything under the cell's lock", fset.Position(p.Pos()))
						}
					}
				}
			case *ast.StructType:
				if name == "cell.go" {
					for _, fl := range n.Fields.List {
						if _, ok := fl.Type.(*ast.FuncType); ok {
							t.Errorf("%s: a cell holds a function", fset.Position(fl.Pos()))
						}
					}
				}
			}
			return true
		})
	}
}
