package fakemongo

import (
	"errors"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// TestDriverLogsIn checks the fake's SCRAM server against the official
// driver: each mechanism and the negotiation, with and without the
// speculative login and the long conversation; then the login is what
// connectionStatus reports and what lets find through.
func TestDriverLogsIn(t *testing.T) {
	for _, mech := range []string{"", MechSCRAMSHA1, MechSCRAMSHA256} {
		for _, o := range []Options{{}, {AuthLongForm: true, NoSpeculativeAuth: true}} {
			o.InMemory = true
			o.Users = []User{{Name: "app", DB: "db1", Password: "secret"}}
			s := Start(t, o)
			c := connectDriver(t, s, func(co *options.ClientOptions) {
				co.SetAuth(options.Credential{AuthMechanism: mech, AuthSource: "db1", Username: "app", Password: "secret"})
			})
			var st struct {
				AuthInfo struct {
					AuthenticatedUsers []struct{ User, DB string }
				}
			}
			if err := c.Database("admin").RunCommand(testCtx(t), bson.D{{Key: "connectionStatus", Value: 1}}).Decode(&st); err != nil {
				t.Fatalf("%q %+v: %v", mech, o, err)
			}
			if u := st.AuthInfo.AuthenticatedUsers; len(u) != 1 || u[0].User != "app" || u[0].DB != "db1" {
				t.Fatalf("%q: connectionStatus users %+v", mech, u)
			}
			if err := c.Database("db1").Collection("c").FindOne(testCtx(t), bson.D{}).Err(); !errors.Is(err, mongo.ErrNoDocuments) {
				t.Fatalf("%q: find: %v", mech, err)
			}
			if n := s.AuthFailures(); n != 0 {
				t.Fatalf("%q: %d failed logins", mech, n)
			}
		}
	}
}

// TestDriverWrongPassword: the driver sees code 18, and an unauthenticated
// connection cannot run find.
func TestDriverWrongPassword(t *testing.T) {
	s := Start(t, Options{InMemory: true, Users: []User{{Name: "app", Password: "secret"}}})
	c := connectDriver(t, s, func(co *options.ClientOptions) {
		co.SetAuth(options.Credential{Username: "app", Password: "wrong"})
	})
	err := c.Ping(testCtx(t), nil)
	var se mongo.ServerError
	if !errors.As(err, &se) || !se.HasErrorCode(18) {
		t.Fatalf("ping with a wrong password: %v, want code 18", err)
	}
	if s.AuthFailures() == 0 {
		t.Fatal("no failed login counted")
	}
	anon := connectDriver(t, s, nil)
	err = anon.Database("db").Collection("c").FindOne(testCtx(t), bson.D{}).Err()
	if !errors.As(err, &se) || !se.HasErrorCode(13) {
		t.Fatalf("find without login: %v, want code 13", err)
	}
}
