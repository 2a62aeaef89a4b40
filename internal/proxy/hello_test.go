package proxy

// Unit tests of the hello glue (hello.go) and the drain's replies: the
// labels and topologyVersion of a drain's 91, and a hello answered in
// quiesce. The protocol's own tests are internal/hello's.

import (
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/hello"
	"github.com/mongobouncer/mongobouncer/internal/routing"
)

// The drain's 91 carries the labels a server gives it: a retryable write
// RetryableWriteError (the driver retries it on another mongobouncer
// instead of failing the application's insert), a read none (reads are
// retried by code); and the topologyVersion of a state change error.
func TestDrainRefusalIsLabelled(t *testing.T) {
	route := limitsRoute(t, "shop", "127.0.0.1:1")
	c := &client{s: &Server{opts: Options{Observer: nopObserver{}}}}
	c.s.topo.Init()
	c.s.topo.Bump()
	c.s.draining.Store(true)
	lsid := bson.E{Key: "lsid", Value: bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: make([]byte, 16)}}}}
	cases := []struct {
		name   string
		cmd    bson.D
		labels []string
	}{
		{"insert", bson.D{{Key: "insert", Value: "c"}, {Key: "$db", Value: "shop"}, lsid, {Key: "txnNumber", Value: int64(1)}}, []string{"RetryableWriteError"}},
		{"update", bson.D{{Key: "update", Value: "c"}, {Key: "$db", Value: "shop"}}, []string{"RetryableWriteError"}},
		{"find", bson.D{{Key: "find", Value: "c"}, {Key: "$db", Value: "shop"}}, nil},
		{"transaction unknown here", bson.D{{Key: "insert", Value: "c"}, {Key: "$db", Value: "shop"}, lsid, {Key: "txnNumber", Value: int64(2)}, {Key: "autocommit", Value: false}}, []string{"TransientTransactionError"}},
	}
	for _, tc := range cases {
		v := c.s.admit(c.login.Ident, &c.sess, 100, 0, reqOf(t, tc.cmd), route)
		if v.kind != admitRefuse || codeOf(v.reply) != 91 {
			t.Fatalf("%s: verdict %d %v, want 91", tc.name, v.kind, bson.Raw(v.reply))
		}
		if got := labelsOf(v.reply); !equalStrings(got, tc.labels) {
			t.Errorf("%s: labels %v, want %v", tc.name, got, tc.labels)
		}
		if cnt, ok := v.reply.Lookup("topologyVersion", "counter").Int64OK(); !ok || cnt != 1 {
			t.Errorf("%s: topologyVersion %v, want counter 1", tc.name, v.reply.Lookup("topologyVersion"))
		}
		if err := v.reply.Validate(); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	// The synthetic reply of a request the drain caught waiting (errors.go).
	doc := c.s.upstreamError(route, errShuttingDown, reqOf(t, cases[1].cmd), false)
	if codeOf(doc) != 91 || !equalStrings(labelsOf(doc), []string{"RetryableWriteError"}) || doc.Lookup("topologyVersion").Type != bsoncore.TypeEmbeddedDocument {
		t.Errorf("upstreamError while shutting down: %v", bson.Raw(doc))
	}
}

func labelsOf(doc bsoncore.Document) []string {
	v, err := doc.LookupErr("errorLabels")
	if err != nil {
		return nil
	}
	vals, _ := v.Array().Values()
	var out []string
	for _, x := range vals {
		out = append(out, x.StringValue())
	}
	return out
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// During a drain every hello, a handshake too, is answered with the
// quiesce reply, as a mongos in quiesce mode answers; before, the same
// hello is answered ok with the topologyVersion.
func TestHelloDuringDrainIsQuiesce(t *testing.T) {
	route := limitsRoute(t, "shop", "127.0.0.1:1")
	s, err := New(Options{Routes: []*routing.Route{route}, HandshakeWait: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	c := &client{s: s, log: s.log}
	body := mustDoc(t, bson.D{{Key: "hello", Value: 1}, {Key: "$db", Value: "admin"}})
	hr := hello.Parse(body, "hello")
	if doc := c.answerHello(body, &hr); okOf(doc) != 1 || doc.Lookup("topologyVersion").Type != bsoncore.TypeEmbeddedDocument {
		t.Fatalf("hello: %v", bson.Raw(doc))
	}
	s.draining.Store(true)
	s.topo.Bump()
	doc := c.answerHello(body, &hr)
	if msg, _ := doc.Lookup("errmsg").StringValueOK(); codeOf(doc) != 91 || okOf(doc) != 0 || msg != "mongobouncer: "+hello.QuiesceMessage {
		t.Fatalf("hello during the drain: %v, want 91", bson.Raw(doc))
	}
	if cnt, _ := doc.Lookup("topologyVersion", "counter").Int64OK(); cnt != 1 {
		t.Fatalf("hello during the drain: topologyVersion %v", doc.Lookup("topologyVersion"))
	}
}
