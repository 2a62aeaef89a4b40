package topology

import (
	"context"
	"testing"

	"github.com/xdg-go/scram"

	"github.com/mongobouncer/mongobouncer/internal/auth"
)

// scramLogin logs user in to a with password over SCRAM-SHA-256 and
// returns the identity the login proved.
func scramLogin(t *testing.T, a *auth.Authenticator, user, password string) *auth.Identity {
	t.Helper()
	cl, err := scram.SHA256.NewClient(user, password, "")
	if err != nil {
		t.Fatal(err)
	}
	cc := cl.NewConversation()
	c1, _ := cc.Step("")
	conv, s1, err := a.Start(context.Background(), auth.SCRAMSHA256, "admin", []byte(c1), true)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := cc.Step(string(s1))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := conv.Step([]byte(c2)); err != nil || conv.Identity() == nil {
		t.Fatalf("login: %v", err)
	}
	return conv.Identity()
}

// A user's secret is the one of its latest login: the same secret again
// changes nothing, another one replaces it (changed), a login without a
// secret (X.509) is not stored, and an unknown user has no authenticator.
func TestUserSecretsFollowLatestLogin(t *testing.T) {
	users, err := auth.ParseFile([]byte(`"u@admin" "first"`), "t")
	if err != nil {
		t.Fatal(err)
	}
	a := auth.New(users, nil, nil)
	var s UserSecrets
	id := scramLogin(t, a, "u", "first")
	key := any(id.ID())
	if s.Authenticator(key) != nil {
		t.Fatal("an authenticator before any login")
	}
	if changed, err := s.Set(id); err != nil || changed {
		t.Fatalf("first login: changed %v, %v", changed, err)
	}
	first := s.Authenticator(key)
	if first == nil {
		t.Fatal("no authenticator after a login")
	}
	if changed, err := s.Set(scramLogin(t, a, "u", "first")); err != nil || changed {
		t.Fatalf("the same password again: changed %v, %v", changed, err)
	}
	users2, err := auth.ParseFile([]byte(`"u@admin" "second"`), "t")
	if err != nil {
		t.Fatal(err)
	}
	a.Update(users2, nil)
	if changed, err := s.Set(scramLogin(t, a, "u", "second")); err != nil || !changed {
		t.Fatalf("a new password: changed %v, %v", changed, err)
	}
	if s.Authenticator(key) != first {
		t.Fatal("the user's pools were given another authenticator: it must read the new secret itself")
	}
	x509 := &auth.Identity{User: "CN=x", DB: auth.ExternalDB, Mechanism: auth.MechX509}
	if changed, err := s.Set(x509); err != nil || changed || s.Authenticator(any(x509.ID())) != nil {
		t.Fatalf("an X.509 login stored: %v, %v", changed, err)
	}
}
