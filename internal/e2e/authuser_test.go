package e2e

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/ferretdb"
)

// authUserSetup starts a fakemongo with a service user (the route's),
// auth_user mbauth and a user "upuser" that only the upstream knows, and a
// mongobouncer whose auth_file has mbauth's plain password only.
func authUserSetup(t *testing.T) (*fakemongo.Server, string) {
	t.Helper()
	up := fakemongo.Start(t, fakemongo.Options{InMemory: true, Users: []fakemongo.User{
		{Name: "svc", Password: "svc-pw"},
		{Name: "mbauth", Password: "mbauth-pw"},
		{Name: "upuser", Password: "up-pw", Iterations: 4500},
	}})
	users := filepath.Join(t.TempDir(), "users.txt")
	if err := os.WriteFile(users, []byte(`"mbauth@admin" "mbauth-pw"`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	extra := fmt.Sprintf("auth_type = \"scram\"\nauth_file = %q\nauth_user = \"mbauth@admin\"\nauth_user_service_routes = true\n", users)
	uri := fmt.Sprintf("mongodb://svc:svc-pw@%s/?directConnection=true", up.Addr())
	_, addr, _ := fileBouncerLogging(t, baseTOML(uri, extra), nil)
	return up, addr
}

// TestAuthUserLookup: a user missing from auth_file logs in through
// mongobouncer with the credentials usersInfo shows upstream (looked up as
// auth_user), once per user thanks to the cache (and once more per failed
// proof); wrong passwords and unknown users get code 18.
func TestAuthUserLookup(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up, addr := authUserSetup(t)
		ctx := ctxT(t, 30*time.Second)
		for _, mech := range []string{"SCRAM-SHA-256", "SCRAM-SHA-1"} {
			c := authDriver(t, addr, mech, "upuser", "up-pw")
			if _, err := c.Database("shop").Collection("o").InsertOne(ctx, bson.D{{Key: "m", Value: mech}}); err != nil {
				t.Fatalf("%s: upstream-only user: %v", mech, err)
			}
		}
		for _, cred := range [][2]string{{"upuser", "wrong"}, {"ghost", "x"}, {"ghost", "y"}} {
			err := authDriver(t, addr, "", cred[0], cred[1]).Ping(ctx, nil)
			var ce mongo.CommandError
			if !errors.As(err, &ce) || ce.Code != 18 {
				t.Fatalf("%v: %v, want code 18", cred, err)
			}
		}
		// One lookup for upuser (positive TTL), one for ghost (negative
		// TTL), and one more each for the failed proofs against answers
		// cached before their attempts (upuser wrong, ghost y): a
		// password may have changed upstream. ghost x's attempt looked
		// ghost up itself, so its failed proof asks nothing more.
		if n := up.Requests("usersInfo"); n != 4 {
			t.Fatalf("%d usersInfo lookups, want 4", n)
		}
		// mbauth logged in upstream for them: the lookups were authenticated.
		if up.AuthFailures() != 0 {
			t.Fatalf("%d failed upstream logins", up.AuthFailures())
		}
	})
}

// TestAuthUserLookupWrongAuthUserPassword: when auth_user cannot log in
// upstream, nobody outside auth_file logs in, and the failure is not
// cached as "no such user" (each login asks again).
func TestAuthUserLookupWrongAuthUserPassword(t *testing.T) {
	oneIO(t) // failed logins only: served on the client's goroutine in every model
	up := fakemongo.Start(t, fakemongo.Options{InMemory: true, Users: []fakemongo.User{
		{Name: "svc", Password: "svc-pw"},
		{Name: "mbauth", Password: "mbauth-pw"},
		{Name: "upuser", Password: "up-pw"},
	}})
	users := filepath.Join(t.TempDir(), "users.txt")
	if err := os.WriteFile(users, []byte(`"mbauth@admin" "not-the-password"`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	extra := fmt.Sprintf("auth_type = \"scram\"\nauth_file = %q\nauth_user = \"mbauth@admin\"\nauth_user_service_routes = true\n", users)
	uri := fmt.Sprintf("mongodb://svc:svc-pw@%s/?directConnection=true", up.Addr())
	_, addr, _ := fileBouncerLogging(t, baseTOML(uri, extra), nil)
	ctx := ctxT(t, 30*time.Second)
	for range 2 {
		err := authDriver(t, addr, "SCRAM-SHA-256", "upuser", "up-pw").Ping(ctx, nil)
		var ce mongo.CommandError
		if !errors.As(err, &ce) || ce.Code != 18 {
			t.Fatalf("%v, want code 18", err)
		}
	}
	if up.AuthFailures() < 2 {
		t.Fatalf("%d failed auth_user logins upstream, want one per client login", up.AuthFailures())
	}
}

// TestAuthUserLookupFerretDB: against FerretDB's own binary with SCRAM, a
// user created upstream after mongobouncer started (so in no auth_file)
// logs in through mongobouncer: FerretDB answers usersInfo with
// showCredentials as mongod does.
func TestAuthUserLookupFerretDB(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		s := ferretdb.Start(t, ferretdb.Options{Database: "app", Username: "mbauth", Password: "mbauth-pw"})
		users := filepath.Join(t.TempDir(), "users.txt")
		if err := os.WriteFile(users, []byte(`"mbauth@app" "mbauth-pw"`+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		extra := fmt.Sprintf("auth_type = \"scram\"\nauth_file = %q\nauth_user = \"mbauth@app\"\nauth_user_service_routes = true\n", users)
		uri := fmt.Sprintf("mongodb://mbauth:mbauth-pw@%s/?authSource=app&directConnection=true", s.Addr())
		_, addr, _ := fileBouncerLogging(t, baseTOML(uri, extra), nil)
		ctx := ctxT(t, 60*time.Second)

		admin, err := mongo.Connect(options.Client().ApplyURI(uri))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = admin.Disconnect(ctxT(t, 5*time.Second)) })
		if err := admin.Database("app").RunCommand(ctx, bson.D{{Key: "createUser", Value: "late"},
			{Key: "pwd", Value: "late-pw"}, {Key: "roles", Value: bson.A{}}}).Err(); err != nil {
			t.Fatalf("createUser upstream: %v", err)
		}
		connect := func(mech, pw string) *mongo.Client {
			c, err := mongo.Connect(options.Client().ApplyURI("mongodb://" + addr + "/?serverSelectionTimeoutMS=10000").SetAuth(
				options.Credential{AuthMechanism: mech, AuthSource: "app", Username: "late", Password: pw}))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Disconnect(ctxT(t, 5*time.Second)) })
			return c
		}
		for _, mech := range []string{"SCRAM-SHA-256", "SCRAM-SHA-1"} {
			if _, err := connect(mech, "late-pw").Database("app").Collection("c").InsertOne(ctx, bson.D{{Key: "m", Value: mech}}); err != nil {
				t.Fatalf("%s: a user known only to FerretDB: %v\nFerretDB log:\n%s", mech, err, s.Log())
			}
		}
		err = connect("", "wrong").Ping(ctx, nil)
		var ce mongo.CommandError
		if !errors.As(err, &ce) || ce.Code != 18 {
			t.Fatalf("wrong password: %v, want code 18", err)
		}
	})
}
