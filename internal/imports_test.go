// Package internal_test holds the layering of the module as a test: one
// table of every package's floor and internal imports, checked against the
// code (every non-test file, whatever its build constraints) and against
// the package table of docs/architecture.md.
package internal_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// module is the module path; packages are named below without it.
const module = "github.com/mongobouncer/mongobouncer/"

// layer is one package's place: its floor, and the internal packages its
// non-test files import, each on a lower floor (so imports point down and
// there is no cycle).
type layer struct {
	floor int
	// imports are exactly the internal packages the package imports, by
	// their path under internal/ ("wire", "testutil/childproc"); a cmd/
	// package is named in full.
	imports []string
	// atMost marks a package being written (or not yet written): imports
	// is the most it may import, not what it does, and the package may
	// not exist yet.
	atMost bool
}

// layers is the module's layering, one row per package (tools/ holds
// separate modules). A new package needs a row here and in
// docs/architecture.md's table; a new import needs its place in both.
var layers = map[string]layer{
	// Floor 0: leaves, no internal import.
	"internal/wire":                 {0, nil, false},
	"internal/pool":                 {0, nil, false},
	"internal/sdam":                 {0, nil, false},
	"internal/sysconn":              {0, nil, false},
	"internal/uring":                {0, nil, false},
	"internal/srv":                  {0, nil, false},
	"internal/auth":                 {0, nil, false},
	"internal/admin":                {0, nil, false},
	"internal/hello":                {0, nil, false},
	"internal/sdnotify":             {0, nil, false},
	"internal/e2e":                  {0, nil, false},
	"internal/testutil/certs":       {0, nil, false},
	"internal/testutil/childproc":   {0, nil, false},
	"internal/testutil/fakesystemd": {0, nil, false},
	"internal/testutil/logbuf":      {0, nil, false},
	"internal/testutil/seccomp":     {0, nil, false},
	"internal/testutil/specdir":     {0, nil, false},
	"internal/testutil/wait":        {0, nil, false},
	// Floor 1: on leaves only.
	"internal/config":             {1, []string{"sdam"}, false},
	"internal/upstream":           {1, []string{"pool", "sysconn", "wire"}, false},
	"internal/metrics":            {1, []string{"pool"}, false},
	"internal/loadgen":            {1, []string{"sysconn", "uring", "wire"}, false},
	"internal/testutil/fakemongo": {1, []string{"wire"}, false},
	"internal/testutil/devmongo":  {1, []string{"testutil/childproc"}, false},
	// The rules a client passes before and at its login, over plain
	// values: no socket, no proxy type.
	"internal/gate": {1, []string{"auth", "wire"}, false},
	// MongoDB commands and replies read in place, and the error replies
	// built: documents only, no connection, no Go error of another package.
	"internal/command": {1, []string{"sdam", "wire"}, false},
	// The event-loop engine (issue 28): moves bytes over swappable I/O,
	// knowing nothing of MongoDB, so never wire, never proxy.
	"internal/evloop": {1, []string{"sysconn", "uring"}, false},
	// Floor 2.
	"internal/topology":          {2, []string{"auth", "pool", "sdam", "srv", "upstream", "wire"}, false},
	"internal/testutil/ferretdb": {2, []string{"testutil/childproc", "testutil/devmongo"}, false},
	// TLS termination for clients: settings, sniff, handshake, refusal
	// counts; sockets only, no MongoDB message, no proxy type.
	"internal/clienttls": {2, []string{"config", "gate"}, false},
	// Floor 3: routes, a deployment (topology) with the terms config sets.
	"internal/routing": {3, []string{"command", "config", "hello", "pool", "sdam", "topology"}, false},
	// Floor 4: a client's session (pins per route, open transactions,
	// phase) under its one lock; it sends nothing upstream.
	"internal/session": {4, []string{"command", "config", "pool", "routing", "topology"}, false},
	// Floor 5: the proxy, over the engine (evloop), which owns the sockets'
	// system calls, over the routes and the sessions.
	"internal/proxy": {5, []string{"auth", "clienttls", "command", "config", "evloop", "gate", "hello", "pool", "routing", "session", "topology", "upstream", "wire"}, false},
	// Floor 6: the wiring.
	"internal/app": {6, []string{"admin", "auth", "clienttls", "config", "metrics", "pool", "proxy", "routing", "sdam", "sdnotify", "srv", "topology", "upstream", "uring"}, false},
	// Floor 7: the commands.
	"cmd/mongobouncer":       {7, []string{"app", "auth", "config", "sdnotify", "upstream"}, false},
	"cmd/mongobouncer-bench": {7, []string{"loadgen", "testutil/childproc", "testutil/devmongo", "testutil/fakemongo", "uring"}, false},
	"cmd/mongobouncer-demo":  {7, []string{"loadgen", "testutil/devmongo"}, false},
}

// fullName turns an imports entry into its package's row name.
func fullName(imp string) string {
	if strings.HasPrefix(imp, "cmd/") {
		return imp
	}
	return "internal/" + imp
}

// repoRoot is the module's root, this file's parent directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("no go.mod in %s: the test is not where it expects to be", root)
	}
	return root
}

// codeImports reads every package under internal/ and cmd/ with non-test
// Go files: the internal packages each imports, as imports entries.
func codeImports(t *testing.T, root string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, top := range []string{"internal", "cmd"} {
		err := filepath.WalkDir(filepath.Join(root, top), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			rel, err := filepath.Rel(root, filepath.Dir(path))
			if err != nil {
				return err
			}
			pkg := filepath.ToSlash(rel)
			seen := out[pkg]
			if seen == nil {
				seen = []string{}
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
			if err != nil {
				return err
			}
			for _, spec := range f.Imports {
				p, err := strconv.Unquote(spec.Path.Value)
				if err != nil {
					return err
				}
				rest, ok := strings.CutPrefix(p, module)
				if !ok {
					continue
				}
				if in, ok := strings.CutPrefix(rest, "internal/"); ok {
					rest = in
				}
				if !slices.Contains(seen, rest) {
					seen = append(seen, rest)
				}
			}
			out[pkg] = seen
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, imps := range out {
		slices.Sort(imps)
	}
	return out
}

// Every package has its row, imports what its row says (no more, and no
// less unless the row is a ceiling), and imports only from lower floors.
func TestLayering(t *testing.T) {
	code := codeImports(t, repoRoot(t))
	if len(code) < 20 {
		t.Fatalf("found only %d packages: the walk is not looking at the module", len(code))
	}
	for _, pkg := range slices.Sorted(maps.Keys(code)) {
		row, ok := layers[pkg]
		if !ok {
			t.Errorf("%s has no row in layers (and docs/architecture.md's table): give it a floor and its imports", pkg)
			continue
		}
		for _, imp := range code[pkg] {
			if !slices.Contains(row.imports, imp) {
				t.Errorf("%s imports %s, which its row does not allow", pkg, imp)
			}
		}
		if row.atMost {
			continue
		}
		for _, imp := range row.imports {
			_, exists := code[fullName(imp)]
			if exists && !slices.Contains(code[pkg], imp) {
				t.Errorf("%s's row says it imports %s, and it does not: take it out of the row", pkg, imp)
			}
		}
	}
	for pkg, row := range layers {
		if _, ok := code[pkg]; !ok && !row.atMost {
			t.Errorf("%s has a row but no package: take the row out", pkg)
		}
		for _, imp := range row.imports {
			dep, ok := layers[fullName(imp)]
			switch {
			case !ok:
				t.Errorf("%s's row names %s, which has no row", pkg, imp)
			case dep.floor >= row.floor:
				t.Errorf("%s (floor %d) imports %s (floor %d): imports point down only", pkg, row.floor, imp, dep.floor)
			}
		}
	}
}

// The engine knows nothing of MongoDB or of the proxy, routing nothing of
// clients, and metrics nothing of the packages that feed it: rules the floors alone would allow to
// break. They hold of every row, so a row cannot be widened past them.
func TestLayeringRules(t *testing.T) {
	never := map[string][]string{
		"internal/evloop":  {"wire", "proxy", "upstream", "topology", "pool", "config", "sdam"},
		"internal/metrics": {"proxy", "admin", "app"},
		"internal/admin":   {"proxy", "metrics", "app", "config"},
		"internal/config":  {"proxy", "app", "topology", "upstream", "pool", "wire"},
		// Routes know no client, socket or wire message: the proxy reads
		// requests and hands routing plain values.
		"internal/routing": {"proxy", "app", "evloop", "upstream", "wire"},
	}
	for pkg, bad := range never {
		for _, imp := range layers[pkg].imports {
			if slices.Contains(bad, imp) {
				t.Errorf("%s may never import %s", pkg, imp)
			}
		}
	}
}

// docsTable reads the package table of docs/architecture.md: each row's
// package, floor and imports (the imports cell is "—" or a list of
// backquoted names separated by ", ").
func docsTable(t *testing.T, root string) map[string]layer {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]layer{}
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "| package | floor |") {
			in = true
			continue
		}
		if !in {
			continue
		}
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		if len(cells) != 4 || strings.HasPrefix(cells[0], "---") {
			if len(cells) != 4 {
				t.Errorf("architecture.md: row %q has %d cells, want 4 (package, floor, role, imports)", line, len(cells))
			}
			continue
		}
		pkg := strings.Trim(cells[0], "`")
		if strings.HasPrefix(pkg, "tools/") {
			continue // a separate module
		}
		floor, err := strconv.Atoi(cells[1])
		if err != nil {
			t.Errorf("architecture.md: %s: floor %q is not a number", pkg, cells[1])
		}
		var imports []string
		if cells[3] != "—" {
			for _, name := range strings.Split(cells[3], ", ") {
				if len(name) < 3 || name[0] != '`' || name[len(name)-1] != '`' {
					t.Errorf("architecture.md: %s: imports cell %q: want `name`, `name` or —", pkg, cells[3])
					continue
				}
				imports = append(imports, strings.Trim(name, "`"))
			}
		}
		slices.Sort(imports)
		rows[pkg] = layer{floor: floor, imports: imports}
	}
	if len(rows) == 0 {
		t.Fatal("architecture.md has no package table (a header starting | package | floor |)")
	}
	return rows
}

// docs/architecture.md's package table says what layers says: a row for
// every package (a package being written may be left out), with its floor
// and its imports.
func TestArchitectureTableMatchesLayering(t *testing.T) {
	root := repoRoot(t)
	docs := docsTable(t, root)
	code := codeImports(t, root)
	for _, pkg := range slices.Sorted(maps.Keys(layers)) {
		row := layers[pkg]
		doc, ok := docs[pkg]
		_, exists := code[pkg]
		switch {
		case !ok && (exists || !row.atMost):
			t.Errorf("architecture.md's table has no row for %s", pkg)
			continue
		case !ok:
			continue
		}
		if doc.floor != row.floor {
			t.Errorf("architecture.md: %s on floor %d, layers says %d", pkg, doc.floor, row.floor)
		}
		// The table states what is: a package not written yet is not
		// imported, and a package being written imports what it does.
		var want []string
		switch {
		case row.atMost && exists:
			want = code[pkg]
		case !exists:
			want = row.imports
		default:
			for _, imp := range row.imports {
				if _, ok := code[fullName(imp)]; ok {
					want = append(want, imp)
				}
			}
		}
		want = slices.Sorted(slices.Values(want))
		if !slices.Equal(doc.imports, want) {
			t.Errorf("architecture.md: %s imports %v, layers says %v", pkg, doc.imports, want)
		}
	}
	for pkg := range docs {
		if _, ok := layers[pkg]; !ok {
			t.Errorf("architecture.md's table has %s, which layers does not", pkg)
		}
	}
}
