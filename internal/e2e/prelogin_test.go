package e2e

import (
	"crypto/x509/pkix"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/app"
	"github.com/mongobouncer/mongobouncer/internal/testutil/certs"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// This file is what a client that has not logged in can make
// mongobouncer do, with client authentication on: little, bounded, and
// nothing upstream.

// A ping and a buildInfo before a login, with a session and a transaction
// number, are answered by mongobouncer: nothing is checked out, forwarded
// or pinned. Sockets that never log in, more of them than the route's
// session-mode pool has connections, leave the whole pool to a client that
// logs in, within a short wait_queue_timeout.
func TestPreLoginPingTakesNoConnection(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		a, addr := preLoginBouncer(t, up.URI(), "session", 2)
		lsid := bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: make([]byte, 16)}}}
		var raws []*rawClient
		for range 4 {
			r := dialRaw(t, addr)
			r.hello()
			ping := bson.D{{Key: "ping", Value: 1}, {Key: "lsid", Value: lsid}, {Key: "txnNumber", Value: int64(7)}, {Key: "$db", Value: "shop"}}
			if rep := r.cmd(ping); okOf(rep) != 1 {
				t.Fatalf("ping before login: %v", rep)
			}
			raws = append(raws, r)
		}
		for _, p := range a.Pools() {
			if p.InUse != 0 {
				t.Fatalf("pool %s/%s has %d connections in use, no client logged in", p.Route, p.Server, p.InUse)
			}
		}
		c := authDriver(t, addr, "SCRAM-SHA-256", "app", authUsers["app"])
		if _, err := c.Database("shop").Collection("orders").InsertOne(ctxT(t, 10*time.Second), bson.D{{Key: "n", Value: 1}}); err != nil {
			t.Fatalf("insert of a logged-in client beside %d unauthenticated sockets: %v", len(raws), err)
		}
		for _, r := range raws {
			if okOf(r.cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "shop"}})) != 1 {
				t.Fatal("a raw socket lost its ping")
			}
			// mongobouncer's own answer: the upstream's would name its build.
			rep := r.cmd(bson.D{{Key: "buildInfo", Value: 1}, {Key: "$db", Value: "admin"}})
			if okOf(rep) != 1 || rep.Lookup("version").StringValue() == "" || rep.Lookup("gitVersion").Validate() == nil {
				t.Fatalf("buildInfo before login: %v", rep)
			}
		}
		if n := up.Requests("ping") + up.Requests("buildInfo"); n != 0 {
			t.Fatalf("the upstream saw %d pings and buildInfos of clients that never logged in", n)
		}
	})
}

// preLoginLimit is max_prelogin_message_size's default.
const preLoginLimit = 64 * 1024

// Before a login a message is read under max_prelogin_message_size: a
// header declaring more is refused at once, before its body (an error
// reply, then the connection is closed), and so is an OP_COMPRESSED
// declaring more, before anything is inflated. After the login the
// listener's max_message_size applies again, compressed or not.
func TestPreLoginMessageBounds(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		_, addr, _ := authSetup(t, up.URI(), nil)
		bigPing := func(id int32, pad int) []byte {
			return wire.AppendMsg(nil, id, 0, 0, docOf(t, bson.D{{Key: "ping", Value: 1},
				{Key: "pad", Value: strings.Repeat("p", pad)}, {Key: "$db", Value: "shop"}}))
		}

		// Only the header of a 1 MiB message: the refusal does not wait
		// for the rest.
		r := dialRaw(t, addr)
		r.hello()
		r.sendRaw(bigPing(41, 1<<20)[:wire.HeaderLen])
		rep, err := malRecv(r.c, 5*time.Second)
		if err != nil {
			t.Fatalf("header of 1 MiB before login: want an error reply at once, got %v", err)
		}
		if rep.responseTo != 41 {
			t.Fatalf("responseTo %d, want 41", rep.responseTo)
		}
		malCheckError(t, rep.body, 17, "max_prelogin_message_size")
		if !r.closed(5 * time.Second) {
			t.Fatal("connection still open after a message over max_prelogin_message_size")
		}

		// Compressed with the compressor the hello agreed on, declaring
		// 16 MiB in a few KB.
		z := dialRaw(t, addr)
		h := z.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "compression", Value: bson.A{"zstd"}}, {Key: "$db", Value: "admin"}})
		if comp, _ := h.Lookup("compression").ArrayOK(); len(comp) == 0 {
			t.Fatalf("zstd not agreed: %v", h)
		}
		bomb, err := wire.Compress(nil, bigPing(42, 16<<20), wire.CompressorZstd)
		if err != nil {
			t.Fatal(err)
		}
		if len(bomb) > preLoginLimit {
			t.Fatalf("compressed bomb is %d bytes, want it under the limit", len(bomb))
		}
		z.sendRaw(bomb)
		rep, err = malRecv(z.c, 5*time.Second)
		if err != nil {
			t.Fatalf("compressed 16 MiB before login: want an error reply, got %v", err)
		}
		malCheckError(t, rep.body, 17, "max_prelogin_message_size")
		if !z.closed(5 * time.Second) {
			t.Fatal("connection still open after a compressed message over max_prelogin_message_size")
		}
		if up.Requests("ping") != 0 {
			t.Fatalf("the upstream saw %d pings", up.Requests("ping"))
		}

		// Logged in, on one connection: 1 MiB plain, and 1 MiB compressed
		// with the agreed compressor.
		l := dialRaw(t, addr)
		h = l.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "compression", Value: bson.A{"zstd"}}, {Key: "$db", Value: "admin"}})
		if comp, _ := h.Lookup("compression").ArrayOK(); len(comp) == 0 {
			t.Fatalf("zstd not agreed: %v", h)
		}
		if rep := rawLogin(t, l, "SCRAM-SHA-256", "app", authUsers["app"], true); okOf(rep) != 1 {
			t.Fatalf("login: %v", rep)
		}
		insert := func(id int32, n int) []byte {
			return wire.AppendMsg(nil, id, 0, 0, docOf(t, bson.D{{Key: "insert", Value: "big"},
				{Key: "documents", Value: bson.A{bson.D{{Key: "_id", Value: n}, {Key: "s", Value: strings.Repeat("s", 1<<20)}}}},
				{Key: "$db", Value: "shop"}}))
		}
		l.sendRaw(insert(43, 1))
		if rep := l.recv(); rep.header.ResponseTo != 43 || okOf(rep.body) != 1 {
			t.Fatalf("1 MiB insert after login: %v", rep.body)
		}
		zi, err := wire.Compress(nil, insert(44, 2), wire.CompressorZstd)
		if err != nil {
			t.Fatal(err)
		}
		l.sendRaw(zi)
		if rep := l.recv(); rep.header.ResponseTo != 44 || okOf(rep.body) != 1 {
			t.Fatalf("compressed 1 MiB insert after login: %v", rep.body)
		}
		if docs := up.Collection("shop", "big"); len(docs) != 2 {
			t.Fatalf("upstream holds %d documents, want 2", len(docs))
		}
	})
}

// max_prelogin_message_size is the configured bound, shown by SHOW
// CONFIG, and a reload changes it for connected clients.
func TestPreLoginMessageSizeConfigured(t *testing.T) {
	oneIO(t) // messages over the loop's inline buffer are the goroutine's in every model
	up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
	users := writeUsers(t, map[string]string{"app@admin": authUsers["app"]})
	toml := func(n int) string {
		return baseTOML(up.URI(), fmt.Sprintf("auth_type = \"scram\"\nauth_file = %q\nmax_prelogin_message_size = %d\n", users, n)) +
			"pass_through = false\n"
	}
	a, addr, path := fileBouncer(t, toml(16384))
	if got := a.Config()["max_prelogin_message_size"]; got != 16384 {
		t.Fatalf("SHOW CONFIG max_prelogin_message_size = %v", got)
	}
	ping := func(id int32) []byte {
		return wire.AppendMsg(nil, id, 0, 0, docOf(t, bson.D{{Key: "ping", Value: 1},
			{Key: "pad", Value: strings.Repeat("p", 20_000)}, {Key: "$db", Value: "shop"}}))
	}
	r := dialRaw(t, addr)
	r.hello()
	r.sendRaw(ping(5))
	rep, err := malRecv(r.c, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	malCheckError(t, rep.body, 17, "max_prelogin_message_size (16384 bytes)")

	if err := os.WriteFile(path, []byte(toml(32768)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	r = dialRaw(t, addr)
	r.hello()
	r.sendRaw(ping(6))
	if rep := r.recv(); rep.header.ResponseTo != 6 || okOf(rep.body) != 1 {
		t.Fatalf("a 20 KB ping before login under a limit reloaded to 32768: %v", rep.body)
	}
}

// A user name over 1 KiB fails the login like any failure, and the log
// does not carry it whole.
func TestPreLoginLongUserName(t *testing.T) {
	oneIO(t) // logins run on the client's goroutine in every model
	up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
	var logs syncBuffer
	_, addr, _ := authSetup(t, up.URI(), &logs)
	r := dialRaw(t, addr)
	r.hello()
	long := strings.Repeat("x", 5000)
	rep := rawLogin(t, r, "SCRAM-SHA-256", long, "pw", true)
	if codeOf(rep) != 18 || rep.Lookup("errmsg").StringValue() != "mongobouncer: Authentication failed." {
		t.Fatalf("login as a 5000-byte user: %v", rep)
	}
	if strings.Contains(logs.String(), strings.Repeat("x", 1000)) {
		t.Fatal("the log carries the long user name whole")
	}
	// The connection stays, as after any failed login.
	if rep := rawLogin(t, r, "SCRAM-SHA-256", "app", authUsers["app"], true); okOf(rep) != 1 {
		t.Fatalf("login after: %v", rep)
	}
}

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex // guards b
	b  []byte
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b = append(s.b, p...)
	return len(p), nil
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return string(s.b)
}

// preLoginBouncer starts a mongobouncer with authSetup's users (app, bob,
// ops) whose route forwards on unauthenticated upstream connections (as
// one with a service user does) in pool mode mode, with at most pool
// connections and a wait_queue_timeout of 500ms.
func preLoginBouncer(t *testing.T, up, mode string, pool int) (*app.App, string) {
	t.Helper()
	users := map[string]string{}
	for _, u := range []string{"app", "bob", "ops"} {
		users[u+"@admin"] = authUsers[u]
	}
	toml := baseTOML(up, fmt.Sprintf("auth_type = \"scram\"\nauth_file = %q\nwait_queue_timeout = \"500ms\"\n", writeUsers(t, users)))
	toml = strings.Replace(toml, `pool_mode = "statement"`, fmt.Sprintf("pool_mode = %q", mode), 1)
	toml = strings.Replace(toml, "max_pool_size = 5", fmt.Sprintf("max_pool_size = %d", pool), 1)
	a, addr, _ := fileBouncer(t, toml+"pass_through = false\n")
	return a, addr
}

// A certificate whose subject is over 1 KiB logs nobody in with
// MONGODB-X509, as a SCRAM user name over 1 KiB.
func TestPreLoginLongX509Subject(t *testing.T) {
	oneIO(t) // TLS clients stay on their goroutine in every model
	up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
	f := newTLSFiles(t, t.TempDir(), "a")
	a, addr, _ := fileBouncer(t, baseTOML(up.URI(), f.tlsTOML("require", true)+"auth_type = \"x509\"\n"))
	waitUsable(t, a, 1)
	long := f.issuer.Client(t, pkix.Name{CommonName: strings.Repeat("x", 1100), Organization: []string{"Example"}})
	longPEM := certs.Write(t, f.dir, "long-client.pem", long.CertPEM(), long.KeyPEM(t))
	_, err := tryDriver(t, addr, "&tls=true&tlsCAFile="+f.ca+"&tlsCertificateKeyFile="+longPEM+"&authMechanism=MONGODB-X509")
	if err == nil || !strings.Contains(err.Error(), "AuthenticationFailed") {
		t.Fatalf("X.509 login with a subject over 1 KiB: %v, want AuthenticationFailed", err)
	}
	// A short one still logs in.
	c := driver(t, addr, "&tls=true&tlsCAFile="+f.ca+"&tlsCertificateKeyFile="+f.clientPEM+"&authMechanism=MONGODB-X509")
	if err := c.Ping(ctxT(t, 10*time.Second), nil); err != nil {
		t.Fatalf("X.509 login: %v", err)
	}
}
