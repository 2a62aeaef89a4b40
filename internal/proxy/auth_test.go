package proxy

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/auth"
)

func authClient(t *testing.T) *client {
	users, err := auth.ParseFile([]byte(`"app@admin" "pw"`+"\n"+`"ops@admin" "pw"`), "t")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{opts: Options{Auth: &ClientAuth{Users: auth.New(users, []auth.UserID{{User: "ops", DB: "admin"}}, nil)}}}
	return &client{s: s}
}

func reqOf(t *testing.T, cmd bson.D) *request {
	b, err := bson.Marshal(cmd)
	if err != nil {
		t.Fatal(err)
	}
	var r request
	r.inspect(b)
	return &r
}

// The decision table of authDenied, which both I/O models ask.
func TestAuthDenied(t *testing.T) {
	c := authClient(t)
	cmd := func(name, db string) *request {
		return reqOf(t, bson.D{{Key: name, Value: 1}, {Key: "$db", Value: db}})
	}
	allowed := []*request{cmd("hello", "admin"), cmd("isMaster", "admin"), cmd("saslStart", "admin"),
		cmd("saslContinue", "admin"), cmd("ping", "shop"), cmd("buildInfo", "admin"), cmd("buildinfo", "x")}
	denied := []*request{cmd("find", "shop"), cmd("insert", "shop"), cmd("getMore", "shop"), cmd("endSessions", "admin"),
		cmd("showClients", AdminDatabase), cmd("ping", AdminDatabase), cmd("listDatabases", "admin")}
	for _, r := range allowed {
		if d := c.authDenied(r); d != nil {
			t.Errorf("%s before login: %v", r.name(), bson.Raw(d))
		}
	}
	for _, r := range denied {
		if d := c.authDenied(r); d == nil || codeOf(d) != 13 {
			t.Errorf("%s before login allowed", r.name())
		}
	}
	c.ident = &auth.Identity{User: "app", DB: "admin"}
	for _, r := range denied[:4] {
		if d := c.authDenied(r); d != nil {
			t.Errorf("%s after login: %v", r.name(), bson.Raw(d))
		}
	}
	if d := c.authDenied(cmd("showClients", AdminDatabase)); d == nil || codeOf(d) != 13 {
		t.Error("admin command by a user not in admin_users")
	}
	c.ident = &auth.Identity{User: "ops", DB: "admin"}
	if d := c.authDenied(cmd("showClients", AdminDatabase)); d != nil {
		t.Errorf("admin command by an admin: %v", bson.Raw(d))
	}
	c.s.opts.Auth, c.ident = nil, nil
	for _, r := range denied {
		if c.authDenied(r) != nil {
			t.Errorf("%s refused without client authentication", r.name())
		}
	}
}

// helloAuth inserts its fields into a valid reply that keeps ok last.
func TestHelloAuthFields(t *testing.T) {
	c := authClient(t)
	body, _ := bson.Marshal(bson.D{{Key: "hello", Value: 1}, {Key: "saslSupportedMechs", Value: "admin.ghost"}})
	reply := c.helloAuth(body, helloReply(helloRequest{}, defaultLimits, 1, "", bson.ObjectID{}))
	if err := bsoncore.Document(reply).Validate(); err != nil {
		t.Fatal(err)
	}
	mechs, ok := bsoncore.Document(reply).Lookup("saslSupportedMechs").ArrayOK()
	if vals, _ := mechs.Values(); !ok || len(vals) != 2 {
		t.Fatalf("saslSupportedMechs for an unknown user: %v", bson.Raw(reply))
	}
	if ok, _ := bsoncore.Document(reply).Lookup("ok").AsFloat64OK(); ok != 1 {
		t.Fatal("ok lost")
	}
	// A speculative login that cannot start is left out.
	body, _ = bson.Marshal(bson.D{{Key: "hello", Value: 1}, {Key: "speculativeAuthenticate", Value: bson.D{
		{Key: "saslStart", Value: 1}, {Key: "mechanism", Value: "PLAIN"}, {Key: "payload", Value: bson.Binary{}}}}})
	reply = c.helloAuth(body, helloReply(helloRequest{}, defaultLimits, 1, "", bson.ObjectID{}))
	if _, err := bsoncore.Document(reply).LookupErr("speculativeAuthenticate"); err == nil {
		t.Fatal("a failed speculative login is in the reply")
	}
}

func codeOf(d bsoncore.Document) int32 {
	v, _ := d.Lookup("code").AsInt32OK()
	return v
}

// A client logging in stays on its goroutine (loginDue) from the hello
// that asks its mechanisms to the end of the conversation; a hello
// without the question, or a login over, lets it enter the loop.
func TestLoginDue(t *testing.T) {
	c := authClient(t)
	plain, _ := bson.Marshal(bson.D{{Key: "hello", Value: 1}})
	c.helloAuth(plain, helloReply(helloRequest{}, defaultLimits, 1, "", bson.ObjectID{}))
	if c.loginDue() {
		t.Fatal("a monitoring hello: login due")
	}
	asks, _ := bson.Marshal(bson.D{{Key: "hello", Value: 1}, {Key: "saslSupportedMechs", Value: "admin.app"}})
	c.helloAuth(asks, helloReply(helloRequest{}, defaultLimits, 1, "", bson.ObjectID{}))
	if !c.loginDue() {
		t.Fatal("after a hello asking saslSupportedMechs: no login due")
	}
	if c.loginDue() {
		t.Fatal("the hello's hint outlived the next command")
	}
	c.conv = &auth.Conversation{}
	if !c.loginDue() {
		t.Fatal("a conversation in progress: no login due")
	}
	c.conv, c.ident = nil, &auth.Identity{User: "app", DB: "admin"}
	c.helloAuth(asks, helloReply(helloRequest{}, defaultLimits, 1, "", bson.ObjectID{}))
	if c.loginDue() {
		t.Fatal("a logged-in client's hello: login due")
	}
}
