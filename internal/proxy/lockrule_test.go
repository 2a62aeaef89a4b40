package proxy

// The lock rule the panic recovery relies on (recover.go, doc.go "Panics"):
// a client's session lock (internal/session's Session.Mu, "sessMu") and
// ownMu are unlocked by a defer in the function that locks them, so a panic
// never leaves one held. Checked here on the source of this package and of
// internal/session.

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// clientLocks are the client's locks the recovery takes: its session's Mu
// (c.sess.Mu, ss.Mu: "sessMu") and its endpoint's Mu (c.lc.Mu, "ownMu").
var clientLocks = map[string]bool{"Mu": true}

// clientLockCall returns the mutex expression (e.g. "c.lc.Mu") when call
// is a method call on one of clientLocks, and the method's name.
func clientLockCall(call ast.Expr) (mu, method string) {
	ce, ok := call.(*ast.CallExpr)
	if !ok {
		return "", ""
	}
	sel, ok := ce.Fun.(*ast.SelectorExpr)
	if !ok {
		return "", ""
	}
	var recv string
	switch x := sel.X.(type) {
	case *ast.SelectorExpr:
		recv = x.Sel.Name
	case *ast.Ident:
		recv = x.Name
	default:
		return "", ""
	}
	if !clientLocks[recv] {
		return "", ""
	}
	var b strings.Builder
	_ = writeExpr(&b, sel.X)
	return b.String(), sel.Sel.Name
}

// writeExpr renders a selector chain ("c.lc.Mu").
func writeExpr(b *strings.Builder, e ast.Expr) bool {
	switch x := e.(type) {
	case *ast.Ident:
		b.WriteString(x.Name)
		return true
	case *ast.SelectorExpr:
		if !writeExpr(b, x.X) {
			return false
		}
		b.WriteString("." + x.Sel.Name)
		return true
	case *ast.UnaryExpr:
		b.WriteString(x.Op.String())
		return writeExpr(b, x.X)
	}
	b.WriteString("?")
	return false
}

// Every Lock of a client's sessMu or ownMu in the package is followed at
// once by its deferred Unlock, and no other Unlock, TryLock or Lock of
// them exists: a panic in a critical section unlocks on its way up, so a
// recovery never meets a lock its own goroutine left held, and takes them
// with a plain Lock, which waits for a legitimate holder.
func TestClientLocksAreUnlockedByDefer(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	// The session's lock (Session.Mu, c.sess.Mu) is taken in its own package.
	sessFiles, err := filepath.Glob("../session/*.go")
	if err != nil || len(sessFiles) == 0 {
		t.Fatalf("no files of internal/session (%v)", err)
	}
	files = append(files, sessFiles...)
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		// Calls allowed where they are: a Lock with its deferred Unlock
		// as the next statement, and that deferred Unlock.
		ok := map[ast.Node]bool{}
		ast.Inspect(f, func(n ast.Node) bool {
			blk, isBlock := n.(*ast.BlockStmt)
			if !isBlock {
				return true
			}
			for i, st := range blk.List {
				es, isExpr := st.(*ast.ExprStmt)
				if !isExpr {
					continue
				}
				mu, m := clientLockCall(es.X)
				if mu == "" || m != "Lock" || i+1 >= len(blk.List) {
					continue
				}
				if ds, isDefer := blk.List[i+1].(*ast.DeferStmt); isDefer {
					if mu2, m2 := clientLockCall(ds.Call); mu2 == mu && m2 == "Unlock" {
						ok[es.X] = true
						ok[ds.Call] = true
						checked++
					}
				}
			}
			return true
		})
		ast.Inspect(f, func(n ast.Node) bool {
			ce, isCall := n.(*ast.CallExpr)
			if !isCall {
				return true
			}
			if mu, m := clientLockCall(ce); mu != "" && !ok[ce] {
				t.Errorf("%s: %s.%s() outside the rule: lock, then defer the unlock at once", fset.Position(ce.Pos()), mu, m)
			}
			return true
		})
	}
	if checked < 10 {
		t.Fatalf("only %d deferred critical sections found: is the check looking at the package?", checked)
	}
}
