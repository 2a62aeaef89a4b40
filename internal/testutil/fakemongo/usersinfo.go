package fakemongo

// usersInfo, as mongod answers it for the users of Options.Users: the
// forms {usersInfo: "name"} (on the command's database), {usersInfo:
// {user, db}} and a list of either, with the stored SCRAM credentials when
// showCredentials is true (what mongobouncer's auth_user lookup reads) and
// the authenticationRestrictions when showAuthenticationRestrictions is.

import (
	"encoding/base64"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// usersInfo answers the command; the caller has checked that the
// connection is authenticated (needsAuth).
func (s *Server) usersInfo(req *Request) Reply {
	var names [][2]string // db, name
	add := func(v bsoncore.Value) bool {
		if n, ok := v.StringValueOK(); ok {
			names = append(names, [2]string{req.DB, n})
			return true
		}
		d, ok := v.DocumentOK()
		if !ok {
			return false
		}
		u, ok1 := d.Lookup("user").StringValueOK()
		db, ok2 := d.Lookup("db").StringValueOK()
		if !ok1 || !ok2 {
			return false
		}
		names = append(names, [2]string{db, u})
		return true
	}
	v := req.Body.Lookup("usersInfo")
	if arr, ok := v.ArrayOK(); ok {
		vals, _ := arr.Values()
		for _, e := range vals {
			if !add(e) {
				return Error(codeBadValue, "", "usersInfo: bad user in the list")
			}
		}
	} else if !add(v) {
		return Error(codeBadValue, "", "usersInfo: give a user name or {user, db}")
	}
	show, _ := req.Body.Lookup("showCredentials").BooleanOK()
	showRestrictions, _ := req.Body.Lookup("showAuthenticationRestrictions").BooleanOK()
	users := bson.A{}
	for _, n := range names {
		u := s.users.lookup(n[0], n[1])
		if u == nil {
			continue
		}
		mechs := bson.A{}
		for _, m := range u.Mechanisms {
			mechs = append(mechs, m)
		}
		doc := bson.D{
			{Key: "_id", Value: u.DB + "." + u.Name},
			{Key: "user", Value: u.Name},
			{Key: "db", Value: u.DB},
			{Key: "roles", Value: bson.A{}},
			{Key: "mechanisms", Value: mechs},
		}
		if show {
			creds := bson.D{}
			for _, m := range u.Mechanisms {
				sc, ok := u.creds[m]
				if !ok {
					continue
				}
				creds = append(creds, bson.E{Key: m, Value: bson.D{
					{Key: "iterationCount", Value: int32(sc.Iters)},
					{Key: "salt", Value: base64.StdEncoding.EncodeToString([]byte(sc.Salt))},
					{Key: "storedKey", Value: base64.StdEncoding.EncodeToString(sc.StoredKey)},
					{Key: "serverKey", Value: base64.StdEncoding.EncodeToString(sc.ServerKey)},
				}})
			}
			doc = append(doc, bson.E{Key: "credentials", Value: creds})
		}
		if showRestrictions {
			rs := bson.A{}
			for _, r := range u.Restrictions {
				rd := bson.D{}
				if r.ClientSource != nil {
					rd = append(rd, bson.E{Key: "clientSource", Value: r.ClientSource})
				}
				if r.ServerAddress != nil {
					rd = append(rd, bson.E{Key: "serverAddress", Value: r.ServerAddress})
				}
				rs = append(rs, rd)
			}
			doc = append(doc, bson.E{Key: "authenticationRestrictions", Value: rs})
		}
		users = append(users, doc)
	}
	return OK(bson.E{Key: "users", Value: users})
}
