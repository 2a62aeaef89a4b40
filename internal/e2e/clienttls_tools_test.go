package e2e

// Real clients other than the Go driver over client TLS: mongosh, pymongo
// and a libmongoc program connect to mongobouncer over TLS (tls_mode =
// "require" and "allow"), log in with SCRAM over TLS and with
// MONGODB-X509, and are refused without TLS, with a certificate from
// another CA, or without one; all certificates are made in the test.
//
// These tests run once (oneIO), on the shipped configuration (the event
// loop on): a TLS client is served on its own goroutine in every I/O model
// (the loop reads raw sockets and cannot decrypt, see proxy.startTLS), so
// the models differ only for the plain client of tls_mode = "allow", which
// the default model sends to the loop; TestTLSAllowPlainAndTLSOnOnePort
// covers that on every model with the Go driver. Each tool starts once per
// test (mongosh alone takes about a second to start) and checks every case
// in that one process; a case that must be refused waits one second for a
// server (the tools report the cause only when server selection gives up),
// which is most of mongosh's and pymongo's five seconds or so.

import (
	"context"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/app"
	"github.com/mongobouncer/mongobouncer/internal/testutil/certs"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/logbuf"
)

// x509User is the subject of newTLSFiles' client certificate, as MongoDB
// names an X.509 user (RFC 2253).
const x509User = "CN=app,O=Example"

// namedSubject and namedUser are the subject of a second client
// certificate, and its user as OpenSSL prints it and mongod names it: a
// non-ASCII character's bytes escaped, and the two values of the
// multi-valued O in reverse of their DER order (a SET sorts the shorter
// first).
var (
	namedSubject = pkix.Name{CommonName: "Jürgen", Organization: []string{"Example", "Two"}}
	namedUser    = `CN=J\C3\BCrgen,O=Example+O=Two`
)

// tlsToolSetup is what the TLS tests of real clients run against: one
// upstream and four mongobouncers in front of it, each with the same
// server certificate.
type tlsToolSetup struct {
	up *fakemongo.Server
	f  tlsFiles
	// otherClient is a client certificate (with its key) from another
	// CA, with the same subject as f's; namedClient one of f's CA with
	// namedSubject.
	otherClient, namedClient string
	// require serves TLS clients only, without client certificates;
	// allow serves TLS and plain on one port; x509 requires TLS with a
	// verified client certificate and auth_type = "x509"; scram requires
	// TLS and auth_type = "scram" (authSetup's users).
	require, allow, x509, scram string
	x509App                     *app.App
	x509Logs                    *logbuf.Buffer
}

func newTLSToolSetup(t *testing.T) *tlsToolSetup {
	t.Helper()
	s := &tlsToolSetup{up: fakemongo.Start(t, fakemongo.Options{InMemory: true}), x509Logs: &logbuf.Buffer{}}
	dir := t.TempDir()
	s.f = newTLSFiles(t, dir, "a")
	other := certs.NewCA(t, "other CA")
	cl := other.Client(t, pkix.Name{CommonName: "app", Organization: []string{"Example"}})
	s.otherClient = certs.Write(t, dir, "other-client.pem", cl.CertPEM(), cl.KeyPEM(t))
	named := s.f.issuer.Client(t, namedSubject)
	s.namedClient = certs.Write(t, dir, "named-client.pem", named.CertPEM(), named.KeyPEM(t))

	var a *app.App
	a, s.require, _ = fileBouncer(t, baseTOML(s.up.URI(), s.f.tlsTOML("require", false)))
	waitUsable(t, a, 1)
	a, s.allow, _ = fileBouncer(t, baseTOML(s.up.URI(), s.f.tlsTOML("allow", false)))
	waitUsable(t, a, 1)
	s.x509App, s.x509, _ = fileBouncerLogging(t, baseTOML(s.up.URI(), s.f.tlsTOML("require", true)+"auth_type = \"x509\"\n"), s.x509Logs)
	waitUsable(t, s.x509App, 1)
	a, s.scram, _ = authSetupWith(t, s.up.URI(), nil, s.f.tlsTOML("require", false))
	waitUsable(t, a, 1)
	return s
}

// toolURI is a connection string to addr with query parameters q. Clients
// expected to be refused wait one second for a server, not ten.
func toolURI(addr string, refused bool, q string) string {
	ms := 10000
	if refused {
		ms = 1000
	}
	return fmt.Sprintf("mongodb://%s/?serverSelectionTimeoutMS=%d&connectTimeoutMS=5000%s", addr, ms, q)
}

// userAt is addr with a user name (MONGODB-X509's user is the
// certificate's subject; drivers send it when the URI names it). The
// name is escaped as a query value, so that a '+' reaches pymongo, which
// decodes the user as one, as '+' and not as a space.
func userAt(addr, user string) string {
	return url.QueryEscape(user) + "@" + addr
}

// cases are the connections every tool makes, in the order of its
// output: name, connection string, and what the tool does (see the
// scripts).
func (s *tlsToolSetup) cases() [][3]string {
	tlsQ := "&tls=true&tlsCAFile=" + s.f.ca
	x509Q := tlsQ + "&authMechanism=MONGODB-X509&tlsCertificateKeyFile="
	return [][3]string{
		{"require tls", toolURI(s.require, false, tlsQ), "rw"},
		{"require plain", toolURI(s.require, true, ""), "ping"},
		{"allow tls", toolURI(s.allow, false, tlsQ), "rw"},
		{"allow plain", toolURI(s.allow, false, ""), "rw"},
		{"x509", toolURI(s.x509, false, x509Q+s.f.clientPEM), "x509"},
		{"x509 named", toolURI(userAt(s.x509, namedUser), false, x509Q+s.namedClient), "x509"},
		{"x509 wrong name", toolURI(userAt(s.x509, "CN=ops,O=Example"), true, x509Q+s.f.clientPEM), "ping"},
		{"x509 other CA", toolURI(s.x509, true, x509Q+s.otherClient), "ping"},
		{"x509 no certificate", toolURI(s.x509, true, tlsQ+"&authMechanism=MONGODB-X509"), "ping"},
		{"scram tls", toolURI(s.login("app", authUsers["app"]), false, tlsQ+"&authSource=admin"), "rw"},
	}
}

// login is the scram mongobouncer's address with user and password.
func (s *tlsToolSetup) login(user, password string) string {
	return url.UserPassword(user, password).String() + "@" + s.scram
}

// toolArgs are the cases as one list: name, URI, action, name, ...
func (s *tlsToolSetup) toolArgs() []string {
	var args []string
	for _, c := range s.cases() {
		args = append(args, c[0], c[1], c[2])
	}
	return args
}

// check compares a tool's output with what each case must print: "rw"
// cases a write and a read, "x509" ones the user mongobouncer logged the
// certificate in as, and every refusal an error naming its cause. It then
// checks the upstream got the writes and mongobouncer logged the X.509
// login.
func (s *tlsToolSetup) check(t *testing.T, tool, coll, out string) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(strings.ReplaceAll(out, "\r\n", "\n")), "\n")
	want := map[string]func(string) bool{
		"require tls":   func(l string) bool { return l == "count 1" },
		"require plain": func(l string) bool { return strings.HasPrefix(l, "error ") && strings.Contains(l, "requires TLS") },
		"allow tls":     func(l string) bool { return l == "count 2" },
		"allow plain":   func(l string) bool { return l == "count 3" },
		"x509":          func(l string) bool { return l == "user "+x509User+" db $external count 4" },
		"x509 named":    func(l string) bool { return l == "user "+namedUser+" db $external count 5" },
		"x509 wrong name": func(l string) bool {
			return strings.HasPrefix(l, "error ") && strings.Contains(l, "Authentication failed")
		},
		// A certificate from another CA, and none, fail the handshake
		// with the alert mongobouncer sends (both tools print OpenSSL's
		// words for it).
		"x509 other CA": func(l string) bool {
			return strings.HasPrefix(l, "error ") && strings.Contains(strings.ToLower(l), "unknown ca")
		},
		"x509 no certificate": func(l string) bool {
			return strings.HasPrefix(l, "error ") && strings.Contains(strings.ToLower(l), "certificate required")
		},
		"scram tls": func(l string) bool { return l == "count 6" },
	}
	got := map[string]string{}
	for _, l := range lines {
		name, rest, ok := strings.Cut(l, ": ")
		if _, known := want[name]; ok && known {
			got[name] = rest
		}
	}
	for _, c := range s.cases() {
		if l, ok := got[c[0]]; !ok || !want[c[0]](l) {
			t.Errorf("%s, %s: got %q", tool, c[0], l)
		}
	}
	if t.Failed() {
		t.Fatalf("%s output:\n%s", tool, out)
	}
	if n := len(s.up.Collection("test", coll)); n != 6 {
		t.Errorf("upstream holds %d documents of test.%s, want 6", n, coll)
	}
	logs := s.x509Logs.String()
	if !strings.Contains(logs, "client logged in") || !strings.Contains(logs, x509User) {
		t.Errorf("mongobouncer logged no X.509 login as %s:\n%s", x509User, logs)
	}
	if hs := handshakeRefusals(s.x509App, 2); hs < 2 {
		t.Errorf("TLS handshake refusals counted: %d, want at least 2 (another CA, no certificate)", hs)
	}
}

// handshakeRefusals returns a's count of failed client TLS handshakes
// once it reaches n, or after two seconds: the server counts a refusal
// after its alert, which the client may have read and reported first.
func handshakeRefusals(a *app.App, n uint64) uint64 {
	deadline := time.Now().Add(2 * time.Second)
	for {
		_, hs := a.Server().TLSRefusals()
		if hs >= n || time.Now().After(deadline) {
			return hs
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// mongoshTLSScript runs the cases given in MONGOBOUNCER_TLS_CASES (see
// cases and toolArgs). The
// X.509 case authenticates once more on the connection to read the user
// mongobouncer answers with, as mongosh shows no such thing otherwise.
const mongoshTLSScript = `
const args = JSON.parse(process.env.MONGOBOUNCER_TLS_CASES);
for (let i = 0; i + 2 < args.length; i += 3) {
  const [name, uri, action] = args.slice(i, i + 3);
  try {
    const db = connect(uri).getSiblingDB("test");
    let line = "";
    if (action === "x509") {
      const r = db.getSiblingDB("$external").runCommand({authenticate: 1, mechanism: "MONGODB-X509"});
      line = "user " + r.user + " db " + r.dbname + " ";
    }
    if (action === "ping") {
      line = "ok " + db.runCommand({ping: 1}).ok;
    } else {
      db.tls_sh.insertOne({case: name});
      line += "count " + db.tls_sh.find().toArray().length;
    }
    print(name + ": " + line);
  } catch (e) {
    print(name + ": error " + e.name + " " + String(e.message).split("\n")[0]);
  }
}
`

// mongosh connects over TLS with the generated CA, is refused without
// TLS where it is required, uses one port both ways with allow, and logs
// in with MONGODB-X509 (refused with a certificate from another CA).
func TestMongoshTLS(t *testing.T) {
	oneIO(t) // TLS clients, which the event loop never serves (see eachIO)
	sh := mongoshPath(t)
	s := newTLSToolSetup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// mongosh takes further arguments as files to run: the cases go in
	// the environment.
	cases, err := json.Marshal(s.toolArgs())
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, sh, "--nodb", "--quiet", "--norc", "--eval", mongoshTLSScript)
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+home, "NO_COLOR=1", "MONGOBOUNCER_TLS_CASES="+string(cases))
	cmd.Dir = home
	s.runAndCheck(t, "mongosh", "tls_sh", cmd)
}

// runAndCheck runs a tool's script (bounded by the command's context and
// WaitDelay), and checks what it printed for every case.
func (s *tlsToolSetup) runAndCheck(t *testing.T, tool, coll string, cmd *exec.Cmd) {
	t.Helper()
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v; output:\n%s", tool, err, out)
	}
	t.Logf("%s ran in %v:\n%s", tool, time.Since(start).Round(time.Millisecond), out)
	s.check(t, tool, coll, string(out))
}

// pymongoTLSScript is mongoshTLSScript for pymongo (3.11: tls, tlsCAFile
// and tlsCertificateKeyFile in the URI, MONGODB-X509 without a user
// name).
const pymongoTLSScript = `import sys, pymongo
args = sys.argv[1:]
for i in range(0, len(args) - 2, 3):
    name, uri, action = args[i:i + 3]
    c = pymongo.MongoClient(uri)
    try:
        db = c.test
        line = ""
        if action == "x509":
            r = c["$external"].command({"authenticate": 1, "mechanism": "MONGODB-X509"})
            line = "user %s db %s " % (r["user"], r["dbname"])
        if action == "ping":
            line = "ok %s" % db.command("ping")["ok"]
        else:
            db.tls_py.insert_one({"case": name})
            line += "count %d" % len(list(db.tls_py.find()))
        print("%s: %s" % (name, line))
    except Exception as e:
        print("%s: error %s %s" % (name, type(e).__name__, str(e).splitlines()[0] if str(e) else ""))
    finally:
        c.close()
`

// pymongo does what TestMongoshTLS's mongosh does.
func TestPymongoTLS(t *testing.T) {
	oneIO(t) // TLS clients, which the event loop never serves (see eachIO)
	needPymongo(t)
	s := newTLSToolSetup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, debianPython, append([]string{"-c", pymongoTLSScript}, s.toolArgs()...)...)
	s.runAndCheck(t, "pymongo", "tls_py", cmd)
}

// needPymongo skips t when Debian's pymongo is missing (and fails it
// under CI, which installs it).
func needPymongo(t *testing.T) {
	t.Helper()
	if err := exec.Command(debianPython, "-c", "import pymongo").Run(); err != nil {
		msg := fmt.Sprintf("pymongo is not installed for %s (%v): run `make python-tools` as root", debianPython, err)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// mongocClient compiles testdata/mongoc_login.c against Debian's
// libmongoc-dev (about half a second) and returns the program; it skips
// when the compiler or the library is missing (and fails under CI, whose
// `make test` installs them with `make c-tools`).
func mongocClient(t *testing.T) string {
	t.Helper()
	need := func(err error) {
		if err == nil {
			return
		}
		msg := fmt.Sprintf("libmongoc client: %v: run `make c-tools` as root", err)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	cc, err := exec.LookPath("cc")
	need(err)
	flags, err := exec.Command("pkg-config", "--cflags", "--libs", "libmongoc-1.0").Output()
	need(err)
	bin := filepath.Join(t.TempDir(), "mongoc_login")
	args := append([]string{"-Wall", "-o", bin, filepath.Join("testdata", "mongoc_login.c")}, strings.Fields(string(flags))...)
	if out, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		t.Fatalf("compiling the libmongoc client: %v\n%s", err, out)
	}
	return bin
}

// libmongoc (Debian's, 1.23: OpenSSL, and ICU for SCRAM-SHA-256's
// SASLprep of app's non-ASCII password) logs in with SCRAM over TLS,
// writes and reads; a wrong password gets AuthenticationFailed, a plain
// connection mongobouncer's TLS-required error; and it logs in with
// MONGODB-X509, but not with a certificate from another CA.
func TestMongocTLS(t *testing.T) {
	oneIO(t) // TLS clients, which the event loop never serves (see eachIO)
	bin := mongocClient(t)
	s := newTLSToolSetup(t)
	tlsQ := "&tls=true&tlsCAFile=" + s.f.ca
	login, wrong := s.login("app", authUsers["app"]), s.login("app", "wrong")
	x509Q := tlsQ + "&authMechanism=MONGODB-X509&tlsCertificateKeyFile="
	cases := [][2]string{
		{"scram tls", toolURI(login, false, tlsQ+"&authSource=admin")},
		{"scram wrong password", toolURI(wrong, true, tlsQ+"&authSource=admin")},
		{"scram plain", toolURI(login, true, "&authSource=admin")},
		{"x509", toolURI(s.x509, false, x509Q+s.f.clientPEM)},
		{"x509 other CA", toolURI(s.x509, true, x509Q+s.otherClient)},
	}
	want := map[string]func(string) bool{
		"scram tls": func(l string) bool { return l == "count 1" },
		// libmongoc reports a failed login with its own code
		// (MONGOC_ERROR_CLIENT_AUTHENTICATE) and the server's message.
		"scram wrong password": func(l string) bool {
			return strings.HasPrefix(l, "error ") && strings.Contains(l, "Authentication failed")
		},
		"scram plain": func(l string) bool {
			return strings.HasPrefix(l, "error ") && strings.Contains(l, "requires TLS")
		},
		"x509": func(l string) bool { return l == "count 2" },
		// It sees the connection closed (TLS 1.3: the client's handshake
		// ends before the server checks its certificate); the server's
		// refusal count tells the cause.
		"x509 other CA": func(l string) bool { return strings.HasPrefix(l, "error ") },
	}
	var args []string
	for _, c := range cases {
		args = append(args, c[0], c[1])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	var stderr logbuf.Buffer
	cmd.Stderr = &stderr // libmongoc logs its warnings there
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("libmongoc client: %v; output:\n%s%s", err, out, stderr.String())
	}
	t.Logf("libmongoc client ran in %v:\n%s", time.Since(start).Round(time.Millisecond), out)
	got := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if name, rest, ok := strings.Cut(l, ": "); ok {
			got[name] = rest
		}
	}
	for _, c := range cases {
		if l, ok := got[c[0]]; !ok || !want[c[0]](l) {
			t.Errorf("libmongoc, %s: got %q", c[0], l)
		}
	}
	if t.Failed() {
		t.Fatalf("output:\n%s%s", out, stderr.String())
	}
	if hs := handshakeRefusals(s.x509App, 1); hs < 1 {
		t.Errorf("TLS handshake refusals counted: %d, want at least 1 (the certificate from another CA)", hs)
	}
	if n := len(s.up.Collection("test", "tls_c")); n != 2 {
		t.Errorf("upstream holds %d documents of test.tls_c, want 2", n)
	}
	if logs := s.x509Logs.String(); !strings.Contains(logs, "client logged in") || !strings.Contains(logs, x509User) {
		t.Errorf("mongobouncer logged no X.509 login as %s:\n%s", x509User, logs)
	}
}
