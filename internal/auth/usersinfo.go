package auth

// The reply of usersInfo with showCredentials: true, from which an
// auth_user Lookup takes a user's stored credentials.

import (
	"encoding/base64"
	"fmt"
	"net/netip"

	"github.com/xdg-go/scram"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// CredsFromUsersInfo reads the stored SCRAM credentials of user@db from the
// reply to {usersInfo: {user, db}, showCredentials: true,
// showAuthenticationRestrictions: true}, with the user's
// authenticationRestrictions, which Authenticator.Start then enforces. A
// reply without that user wraps ErrNotFound; a user with no SCRAM
// credentials, or with malformed ones or restrictions it cannot read, is an
// error too (it could not log in anyway: refusing is the safe side).
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
		rs, err := restrictionsFromDoc(doc.Lookup("authenticationRestrictions"))
		if err != nil {
			return Creds{}, fmt.Errorf("usersInfo %s authenticationRestrictions: %v", UserID{User: user, DB: db}, err)
		}
		c, err := NewCreds(stored)
		c.restrict = rs
		return c, err
	}
	return Creds{}, fmt.Errorf("%w: %s", ErrNotFound, UserID{User: user, DB: db})
}

// storedFromDoc reads {iterationCount, salt, storedKey, serverKey}.
func storedFromDoc(d bsoncore.Document) (scram.StoredCredentials, error) {
	var sc scram.StoredCredentials
	n, ok := d.Lookup("iterationCount").AsInt64OK()
	if !ok || n < 0 || n > int64(MaxIterations()) {
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

// restrictionsFromDoc reads authenticationRestrictions: an array of
// documents with clientSource and serverAddress, each an array of CIDR
// ranges or IP addresses (or one as a string). Absent, it is none. A field
// it does not know is an error: a restriction not understood must not be
// taken for no restriction.
func restrictionsFromDoc(v bsoncore.Value) (restrictions, error) {
	if v.Type == 0 {
		return nil, nil
	}
	arr, ok := v.ArrayOK()
	if !ok {
		return nil, fmt.Errorf("not an array")
	}
	docs, _ := arr.Values()
	var rs restrictions
	for _, dv := range docs {
		d, ok := dv.DocumentOK()
		if !ok {
			return nil, fmt.Errorf("an entry is not a document")
		}
		elems, err := d.Elements()
		if err != nil {
			return nil, err
		}
		var r restriction
		for _, e := range elems {
			ranges, err := rangesFrom(e.Value())
			if err != nil {
				return nil, fmt.Errorf("%s: %v", e.Key(), err)
			}
			switch e.Key() {
			case "clientSource":
				r.clientSource = ranges
			case "serverAddress":
				r.serverAddress = ranges
			default:
				return nil, fmt.Errorf("unknown restriction %q", e.Key())
			}
		}
		rs = append(rs, r)
	}
	return rs, nil
}

// rangesFrom reads a list of ranges: an array of strings, or one string.
// The result is never nil, so that an empty list is a restriction nothing
// meets rather than none.
func rangesFrom(v bsoncore.Value) ([]netip.Prefix, error) {
	var strs []string
	if s, ok := v.StringValueOK(); ok {
		strs = []string{s}
	} else if arr, ok := v.ArrayOK(); ok {
		vals, _ := arr.Values()
		for _, x := range vals {
			s, ok := x.StringValueOK()
			if !ok {
				return nil, fmt.Errorf("an entry is not a string")
			}
			strs = append(strs, s)
		}
	} else {
		return nil, fmt.Errorf("not an array of strings")
	}
	out := make([]netip.Prefix, 0, len(strs))
	for _, s := range strs {
		p, err := parseRange(s)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}
