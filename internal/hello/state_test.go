package hello

// Unit tests of the reply and the awaitable state (reply.go, state.go):
// the topologyVersion replies carry, the waits and what ends them, the
// quiesce, and the restamp of a member's state change error.

import (
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

func okOf(d bsoncore.Document) float64 {
	v, _ := d.Lookup("ok").AsFloat64OK()
	return v
}

// Hello replies carry the topologyVersion, each State its own processId,
// and what the request asked for.
func TestReplyCarriesTopologyVersion(t *testing.T) {
	a, b := newState(), newState()
	a.Bump()
	r := Request{HelloOK: true, LoadBalanced: true}
	sid := bson.NewObjectID()
	doc := Reply(&r, DefaultLimits, 7, "zstd", sid, a.Version())
	if err := doc.Validate(); err != nil {
		t.Fatal(err)
	}
	pid, ok := doc.Lookup("topologyVersion", "processId").ObjectIDOK()
	cnt, ok2 := doc.Lookup("topologyVersion", "counter").Int64OK()
	if !ok || !ok2 || pid != a.processID || cnt != 1 {
		t.Fatalf("topologyVersion %v, want {%v, 1}", doc.Lookup("topologyVersion"), a.processID)
	}
	if a.processID == b.processID || a.processID.IsZero() {
		t.Fatalf("two states share processId %v", a.processID)
	}
	if okOf(doc) != 1 || doc.Lookup("isWritablePrimary").Boolean() != true || doc.Lookup("serviceId").ObjectID() != sid ||
		doc.Lookup("compression", "0").StringValue() != "zstd" || doc.Lookup("connectionId").Int64() != 7 ||
		doc.Lookup("maxWireVersion").Int32() != MaxWireVersion || !doc.Lookup("helloOk").Boolean() {
		t.Fatalf("reply %v", bson.Raw(doc))
	}
	if legacy := Reply(&Request{LegacyName: true}, DefaultLimits, 1, "", sid, a.Version()); !legacy.Lookup("ismaster").Boolean() ||
		legacy.Lookup("compression").Type != 0 || legacy.Lookup("serviceId").Type != 0 {
		t.Fatalf("isMaster reply %v", bson.Raw(legacy))
	}
}

func TestAgree(t *testing.T) {
	offered := func(n string) bool { return n == "zlib" || n == "zstd" }
	if got := Agree([]string{"snappy", "zstd", "zlib"}, offered); got != "zstd" {
		t.Errorf("agreed %q, want the client's first we offer, zstd", got)
	}
	if got := Agree([]string{"snappy"}, offered); got != "" {
		t.Errorf("agreed %q, want none", got)
	}
}

// hello_max_await caps a wait within [MinStreamInterval, MaxAwait].
func TestAwaitFor(t *testing.T) {
	s := newState()
	if got := s.AwaitFor(10 * time.Second); got != 10*time.Second {
		t.Errorf("unset: %v", got)
	}
	s.SetMaxAwait(time.Millisecond)
	if got := s.AwaitFor(time.Minute); got != MinStreamInterval {
		t.Errorf("hello_max_await 1ms gives waits of %v, want %v", got, MinStreamInterval)
	}
	s.SetMaxAwait(time.Hour)
	if got := s.AwaitFor(2 * MaxAwait); got != MaxAwait {
		t.Errorf("hello_max_await 1h gives waits of %v, want %v", got, MaxAwait)
	}
}

// A wait ends at once for another process's or an old counter, with d
// passed, at a Bump, or when gone or stop closes; Serving counts.
func TestWait(t *testing.T) {
	s := newState()
	tv := s.Version()
	if w := s.Wait(TopologyVersion{bson.NewObjectID(), 0}, time.Minute, nil, nil); w != Changed {
		t.Errorf("another process: %v", w)
	}
	if w := s.Wait(tv, 0, nil, nil); w != Expired {
		t.Errorf("d 0: %v", w)
	}
	began := time.Now()
	if w := s.Wait(tv, 30*time.Millisecond, nil, nil); w != Expired || time.Since(began) < 30*time.Millisecond {
		t.Errorf("bounded wait: %v after %v", w, time.Since(began))
	}
	for _, tc := range []struct {
		name string
		end  func(gone, stop chan struct{})
		want Wake
	}{
		{"bump", func(_, _ chan struct{}) { s.Bump() }, Changed},
		{"gone", func(gone, _ chan struct{}) { close(gone) }, Gone},
		{"stop", func(_, stop chan struct{}) { close(stop) }, Stopped},
	} {
		tv := s.Version()
		gone, stop := make(chan struct{}), make(chan struct{})
		done := make(chan Wake)
		s.Enter()
		go func() {
			// Leave before the result is sent: the next case's Enter
			// must find this wait gone from Serving.
			w := s.Wait(tv, time.Minute, gone, stop)
			s.Leave()
			done <- w
		}()
		if s.Serving() != 1 {
			t.Fatalf("%s: serving %d", tc.name, s.Serving())
		}
		tc.end(gone, stop)
		select {
		case w := <-done:
			if w != tc.want {
				t.Errorf("%s: woken %v, want %v", tc.name, w, tc.want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the wait did not end", tc.name)
		}
	}
	if s.Wait(tv, time.Minute, nil, nil) != Changed || s.Current(tv) {
		t.Error("an old counter waits")
	}
}

// During a drain a hello is answered as a mongos in quiesce mode answers.
func TestQuiesce(t *testing.T) {
	s := newState()
	s.Bump()
	s.SetDrainDeadline(time.Now().Add(5 * time.Second))
	errDoc := bsoncore.NewDocumentBuilder().AppendDouble("ok", 0).AppendInt32("code", 91).Build()
	doc := s.Quiesce(errDoc)
	if err := doc.Validate(); err != nil {
		t.Fatal(err)
	}
	left, _ := doc.Lookup("remainingQuiesceTimeMillis").Int64OK()
	if code, _ := doc.Lookup("code").Int32OK(); code != 91 || okOf(doc) != 0 || left <= 0 || left > 5000 {
		t.Fatalf("quiesce reply %v", bson.Raw(doc))
	}
	if cnt, _ := doc.Lookup("topologyVersion", "counter").Int64OK(); cnt != 1 {
		t.Fatalf("quiesce reply topologyVersion %v", doc.Lookup("topologyVersion"))
	}
}

// A member's state change error reaches the client with our
// topologyVersion in place of the member's, bytes otherwise unchanged; a
// reply without one, or with other types, is left alone.
func TestRestamp(t *testing.T) {
	s := newState()
	s.Bump()
	member := bson.NewObjectID()
	body := mustDoc(t, bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: int32(10107)},
		{Key: "topologyVersion", Value: bson.D{{Key: "processId", Value: member}, {Key: "counter", Value: int64(7)}}},
		{Key: "errorLabels", Value: bson.A{"RetryableWriteError"}}})
	n := len(body)
	if !s.Restamp(body) || len(body) != n {
		t.Fatal("not stamped")
	}
	pid, _ := body.Lookup("topologyVersion", "processId").ObjectIDOK()
	cnt, _ := body.Lookup("topologyVersion", "counter").Int64OK()
	label, _ := body.Lookup("errorLabels", "0").StringValueOK()
	if code, _ := body.Lookup("code").Int32OK(); pid != s.processID || cnt != 1 || code != 10107 || label != "RetryableWriteError" {
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
		if s.Restamp(b) || string(b) != string(orig) {
			t.Errorf("%v stamped", bson.Raw(orig))
		}
	}
}
