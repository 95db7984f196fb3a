package store

import (
	"go/ast"
	"go/parser"
	"go/token"
	"slices"
	"testing"
)

// TestAllScriptsListsEveryScript: a script missing from allScripts is not
// preloaded, and its first call after a Redis restart goes out whole; this
// finds every package-level redis.NewScript variable in the package's
// source and checks that allScripts names each once.
func TestAllScriptsListsEveryScript(t *testing.T) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var declared, listed []string
	for _, f := range pkgs["store"].Files {
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.VAR {
				continue
			}
			for _, sp := range g.Specs {
				vs := sp.(*ast.ValueSpec)
				for i, v := range vs.Values {
					if isNewScript(v) {
						declared = append(declared, vs.Names[i].Name)
					}
					if vs.Names[i].Name != "allScripts" {
						continue
					}
					for _, e := range v.(*ast.CompositeLit).Elts {
						listed = append(listed, e.(*ast.Ident).Name)
					}
				}
			}
		}
	}
	slices.Sort(declared)
	slices.Sort(listed)
	if len(declared) == 0 || !slices.Equal(declared, listed) {
		t.Fatalf("allScripts lists %v; the package declares the scripts %v", listed, declared)
	}
	if len(allScripts) != len(listed) {
		t.Fatalf("allScripts has %d scripts, its literal %d", len(allScripts), len(listed))
	}
}

// isNewScript reports whether e is a call redis.NewScript(...).
func isNewScript(e ast.Expr) bool {
	c, ok := e.(*ast.CallExpr)
	if !ok {
		return false
	}
	sel, ok := c.Fun.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "NewScript" {
		return false
	}
	x, ok := sel.X.(*ast.Ident)
	return ok && x.Name == "redis"
}
