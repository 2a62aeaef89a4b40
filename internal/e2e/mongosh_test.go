package e2e

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.uber.org/goleak"

	"github.com/mongobouncer/mongobouncer/internal/testutil/devmongo"
)

// mongoshPath finds the mongosh that `make node-tools` installs in
// tools/node. Missing, it fails the test under CI (where the Makefile
// installs it, so absence is a bug) and skips it elsewhere.
func mongoshPath(t *testing.T) string {
	t.Helper()
	root, err := devmongo.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(root, "tools", "node", "node_modules", ".bin", "mongosh")
	if _, err := os.Stat(p); err != nil {
		msg := "mongosh is not installed (" + p + "): run `make node-tools`"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return p
}

// TestMongosh runs a mongosh script (insert, find with getMore, aggregate,
// runCommand) through mongobouncer against FerretDB and checks its output
// line by line.
func TestMongosh(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		sh := mongoshPath(t)
		ignore := goleak.IgnoreCurrent()
		t.Cleanup(func() { goleak.VerifyNone(t, ignore) })

		up := devmongo.Start(t)
		a, addr := bouncer(t, up.URI(), nil)
		script, err := filepath.Abs(filepath.Join("testdata", "mongosh_smoke.js"))
		if err != nil {
			t.Fatal(err)
		}

		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, sh, "mongodb://"+addr+"/test?serverSelectionTimeoutMS=10000",
			"--quiet", "--norc", "--file", script)
		// A private HOME keeps mongosh's logs and history out of the user's
		// home; without a terminal and with --quiet it neither sends telemetry
		// nor checks for updates.
		home := t.TempDir()
		cmd.Env = append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+home, "NO_COLOR=1")
		cmd.Dir = home
		cmd.WaitDelay = 5 * time.Second
		start := time.Now()
		out, err := cmd.CombinedOutput()
		t.Logf("mongosh ran in %v", time.Since(start).Round(time.Millisecond))
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) || ctx.Err() != nil {
				t.Fatalf("mongosh: %v (ctx %v); output:\n%s", err, ctx.Err(), out)
			}
			t.Fatal(err)
		}

		want := []string{
			"inserted: 5",
			"count: 6",
			"find: [1,2,3,4,6]",
			`aggregate: [{"_id":"a","total":9},{"_id":"b","total":6},{"_id":"c","total":5}]`,
			"ping: 1",
			`db: "test"`,
			"unknown command: 59",
		}
		got := strings.Split(strings.TrimSpace(strings.ReplaceAll(string(out), "\r\n", "\n")), "\n")
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("mongosh output:\n%s\nwant:\n%s", out, strings.Join(want, "\n"))
		}

		// The work went through the bouncer to the upstream: the documents are
		// there when read directly, and the bouncer served mongosh's
		// connections.
		if n := a.Server().TotalClients(); n == 0 {
			t.Fatal("the bouncer saw no client")
		}
		direct := driver(t, up.Addr(), "&directConnection=true")
		n, err := direct.Database("test").Collection("smoke").CountDocuments(ctxT(t, 10*time.Second), bson.D{})
		if err != nil {
			t.Fatal(err)
		}
		if n != 6 {
			t.Fatalf("upstream holds %d documents, want 6", n)
		}
	})
}

// TestMongoshShowPools runs the admin command an operator would type.
func TestMongoshShowPools(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		sh := mongoshPath(t)
		ignore := goleak.IgnoreCurrent()
		t.Cleanup(func() { goleak.VerifyNone(t, ignore) })

		up := devmongo.Start(t)
		a, addr := bouncer(t, up.URI(), nil)
		waitUsable(t, a, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		eval := `const r = db.getSiblingDB("mongobouncer").runCommand({showPools: 1});
	print("ok: " + r.ok + " pools: " + r.pools.length + " route: " + r.pools[0].route + " server: " + r.pools[0].server);`
		cmd := exec.CommandContext(ctx, sh, "mongodb://"+addr+"/test?serverSelectionTimeoutMS=10000",
			"--quiet", "--norc", "--eval", eval)
		home := t.TempDir()
		cmd.Env = append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+home, "NO_COLOR=1")
		cmd.Dir = home
		cmd.WaitDelay = 5 * time.Second
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("mongosh: %v; output:\n%s", err, out)
		}
		want := "ok: 1 pools: 1 route: * server: " + up.Addr()
		if got := strings.TrimSpace(string(out)); got != want {
			t.Fatalf("mongosh showPools:\n%s\nwant:\n%s", got, want)
		}
	})
}
