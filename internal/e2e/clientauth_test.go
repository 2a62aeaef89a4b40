package e2e

import (
	"bytes"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/xdg-go/scram"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongobouncer/mongobouncer/internal/app"
	"github.com/mongobouncer/mongobouncer/internal/auth"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// authUsers are the users of the client authentication tests: a plain
// password, a hash-password line, and an admin.
var authUsers = map[string]string{
	"app":  "app-pässword",
	"bob":  "bob's secret",
	"ops":  "ops pass",
	"late": "added later",
}

// authSetup writes an auth_file (app plain, bob and ops hashed; late
// missing) and starts a mongobouncer with auth_type = "scram" and ops as
// admin, logging at info into logs. It returns the app, its address and
// the auth_file's path.
func authSetup(t *testing.T, up string, logs io.Writer) (*app.App, string, string) {
	t.Helper()
	return authSetupWith(t, up, logs, "")
}

// authSetupWith is authSetup with extra [mongobouncer] lines (TLS).
func authSetupWith(t *testing.T, up string, logs io.Writer, extraTOML string) (*app.App, string, string) {
	t.Helper()
	dir := t.TempDir()
	users := filepath.Join(dir, "users.txt")
	var b strings.Builder
	fmt.Fprintf(&b, "# users\n%q %q\n", "app@admin", authUsers["app"])
	for _, u := range []string{"bob", "ops"} {
		line, err := auth.HashPassword(u, "admin", authUsers[u])
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString(line + "\n")
	}
	if err := os.WriteFile(users, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	extra := fmt.Sprintf("auth_type = \"scram\"\nauth_file = %q\nadmin_users = [\"ops@admin\"]\n", users) + extraTOML
	// The fake upstream has no users: the route forwards unauthenticated
	// (pass-through has tests of its own, passthrough_test.go).
	a, addr, _ := fileBouncerLogging(t, baseTOML(up, extra)+"pass_through = false\n", logs)
	return a, addr, users
}

// authDriver connects the Go driver as user with mechanism.
func authDriver(t *testing.T, addr, mech, user, password string) *mongo.Client {
	t.Helper()
	uri := fmt.Sprintf("mongodb://%s/?serverSelectionTimeoutMS=10000&connectTimeoutMS=5000", addr)
	c, err := mongo.Connect(options.Client().ApplyURI(uri).SetAuth(options.Credential{
		AuthMechanism: mech, AuthSource: "admin", Username: user, Password: password,
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Disconnect(ctxT(t, 5*time.Second)) })
	return c
}

func TestClientLoginSCRAM(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		_, addr, _ := authSetup(t, up.URI(), nil)
		spy := newSpy(t, addr)
		for _, mech := range []string{"SCRAM-SHA-256", "SCRAM-SHA-1", ""} {
			for _, user := range []string{"app", "bob"} {
				t.Run(mech+"/"+user, func(t *testing.T) {
					ctx := ctxT(t, 30*time.Second)
					c := authDriver(t, spy.addr, mech, user, authUsers[user])
					coll := c.Database("shop").Collection("orders_" + user + mech)
					for i := range 5 {
						if _, err := coll.InsertOne(ctx, bson.D{{Key: "n", Value: i}}); err != nil {
							t.Fatal(err)
						}
					}
					cur, err := coll.Find(ctx, bson.D{})
					if err != nil {
						t.Fatal(err)
					}
					var docs []bson.M
					if err := cur.All(ctx, &docs); err != nil || len(docs) != 5 {
						t.Fatalf("found %d, %v", len(docs), err)
					}
				})
			}
		}
		// The driver logs in speculatively: the first step rides in hello,
		// so every saslStart the spy saw is inside a hello's
		// speculativeAuthenticate, and none was sent on its own.
		spec, starts := spy.count("speculativeAuthenticate"), spy.count("saslStart")
		if spec == 0 || starts != spec || spy.count("saslContinue") == 0 {
			t.Fatalf("speculativeAuthenticate seen %d times, saslStart %d, saslContinue %d", spec, starts, spy.count("saslContinue"))
		}
	})
}

func TestClientLoginFailuresLookAlike(t *testing.T) {
	oneIO(t) // the login is on the client's goroutine in every model
	up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
	_, addr, _ := authSetup(t, up.URI(), nil)
	for _, mech := range []string{"SCRAM-SHA-256", "SCRAM-SHA-1"} {
		var msgs []string
		for _, cred := range [][2]string{{"app", "wrong"}, {"nobody", "wrong"}, {"nobody", authUsers["app"]}} {
			c := authDriver(t, addr, mech, cred[0], cred[1])
			err := c.Ping(ctxT(t, 15*time.Second), nil)
			if err == nil {
				t.Fatalf("%s %s logged in", mech, cred[0])
			}
			var ce mongo.CommandError
			if !errors.As(err, &ce) || ce.Code != 18 {
				t.Fatalf("%s %v: %v, want code 18", mech, cred, err)
			}
			msgs = append(msgs, ce.Message)
		}
		for _, m := range msgs {
			if m != msgs[0] || m != "mongobouncer: Authentication failed." {
				t.Fatalf("%s: messages differ: %q", mech, msgs)
			}
		}
	}
}

// rawLogin logs a raw connection in with SCRAM, the long way (saslStart,
// then the final empty saslContinue) unless skip, and returns the reply
// of the step that failed or the last one.
func rawLogin(t *testing.T, r *rawClient, mech, user, password string, skip bool) bson.Raw {
	t.Helper()
	hg := scram.SHA256
	if mech == "SCRAM-SHA-1" {
		hg = scram.SHA1
		// MongoDB's SCRAM-SHA-1 password is this digest.
		password = md5hex(user + ":mongo:" + password)
	}
	cl, err := hg.NewClientUnprepped(user, password, "")
	if err != nil {
		t.Fatal(err)
	}
	conv := cl.NewConversation()
	c1, _ := conv.Step("")
	start := bson.D{{Key: "saslStart", Value: 1}, {Key: "mechanism", Value: mech},
		{Key: "payload", Value: bson.Binary{Data: []byte(c1)}}, {Key: "$db", Value: "admin"}}
	if skip {
		start = append(start, bson.E{Key: "options", Value: bson.D{{Key: "skipEmptyExchange", Value: true}}})
	}
	rep := r.cmd(start)
	for okOf(rep) == 1 {
		if done, _ := rep.Lookup("done").BooleanOK(); done {
			return rep
		}
		_, in, _ := rep.Lookup("payload").BinaryOK()
		out, err := conv.Step(string(in))
		if err != nil && !conv.Done() {
			t.Fatalf("client step: %v", err)
		}
		rep = r.cmd(bson.D{{Key: "saslContinue", Value: 1}, {Key: "conversationId", Value: rep.Lookup("conversationId")},
			{Key: "payload", Value: bson.Binary{Data: []byte(out)}}, {Key: "$db", Value: "admin"}})
	}
	return rep
}

func TestUnauthenticatedCommandsRefusedConnectionStays(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		_, addr, _ := authSetup(t, up.URI(), nil)
		r := dialRaw(t, addr)
		r.hello()
		time.Sleep(20 * time.Millisecond) // idle: the event loop takes the client
		find := bson.D{{Key: "find", Value: "orders"}, {Key: "$db", Value: "shop"}}
		for range 3 {
			rep := r.cmd(find)
			if codeOf(rep) != 13 || !strings.Contains(rep.Lookup("errmsg").StringValue(), "requires authentication") {
				t.Fatalf("unauthenticated find: %v", rep)
			}
		}
		if rep := r.cmd(bson.D{{Key: "showClients", Value: 1}, {Key: "$db", Value: "mongobouncer"}}); codeOf(rep) != 13 {
			t.Fatalf("unauthenticated admin command: %v", rep)
		}
		if rep := r.cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "shop"}}); okOf(rep) != 1 {
			t.Fatalf("ping before login: %v", rep)
		}
		if up.Requests("find") != 0 || up.Requests("ping") != 0 {
			t.Fatalf("unauthenticated commands reached the upstream: %d finds, %d pings", up.Requests("find"), up.Requests("ping"))
		}
		if rep := r.cmd(bson.D{{Key: "saslContinue", Value: 1}, {Key: "conversationId", Value: 1},
			{Key: "payload", Value: bson.Binary{}}, {Key: "$db", Value: "admin"}}); codeOf(rep) != 17 {
			t.Fatalf("saslContinue without saslStart: %v", rep)
		}
		// The long form: the final empty saslContinue.
		if rep := rawLogin(t, r, "SCRAM-SHA-256", "app", authUsers["app"], false); okOf(rep) != 1 {
			t.Fatalf("login: %v", rep)
		}
		time.Sleep(20 * time.Millisecond)
		for range 3 {
			if rep := r.cmd(find); okOf(rep) != 1 {
				t.Fatalf("find after login: %v", rep)
			}
		}
		if up.Requests("find") != 3 {
			t.Fatalf("%d finds upstream, want 3", up.Requests("find"))
		}
		// Not an admin.
		if rep := r.cmd(bson.D{{Key: "showClients", Value: 1}, {Key: "$db", Value: "mongobouncer"}}); codeOf(rep) != 13 ||
			!strings.Contains(rep.Lookup("errmsg").StringValue(), "admin_users") {
			t.Fatalf("admin command by a non-admin: %v", rep)
		}
		// The same user again is fine; another user is refused, and the
		// connection keeps its user.
		if rep := rawLogin(t, r, "SCRAM-SHA-1", "app", authUsers["app"], true); okOf(rep) != 1 {
			t.Fatalf("same user again: %v", rep)
		}
		rep := rawLogin(t, r, "SCRAM-SHA-256", "ops", authUsers["ops"], true)
		if codeOf(rep) != 18 || !strings.Contains(rep.Lookup("errmsg").StringValue(), "one user") {
			t.Fatalf("second user on one connection: %v", rep)
		}
		if rep := r.cmd(bson.D{{Key: "logout", Value: 1}, {Key: "$db", Value: "admin"}}); codeOf(rep) != 115 {
			t.Fatalf("logout: %v", rep)
		}
		if rep := r.cmd(find); okOf(rep) != 1 {
			t.Fatalf("find after the refused login: %v", rep)
		}
	})
}

// TestUnauthenticatedCommandsPassThrough is the test above on a
// pass-through route (the default with auth_type = "scram"): a health
// check's ping and buildInfo before any login are answered by mongobouncer
// and reach nothing upstream: after the login, in session mode too, the
// client's commands run upstream as its user.
func TestUnauthenticatedCommandsPassThrough(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		for _, mode := range []string{"statement", "session"} {
			t.Run(mode, func(t *testing.T) {
				up, log := passUp(t)
				users := writeUsers(t, map[string]string{"alice@admin": "alice-pw"})
				toml := strings.Replace(baseTOML(up.URI(), fmt.Sprintf("auth_type = \"scram\"\nauth_file = %q\n", users)),
					`pool_mode = "statement"`, fmt.Sprintf("pool_mode = %q", mode), 1)
				_, addr, _ := fileBouncer(t, toml)
				r := dialRaw(t, addr)
				r.hello()
				time.Sleep(20 * time.Millisecond) // idle: the event loop takes the client
				for range 3 {
					if rep := r.cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "shop"}}); okOf(rep) != 1 {
						t.Fatalf("ping before login: %v", rep)
					}
					rep := r.cmd(bson.D{{Key: "buildInfo", Value: 1}, {Key: "$db", Value: "admin"}})
					if okOf(rep) != 1 || rep.Lookup("version").StringValue() == "" {
						t.Fatalf("buildInfo before login: %v", rep)
					}
				}
				find := bson.D{{Key: "find", Value: "orders"}, {Key: "$db", Value: "shop"}}
				if rep := r.cmd(find); codeOf(rep) != 13 || !strings.Contains(rep.Lookup("errmsg").StringValue(), "requires authentication") {
					t.Fatalf("unauthenticated find: %v", rep)
				}
				if up.Requests("ping") != 0 || up.Requests("buildInfo") != 0 || up.Requests("find") != 0 {
					t.Fatalf("upstream saw %d pings, %d buildInfos and %d finds of a client that has not logged in",
						up.Requests("ping"), up.Requests("buildInfo"), up.Requests("find"))
				}
				if rep := rawLogin(t, r, "SCRAM-SHA-256", "alice", "alice-pw", true); okOf(rep) != 1 {
					t.Fatalf("login: %v", rep)
				}
				time.Sleep(20 * time.Millisecond)
				for range 3 {
					if rep := r.cmd(find); okOf(rep) != 1 {
						t.Fatalf("find after login: %v", rep)
					}
				}
				if got := log.users("find"); !slices.Equal(got, []string{"admin.alice"}) {
					t.Fatalf("finds ran upstream as %q, want alice only", got)
				}
			})
		}
	})
}

func TestSaslSupportedMechsAndSpeculativeHello(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		_, addr, _ := authSetup(t, up.URI(), nil)
		r := dialRaw(t, addr)
		rep := r.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "saslSupportedMechs", Value: "admin.app"}, {Key: "$db", Value: "admin"}})
		mechs, _ := rep.Lookup("saslSupportedMechs").Array().Values()
		if len(mechs) != 2 || mechs[0].StringValue() != "SCRAM-SHA-1" || mechs[1].StringValue() != "SCRAM-SHA-256" {
			t.Fatalf("saslSupportedMechs: %v", rep)
		}
		cl, _ := scram.SHA256.NewClient("app", authUsers["app"], "")
		conv := cl.NewConversation()
		c1, _ := conv.Step("")
		rep = r.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "$db", Value: "admin"}, {Key: "speculativeAuthenticate", Value: bson.D{
			{Key: "saslStart", Value: 1}, {Key: "mechanism", Value: "SCRAM-SHA-256"},
			{Key: "payload", Value: bson.Binary{Data: []byte(c1)}}, {Key: "db", Value: "admin"},
			{Key: "options", Value: bson.D{{Key: "skipEmptyExchange", Value: true}}}}}})
		spec, ok := rep.Lookup("speculativeAuthenticate").DocumentOK()
		if !ok || okOf(rep) != 1 {
			t.Fatalf("hello with speculativeAuthenticate: %v", rep)
		}
		_, s1, _ := spec.Lookup("payload").BinaryOK()
		c2, err := conv.Step(string(s1))
		if err != nil {
			t.Fatal(err)
		}
		rep = r.cmd(bson.D{{Key: "saslContinue", Value: 1}, {Key: "conversationId", Value: spec.Lookup("conversationId")},
			{Key: "payload", Value: bson.Binary{Data: []byte(c2)}}, {Key: "$db", Value: "admin"}})
		if done, _ := rep.Lookup("done").BooleanOK(); !done || okOf(rep) != 1 {
			t.Fatalf("saslContinue after speculative start: %v", rep)
		}
		_, s2, _ := rep.Lookup("payload").BinaryOK()
		if _, err := conv.Step(string(s2)); err != nil || !conv.Valid() {
			t.Fatalf("server proof refused: %v", err)
		}
		if rep := r.cmd(bson.D{{Key: "find", Value: "x"}, {Key: "$db", Value: "shop"}}); okOf(rep) != 1 {
			t.Fatalf("find after speculative login: %v", rep)
		}
	})
}

func TestAdminUsersAndAuthFileReload(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		a, addr, users := authSetup(t, up.URI(), nil)
		ctx := ctxT(t, 30*time.Second)
		ops := authDriver(t, addr, "", "ops", authUsers["ops"])
		clients, err := ops.Database("mongobouncer").RunCommand(ctx, bson.D{{Key: "showClients", Value: 1}}).Raw()
		if err != nil {
			t.Fatalf("admin user: %v", err)
		}
		if !strings.Contains(clients.String(), `"user": "ops@admin"`) {
			t.Fatalf("showClients does not name the user: %s", clients)
		}
		app := authDriver(t, addr, "", "app", authUsers["app"])
		var ce mongo.CommandError
		if _, err := app.Database("mongobouncer").RunCommand(ctx, bson.D{{Key: "showClients", Value: 1}}).Raw(); !errors.As(err, &ce) || ce.Code != 13 {
			t.Fatalf("non-admin user: %v", err)
		}

		late := authDriver(t, addr, "SCRAM-SHA-256", "late", authUsers["late"])
		if err := late.Ping(ctx, nil); err == nil {
			t.Fatal("late logged in before it was added")
		}
		// A bad file: the reload fails, the users in force stay.
		old, _ := os.ReadFile(users)
		if err := os.WriteFile(users, append(append([]byte{}, old...), "\"broken\n"...), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := a.Reload(); err == nil || !strings.Contains(err.Error(), "users.txt:") {
			t.Fatalf("reload of a bad auth_file: %v", err)
		}
		if err := authDriver(t, addr, "", "bob", authUsers["bob"]).Ping(ctx, nil); err != nil {
			t.Fatalf("bob after a failed reload: %v", err)
		}
		line, _ := auth.HashPassword("late", "admin", authUsers["late"])
		if err := os.WriteFile(users, append(append([]byte{}, old...), line+"\n"...), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := a.Reload(); err != nil {
			t.Fatal(err)
		}
		late = authDriver(t, addr, "SCRAM-SHA-256", "late", authUsers["late"])
		if err := late.Ping(ctx, nil); err != nil {
			t.Fatalf("late after the reload: %v", err)
		}
	})
}

// spy relays connections to addr and keeps what clients sent, to count
// the commands drivers send during their handshake.
type spy struct {
	addr string
	mu   sync.Mutex
	sent bytes.Buffer
}

func newSpy(t *testing.T, target string) *spy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &spy{addr: l.Addr().String()}
	var wg sync.WaitGroup
	var connsMu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		l.Close()
		connsMu.Lock()
		for _, c := range conns {
			c.Close()
		}
		connsMu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			connsMu.Lock()
			conns = append(conns, c, u)
			connsMu.Unlock()
			wg.Go(func() {
				defer u.Close()
				_, _ = io.Copy(u, io.TeeReader(c, s))
			})
			wg.Go(func() {
				defer c.Close()
				_, _ = io.Copy(c, u)
			})
		}
	})
	return s
}

func (s *spy) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sent.Write(b)
}

func (s *spy) count(what string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Count(s.sent.Bytes(), []byte(what))
}

func md5hex(s string) string {
	sum := md5.Sum([]byte(s))
	return hex.EncodeToString(sum[:])
}
