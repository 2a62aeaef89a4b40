package proxy

// Unit tests of the awaitable hello's fields (awaithello.go): parsing, a
// mongos's error codes, and the topologyVersion and labels of the replies
// a drain gives.

import (
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

func TestParseAwait(t *testing.T) {
	pid := bson.NewObjectID()
	tv := bson.D{{Key: "processId", Value: pid}, {Key: "counter", Value: int64(3)}}
	cases := []struct {
		name      string
		body      bson.D
		awaitable bool
		code      int32 // of the error reply, 0 for none
		maxAwait  time.Duration
	}{
		{"plain hello", bson.D{}, false, 0, 0},
		{"awaitable int64", bson.D{{Key: "topologyVersion", Value: tv}, {Key: "maxAwaitTimeMS", Value: int64(1500)}}, true, 0, 1500 * time.Millisecond},
		{"awaitable int32", bson.D{{Key: "topologyVersion", Value: tv}, {Key: "maxAwaitTimeMS", Value: int32(10)}}, true, 0, 10 * time.Millisecond},
		{"awaitable whole double", bson.D{{Key: "topologyVersion", Value: tv}, {Key: "maxAwaitTimeMS", Value: 20.0}}, true, 0, 20 * time.Millisecond},
		{"capped", bson.D{{Key: "topologyVersion", Value: tv}, {Key: "maxAwaitTimeMS", Value: int64(1 << 50)}}, true, 0, maxHelloAwait},
		{"zero", bson.D{{Key: "topologyVersion", Value: tv}, {Key: "maxAwaitTimeMS", Value: int64(0)}}, true, 0, 0},
		{"topologyVersion alone", bson.D{{Key: "topologyVersion", Value: tv}}, false, 51760, 0},
		{"maxAwaitTimeMS alone", bson.D{{Key: "maxAwaitTimeMS", Value: int64(5)}}, false, 51760, 0},
		{"negative wait", bson.D{{Key: "topologyVersion", Value: tv}, {Key: "maxAwaitTimeMS", Value: int64(-1)}}, false, 51759, 0},
		{"fractional wait", bson.D{{Key: "topologyVersion", Value: tv}, {Key: "maxAwaitTimeMS", Value: 1.5}}, false, 14, 0},
		{"string wait", bson.D{{Key: "topologyVersion", Value: tv}, {Key: "maxAwaitTimeMS", Value: "10"}}, false, 14, 0},
		{"negative counter", bson.D{{Key: "topologyVersion", Value: bson.D{{Key: "processId", Value: pid}, {Key: "counter", Value: int64(-1)}}}, {Key: "maxAwaitTimeMS", Value: int64(5)}}, false, 51758, 0},
		{"int32 counter", bson.D{{Key: "topologyVersion", Value: bson.D{{Key: "processId", Value: pid}, {Key: "counter", Value: int32(1)}}}, {Key: "maxAwaitTimeMS", Value: int64(5)}}, false, 14, 0},
		{"no counter", bson.D{{Key: "topologyVersion", Value: bson.D{{Key: "processId", Value: pid}}}, {Key: "maxAwaitTimeMS", Value: int64(5)}}, false, 40414, 0},
		{"no processId", bson.D{{Key: "topologyVersion", Value: bson.D{{Key: "counter", Value: int64(1)}}}, {Key: "maxAwaitTimeMS", Value: int64(5)}}, false, 40414, 0},
		{"string processId", bson.D{{Key: "topologyVersion", Value: bson.D{{Key: "processId", Value: "x"}, {Key: "counter", Value: int64(1)}}}, {Key: "maxAwaitTimeMS", Value: int64(5)}}, false, 14, 0},
		{"topologyVersion not a document", bson.D{{Key: "topologyVersion", Value: 1}, {Key: "maxAwaitTimeMS", Value: int64(5)}}, false, 14, 0},
	}
	for _, tc := range cases {
		body := mustDoc(t, append(bson.D{{Key: "hello", Value: 1}}, tc.body...))
		a := parseAwait(body)
		if a.awaitable() != tc.awaitable {
			t.Errorf("%s: awaitable %v, want %v", tc.name, a.awaitable(), tc.awaitable)
		}
		if got := codeOf(a.err); got != tc.code {
			t.Errorf("%s: error %v, want code %d", tc.name, bson.Raw(a.err), tc.code)
		}
		if tc.awaitable && (a.maxAwait != tc.maxAwait || a.processID != pid || a.counter != 3) {
			t.Errorf("%s: %+v, want maxAwait %v, processId %v, counter 3", tc.name, a, tc.maxAwait, pid)
		}
	}
}

// A counter ahead of ours, with our processId, is refused as a mongos
// refuses it; another process's counter is not compared.
func TestCheckAwaitCounterAhead(t *testing.T) {
	s := &Server{}
	s.topo.init()
	ahead := helloAwait{hasTV: true, hasMax: true, processID: s.topo.processID, counter: 1}
	if got := codeOf(s.checkAwait(&ahead)); got != 51761 {
		t.Errorf("counter ahead of ours: code %d, want 51761", got)
	}
	other := helloAwait{hasTV: true, hasMax: true, processID: bson.NewObjectID(), counter: 99}
	if doc := s.checkAwait(&other); doc != nil {
		t.Errorf("another process's counter: %v, want no error", bson.Raw(doc))
	}
	s.topo.bump()
	same := helloAwait{hasTV: true, hasMax: true, processID: s.topo.processID, counter: 1}
	if doc := s.checkAwait(&same); doc != nil {
		t.Errorf("our counter: %v", bson.Raw(doc))
	}
}

// Hello replies carry the topologyVersion, each Server its own processId.
func TestHelloReplyCarriesTopologyVersion(t *testing.T) {
	a, b := &Server{}, &Server{}
	a.topo.init()
	b.topo.init()
	a.topo.bump()
	doc := a.plainHello(helloRequest{}, defaultLimits, 1, "")
	if err := doc.Validate(); err != nil {
		t.Fatal(err)
	}
	pid, ok := doc.Lookup("topologyVersion", "processId").ObjectIDOK()
	cnt, ok2 := doc.Lookup("topologyVersion", "counter").Int64OK()
	if !ok || !ok2 || pid != a.topo.processID || cnt != 1 {
		t.Fatalf("topologyVersion %v, want {%v, 1}", doc.Lookup("topologyVersion"), a.topo.processID)
	}
	if a.topo.processID == b.topo.processID || a.topo.processID.IsZero() {
		t.Fatalf("two servers share processId %v", a.topo.processID)
	}
	if okOf(doc) != 1 {
		t.Fatal("ok is not 1")
	}
}

// The drain's 91 carries the labels a server gives it: a retryable write
// RetryableWriteError (the driver retries it on another mongobouncer
// instead of failing the application's insert), a read none (reads are
// retried by code); and the topologyVersion of a state change error.
func TestDrainRefusalIsLabelled(t *testing.T) {
	route := limitsRoute(t, "shop", "127.0.0.1:1")
	c := &client{s: &Server{opts: Options{Observer: nopObserver{}}}}
	c.s.topo.init()
	c.s.topo.bump()
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

// During a drain a hello is answered as a mongos in quiesce mode answers.
func TestQuiesceReply(t *testing.T) {
	s := &Server{}
	s.topo.init()
	s.topo.bump()
	s.topo.drainDeadline.Store(time.Now().Add(5 * time.Second).UnixNano())
	doc := s.quiesceReply()
	if err := doc.Validate(); err != nil {
		t.Fatal(err)
	}
	left, _ := doc.Lookup("remainingQuiesceTimeMillis").Int64OK()
	msg, _ := doc.Lookup("errmsg").StringValueOK()
	if codeOf(doc) != 91 || okOf(doc) != 0 || left <= 0 || left > 5000 || msg != "mongobouncer: "+quiesceMessage {
		t.Fatalf("quiesce reply %v", bson.Raw(doc))
	}
	if cnt, _ := doc.Lookup("topologyVersion", "counter").Int64OK(); cnt != 1 {
		t.Fatalf("quiesce reply topologyVersion %v", doc.Lookup("topologyVersion"))
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

// FuzzParseAwait: any hello body parses without a panic, and what it
// allows stays within the bounds (awaitable implies no error and a wait
// within maxHelloAwait; an error is a valid error reply).
func FuzzParseAwait(f *testing.F) {
	pid := bson.NewObjectID()
	for _, d := range []bson.D{
		{{Key: "hello", Value: 1}},
		{{Key: "hello", Value: 1}, {Key: "topologyVersion", Value: bson.D{{Key: "processId", Value: pid}, {Key: "counter", Value: int64(0)}}}, {Key: "maxAwaitTimeMS", Value: int64(10000)}},
		{{Key: "hello", Value: 1}, {Key: "maxAwaitTimeMS", Value: -1.0}},
		{{Key: "hello", Value: 1}, {Key: "topologyVersion", Value: bson.D{{Key: "counter", Value: "x"}}}},
	} {
		b, _ := bson.Marshal(d)
		f.Add(b)
	}
	s := &Server{}
	s.topo.init()
	f.Fuzz(func(t *testing.T, b []byte) {
		if bsoncore.Document(b).Validate() != nil {
			return
		}
		a := parseAwait(b)
		if a.awaitable() && (a.err != nil || a.maxAwait < 0 || a.maxAwait > maxHelloAwait || a.counter < 0) {
			t.Fatalf("awaitable with %+v", a)
		}
		if doc := s.checkAwait(&a); doc != nil {
			if err := doc.Validate(); err != nil || okOf(doc) != 0 || codeOf(doc) == 0 {
				t.Fatalf("error reply %v: %v", bson.Raw(doc), err)
			}
		}
	})
}

// During a drain every hello, a handshake too, is answered with the
// quiesce reply, as a mongos in quiesce mode answers; before, the same
// hello is answered ok with the topologyVersion.
func TestHelloDuringDrainIsQuiesce(t *testing.T) {
	route := limitsRoute(t, "shop", "127.0.0.1:1")
	s, err := New(Options{Routes: []*Route{route}, HandshakeWait: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	c := &client{s: s, log: s.log}
	body := mustDoc(t, bson.D{{Key: "hello", Value: 1}, {Key: "$db", Value: "admin"}})
	if doc := c.answerHello(body, "hello"); okOf(doc) != 1 || doc.Lookup("topologyVersion").Type != bsoncore.TypeEmbeddedDocument {
		t.Fatalf("hello: %v", bson.Raw(doc))
	}
	s.draining.Store(true)
	s.topo.bump()
	doc := c.answerHello(body, "hello")
	if codeOf(doc) != 91 || okOf(doc) != 0 {
		t.Fatalf("hello during the drain: %v, want 91", bson.Raw(doc))
	}
	if cnt, _ := doc.Lookup("topologyVersion", "counter").Int64OK(); cnt != 1 {
		t.Fatalf("hello during the drain: topologyVersion %v", doc.Lookup("topologyVersion"))
	}
}

// A member's state change error reaches the client with mongobouncer's
// topologyVersion in place of the member's, bytes otherwise unchanged; a
// reply without one, or with other types, is left alone.
func TestStampTopologyVersion(t *testing.T) {
	s := &Server{}
	s.topo.init()
	s.topo.bump()
	member := bson.NewObjectID()
	body := mustDoc(t, bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: int32(10107)},
		{Key: "topologyVersion", Value: bson.D{{Key: "processId", Value: member}, {Key: "counter", Value: int64(7)}}},
		{Key: "errorLabels", Value: bson.A{"RetryableWriteError"}}})
	n := len(body)
	if !s.stampTopologyVersion(body) || len(body) != n {
		t.Fatal("not stamped")
	}
	pid, _ := body.Lookup("topologyVersion", "processId").ObjectIDOK()
	cnt, _ := body.Lookup("topologyVersion", "counter").Int64OK()
	if pid != s.topo.processID || cnt != 1 || codeOf(body) != 10107 || !equalStrings(labelsOf(body), []string{"RetryableWriteError"}) {
		t.Fatalf("stamped: %v", bson.Raw(body))
	}
	for _, d := range []bson.D{
		{{Key: "ok", Value: 0.0}, {Key: "code", Value: int32(10107)}},
		{{Key: "topologyVersion", Value: bson.D{{Key: "processId", Value: "x"}, {Key: "counter", Value: int64(1)}}}},
		{{Key: "topologyVersion", Value: bson.D{{Key: "processId", Value: member}, {Key: "counter", Value: int32(1)}}}},
		{{Key: "topologyVersion", Value: 3}},
	} {
		b := mustDoc(t, d)
		orig := append([]byte(nil), b...)
		if s.stampTopologyVersion(b) || string(b) != string(orig) {
			t.Errorf("%v stamped", bson.Raw(orig))
		}
	}
}
