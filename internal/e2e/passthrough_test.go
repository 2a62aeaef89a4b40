package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/auth"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/ferretdb"
	"github.com/mongobouncer/mongobouncer/internal/testutil/wait"
)

// SCRAM pass-through (issue 19): a route without credentials while
// clients log in with SCRAM logs in upstream as each client's own user.

// upstreamSecret returns the auth_file secret of user@db as the upstream
// stores it (usersInfo {showCredentials: true}, asked as who/pw): what an
// operator copies into auth_file for pass-through without the password.
func upstreamSecret(t *testing.T, addr, who, pw, user, db string) string {
	t.Helper()
	c, err := mongo.Connect(options.Client().ApplyURI(fmt.Sprintf("mongodb://%s/?directConnection=true", addr)).
		SetAuth(options.Credential{Username: who, Password: pw, AuthSource: db}))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Disconnect(ctxT(t, 5*time.Second)) }()
	raw, err := c.Database(db).RunCommand(ctxT(t, 10*time.Second), bson.D{
		{Key: "usersInfo", Value: bson.D{{Key: "user", Value: user}, {Key: "db", Value: db}}},
		{Key: "showCredentials", Value: true}}).Raw()
	if err != nil {
		t.Fatalf("usersInfo: %v", err)
	}
	creds, err := auth.CredsFromUsersInfo(bsoncore.Document(raw), user, db)
	if err != nil {
		t.Fatal(err)
	}
	var forms []string
	for _, m := range creds.Mechanisms() {
		sc, _ := creds.For(m)
		forms = append(forms, auth.FormatStored(m, sc))
	}
	return strings.Join(forms, " ")
}

// writeUsers writes an auth_file of user@db → secret lines.
func writeUsers(t *testing.T, lines map[string]string) string {
	t.Helper()
	var b strings.Builder
	for u, secret := range lines {
		fmt.Fprintf(&b, "%q %q\n", u, secret)
	}
	path := filepath.Join(t.TempDir(), "users.txt")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// userLog records which upstream user ran each command the handlers see.
type userLog struct {
	mu   sync.Mutex
	seen map[string][]string // command → users, in order
}

func (l *userLog) handle(up *fakemongo.Server, cmds ...string) {
	l.seen = map[string][]string{}
	for _, cmd := range cmds {
		up.Handle(cmd, func(req *fakemongo.Request) fakemongo.Reply {
			u := up.AuthenticatedUsers()[req.ConnID]
			l.mu.Lock()
			l.seen[req.Command] = append(l.seen[req.Command], u)
			l.mu.Unlock()
			return up.Builtin(req)
		})
	}
}

func (l *userLog) users(cmd string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := slices.Clone(l.seen[cmd])
	slices.Sort(out)
	return slices.Compact(out)
}

// passUp starts a fakemongo with the pass-through test users (root only
// reads the others' secrets) and logs which user runs what.
func passUp(t *testing.T) (*fakemongo.Server, *userLog) {
	t.Helper()
	up := fakemongo.Start(t, fakemongo.Options{InMemory: true, Users: []fakemongo.User{
		{Name: "root", Password: "root-pw"},
		{Name: "alice", Password: "alice-pw"},
		{Name: "bob", Password: "bob-pw"},
		{Name: "carol", Password: "carol-pw"},
		{Name: "dave", Password: "dave-pw"},
	}})
	log := &userLog{}
	log.handle(up, "insert", "find", "getMore", "commitTransaction", "connectionStatus")
	return up, log
}

// connectionStatusUser runs connectionStatus through c and returns the
// user@db it reports.
func connectionStatusUser(t *testing.T, c *mongo.Client) string {
	t.Helper()
	var out struct {
		AuthInfo struct {
			AuthenticatedUsers []struct{ User, DB string } `bson:"authenticatedUsers"`
		} `bson:"authInfo"`
	}
	if err := c.Database("admin").RunCommand(ctxT(t, 10*time.Second), bson.D{{Key: "connectionStatus", Value: 1}}).Decode(&out); err != nil {
		t.Fatalf("connectionStatus: %v", err)
	}
	if len(out.AuthInfo.AuthenticatedUsers) != 1 {
		return fmt.Sprint(out.AuthInfo.AuthenticatedUsers)
	}
	u := out.AuthInfo.AuthenticatedUsers[0]
	return u.User + "@" + u.DB
}

// TestPassThroughActsAsEachUser: alice (plain password in auth_file) and
// bob (the upstream's own secret, no password) reach the upstream as
// themselves: connectionStatus, sent through mongobouncer and answered
// upstream, names each one's user; their writes, reads, cursors and
// transactions run on connections logged in as them, and on no other.
func TestPassThroughActsAsEachUser(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up, log := passUp(t)
		users := writeUsers(t, map[string]string{
			"alice@admin": "alice-pw",
			"bob@admin":   upstreamSecret(t, up.Addr(), "root", "root-pw", "bob", "admin"),
		})
		a, addr, _ := fileBouncer(t, baseTOML(up.URI(), fmt.Sprintf("auth_type = \"scram\"\nauth_file = %q\n", users)))
		ctx := ctxT(t, 30*time.Second)
		for _, tc := range []struct{ user, pw, mech string }{
			{"alice", "alice-pw", "SCRAM-SHA-256"}, {"bob", "bob-pw", "SCRAM-SHA-256"}, {"bob", "bob-pw", "SCRAM-SHA-1"},
		} {
			c := authDriver(t, addr, tc.mech, tc.user, tc.pw)
			if got := connectionStatusUser(t, c); got != tc.user+"@admin" {
				t.Fatalf("%s (%s): connectionStatus through mongobouncer says %s", tc.user, tc.mech, got)
			}
			coll := c.Database("shop").Collection(tc.user + tc.mech)
			for i := range 3 {
				if _, err := coll.InsertOne(ctx, bson.D{{Key: "i", Value: i}}); err != nil {
					t.Fatalf("%s: insert: %v", tc.user, err)
				}
			}
			cur, err := coll.Find(ctx, bson.D{}, options.Find().SetBatchSize(1))
			if err != nil {
				t.Fatal(err)
			}
			var docs []bson.M
			if err := cur.All(ctx, &docs); err != nil || len(docs) != 3 {
				t.Fatalf("%s: find with getMore: %d docs, %v", tc.user, len(docs), err)
			}
			err = c.UseSession(ctx, func(sc context.Context) error {
				_, err := mongo.SessionFromContext(sc).WithTransaction(sc, func(sc context.Context) (any, error) {
					return coll.InsertOne(sc, bson.D{{Key: "txn", Value: true}})
				})
				return err
			})
			if err != nil {
				t.Fatalf("%s: transaction: %v", tc.user, err)
			}
		}
		want := []string{"admin.alice", "admin.bob"}
		for _, cmd := range []string{"insert", "find", "getMore", "commitTransaction", "connectionStatus"} {
			if got := log.users(cmd); !slices.Equal(got, want) {
				t.Errorf("%s ran upstream as %q, want %q", cmd, got, want)
			}
		}
		if up.AuthFailures() != 0 {
			t.Errorf("%d failed upstream logins", up.AuthFailures())
		}
		// One pool per user on the server, shown by showPools.
		var rows []string
		for _, p := range a.Pools() {
			if p.User != "" {
				rows = append(rows, p.User)
			}
		}
		if slices.Sort(rows); !slices.Equal(rows, []string{"alice@admin", "bob@admin"}) {
			t.Errorf("user pools %v", rows)
		}
		// The metrics have no label per user: the user pools' figures add
		// up under the route's and server's.
		resp, err := http.Get("http://" + a.AdminAddr().String() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), "alice") || strings.Contains(string(body), "bob") {
			t.Error("/metrics names a user")
		}
		created := 0.0
		for line := range strings.Lines(string(body)) {
			if strings.HasPrefix(line, "mongobouncer_pool_connections_created_total{") {
				var v float64
				fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
				created += v
			}
		}
		if created < 2 {
			t.Errorf("the pool metrics count %v connections created, want the user pools' (at least 2)", created)
		}
	})
}

// TestPassThroughFailureIsTheUsersAlone: carol's auth_file secret has
// mongobouncer's own salt (hash-password), which the upstream does not
// have; dave's has the upstream's salt but an old password. Both log in to
// mongobouncer, and their commands fail with code 18 saying why, while
// alice, on the same server, is served throughout and the server stays
// usable.
func TestPassThroughFailureIsTheUsersAlone(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up, _ := passUp(t)
		// The same fake with dave's old password: the same salt (fakemongo
		// derives it from the user's position), other keys.
		old := fakemongo.Start(t, fakemongo.Options{InMemory: true, Users: []fakemongo.User{
			{Name: "root", Password: "root-pw"}, {Name: "alice"}, {Name: "bob"}, {Name: "carol"},
			{Name: "dave", Password: "dave-old-pw"},
		}})
		carolLine, err := auth.HashPassword("carol", "admin", "carol-pw")
		if err != nil {
			t.Fatal(err)
		}
		_, carolSecret, _ := strings.Cut(carolLine, " ")
		users := writeUsers(t, map[string]string{
			"alice@admin": "alice-pw",
			"carol@admin": strings.ReplaceAll(strings.Trim(carolSecret, `"`), `""`, `"`),
			"dave@admin":  upstreamSecret(t, old.Addr(), "root", "root-pw", "dave", "admin"),
		})
		a, addr, _ := fileBouncer(t, baseTOML(up.URI(), fmt.Sprintf("auth_type = \"scram\"\nauth_file = %q\n", users)))
		ctx := ctxT(t, 30*time.Second)
		alice := authDriver(t, addr, "SCRAM-SHA-256", "alice", "alice-pw").Database("shop").Collection("a")
		for _, tc := range []struct{ user, pw, says string }{
			{"carol", "carol-pw", "salt"},
			{"dave", "dave-old-pw", "AuthenticationFailed"},
		} {
			c := authDriver(t, addr, "SCRAM-SHA-256", tc.user, tc.pw)
			for range 3 {
				_, err := c.Database("shop").Collection("x").InsertOne(ctx, bson.D{{Key: "u", Value: tc.user}})
				var ce mongo.CommandError
				if !errors.As(err, &ce) || ce.Code != 18 || !strings.Contains(ce.Message, tc.says) ||
					!strings.Contains(ce.Message, "pass-through") || ce.HasErrorLabel("RetryableWriteError") {
					t.Fatalf("%s: %v, want code 18 without retry labels, saying pass-through and %q", tc.user, err, tc.says)
				}
				if _, err := alice.InsertOne(ctx, bson.D{{Key: "u", Value: "alice"}}); err != nil {
					t.Fatalf("alice, beside %s's failure: %v", tc.user, err)
				}
			}
		}
		for _, p := range a.Pools() {
			if p.User == "" && (!p.Usable || p.State != "ready") {
				t.Fatalf("the server's pool after users' failed logins: %+v", p)
			}
			if p.User == "alice@admin" && p.State != "ready" {
				t.Fatalf("alice's pool: %+v", p)
			}
		}
	})
}

// TestPassThroughUserLimits: max_user_connections caps one user's
// connections to the server while another user is served beside it, and
// a user pool nobody uses closes after user_pool_idle_timeout, its
// upstream connections with it.
func TestPassThroughUserLimits(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up, _ := passUp(t)
		var mu sync.Mutex
		running, peak := map[string]int{}, map[string]int{}
		up.Handle("find", func(req *fakemongo.Request) fakemongo.Reply {
			u := up.AuthenticatedUsers()[req.ConnID]
			mu.Lock()
			running[u]++
			peak[u] = max(peak[u], running[u])
			mu.Unlock()
			time.Sleep(150 * time.Millisecond)
			mu.Lock()
			running[u]--
			mu.Unlock()
			return up.Builtin(req)
		})
		users := writeUsers(t, map[string]string{"alice@admin": "alice-pw", "bob@admin": "bob-pw"})
		extra := fmt.Sprintf("auth_type = \"scram\"\nauth_file = %q\nmax_user_connections = 1\nuser_pool_idle_timeout = \"400ms\"\n", users)
		a, addr, _ := fileBouncer(t, baseTOML(up.URI(), extra))
		ctx := ctxT(t, 30*time.Second)
		clients := map[string]*mongo.Client{
			"alice": authDriver(t, addr, "", "alice", "alice-pw"),
			"bob":   authDriver(t, addr, "", "bob", "bob-pw"),
		}
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for _, u := range []string{"alice", "alice", "alice", "bob", "bob", "bob"} {
			wg.Go(func() {
				if err := clients[u].Database("shop").Collection("c").FindOne(ctx, bson.D{}).Err(); err != nil && !errors.Is(err, mongo.ErrNoDocuments) {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		mu.Lock()
		if peak["admin.alice"] != 1 || peak["admin.bob"] != 1 {
			t.Fatalf("peak concurrent finds per upstream user %v, want 1 each (max_user_connections = 1)", peak)
		}
		mu.Unlock()
		// Both users' pools go idle, close, and take their connections along.
		wait.Until(t, "the idle user pools closed", 10*time.Second, 10*time.Millisecond, func() bool {
			for _, p := range a.Pools() {
				if p.User != "" {
					return false
				}
			}
			for _, u := range up.AuthenticatedUsers() {
				if u != "" {
					return false
				}
			}
			return true
		})
		// And come back on the next request.
		if err := clients["alice"].Ping(ctx, nil); err != nil {
			t.Fatal(err)
		}
		if err := clients["alice"].Database("shop").Collection("c").FindOne(ctx, bson.D{}).Err(); err != nil && !errors.Is(err, mongo.ErrNoDocuments) {
			t.Fatal(err)
		}
	})
}

// TestPassThroughLookupRefreshedAfterRefusal: a user known only upstream
// (auth_user looks it up) changes its password there. A client still
// logged in with the old one is refused upstream (code 18): that forgets
// the cached lookup, so that the user's login with the new password looks
// the user up again and is served at once, its user pool retried without
// waiting for a heartbeat.
func TestPassThroughLookupRefreshedAfterRefusal(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true, Users: []fakemongo.User{
			{Name: "mbauth", Password: "mbauth-pw"},
			{Name: "upuser", Password: "old-pw"},
		}})
		users := writeUsers(t, map[string]string{"mbauth@admin": "mbauth-pw"})
		extra := fmt.Sprintf("auth_type = \"scram\"\nauth_file = %q\nauth_user = \"mbauth@admin\"\n", users)
		// A heartbeat far away: only the retry on a new login can ready the
		// paused user pool within the test.
		toml := strings.Replace(baseTOML(up.URI(), extra), `heartbeat_interval = "500ms"`, `heartbeat_interval = "60s"`, 1)
		_, addr, _ := fileBouncer(t, toml)
		ctx := ctxT(t, 30*time.Second)
		insert := func(c *mongo.Client) error {
			_, err := c.Database("shop").Collection("c").InsertOne(ctx, bson.D{{Key: "x", Value: 1}})
			return err
		}
		old := authDriver(t, addr, "SCRAM-SHA-256", "upuser", "old-pw")
		if err := insert(old); err != nil {
			t.Fatal(err)
		}
		if n := up.Requests("usersInfo"); n != 1 {
			t.Fatalf("%d lookups, want 1", n)
		}
		if err := up.SetUserPassword("upuser", "admin", "new-pw"); err != nil {
			t.Fatal(err)
		}
		// The pooled connections stay logged in upstream, as mongod's do:
		// drop them, so that the next request must log in again.
		up.CloseAllConns()
		var err error
		for range 5 { // the first may meet a connection the drop broke
			if err = insert(old); err != nil {
				var ce mongo.CommandError
				if errors.As(err, &ce) && ce.Code == 18 {
					break
				}
			}
		}
		var ce mongo.CommandError
		if !errors.As(err, &ce) || ce.Code != 18 {
			t.Fatalf("the old secret upstream: %v, want code 18", err)
		}
		fresh := authDriver(t, addr, "SCRAM-SHA-256", "upuser", "new-pw")
		if err := insert(fresh); err != nil {
			t.Fatalf("after the password change, with the new password: %v", err)
		}
		if got := connectionStatusUser(t, fresh); got != "upuser@admin" {
			t.Fatalf("connectionStatus says %s", got)
		}
		if n := up.Requests("usersInfo"); n != 2 {
			t.Fatalf("%d lookups, want 2 (the refusal forgot the first)", n)
		}
	})
}

// TestPassThroughFerretDB: in front of FerretDB's own binary with SCRAM,
// users with a plain password in auth_file and with FerretDB's own secret
// (usersInfo showCredentials) act upstream as themselves: FerretDB's
// connectionStatus, asked through mongobouncer, names each one.
func TestPassThroughFerretDB(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		s := ferretdb.Start(t, ferretdb.Options{Database: "app", Username: "owner", Password: "owner-pw"})
		ctx := ctxT(t, 60*time.Second)
		admin, err := mongo.Connect(options.Client().ApplyURI("mongodb://" + s.Addr() + "/?directConnection=true").
			SetAuth(options.Credential{Username: "owner", Password: "owner-pw", AuthSource: "app"}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = admin.Disconnect(ctxT(t, 5*time.Second)) })
		for _, u := range []string{"plain", "stored"} {
			if err := admin.Database("app").RunCommand(ctx, bson.D{{Key: "createUser", Value: u},
				{Key: "pwd", Value: u + "-pw"}, {Key: "roles", Value: bson.A{}}}).Err(); err != nil {
				t.Fatalf("createUser %s: %v", u, err)
			}
		}
		users := writeUsers(t, map[string]string{
			"plain@app":  "plain-pw",
			"stored@app": upstreamSecret(t, s.Addr(), "owner", "owner-pw", "stored", "app"),
		})
		_, addr, _ := fileBouncer(t, baseTOML("mongodb://"+s.Addr()+"/?directConnection=true",
			fmt.Sprintf("auth_type = \"scram\"\nauth_file = %q\n", users)))
		for _, u := range []string{"plain", "stored"} {
			for _, mech := range []string{"SCRAM-SHA-256", "SCRAM-SHA-1"} {
				c, err := mongo.Connect(options.Client().ApplyURI("mongodb://" + addr + "/?serverSelectionTimeoutMS=10000").SetAuth(
					options.Credential{AuthMechanism: mech, AuthSource: "app", Username: u, Password: u + "-pw"}))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = c.Disconnect(ctxT(t, 5*time.Second)) })
				if got := connectionStatusUser(t, c); got != u+"@app" {
					t.Fatalf("%s %s: FerretDB's connectionStatus through mongobouncer says %q\nFerretDB log:\n%s", u, mech, got, s.Log())
				}
				coll := c.Database("app").Collection("pt")
				if _, err := coll.InsertOne(ctx, bson.D{{Key: "u", Value: u}, {Key: "m", Value: mech}}); err != nil {
					t.Fatalf("%s %s: insert: %v", u, mech, err)
				}
				if n, err := coll.CountDocuments(ctx, bson.D{{Key: "u", Value: u}, {Key: "m", Value: mech}}); err != nil || n != 1 {
					t.Fatalf("%s %s: count %d, %v", u, mech, n, err)
				}
			}
		}
	})
}
