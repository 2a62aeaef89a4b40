package upstream

import (
	"errors"
	"testing"

	"github.com/xdg-go/scram"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/testutil/ferretdb"
)

// TestSCRAMAgainstFerretDB logs in to a real authenticating server,
// FerretDB's own command, with each SCRAM mechanism and with negotiation.
// FerretDB answers no speculativeAuthenticate and always has the long
// conversation, so this covers the fallbacks a current mongod never
// takes; a wrong password is refused with code 18.
func TestSCRAMAgainstFerretDB(t *testing.T) {
	s := ferretdb.Start(t, ferretdb.Options{Database: "app", Username: testUser, Password: testPassword})
	for _, mech := range []string{"", MechanismSCRAMSHA256, MechanismSCRAMSHA1} {
		c, err := dialAuth(t, s.Addr(), Credential{Mechanism: mech, Username: testUser, Password: testPassword, Source: "app"}, nil)
		if err != nil {
			t.Fatalf("%s: %v\nFerretDB log:\n%s", mechanismName(mech), err, s.Log())
		}
		if u := loggedInAs(t, c); u != "app."+testUser {
			t.Fatalf("%s: logged in as %q", mechanismName(mech), u)
		}
	}
	_, err := dialAuth(t, s.Addr(), Credential{Username: testUser, Password: "wrong", Source: "app"}, nil)
	var ae *AuthError
	if !errors.As(err, &ae) || !ae.AuthenticationFailed() {
		t.Fatalf("wrong password: %v, want code 18", err)
	}
}

// TestPassThroughAgainstFerretDB logs in to FerretDB as its user without
// the password: the user's stored credentials come from usersInfo
// {showCredentials: true} (as auth_user reads them), the ClientKey from
// the password as a client's login to mongobouncer would reveal it. With
// each mechanism the connection is the user's and runs commands; keys
// with another salt end with ErrPassThroughMismatch.
func TestPassThroughAgainstFerretDB(t *testing.T) {
	s := ferretdb.Start(t, ferretdb.Options{Database: "app", Username: testUser, Password: testPassword})
	for _, mech := range []string{MechanismSCRAMSHA256, MechanismSCRAMSHA1} {
		p := passThroughFor(t, mech, "app", testUser, testPassword,
			fakeStoredCredentials(t, s.Addr(), "app", testUser, testPassword, mech))
		c, err := dialPassThrough(t, s.Addr(), p)
		if err != nil {
			t.Fatalf("%s: %v\nFerretDB log:\n%s", mech, err, s.Log())
		}
		if u := loggedInAs(t, c); u != "app."+testUser {
			t.Fatalf("%s: logged in as %q", mech, u)
		}
		insert := doc(func(b *bsoncore.DocumentBuilder) {
			b.AppendString("insert", "passthrough")
			b.AppendArray("documents", bsoncore.NewArrayBuilder().AppendDocument(
				bsoncore.NewDocumentBuilder().AppendString("mech", mech).Build()).Build())
		})
		r, err := c.RoundTrip(testCtx(t), "app", insert)
		if err != nil {
			t.Fatalf("%s: insert: %v", mech, err)
		}
		if n, _ := r.Lookup("n").AsInt64OK(); n != 1 {
			t.Fatalf("%s: insert: %v", mech, r)
		}

		ck, other := deriveKeys(t, mech, testUser, testPassword, scram.KeyFactors{Salt: p.Stored.Salt + "x", Iters: p.Stored.Iters})
		_, err = dialPassThrough(t, s.Addr(), PassThrough{Mechanism: mech, Username: testUser, Source: "app", ClientKey: ck, Stored: other})
		if !errors.Is(err, ErrPassThroughMismatch) {
			t.Fatalf("%s: another salt: %v, want ErrPassThroughMismatch", mech, err)
		}
	}
}
