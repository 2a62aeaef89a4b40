package evloop

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The engine knows nothing of MongoDB nor of its user: besides the
// standard library it imports only the leaves that reach the kernel.
// Every non-test file is parsed, whatever its build constraints.
func TestImportsOnlyLeaves(t *testing.T) {
	const module = "github.com/mongobouncer/mongobouncer/"
	allowed := map[string]bool{module + "internal/sysconn": true, module + "internal/uring": true}
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
			if strings.Contains(path, ".") && !allowed[path] {
				t.Errorf("%s imports %s: the engine imports only the standard library, sysconn and uring", name, path)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no non-test files found: the test is not looking at the package")
	}
}
