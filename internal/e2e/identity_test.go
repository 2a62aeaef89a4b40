package e2e

// Who a client is: a login is complete only when its conversation has
// ended in success, and users are (name, database) pairs that no spelling
// makes collide.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/xdg-go/scram"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// TestFailedLastSCRAMStepLeavesTheClientOut: in the long form, a client
// whose proof verified and whose last step (which must be empty) fails is
// answered 18 and is not logged in: its next command is refused as any
// unauthenticated client's.
func TestFailedLastSCRAMStepLeavesTheClientOut(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		_, addr, _ := authSetup(t, up.URI(), nil)
		r := dialRaw(t, addr)
		r.hello()
		cl, err := scram.SHA256.NewClient("app", authUsers["app"], "")
		if err != nil {
			t.Fatal(err)
		}
		conv := cl.NewConversation()
		c1, _ := conv.Step("")
		rep := r.cmd(bson.D{{Key: "saslStart", Value: 1}, {Key: "mechanism", Value: "SCRAM-SHA-256"},
			{Key: "payload", Value: bson.Binary{Data: []byte(c1)}}, {Key: "$db", Value: "admin"}})
		if okOf(rep) != 1 {
			t.Fatalf("saslStart: %v", rep)
		}
		step := func(payload []byte) bson.Raw {
			return r.cmd(bson.D{{Key: "saslContinue", Value: 1}, {Key: "conversationId", Value: rep.Lookup("conversationId")},
				{Key: "payload", Value: bson.Binary{Data: payload}}, {Key: "$db", Value: "admin"}})
		}
		_, s1, _ := rep.Lookup("payload").BinaryOK()
		c2, err := conv.Step(string(s1))
		if err != nil {
			t.Fatal(err)
		}
		rep = step([]byte(c2))
		if done, _ := rep.Lookup("done").BooleanOK(); okOf(rep) != 1 || done {
			t.Fatalf("proof step: %v", rep)
		}
		// The last step must be empty: garbage fails the login.
		if rep = step([]byte("garbage")); codeOf(rep) != 18 {
			t.Fatalf("garbage last step: %v", rep)
		}
		time.Sleep(20 * time.Millisecond) // idle: the event loop takes the client
		find := bson.D{{Key: "find", Value: "orders"}, {Key: "$db", Value: "shop"}}
		if rep = r.cmd(find); codeOf(rep) != 13 || !strings.Contains(rep.Lookup("errmsg").StringValue(), "requires authentication") {
			t.Fatalf("find after a failed login: %v", rep)
		}
		if up.Requests("find") != 0 {
			t.Fatal("a find reached the upstream after a failed login")
		}
		// The same connection can still log in properly.
		if rep = rawLogin(t, r, "SCRAM-SHA-256", "app", authUsers["app"], false); okOf(rep) != 1 {
			t.Fatalf("login: %v", rep)
		}
		if rep = r.cmd(find); okOf(rep) != 1 {
			t.Fatalf("find after the login: %v", rep)
		}
	})
}

// TestUsersWhoseNamesCollideStayApart: user "a" on database "b@c" and user
// "a@b" on database "c" both write "a@b@c". The auth_file line "a@b@c"
// names the second (its database follows the last @); the first, known
// upstream only, logs in through an auth_user lookup. Neither logs in with
// the other's password, and on a pass-through route each one's requests go
// upstream as itself, over its own pool, with its own secret.
func TestUsersWhoseNamesCollideStayApart(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true, Users: []fakemongo.User{
			{Name: "mbauth", Password: "mbauth-pw"},
			{Name: "a", DB: "b@c", Password: "tenant-1-pw"},
			{Name: "a@b", DB: "c", Password: "tenant-2-pw"},
		}})
		users := filepath.Join(t.TempDir(), "users.txt")
		if err := os.WriteFile(users, []byte(`"mbauth@admin" "mbauth-pw"`+"\n"+`"a@b@c" "tenant-2-pw"`+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		extra := fmt.Sprintf("auth_type = \"scram\"\nauth_file = %q\nauth_user = \"mbauth@admin\"\nadmin_users = [\"a@b@c\"]\n", users)
		_, addr, _ := fileBouncerLogging(t, baseTOML(fmt.Sprintf("mongodb://%s/?directConnection=true", up.Addr()), extra), nil)
		ctx := ctxT(t, 30*time.Second)
		as := func(user, db, pw string) *mongo.Client {
			uri := fmt.Sprintf("mongodb://%s/?serverSelectionTimeoutMS=10000&connectTimeoutMS=5000", addr)
			c, err := mongo.Connect(options.Client().ApplyURI(uri).SetAuth(options.Credential{
				AuthMechanism: "SCRAM-SHA-256", AuthSource: db, Username: user, Password: pw}))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Disconnect(ctxT(t, 5*time.Second)) })
			return c
		}
		// The proven case: "a" on "b@c" with the password of the line
		// "a@b@c".
		// The login to mongobouncer fails (the driver's handshake), not
		// a command after it.
		var ce mongo.CommandError
		if err := as("a", "b@c", "tenant-2-pw").Ping(ctx, nil); !errors.As(err, &ce) || ce.Code != 18 || !strings.Contains(err.Error(), "unable to authenticate") {
			t.Fatalf(`user "a" on "b@c" with the password of "a@b" on "c": %v, want a failed login`, err)
		}
		if err := as("a@b", "c", "tenant-1-pw").Ping(ctx, nil); !errors.As(err, &ce) || ce.Code != 18 || !strings.Contains(err.Error(), "unable to authenticate") {
			t.Fatalf(`user "a@b" on "c" with the password of "a" on "b@c": %v, want a failed login`, err)
		}
		// Both log in before either sends a command upstream: with one
		// secret for both, the second login's would be the one both
		// pools log in with.
		raw1, raw2 := dialRaw(t, addr), dialRaw(t, addr)
		if rep := rawLoginDB(t, raw1, "a", "b@c", "tenant-1-pw"); okOf(rep) != 1 {
			t.Fatalf("tenant 1: %v", rep)
		}
		if rep := rawLoginDB(t, raw2, "a@b", "c", "tenant-2-pw"); okOf(rep) != 1 {
			t.Fatalf("tenant 2: %v", rep)
		}
		for i, r := range []*rawClient{raw1, raw2, raw1, raw2} {
			if rep := r.cmd(bson.D{{Key: "insert", Value: "o"}, {Key: "documents", Value: bson.A{bson.D{{Key: "i", Value: i}}}},
				{Key: "$db", Value: "shop"}}); okOf(rep) != 1 {
				t.Fatalf("insert %d: %v", i, rep)
			}
		}
		one, two := as("a", "b@c", "tenant-1-pw"), as("a@b", "c", "tenant-2-pw")
		// admin_users' "a@b@c" is "a@b" on "c": "a" on "b@c" is no admin.
		showClients := bson.D{{Key: "showClients", Value: 1}}
		if _, err := one.Database("mongobouncer").RunCommand(ctx, showClients).Raw(); !errors.As(err, &ce) || ce.Code != 13 {
			t.Fatalf(`user "a" on "b@c" ran an admin command as "a@b" on "c": %v`, err)
		}
		if _, err := two.Database("mongobouncer").RunCommand(ctx, showClients).Raw(); err != nil {
			t.Fatalf("the admin: %v", err)
		}
		// Each tenant's pool logged in upstream as that tenant.
		seen := map[string]bool{}
		for _, u := range up.AuthenticatedUsers() {
			seen[u] = true
		}
		if !seen["b@c.a"] || !seen["c.a@b"] {
			t.Fatalf("the upstream saw %v logged in, want both b@c.a and c.a@b", up.AuthenticatedUsers())
		}
		// No pool tried a secret that was not its user's.
		if n := up.AuthFailures(); n != 0 {
			t.Fatalf("%d failed logins upstream", n)
		}
	})
}

// TestUserNameWithCommaAndEquals: SCRAM writes "," as "=2C" and "=" as
// "=3D" in the user name (RFC 5802); a user named "a,b=c" logs in with the
// Go driver, which encodes, against its auth_file line, with either
// mechanism.
func TestUserNameWithCommaAndEquals(t *testing.T) {
	oneIO(t) // the login is on the client's goroutine in every model
	up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
	a, addr, users := authSetup(t, up.URI(), nil)
	f, err := os.OpenFile(users, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteString(`"a,b=c@admin" "odd-pw"` + "\n")
	if cerr := f.Close(); err != nil || cerr != nil {
		t.Fatal(err, cerr)
	}
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 30*time.Second)
	for _, mech := range []string{"SCRAM-SHA-256", "SCRAM-SHA-1"} {
		c := authDriver(t, addr, mech, "a,b=c", "odd-pw")
		if _, err := c.Database("shop").Collection("o").InsertOne(ctx, bson.D{{Key: "m", Value: mech}}); err != nil {
			t.Fatalf("%s: %v", mech, err)
		}
		var ce mongo.CommandError
		if err := authDriver(t, addr, mech, "a,b=c", "wrong").Ping(ctx, nil); !errors.As(err, &ce) || ce.Code != 18 {
			t.Fatalf("%s: a wrong password: %v", mech, err)
		}
	}
	// A malformed escape is refused.
	r := dialRaw(t, addr)
	rep := r.cmd(bson.D{{Key: "saslStart", Value: 1}, {Key: "mechanism", Value: "SCRAM-SHA-256"},
		{Key: "payload", Value: bson.Binary{Data: []byte("n,,n=a=2Xb,r=abcdefghijklmnop")}}, {Key: "$db", Value: "admin"}})
	if codeOf(rep) != 18 {
		t.Fatalf("a malformed user name escape: %v", rep)
	}
}

// rawLoginDB logs a raw connection in with SCRAM-SHA-256 as user on
// authentication database db, the long way, and returns the last reply.
func rawLoginDB(t *testing.T, r *rawClient, user, db, password string) bson.Raw {
	t.Helper()
	cl, err := scram.SHA256.NewClient(user, password, "")
	if err != nil {
		t.Fatal(err)
	}
	conv := cl.NewConversation()
	c1, _ := conv.Step("")
	rep := r.cmd(bson.D{{Key: "saslStart", Value: 1}, {Key: "mechanism", Value: "SCRAM-SHA-256"},
		{Key: "payload", Value: bson.Binary{Data: []byte(c1)}}, {Key: "$db", Value: db}})
	for okOf(rep) == 1 {
		if done, _ := rep.Lookup("done").BooleanOK(); done {
			return rep
		}
		_, in, _ := rep.Lookup("payload").BinaryOK()
		out, err := conv.Step(string(in))
		if err != nil {
			t.Fatalf("client step: %v", err)
		}
		rep = r.cmd(bson.D{{Key: "saslContinue", Value: 1}, {Key: "conversationId", Value: rep.Lookup("conversationId")},
			{Key: "payload", Value: bson.Binary{Data: []byte(out)}}, {Key: "$db", Value: db}})
	}
	return rep
}
