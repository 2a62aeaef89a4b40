package fakemongo

import (
	"bytes"
	"encoding/base64"
	"testing"

	"github.com/xdg-go/scram"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// TestUsersInfoShowCredentials: the stored SCRAM-SHA-256 keys usersInfo
// shows are those the password derives with the shown salt and count, and
// only with showCredentials; unknown users are left out.
func TestUsersInfoShowCredentials(t *testing.T) {
	s := Start(t, Options{InMemory: true, Users: []User{
		{Name: "admin", Password: "adminpw"},
		{Name: "app", DB: "db1", Password: "secret", Iterations: 5000},
	}})
	c := connectDriver(t, s, func(co *options.ClientOptions) {
		co.SetAuth(options.Credential{Username: "admin", Password: "adminpw"})
	})
	type cred struct {
		IterationCount             int
		Salt, StoredKey, ServerKey string
	}
	var r struct {
		Users []struct {
			User, DB    string
			Credentials map[string]cred
		}
	}
	cmd := bson.D{{Key: "usersInfo", Value: bson.A{bson.D{{Key: "user", Value: "app"}, {Key: "db", Value: "db1"}}, "ghost"}}, {Key: "showCredentials", Value: true}}
	if err := c.Database("db1").RunCommand(testCtx(t), cmd).Decode(&r); err != nil {
		t.Fatal(err)
	}
	if len(r.Users) != 1 || r.Users[0].User != "app" || r.Users[0].DB != "db1" {
		t.Fatalf("users %+v", r.Users)
	}
	got, ok := r.Users[0].Credentials[MechSCRAMSHA256]
	if !ok || got.IterationCount != 5000 || len(r.Users[0].Credentials) != 2 {
		t.Fatalf("credentials %+v", r.Users[0].Credentials)
	}
	salt, _ := base64.StdEncoding.DecodeString(got.Salt)
	cl, _ := scram.SHA256.NewClient("app", "secret", "")
	want := cl.GetStoredCredentials(scram.KeyFactors{Salt: string(salt), Iters: got.IterationCount})
	sk, _ := base64.StdEncoding.DecodeString(got.StoredKey)
	if !bytes.Equal(sk, want.StoredKey) {
		t.Fatal("storedKey is not the password's")
	}
	r.Users = nil
	if err := c.Database("db1").RunCommand(testCtx(t), bson.D{{Key: "usersInfo", Value: "app"}}).Decode(&r); err != nil {
		t.Fatal(err)
	}
	if len(r.Users) != 1 || r.Users[0].Credentials != nil {
		t.Fatalf("without showCredentials: %+v", r.Users)
	}
}

// TestUsersInfoRestrictionsAndDropUser: authenticationRestrictions are
// shown only with showAuthenticationRestrictions (an empty array for a
// user without any, as mongod), each field only when set; a dropped user
// is no longer shown.
func TestUsersInfoRestrictionsAndDropUser(t *testing.T) {
	s := Start(t, Options{InMemory: true, Users: []User{
		{Name: "admin", Password: "adminpw"},
		{Name: "r", Password: "pw", Restrictions: []Restriction{{ClientSource: []string{"10.0.0.0/8", "192.0.2.1"}}, {ServerAddress: []string{"127.0.0.1"}}}},
	}})
	c := connectDriver(t, s, func(co *options.ClientOptions) {
		co.SetAuth(options.Credential{Username: "admin", Password: "adminpw"})
	})
	type restriction struct {
		ClientSource  []string `bson:"clientSource"`
		ServerAddress []string `bson:"serverAddress"`
	}
	var r struct {
		Users []struct {
			User         string
			Restrictions *[]restriction `bson:"authenticationRestrictions"`
		}
	}
	run := func(show bool) {
		t.Helper()
		r.Users = nil
		cmd := bson.D{{Key: "usersInfo", Value: bson.A{"r", "admin"}}, {Key: "showAuthenticationRestrictions", Value: show}}
		if err := c.Database("admin").RunCommand(testCtx(t), cmd).Decode(&r); err != nil {
			t.Fatal(err)
		}
	}
	run(true)
	if len(r.Users) != 2 {
		t.Fatalf("users %+v", r.Users)
	}
	for _, u := range r.Users {
		switch {
		case u.Restrictions == nil:
			t.Fatalf("%s: no authenticationRestrictions field", u.User)
		case u.User == "admin" && len(*u.Restrictions) != 0:
			t.Fatalf("admin: %+v", *u.Restrictions)
		case u.User == "r":
			rs := *u.Restrictions
			if len(rs) != 2 || len(rs[0].ClientSource) != 2 || rs[0].ServerAddress != nil || rs[1].ServerAddress[0] != "127.0.0.1" || rs[1].ClientSource != nil {
				t.Fatalf("r: %+v", rs)
			}
		}
	}
	run(false)
	if len(r.Users) != 2 || r.Users[0].Restrictions != nil || r.Users[1].Restrictions != nil {
		t.Fatalf("without showAuthenticationRestrictions: %+v", r.Users)
	}
	if err := s.DropUser("r", "admin"); err != nil {
		t.Fatal(err)
	}
	if err := s.DropUser("r", "admin"); err == nil {
		t.Fatal("dropped twice")
	}
	run(true)
	if len(r.Users) != 1 || r.Users[0].User != "admin" {
		t.Fatalf("after dropUser: %+v", r.Users)
	}
}
