package hello

// Unit tests of a hello's fields (request.go): parsing, the awaitable
// protocol's bounds, and a mongos's refusal codes.

import (
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func mustDoc(t testing.TB, v any) bsoncore.Document {
	t.Helper()
	b, err := bson.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func codeOf(e *Error) int32 {
	if e == nil {
		return 0
	}
	return e.Code
}

func newState() *State {
	s := new(State)
	s.Init()
	return s
}

func TestParse(t *testing.T) {
	body := mustDoc(t, bson.D{{Key: "isMaster", Value: 1}, {Key: "helloOk", Value: true}, {Key: "loadBalanced", Value: true},
		{Key: "compression", Value: bson.A{"zstd", 3, "snappy"}},
		{Key: "client", Value: bson.D{{Key: "application", Value: bson.D{{Key: "name", Value: "shop"}}}}},
		{Key: "apiVersion", Value: "1"}})
	r := Parse(body, "isMaster")
	if !r.LegacyName || !r.HelloOK || !r.LoadBalanced || r.AppName != "shop" || r.APIVersion != "1" ||
		len(r.Compression) != 2 || r.Compression[0] != "zstd" || r.Compression[1] != "snappy" || r.Awaitable() {
		t.Fatalf("parsed %+v", r)
	}
	if Parse(body, "hello").LegacyName {
		t.Error("hello parsed as a legacy isMaster")
	}
}

// An apiVersion other than "1" is refused, with a server's codes.
func TestCheckAPIVersion(t *testing.T) {
	s := newState()
	for _, tc := range []struct {
		v    any
		code int32
	}{{"1", 0}, {"2", 322}, {int32(1), 14}, {bson.D{}, 14}} {
		r := Parse(mustDoc(t, bson.D{{Key: "hello", Value: 1}, {Key: "apiVersion", Value: tc.v}}), "hello")
		if got := codeOf(s.Check(&r)); got != tc.code {
			t.Errorf("apiVersion %v: code %d, want %d", tc.v, got, tc.code)
		}
	}
}

func TestParseAwait(t *testing.T) {
	pid := bson.NewObjectID()
	tv := bson.D{{Key: "processId", Value: pid}, {Key: "counter", Value: int64(3)}}
	cases := []struct {
		name      string
		body      bson.D
		awaitable bool
		code      int32 // of the refusal, 0 for none
		wait      time.Duration
	}{
		{"plain hello", bson.D{}, false, 0, 0},
		{"awaitable int64", bson.D{{Key: "topologyVersion", Value: tv}, {Key: "maxAwaitTimeMS", Value: int64(1500)}}, true, 0, 1500 * time.Millisecond},
		{"awaitable int32", bson.D{{Key: "topologyVersion", Value: tv}, {Key: "maxAwaitTimeMS", Value: int32(10)}}, true, 0, 10 * time.Millisecond},
		{"awaitable whole double", bson.D{{Key: "topologyVersion", Value: tv}, {Key: "maxAwaitTimeMS", Value: 20.0}}, true, 0, 20 * time.Millisecond},
		{"capped", bson.D{{Key: "topologyVersion", Value: tv}, {Key: "maxAwaitTimeMS", Value: int64(1 << 50)}}, true, 0, MaxAwait},
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
	s := newState()
	for _, tc := range cases {
		body := mustDoc(t, append(bson.D{{Key: "hello", Value: 1}}, tc.body...))
		r := Parse(body, "hello")
		if r.Awaitable() != tc.awaitable {
			t.Errorf("%s: awaitable %v, want %v", tc.name, r.Awaitable(), tc.awaitable)
		}
		if got := codeOf(s.Check(&r)); got != tc.code {
			t.Errorf("%s: refusal %v, want code %d", tc.name, s.Check(&r), tc.code)
		}
		if tc.awaitable && (r.Wait != tc.wait || r.Version != (TopologyVersion{pid, 3})) {
			t.Errorf("%s: %+v, want wait %v, topologyVersion {%v, 3}", tc.name, r, tc.wait, pid)
		}
	}
}

// A counter ahead of ours, with our processId, is refused as a mongos
// refuses it; another process's counter is not compared.
func TestCheckCounterAhead(t *testing.T) {
	s := newState()
	ahead := Request{HasVersion: true, HasWait: true, Version: TopologyVersion{s.processID, 1}}
	if got := codeOf(s.Check(&ahead)); got != 51761 {
		t.Errorf("counter ahead of ours: code %d, want 51761", got)
	}
	other := Request{HasVersion: true, HasWait: true, Version: TopologyVersion{bson.NewObjectID(), 99}}
	if e := s.Check(&other); e != nil {
		t.Errorf("another process's counter: %v, want no refusal", e)
	}
	s.Bump()
	if e := s.Check(&ahead); e != nil {
		t.Errorf("our counter: %v", e)
	}
}

// FuzzParse: any hello body parses without a panic, and what it allows
// stays within the bounds (awaitable implies no refusal of its fields and
// a wait within MaxAwait; a refusal has a code).
func FuzzParse(f *testing.F) {
	pid := bson.NewObjectID()
	for _, d := range []bson.D{
		{{Key: "hello", Value: 1}},
		{{Key: "hello", Value: 1}, {Key: "compression", Value: bson.A{"zstd"}}, {Key: "client", Value: bson.D{{Key: "application", Value: bson.D{{Key: "name", Value: "x"}}}}}},
		{{Key: "hello", Value: 1}, {Key: "topologyVersion", Value: bson.D{{Key: "processId", Value: pid}, {Key: "counter", Value: int64(0)}}}, {Key: "maxAwaitTimeMS", Value: int64(10000)}},
		{{Key: "hello", Value: 1}, {Key: "maxAwaitTimeMS", Value: -1.0}},
		{{Key: "hello", Value: 1}, {Key: "topologyVersion", Value: bson.D{{Key: "counter", Value: "x"}}}},
	} {
		b, _ := bson.Marshal(d)
		f.Add(b)
	}
	s := newState()
	f.Fuzz(func(t *testing.T, b []byte) {
		if bsoncore.Document(b).Validate() != nil {
			return
		}
		r := Parse(b, "hello")
		if r.Awaitable() && (r.awaitErr != nil || r.Wait < 0 || r.Wait > MaxAwait || r.Version.Counter < 0) {
			t.Fatalf("awaitable with %+v", r)
		}
		if e := s.Check(&r); e != nil && (e.Code == 0 || e.CodeName == "" || e.Msg == "") {
			t.Fatalf("refusal %+v", e)
		}
	})
}
