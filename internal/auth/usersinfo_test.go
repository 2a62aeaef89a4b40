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
