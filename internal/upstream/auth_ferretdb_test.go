package upstream

import (
	"errors"
	"testing"

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
