package auth

// The reply of usersInfo with showCredentials: true, from which an
// auth_user Lookup takes a user's stored credentials.

import (
	"encoding/base64"
	"fmt"

	"github.com/xdg-go/scram"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// CredsFromUsersInfo reads the stored SCRAM credentials of user@db from the
// reply to {usersInfo: {user, db}, showCredentials: true}. A reply without
// that user wraps ErrNotFound; a user with no SCRAM credentials, or with
// malformed ones, is an error too (it could not log in anyway).
func CredsFromUsersInfo(reply bsoncore.Document, user, db string) (Creds, error) {
	if err := reply.Validate(); err != nil {
		return Creds{}, fmt.Errorf("usersInfo reply: %w", err)
	}
	if ok, _ := reply.Lookup("ok").AsFloat64OK(); ok != 1 {
		msg, _ := reply.Lookup("errmsg").StringValueOK()
		return Creds{}, fmt.Errorf("usersInfo failed: %s", msg)
	}
	arr, ok := reply.Lookup("users").ArrayOK()
	if !ok {
		return Creds{}, fmt.Errorf("usersInfo reply has no users array")
	}
	vals, _ := arr.Values()
	for _, v := range vals {
		doc, ok := v.DocumentOK()
		if !ok {
			continue
		}
		u, _ := doc.Lookup("user").StringValueOK()
		d, _ := doc.Lookup("db").StringValueOK()
		if u != user || d != db {
			continue
		}
		stored := map[Mechanism]scram.StoredCredentials{}
		for _, m := range Mechanisms {
			cd, ok := doc.Lookup("credentials", string(m)).DocumentOK()
			if !ok {
				continue
			}
			sc, err := storedFromDoc(cd)
			if err != nil {
				return Creds{}, fmt.Errorf("usersInfo %s %s: %v", UserID{User: user, DB: db}, m, err)
			}
			stored[m] = sc
		}
		if len(stored) == 0 {
			return Creds{}, fmt.Errorf("usersInfo: %s has no SCRAM credentials", UserID{User: user, DB: db})
		}
		return NewCreds(stored)
	}
	return Creds{}, fmt.Errorf("%w: %s", ErrNotFound, UserID{User: user, DB: db})
}

// storedFromDoc reads {iterationCount, salt, storedKey, serverKey}.
func storedFromDoc(d bsoncore.Document) (scram.StoredCredentials, error) {
	var sc scram.StoredCredentials
	n, ok := d.Lookup("iterationCount").AsInt64OK()
	if !ok || n < 0 || n > MaxIterations {
		return sc, fmt.Errorf("bad iterationCount")
	}
	sc.Iters = int(n)
	field := func(key string) ([]byte, error) {
		s, ok := d.Lookup(key).StringValueOK()
		if !ok {
			return nil, fmt.Errorf("no %s", key)
		}
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return nil, fmt.Errorf("%s is not base64", key)
		}
		return b, nil
	}
	salt, err := field("salt")
	if err != nil {
		return sc, err
	}
	sc.Salt = string(salt)
	if sc.StoredKey, err = field("storedKey"); err != nil {
		return sc, err
	}
	if sc.ServerKey, err = field("serverKey"); err != nil {
		return sc, err
	}
	return sc, nil
}
