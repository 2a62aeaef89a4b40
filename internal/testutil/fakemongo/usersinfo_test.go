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
