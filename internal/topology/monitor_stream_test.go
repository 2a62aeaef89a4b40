package topology

import (
	"errors"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// streamedSeeds are replies a streaming connection may read, as whole
// messages: a streamed hello, the last of a stream, an ok:0, a reply to
// another request, a legacy OP_REPLY, and a hello with a mistyped field.
func streamedSeeds(tb testing.TB) [][]byte {
	tb.Helper()
	hello := fakemongo.Doc(bson.D{{Key: "isWritablePrimary", Value: true}, {Key: "msg", Value: "isdbgrid"},
		{Key: "maxWireVersion", Value: int32(25)},
		{Key: "topologyVersion", Value: bson.D{{Key: "processId", Value: bson.ObjectID{1}}, {Key: "counter", Value: int64(4)}}},
		{Key: "ok", Value: 1.0}})
	failed := fakemongo.Doc(bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: int32(91)}, {Key: "codeName", Value: "ShutdownInProgress"}})
	mistyped := fakemongo.Doc(bson.D{{Key: "maxWireVersion", Value: "25"}, {Key: "ok", Value: 1.0}})
	return [][]byte{
		wire.AppendMsg(nil, 8, 7, wire.FlagMoreToCome, hello),
		wire.AppendMsg(nil, 9, 7, 0, hello),
		wire.AppendMsg(nil, 10, 7, 0, failed),
		wire.AppendMsg(nil, 11, 6, wire.FlagMoreToCome, hello),
		wire.AppendReply(nil, 12, 7, hello),
		wire.AppendMsg(nil, 13, 7, 0, mistyped),
	}
}

func TestParseStreamed(t *testing.T) {
	seeds := streamedSeeds(t)
	hs := &upstream.Hello{Compression: []string{"zstd"}}
	r, err := parseStreamed(seeds[0], 7, hs)
	if err != nil || r.err != nil || !r.moreToCome || r.requestID != 8 || r.hello == nil ||
		r.hello.TopologyVersion == nil || r.hello.TopologyVersion.Counter != 4 || r.hello.Msg != "isdbgrid" || len(r.hello.Compression) != 1 {
		t.Fatalf("streamed hello: %+v, %v", r, err)
	}
	if r, err := parseStreamed(seeds[1], 7, hs); err != nil || r.moreToCome || r.hello == nil {
		t.Errorf("last reply: %+v, %v", r, err)
	}
	var ce *upstream.CommandError
	if r, err := parseStreamed(seeds[2], 7, hs); err != nil || !errors.As(r.err, &ce) || ce.Code != 91 || r.hello != nil {
		t.Errorf("ok:0: %+v, %v", r, err)
	}
	if _, err := parseStreamed(seeds[3], 7, hs); err == nil {
		t.Error("a reply to another request was accepted")
	}
	if _, err := parseStreamed(seeds[4], 7, hs); err == nil {
		t.Error("an OP_REPLY was accepted")
	}
	if r, err := parseStreamed(seeds[5], 7, hs); err != nil || r.err == nil || r.hello != nil {
		t.Errorf("mistyped hello: %+v, %v", r, err)
	}
	if err := annotate("a:1", errors.New("x")); !upstream.IsNetworkError(err) || !errors.Is(err, upstream.ErrBadReply) {
		t.Errorf("annotate: %v", err)
	}
}

func TestAwaitableHelloRequest(t *testing.T) {
	d := awaitableHello(&upstream.TopologyVersion{ProcessID: bson.ObjectID{9}, Counter: 5}, 10_000_000_000)
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	if ms, ok := d.Lookup("maxAwaitTimeMS").Int64OK(); !ok || ms != 10_000 {
		t.Errorf("maxAwaitTimeMS %v", d.Lookup("maxAwaitTimeMS"))
	}
	if c, ok := d.Lookup("topologyVersion", "counter").Int64OK(); !ok || c != 5 {
		t.Errorf("counter %v", d.Lookup("topologyVersion", "counter"))
	}
	if p, ok := d.Lookup("topologyVersion", "processId").ObjectIDOK(); !ok || p != (bson.ObjectID{9}) {
		t.Errorf("processId %v", d.Lookup("topologyVersion", "processId"))
	}
	if db, _ := d.Lookup("$db").StringValueOK(); db != "admin" || bsoncore.Document(d).Index(0).Key() != "hello" {
		t.Errorf("request %v", d)
	}
}

// FuzzParseStreamed feeds arbitrary messages to the reader of streamed
// hello replies. It may not panic; it must say exactly one of: a protocol
// error, a failed check, a hello.
func FuzzParseStreamed(f *testing.F) {
	for _, s := range streamedSeeds(f) {
		f.Add(s, int32(7))
	}
	hs := &upstream.Hello{SaslSupportedMechs: []string{"SCRAM-SHA-256"}}
	f.Fuzz(func(t *testing.T, msg []byte, respTo int32) {
		r, err := parseStreamed(msg, respTo, hs)
		if err != nil {
			if r.hello != nil || r.err != nil || r.moreToCome {
				t.Fatalf("a result with the error %v: %+v", err, r)
			}
			return
		}
		if (r.hello == nil) == (r.err == nil) {
			t.Fatalf("want a hello or an error: %+v", r)
		}
		if r.hello != nil && len(r.hello.Raw) > len(msg) {
			t.Fatal("hello larger than the message")
		}
	})
}
