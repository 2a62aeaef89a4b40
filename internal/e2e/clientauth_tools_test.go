package e2e

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/testutil/devmongo"
)

// authURI is a connection string to addr logged in as app.
func authURI(addr, path string) string {
	u := url.URL{Scheme: "mongodb", User: url.UserPassword("app", authUsers["app"]), Host: addr, Path: path,
		RawQuery: "authSource=admin&serverSelectionTimeoutMS=10000"}
	return u.String()
}

// mongosh logs in (it negotiates the mechanism with saslSupportedMechs and
// starts speculatively) and works; with a wrong password it is refused.
func TestMongoshLogsIn(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		sh := mongoshPath(t)
		up := devmongo.Start(t)
		_, addr, _ := authSetup(t, up.URI(), nil)
		run := func(uri string) (string, error) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, sh, uri, "--quiet", "--norc", "--eval",
				`db.auth_sh.insertOne({a: 1}); print("ping: " + db.runCommand({ping: 1}).ok); print("count: " + db.auth_sh.countDocuments({}))`)
			home := t.TempDir()
			cmd.Env = append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+home, "NO_COLOR=1")
			cmd.Dir = home
			cmd.WaitDelay = 5 * time.Second
			out, err := cmd.CombinedOutput()
			return strings.TrimSpace(strings.ReplaceAll(string(out), "\r\n", "\n")), err
		}
		out, err := run(authURI(addr, "/test"))
		if err != nil || out != "ping: 1\ncount: 1" {
			t.Fatalf("mongosh: %v; output:\n%s", err, out)
		}
		// And with SCRAM-SHA-1, named in the string.
		out, err = run(authURI(addr, "/test") + "&authMechanism=SCRAM-SHA-1")
		if err != nil || out != "ping: 1\ncount: 2" {
			t.Fatalf("mongosh with SCRAM-SHA-1: %v; output:\n%s", err, out)
		}
		bad := strings.Replace(authURI(addr, "/test"), url.QueryEscape(authUsers["app"]), "wrong", 1)
		if out, err := run(bad); err == nil || !strings.Contains(out, "Authentication failed") {
			t.Fatalf("mongosh with a wrong password: %v; output:\n%s", err, out)
		}
	})
}

// pymongo 3.11 logs in after a legacy OP_QUERY isMaster (with
// saslSupportedMechs and speculativeAuthenticate in it).
func TestPymongoLogsIn(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := devmongo.Start(t)
		_, addr, _ := authSetup(t, up.URI(), nil)
		if err := exec.Command(debianPython, "-c", "import pymongo").Run(); err != nil {
			msg := "pymongo is not installed for " + debianPython + ": run `make python-tools` as root"
			if os.Getenv("CI") != "" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
		script := `import sys, pymongo
c = pymongo.MongoClient(sys.argv[1], serverSelectionTimeoutMS=10000, connectTimeoutMS=5000)
c.test.auth_py.insert_one({"a": 1})
print("ping: %s" % c.admin.command("ping")["ok"])
print("count: %d" % c.test.auth_py.count_documents({}))
for mech in ("SCRAM-SHA-1", "SCRAM-SHA-256"):
    m = pymongo.MongoClient(sys.argv[1] + "&authMechanism=" + mech, serverSelectionTimeoutMS=10000)
    m.test.auth_py.insert_one({"m": mech})
    print("%s: %d" % (mech, m.test.auth_py.count_documents({"m": mech})))
try:
    pymongo.MongoClient(sys.argv[2], serverSelectionTimeoutMS=10000).admin.command("ping")
except pymongo.errors.OperationFailure as e:
    print("wrong password: %d" % e.code)
`
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		bad := strings.Replace(authURI(addr, "/"), url.QueryEscape(authUsers["app"]), "wrong", 1)
		cmd := exec.CommandContext(ctx, debianPython, "-c", script, authURI(addr, "/"), bad)
		cmd.WaitDelay = 5 * time.Second
		out, err := cmd.CombinedOutput()
		if got := strings.TrimSpace(string(out)); err != nil || got != "ping: 1.0\ncount: 1\nSCRAM-SHA-1: 1\nSCRAM-SHA-256: 1\nwrong password: 18" {
			t.Fatalf("pymongo: %v; output:\n%s", err, out)
		}
	})
}
