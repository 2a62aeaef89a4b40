package metrics

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Packages import downward only: proxy and admin sit above metrics (app
// wires them together and maps metrics' snapshots to admin's types), so
// metrics must not import them, nor app. Every non-test file is parsed,
// whatever its build constraints.
func TestImportsPointDown(t *testing.T) {
	const module = "github.com/mongobouncer/mongobouncer/internal/"
	forbidden := []string{"proxy", "admin", "app"}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, imp := range f.Imports {
			path, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				t.Fatal(err)
			}
			for _, bad := range forbidden {
				if path == module+bad || strings.HasPrefix(path, module+bad+"/") {
					t.Errorf("%s imports %s: metrics must not import a package above it", name, path)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no non-test files found: the test is not looking at the package")
	}
}
