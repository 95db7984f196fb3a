package main

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// The cluster suite scales the workers with KEDA's redis trigger only, but
// KEDA links every scaler into its operator and metrics adapter: one
// package, pkg/scalers, holds all of them, and pkg/scaling's buildScaler
// picks one in a switch, so a build tag or a registry cannot leave the
// others out. Their cloud SDKs (Azure, AWS, GCP, Kafka, databases) are
// about half of what a cold KEDA build compiles. kedaRedisOnly makes a
// copy of KEDA's module in which pkg/scalers holds the shared scaler code
// and the redis scalers only, and buildScaler knows only the redis trigger
// types; the operator, adapter and webhooks are built from that copy (a
// replace in a go.mod of the cache's own), with KEDA's dependency graph
// unchanged. The redis scaler itself is KEDA's code as released.

// kedaScalerFiles are the files of pkg/scalers the copy keeps: the Scaler
// interface and its helpers, and the redis list and stream scalers.
var kedaScalerFiles = map[string]bool{
	"scaler.go":               true,
	"redis_scaler.go":         true,
	"redis_streams_scaler.go": true,
}

// kedaRedisOnly writes the trimmed copy of the KEDA module at src (its
// directory in the module cache) under dst, and a go.mod and go.sum that
// are modDir's (../keda) plus a replace of KEDA by the copy. It returns
// the go.mod's path, for go build -modfile.
func kedaRedisOnly(src, dst, modDir string) (string, error) {
	copyDir := filepath.Join(dst, "keda")
	if err := os.RemoveAll(dst); err != nil {
		return "", err
	}
	if err := os.CopyFS(copyDir, os.DirFS(src)); err != nil {
		return "", fmt.Errorf("copy KEDA's module: %w", err)
	}
	scalers := filepath.Join(copyDir, "pkg", "scalers")
	ents, err := os.ReadDir(scalers)
	if err != nil {
		return "", err
	}
	var keep, drop []string
	for _, ent := range ents {
		name := ent.Name()
		if ent.IsDir() || !strings.HasSuffix(name, ".go") {
			continue
		}
		if kedaScalerFiles[name] {
			keep = append(keep, filepath.Join(scalers, name))
		} else {
			drop = append(drop, filepath.Join(scalers, name))
		}
	}
	if len(keep) != len(kedaScalerFiles) {
		return "", fmt.Errorf("KEDA's pkg/scalers has %d of the files %v: the release's layout changed", len(keep), kedaScalerFiles)
	}
	consts, err := borrowedConsts(keep, drop)
	if err != nil {
		return "", err
	}
	for _, f := range drop {
		if err := os.Remove(f); err != nil {
			return "", err
		}
	}
	if err := os.WriteFile(filepath.Join(scalers, "zz_redis_only_consts.go"), consts, 0o644); err != nil {
		return "", err
	}
	builder := filepath.Join(copyDir, "pkg", "scaling", "scalers_builder.go")
	if err := redisOnlyBuilder(builder); err != nil {
		return "", err
	}

	mod, err := os.ReadFile(filepath.Join(modDir, "go.mod"))
	if err != nil {
		return "", err
	}
	mod = append(mod, "\nreplace github.com/kedacore/keda/v2 => "+copyDir+"\n"...)
	modFile := filepath.Join(dst, "go.mod")
	if err := os.WriteFile(modFile, mod, 0o644); err != nil {
		return "", err
	}
	sum, err := os.ReadFile(filepath.Join(modDir, "go.sum"))
	if err != nil {
		return "", err
	}
	return modFile, os.WriteFile(filepath.Join(dst, "go.sum"), sum, 0o644)
}

// borrowedConsts returns a Go file of package scalers declaring the
// constants that the kept files use but the dropped ones declare (the
// redis scaler uses a few, such as "enable", declared beside other
// scalers), and those their values use in turn. A constant whose value
// names another package is refused: the file has no imports.
func borrowedConsts(keep, drop []string) ([]byte, error) {
	fset := token.NewFileSet()
	declared := map[string]*ast.ValueSpec{}
	for _, f := range drop {
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			return nil, err
		}
		for _, d := range af.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, sp := range gd.Specs {
				vs := sp.(*ast.ValueSpec)
				for _, n := range vs.Names {
					declared[n.Name] = vs
				}
			}
		}
	}
	var queue []ast.Node
	for _, f := range keep {
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			return nil, err
		}
		queue = append(queue, af)
	}
	used := map[*ast.ValueSpec]bool{}
	var order []*ast.ValueSpec
	for len(queue) > 0 {
		n := queue[0]
		queue = queue[1:]
		ast.Inspect(n, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok {
				queue = append(queue, sel.X)
				return false // x.Name: Name is not one of this package's names
			}
			id, ok := n.(*ast.Ident)
			if !ok {
				return true
			}
			if vs := declared[id.Name]; vs != nil && !used[vs] {
				used[vs] = true
				order = append(order, vs)
				queue = append(queue, vs)
			}
			return true
		})
	}
	var b bytes.Buffer
	b.WriteString("// Code written by the test cluster's driver: constants of KEDA's\n// dropped scaler files that the redis scalers use.\n\npackage scalers\n\n")
	for _, vs := range order {
		if len(vs.Values) != len(vs.Names) {
			return nil, fmt.Errorf("constant %s has no value of its own (iota): the release's layout changed", vs.Names[0])
		}
		bad := false
		for _, v := range vs.Values {
			ast.Inspect(v, func(n ast.Node) bool {
				if _, ok := n.(*ast.SelectorExpr); ok {
					bad = true
				}
				return true
			})
		}
		if vs.Type != nil {
			if _, ok := vs.Type.(*ast.Ident); !ok {
				bad = true
			}
		}
		if bad {
			return nil, fmt.Errorf("constant %s names another package: the release's layout changed", vs.Names[0])
		}
		b.WriteString("const ")
		if err := format.Node(&b, fset, vs); err != nil {
			return nil, err
		}
		b.WriteString("\n")
	}
	return format.Source(b.Bytes())
}

// redisOnlyBuilder rewrites the file holding buildScaler so that its
// switch on the trigger type keeps the redis cases and the default only.
func redisOnlyBuilder(path string) error {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
	if err != nil {
		return err
	}
	var sw *ast.SwitchStmt
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Name.Name != "buildScaler" {
			continue
		}
		for _, s := range fn.Body.List {
			if s, ok := s.(*ast.SwitchStmt); ok {
				sw = s
			}
		}
	}
	if sw == nil {
		return fmt.Errorf("%s: no switch in buildScaler: the release's layout changed", path)
	}
	var kept []ast.Stmt
	redis := 0
	for _, s := range sw.Body.List {
		cc := s.(*ast.CaseClause)
		if cc.List == nil { // default
			kept = append(kept, cc)
			continue
		}
		all := true
		for _, e := range cc.List {
			lit, ok := e.(*ast.BasicLit)
			v, err := strconv.Unquote(litValue(lit, ok))
			if !ok || err != nil || !strings.HasPrefix(v, "redis") {
				all = false
			}
		}
		if all {
			kept = append(kept, cc)
			redis++
		}
	}
	if redis == 0 {
		return fmt.Errorf("%s: buildScaler has no redis case: the release's layout changed", path)
	}
	// The comments of the dropped cases would land in the kept ones.
	var comments []*ast.CommentGroup
	for _, c := range f.Comments {
		if c.Pos() > sw.Body.Lbrace && c.End() < sw.Body.Rbrace && !within(c, kept) {
			continue
		}
		comments = append(comments, c)
	}
	f.Comments = comments
	sw.Body.List = kept
	var b bytes.Buffer
	if err := format.Node(&b, fset, f); err != nil {
		return err
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

func within(c *ast.CommentGroup, stmts []ast.Stmt) bool {
	for _, s := range stmts {
		if c.Pos() >= s.Pos() && c.End() <= s.End() {
			return true
		}
	}
	return false
}

func litValue(lit *ast.BasicLit, ok bool) string {
	if !ok || lit.Kind != token.STRING {
		return ""
	}
	return lit.Value
}
