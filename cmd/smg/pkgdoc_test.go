package main

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPackagesDocumented: every package of the repository but the generated
// ones has a doc comment ("// Package x ..." or "// Command x ..."), which
// says what the package owns and what it leaves to others (docs/design.md,
// "Layout"). A package made only of tests counts its test files.
func TestPackagesDocumented(t *testing.T) {
	root := filepath.Join("..", "..")
	dirs := map[string][]string{} // dir -> its Go files
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") ||
				path == filepath.Join(root, "gen") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".go") {
			dirs[filepath.Dir(path)] = append(dirs[filepath.Dir(path)], path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) < 40 {
		t.Fatalf("found %d package directories under %s; the walk is broken", len(dirs), root)
	}
	for dir, files := range dirs {
		if !documented(t, files) {
			rel, _ := filepath.Rel(root, dir)
			t.Errorf("package %s has no doc comment: say what it owns and what it may not touch", rel)
		}
	}
}

// documented reports whether one of files (all of them test files, or the
// non-test ones when there are any) carries the package's doc comment.
func documented(t *testing.T, files []string) bool {
	var src []string
	for _, f := range files {
		if !strings.HasSuffix(f, "_test.go") {
			src = append(src, f)
		}
	}
	if len(src) == 0 {
		src = files
	}
	fset := token.NewFileSet()
	for _, f := range src {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		af, err := parser.ParseFile(fset, f, b, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		if af.Doc != nil && len(strings.TrimSpace(af.Doc.Text())) > 0 {
			return true
		}
	}
	return false
}
