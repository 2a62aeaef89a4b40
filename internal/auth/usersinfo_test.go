package auth

import (
	"context"
	"encoding/base64"
	"errors"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// usersInfoReply builds a usersInfo reply as a server gives it.
func usersInfoReply(t testing.TB, user, db, password string) []byte {
	creds := bson.D{}
	for _, m := range Mechanisms {
		sc, err := Derive(m, user, password, []byte("salt-salt-salt-salt"), 4096)
		if err != nil {
			t.Fatal(err)
		}
		enc := base64.StdEncoding.EncodeToString
		creds = append(creds, bson.E{Key: string(m), Value: bson.D{
			{Key: "iterationCount", Value: int32(sc.Iters)}, {Key: "salt", Value: enc([]byte(sc.Salt))},
			{Key: "storedKey", Value: enc(sc.StoredKey)}, {Key: "serverKey", Value: enc(sc.ServerKey)}}})
	}
	b, err := bson.Marshal(bson.D{{Key: "users", Value: bson.A{bson.D{
		{Key: "_id", Value: db + "." + user}, {Key: "user", Value: user}, {Key: "db", Value: db},
		{Key: "credentials", Value: creds}, {Key: "roles", Value: bson.A{}}}}}, {Key: "ok", Value: 1.0}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A Lookup built on CredsFromUsersInfo logs users in; a reply without the
// user is ErrNotFound.
func TestCredsFromUsersInfo(t *testing.T) {
	reply := usersInfoReply(t, "dyn", "sales", "pw")
	c, err := CredsFromUsersInfo(reply, "dyn", "sales")
	if err != nil || len(c.Mechanisms()) != 2 {
		t.Fatal(c, err)
	}
	if _, err := CredsFromUsersInfo(reply, "dyn", "admin"); !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
	cache := NewCache(LookupFunc(func(ctx context.Context, user, db string) (Creds, error) {
		return CredsFromUsersInfo(reply, user, db)
	}), CacheOptions{})
	a := New(&Users{}, nil, cache)
	for _, m := range Mechanisms {
		if id, err := login(t, a, m, "dyn", "sales", "pw", true); err != nil || id.ID() != (UserID{User: "dyn", DB: "sales"}) {
			t.Fatal(m, id, err)
		}
		if _, err := login(t, a, m, "dyn", "sales", "nope", true); !IsAuthFailed(err) {
			t.Fatal(m, err)
		}
	}
	bad, _ := bson.Marshal(bson.D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "not authorized"}})
	if _, err := CredsFromUsersInfo(bad, "dyn", "sales"); err == nil || errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
}

// FuzzCredsFromUsersInfo: any bytes as a usersInfo reply.
func FuzzCredsFromUsersInfo(f *testing.F) {
	f.Add(usersInfoReply(f, "u", "db", "pw"))
	f.Add([]byte{5, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := CredsFromUsersInfo(b, "u", "db")
		if err == nil && len(c.Mechanisms()) == 0 {
			t.Fatal("no credentials and no error")
		}
	})
}

// withRestrictions adds an authenticationRestrictions field, as usersInfo
// shows it with showAuthenticationRestrictions, to the reply's user.
func withRestrictions(t *testing.T, reply []byte, rs bson.A) []byte {
	t.Helper()
	var d bson.D
	if err := bson.Unmarshal(reply, &d); err != nil {
		t.Fatal(err)
	}
	users := d[0].Value.(bson.A)
	u := users[0].(bson.D)
	users[0] = append(u, bson.E{Key: "authenticationRestrictions", Value: rs})
	b, err := bson.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// authenticationRestrictions are read from usersInfo and enforced: the
// address a login comes from and the one it reached; a restriction that
// cannot be read fails the lookup rather than be taken for none.
func TestCredsFromUsersInfoRestrictions(t *testing.T) {
	reply := withRestrictions(t, usersInfoReply(t, "dyn", "sales", "pw"), bson.A{
		bson.D{{Key: "clientSource", Value: bson.A{"192.0.2.0/24", "198.51.100.7"}}, {Key: "serverAddress", Value: bson.A{"127.0.0.1"}}},
	})
	c, err := CredsFromUsersInfo(reply, "dyn", "sales")
	if err != nil || len(c.restrict) != 1 {
		t.Fatal(c, err)
	}
	for _, tc := range []struct {
		p  Peer
		ok bool
	}{
		{Peer{"192.0.2.9:1000", "127.0.0.1:27017"}, true},
		{Peer{"198.51.100.7:1000", "127.0.0.1:27017"}, true},
		{Peer{"198.51.100.8:1000", "127.0.0.1:27017"}, false},
		{Peer{"192.0.2.9:1000", "10.0.0.1:27017"}, false},
	} {
		if got := c.restrict.allows(tc.p, true); got != tc.ok {
			t.Errorf("%+v: allows %v, want %v", tc.p, got, tc.ok)
		}
	}
	for _, bad := range []bson.A{
		{bson.D{{Key: "clientSource", Value: bson.A{"not-an-ip"}}}},
		{bson.D{{Key: "clientSourceTypo", Value: bson.A{"10.0.0.0/8"}}}},
		{"a string"},
	} {
		if _, err := CredsFromUsersInfo(withRestrictions(t, usersInfoReply(t, "dyn", "sales", "pw"), bad), "dyn", "sales"); err == nil || errors.Is(err, ErrNotFound) {
			t.Errorf("%v: %v, want an error", bad, err)
		}
	}
	if c, err := CredsFromUsersInfo(withRestrictions(t, usersInfoReply(t, "dyn", "sales", "pw"), bson.A{}), "dyn", "sales"); err != nil || c.restrict != nil {
		t.Fatalf("no restrictions: %v %v", c.restrict, err)
	}
}
