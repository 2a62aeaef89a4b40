package proxy

// The login fields of a hello reply (saslSupportedMechs,
// speculativeAuthenticate) and when a login is due.

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/auth"
	"github.com/mongobouncer/mongobouncer/internal/command"
	"github.com/mongobouncer/mongobouncer/internal/hello"
)

func authClient(t *testing.T) *client {
	users, err := auth.ParseFile([]byte(`"app@admin" "pw"`+"\n"+`"ops@admin" "pw"`), "t")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{opts: Options{Auth: &ClientAuth{Users: auth.New(users, []auth.UserID{{User: "ops", DB: "admin"}}, nil)}}}
	c := &client{s: s}
	c.bind()
	return c
}

func reqOf(t *testing.T, cmd bson.D) *command.Request {
	b, err := bson.Marshal(cmd)
	if err != nil {
		t.Fatal(err)
	}
	var r command.Request
	r.Inspect(b)
	return &r
}

// authStep.hello inserts its fields into a valid reply that keeps ok last.
func TestHelloAuthFields(t *testing.T) {
	c := authClient(t)
	body, _ := bson.Marshal(bson.D{{Key: "hello", Value: 1}, {Key: "saslSupportedMechs", Value: "admin.ghost"}})
	reply := c.authStep().hello(body, hello.Reply(&hello.Request{}, hello.DefaultLimits, 1, "", bson.ObjectID{}, hello.TopologyVersion{}))
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
	reply = c.authStep().hello(body, hello.Reply(&hello.Request{}, hello.DefaultLimits, 1, "", bson.ObjectID{}, hello.TopologyVersion{}))
	if _, err := bsoncore.Document(reply).LookupErr("speculativeAuthenticate"); err == nil {
		t.Fatal("a failed speculative login is in the reply")
	}
}

func codeOf(d bsoncore.Document) int32 {
	v, _ := d.Lookup("code").AsInt32OK()
	return v
}

// A client logging in stays on its goroutine (login.due) from the hello
// that asks its mechanisms to the end of the conversation; a hello
// without the question, or a login over, lets it enter the loop.
func TestLoginDue(t *testing.T) {
	c := authClient(t)
	plain, _ := bson.Marshal(bson.D{{Key: "hello", Value: 1}})
	c.authStep().hello(plain, hello.Reply(&hello.Request{}, hello.DefaultLimits, 1, "", bson.ObjectID{}, hello.TopologyVersion{}))
	if c.login.due() {
		t.Fatal("a monitoring hello: login due")
	}
	asks, _ := bson.Marshal(bson.D{{Key: "hello", Value: 1}, {Key: "saslSupportedMechs", Value: "admin.app"}})
	c.authStep().hello(asks, hello.Reply(&hello.Request{}, hello.DefaultLimits, 1, "", bson.ObjectID{}, hello.TopologyVersion{}))
	if !c.login.due() {
		t.Fatal("after a hello asking saslSupportedMechs: no login due")
	}
	if c.login.due() {
		t.Fatal("the hello's hint outlived the next command")
	}
	c.login.Conv = &auth.Conversation{}
	if !c.login.due() {
		t.Fatal("a conversation in progress: no login due")
	}
	c.login.Conv, c.login.Ident = nil, &auth.Identity{User: "app", DB: "admin"}
	c.authStep().hello(asks, hello.Reply(&hello.Request{}, hello.DefaultLimits, 1, "", bson.ObjectID{}, hello.TopologyVersion{}))
	if c.login.due() {
		t.Fatal("a logged-in client's hello: login due")
	}
}
