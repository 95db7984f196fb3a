package api

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestEvery429NamesItsLimit reads the package's source: every error it
// answers with 429 Too Many Requests names, in its message, the setting
// of the limit that answered ("(RATE_LIMIT_PER_SECOND)"), so that a
// client or an operator knows which limit to wait out or raise.
func TestEvery429NamesItsLimit(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	setting := regexp.MustCompile(`\([A-Z][A-Z0-9_]+\)`)
	found := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		fset := token.NewFileSet()
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) < 4 {
				return true
			}
			if id, ok := call.Fun.(*ast.Ident); !ok || id.Name != "newError" {
				return true
			}
			if sel, ok := call.Args[0].(*ast.SelectorExpr); !ok || sel.Sel.Name != "StatusTooManyRequests" {
				return true
			}
			found++
			lit, ok := call.Args[3].(*ast.BasicLit)
			if !ok {
				t.Errorf("%s: a 429 whose message is not a literal", fset.Position(call.Pos()))
				return true
			}
			msg, _ := strconv.Unquote(lit.Value)
			if !setting.MatchString(msg) {
				t.Errorf("%s: 429 %q names no limit setting", fset.Position(call.Pos()), msg)
			}
			return true
		})
	}
	if found < 6 {
		t.Fatalf("found %d 429s; the source walk missed some", found)
	}
}
