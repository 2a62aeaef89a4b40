package fakemongo

import (
	"errors"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
	"go.uber.org/goleak"

	"github.com/mongobouncer/mongobouncer/internal/wire"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestHelloShapes(t *testing.T) {
	oid := bson.NewObjectID()
	cases := []struct {
		name  string
		opts  Options
		cmd   string
		extra d
		check func(t *testing.T, s *Server, r bsoncore.Document)
	}{
		{"standalone", Options{}, "hello", d{{"helloOk", true}}, func(t *testing.T, s *Server, r bsoncore.Document) {
			wantBool(t, r, "isWritablePrimary", true)
			wantBool(t, r, "helloOk", true)
			wantInt(t, r, "maxWireVersion", 25)
			wantInt(t, r, "minWireVersion", 0)
			wantInt(t, r, "maxBsonObjectSize", 16777216)
			wantInt(t, r, "maxMessageSizeBytes", 48000000)
			wantInt(t, r, "maxWriteBatchSize", 100000)
			wantInt(t, r, "logicalSessionTimeoutMinutes", 30)
			wantAbsent(t, r, "msg", "setName", "topologyVersion", "serviceId", "compression")
			if _, ok := r.Lookup("localTime").DateTimeOK(); !ok {
				t.Errorf("localTime missing: %v", r)
			}
		}},
		{"isMaster", Options{MaxWireVersion: 21, MinWireVersion: 6}, "isMaster", nil, func(t *testing.T, s *Server, r bsoncore.Document) {
			wantBool(t, r, "ismaster", true)
			wantAbsent(t, r, "isWritablePrimary", "helloOk")
			wantInt(t, r, "maxWireVersion", 21)
			wantInt(t, r, "minWireVersion", 6)
		}},
		{"mongos", Options{Kind: Mongos}, "hello", nil, func(t *testing.T, s *Server, r bsoncore.Document) {
			if m, _ := r.Lookup("msg").StringValueOK(); m != "isdbgrid" {
				t.Errorf("msg = %q", m)
			}
		}},
		{"primary", Options{Kind: ReplicaSetMember, SetName: "rsx"}, "hello", nil, func(t *testing.T, s *Server, r bsoncore.Document) {
			wantBool(t, r, "isWritablePrimary", true)
			wantBool(t, r, "secondary", false)
			if n, _ := r.Lookup("setName").StringValueOK(); n != "rsx" {
				t.Errorf("setName = %q", n)
			}
			if p, _ := r.Lookup("primary").StringValueOK(); p != s.Addr() {
				t.Errorf("primary = %q, want %q", p, s.Addr())
			}
			if h, _ := r.Lookup("hosts").ArrayOK(); h.String() != `["`+s.Addr()+`"]` {
				t.Errorf("hosts = %v", h)
			}
		}},
		{"secondary", Options{Kind: ReplicaSetMember, Secondary: true, Hosts: []string{"a:1", "b:2"}, Primary: "a:1"}, "hello", nil, func(t *testing.T, s *Server, r bsoncore.Document) {
			wantBool(t, r, "isWritablePrimary", false)
			wantBool(t, r, "secondary", true)
			if p, _ := r.Lookup("primary").StringValueOK(); p != "a:1" {
				t.Errorf("primary = %q", p)
			}
			wantAbsent(t, r, "electionId")
		}},
		{"loadBalanced", Options{Kind: Mongos, LoadBalanced: true, ServiceID: oid}, "hello", d{{"loadBalanced", true}}, func(t *testing.T, s *Server, r bsoncore.Document) {
			if got, _ := r.Lookup("serviceId").ObjectIDOK(); got != oid {
				t.Errorf("serviceId = %v, want %v", got, oid)
			}
		}},
		{"loadBalancedNotAsked", Options{Kind: Mongos, LoadBalanced: true}, "hello", nil, func(t *testing.T, s *Server, r bsoncore.Document) {
			wantAbsent(t, r, "serviceId")
		}},
		{"noSessions", Options{LogicalSessionTimeoutMinutes: -1, HelloExtra: bson.D{{Key: "saslSupportedMechs", Value: bson.A{"SCRAM-SHA-256"}}}}, "hello", nil, func(t *testing.T, s *Server, r bsoncore.Document) {
			wantAbsent(t, r, "logicalSessionTimeoutMinutes")
			if _, ok := r.Lookup("saslSupportedMechs").ArrayOK(); !ok {
				t.Errorf("HelloExtra field missing: %v", r)
			}
		}},
		{"topologyVersion", Options{TopologyVersion: true}, "hello", nil, func(t *testing.T, s *Server, r bsoncore.Document) {
			if c, ok := r.Lookup("topologyVersion", "counter").Int64OK(); !ok || c != 0 {
				t.Errorf("topologyVersion.counter = %v, %v", c, ok)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := Start(t, tc.opts)
			c := dialRaw(t, s)
			body := append(d{{tc.cmd, 1}}, tc.extra...)
			body = append(body, e{"$db", "admin"})
			r := c.roundTrip(body)
			mustOK(t, r)
			if id, _ := r.Lookup("connectionId").AsInt64OK(); id != s.Conns()[0].ID {
				t.Errorf("connectionId = %d, want %d", id, s.Conns()[0].ID)
			}
			tc.check(t, s, r)
		})
	}
}

func wantBool(t *testing.T, r bsoncore.Document, key string, want bool) {
	t.Helper()
	if got, ok := r.Lookup(key).BooleanOK(); !ok || got != want {
		t.Errorf("%s = %v (present %v), want %v", key, got, ok, want)
	}
}

func wantInt(t *testing.T, r bsoncore.Document, key string, want int64) {
	t.Helper()
	if got, ok := r.Lookup(key).AsInt64OK(); !ok || got != want {
		t.Errorf("%s = %v (present %v), want %v", key, got, ok, want)
	}
}

func wantAbsent(t *testing.T, r bsoncore.Document, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if _, err := r.LookupErr(k); err == nil {
			t.Errorf("%s should be absent: %v", k, r)
		}
	}
}

func TestListenRejectsBadOptions(t *testing.T) {
	if _, err := Listen("127.0.0.1:0", Options{Compressors: []string{"lz4"}}); err == nil {
		t.Fatal("unknown compressor accepted")
	}
	if _, err := Listen("127.0.0.1:0", Options{Kind: Kind(9)}); err == nil {
		t.Fatal("unknown kind accepted")
	}
}

func TestLegacyOpQueryHello(t *testing.T) {
	s := Start(t, Options{Kind: Mongos, Compressors: []string{"zlib"}})
	c := dialRaw(t, s)
	for i, q := range []d{
		{{"isMaster", 1}, {"client", d{{"application", d{{"name", "legacyApp"}}}}}, {"compression", bson.A{"snappy", "zlib"}}},
		{{"$query", d{{"ismaster", 1}}}, {"$readPreference", d{{"mode", "primaryPreferred"}}}},
	} {
		id := int32(100 + i)
		c.write(wire.AppendQuery(nil, id, 0, "admin.$cmd", 0, -1, Doc(q)))
		h, msg, err := c.readRaw(ioTimeout)
		if err != nil {
			t.Fatal(err)
		}
		if h.OpCode != wire.OpReply || h.ResponseTo != id {
			t.Fatalf("got %v responseTo %d, want OP_REPLY to %d", h.OpCode, h.ResponseTo, id)
		}
		rep, err := wire.ParseReply(msg)
		if err != nil || len(rep.Documents) != 1 {
			t.Fatalf("reply: %v, %d docs", err, len(rep.Documents))
		}
		r := rep.Documents[0]
		mustOK(t, r)
		wantBool(t, r, "ismaster", true)
		if i == 0 {
			if a, _ := r.Lookup("compression").ArrayOK(); a.String() != `["zlib"]` {
				t.Errorf("compression = %v", a)
			}
		}
	}
	if got := s.Conns()[0].AppName; got != "legacyApp" {
		t.Errorf("appName = %q", got)
	}
	if s.Requests("isMaster") != 1 || s.Requests("ismaster") != 1 {
		t.Errorf("counts = %v", s.RequestCounts())
	}
	// Anything but hello over OP_QUERY is refused, as by servers >= 6.0.
	c.write(wire.AppendQuery(nil, 7, 0, "admin.$cmd", 0, -1, Doc(d{{"ping", 1}})))
	_, msg, err := c.readRaw(ioTimeout)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := wire.ParseReply(msg)
	if err != nil || codeOf(rep.Documents[0]) != codeUnsupportedOpQueryCommand {
		t.Fatalf("OP_QUERY ping: %v %v", err, rep.Documents)
	}
}

func TestUnknownCommandAndPing(t *testing.T) {
	s := Start(t, Options{})
	c := dialRaw(t, s)
	mustOK(t, c.roundTrip(d{{"ping", 1}, {"$db", "admin"}}))
	r := c.roundTrip(d{{"frobnicate", 1}, {"$db", "test"}})
	if okOf(t, r) != 0 || codeOf(r) != 59 {
		t.Fatalf("unknown command: %v", r)
	}
	if n, _ := r.Lookup("codeName").StringValueOK(); n != "CommandNotFound" {
		t.Errorf("codeName = %q", n)
	}
	// Without InMemory, the CRUD commands are unknown too.
	if r := c.roundTrip(d{{"find", "c"}, {"$db", "test"}}); codeOf(r) != 59 {
		t.Fatalf("find without InMemory: %v", r)
	}
	r = c.roundTrip(d{{"buildInfo", 1}, {"$db", "admin"}})
	mustOK(t, r)
	if v, _ := r.Lookup("version").StringValueOK(); v != "8.0.0" {
		t.Errorf("version = %q", v)
	}
}

func TestMoreToComeRequestGetsNoReply(t *testing.T) {
	s := Start(t, Options{InMemory: true})
	c := dialRaw(t, s)
	seq := wire.Sequence{Identifier: "documents", Documents: append(Doc(d{{"_id", 1}}), Doc(d{{"_id", 2}})...)}
	c.send(wire.FlagMoreToCome, d{{"insert", "c"}, {"$db", "db"}, {"writeConcern", d{{"w", 0}}}}, seq)
	// The next reply must answer the ping, not the w:0 insert.
	mustOK(t, c.roundTrip(d{{"ping", 1}, {"$db", "admin"}}))
	if got := len(s.Collection("db", "c")); got != 2 {
		t.Fatalf("collection has %d docs, want 2", got)
	}
	// A handler's reply is dropped too for moreToCome requests.
	s.Handle("custom", func(*Request) Reply { return OK() })
	c.send(wire.FlagMoreToCome, d{{"custom", 1}, {"$db", "db"}})
	c.expectNothing(100 * time.Millisecond)
	if s.Requests("custom") != 1 {
		t.Fatalf("custom not received: %v", s.RequestCounts())
	}
}

func TestExhaustStream(t *testing.T) {
	s := Start(t, Options{})
	var mu sync.Mutex
	var seen []*Request
	s.Handle("stream", func(req *Request) Reply {
		mu.Lock()
		seen = append(seen, req.Clone())
		mu.Unlock()
		return Docs(d{{"i", 0}, {"ok", 1}}, d{{"i", 1}, {"ok", 1}}, d{{"i", 2}, {"ok", 1}})
	})
	c := dialRaw(t, s)
	id := c.send(wire.FlagExhaustAllowed, d{{"stream", 1}, {"$db", "x"}})
	prev := id
	for i := range 3 {
		m := c.recv()
		if m.Header.ResponseTo != prev {
			t.Fatalf("reply %d responseTo %d, want %d", i, m.Header.ResponseTo, prev)
		}
		more := m.Flags.Has(wire.FlagMoreToCome)
		if more != (i < 2) {
			t.Fatalf("reply %d moreToCome = %v", i, more)
		}
		if got, _ := m.Body.Lookup("i").AsInt64OK(); got != int64(i) {
			t.Fatalf("reply %d is %v", i, m.Body)
		}
		prev = m.Header.RequestID
	}
	// Without exhaustAllowed only the first document is sent.
	mustOK(t, c.roundTrip(d{{"stream", 1}, {"$db", "x"}}))
	mustOK(t, c.roundTrip(d{{"ping", 1}, {"$db", "x"}}))
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 || !seen[0].ExhaustAllowed() || seen[1].ExhaustAllowed() || seen[0].DB != "x" || seen[0].Command != "stream" {
		t.Fatalf("requests seen: %+v", seen)
	}
}

func TestRequestAccessors(t *testing.T) {
	s := Start(t, Options{})
	got := make(chan *Request, 1)
	s.Handle("insert", func(req *Request) Reply {
		got <- req.Clone()
		return OK(bson.E{Key: "n", Value: int32(len(req.Documents("documents")))})
	})
	c := dialRaw(t, s)
	mustOK(t, c.roundTrip(d{{"hello", 1}, {"client", d{{"application", d{{"name", "acc"}}}}}, {"$db", "admin"}}))
	lsid := bson.Binary{Subtype: 4, Data: []byte("0123456789abcdef")}
	seq := wire.Sequence{Identifier: "documents", Documents: append(Doc(d{{"a", 1}}), Doc(d{{"a", 2}})...)}
	c.send(0, d{{"insert", "coll"}, {"$db", "db1"}, {"lsid", d{{"id", lsid}}}, {"txnNumber", int64(7)}}, seq)
	r := c.recv()
	if n, _ := r.Body.Lookup("n").AsInt32OK(); n != 2 {
		t.Fatalf("reply %v", r.Body)
	}
	req := <-got
	id, ok := req.LSID()
	tn, ok2 := req.TxnNumber()
	if !ok || string(id) != "0123456789abcdef" || !ok2 || tn != 7 {
		t.Errorf("lsid %q %v txnNumber %d %v", id, ok, tn, ok2)
	}
	if req.AppName != "acc" || req.DB != "db1" || req.ConnID != s.Conns()[0].ID || req.OpCode != wire.OpMsg {
		t.Errorf("request %+v", req)
	}
	if len(req.Sequences) != 1 || req.Sequences[0].Len() != 2 || len(req.Documents("documents")) != 2 {
		t.Errorf("sequences %+v", req.Sequences)
	}
	if name, _ := req.Lookup("insert").StringValueOK(); name != "coll" {
		t.Errorf("Lookup(insert) = %q", name)
	}
}

func TestHandlerCloseConnAndDelay(t *testing.T) {
	s := Start(t, Options{})
	s.Handle("close", func(*Request) Reply { return Reply{CloseConn: true} })
	s.Handle("slow", func(*Request) Reply {
		r := OK()
		r.Delay = 150 * time.Millisecond
		return r
	})
	c := dialRaw(t, s)
	start := time.Now()
	mustOK(t, c.roundTrip(d{{"slow", 1}, {"$db", "x"}}))
	if el := time.Since(start); el < 150*time.Millisecond {
		t.Errorf("delayed reply after %v", el)
	}
	c.send(0, d{{"close", 1}, {"$db", "x"}})
	c.expectClosed(ioTimeout)
	waitFor(t, "connection to be forgotten", func() bool { return s.Open() == 0 })

	// A nil handler restores the built-in (CommandNotFound here).
	s.Handle("close", nil)
	c2 := dialRaw(t, s)
	if r := c2.roundTrip(d{{"close", 1}, {"$db", "x"}}); codeOf(r) != 59 {
		t.Fatalf("after removing handler: %v", r)
	}
}

func TestDelayEndsWhenClientLeaves(t *testing.T) {
	s := Start(t, Options{})
	s.Handle("forever", func(*Request) Reply { return Reply{Delay: time.Hour, Docs: okDocs} })
	c := dialRaw(t, s)
	c.send(0, d{{"forever", 1}, {"$db", "x"}})
	waitFor(t, "request to arrive", func() bool { return s.Requests("forever") == 1 })
	_ = c.nc.Close()
	waitFor(t, "blocked connection to notice the client left", func() bool { return s.Open() == 0 })
}

func TestCloseInterruptsBlockedRequests(t *testing.T) {
	s, err := Listen("127.0.0.1:0", Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.SetFailPoint(FailPoint{Mode: FailAlwaysOn, FailCommands: []string{"ping"}, BlockConnection: true, BlockTime: time.Hour})
	c := dialRaw(t, s)
	c.send(0, d{{"ping", 1}, {"$db", "x"}})
	waitFor(t, "ping to block", func() bool { return s.FailPointHits() == 1 })
	done := make(chan struct{})
	go func() { s.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not interrupt a blocked request")
	}
	c.expectClosed(ioTimeout)
	if _, err := net.DialTimeout("tcp", s.Addr(), time.Second); err == nil {
		t.Fatal("dial after Close succeeded")
	}
	s.Close() // idempotent
}

func TestKillFromHandler(t *testing.T) {
	s := Start(t, Options{})
	s.Handle("die", func(*Request) Reply { return Reply{Kill: true} })
	a, b := dialRaw(t, s), dialRaw(t, s)
	mustOK(t, b.roundTrip(d{{"ping", 1}, {"$db", "x"}}))
	a.send(0, d{{"die", 1}, {"$db", "x"}})
	a.expectClosed(ioTimeout)
	b.expectClosed(ioTimeout)
	if !s.Killed() {
		t.Fatal("not killed")
	}
	if nc, err := net.DialTimeout("tcp", s.Addr(), time.Second); err == nil {
		_ = nc.Close()
		t.Fatal("dial after Kill succeeded")
	}
}

func TestCloseAllConnsKeepsListening(t *testing.T) {
	s := Start(t, Options{})
	a, b := dialRaw(t, s), dialRaw(t, s)
	mustOK(t, a.roundTrip(d{{"ping", 1}, {"$db", "x"}}))
	mustOK(t, b.roundTrip(d{{"ping", 1}, {"$db", "x"}}))
	if s.Open() != 2 || s.MaxOpen() != 2 || s.Accepted() != 2 {
		t.Fatalf("open %d max %d accepted %d", s.Open(), s.MaxOpen(), s.Accepted())
	}
	s.CloseAllConns()
	a.expectClosed(ioTimeout)
	b.expectClosed(ioTimeout)
	waitFor(t, "conns to close", func() bool { return s.Open() == 0 })
	c := dialRaw(t, s)
	mustOK(t, c.roundTrip(d{{"ping", 1}, {"$db", "x"}}))
	if s.Accepted() != 3 || s.MaxOpen() != 2 || s.Requests("ping") != 3 {
		t.Fatalf("accepted %d max %d pings %d", s.Accepted(), s.MaxOpen(), s.Requests("ping"))
	}
	s.ResetCounters()
	if s.Requests("ping") != 0 || s.MaxOpen() != 1 || len(s.RequestCounts()) != 0 {
		t.Fatalf("after reset: %v max %d", s.RequestCounts(), s.MaxOpen())
	}
}

func TestFailPointGo(t *testing.T) {
	s := Start(t, Options{})
	a, b := dialRaw(t, s), dialRaw(t, s)
	mustOK(t, a.roundTrip(d{{"hello", 1}, {"client", d{{"application", d{{"name", "victim"}}}}}, {"$db", "admin"}}))
	mustOK(t, b.roundTrip(d{{"hello", 1}, {"client", d{{"application", d{{"name", "bystander"}}}}}, {"$db", "admin"}}))

	s.SetFailPoint(FailPoint{Mode: FailTimes, Times: 2, FailCommands: []string{"ping"}, ErrorCode: 91,
		ErrorLabels: []string{"RetryableWriteError"}, AppName: "victim"})
	mustOK(t, b.roundTrip(d{{"ping", 1}, {"$db", "x"}})) // other app: untouched
	for range 2 {
		r := a.roundTrip(d{{"ping", 1}, {"$db", "x"}})
		if codeOf(r) != 91 {
			t.Fatalf("expected code 91, got %v", r)
		}
		if n, _ := r.Lookup("codeName").StringValueOK(); n != "ShutdownInProgress" {
			t.Errorf("codeName %q", n)
		}
		if l, _ := r.Lookup("errorLabels").ArrayOK(); l.String() != `["RetryableWriteError"]` {
			t.Errorf("labels %v", l)
		}
	}
	mustOK(t, a.roundTrip(d{{"ping", 1}, {"$db", "x"}})) // times exhausted
	if s.FailPointHits() != 2 || s.FailPointState().Mode != FailOff {
		t.Fatalf("hits %d state %+v", s.FailPointHits(), s.FailPointState())
	}

	// blockConnection then normal execution.
	s.SetFailPoint(FailPoint{Mode: FailAlwaysOn, FailCommands: []string{"ping"}, BlockConnection: true, BlockTime: 100 * time.Millisecond})
	start := time.Now()
	mustOK(t, a.roundTrip(d{{"ping", 1}, {"$db", "x"}}))
	if el := time.Since(start); el < 100*time.Millisecond {
		t.Errorf("blocked ping answered after %v", el)
	}
	if st := s.FailPointState(); st.Mode != FailAlwaysOn || !slices.Equal(st.FailCommands, []string{"ping"}) {
		t.Errorf("state %+v", st)
	}

	// closeConnection.
	s.SetFailPoint(FailPoint{Mode: FailAlwaysOn, FailCommands: []string{"ping"}, CloseConnection: true})
	a.send(0, d{{"ping", 1}, {"$db", "x"}})
	a.expectClosed(ioTimeout)
	s.ClearFailPoint()
	mustOK(t, b.roundTrip(d{{"ping", 1}, {"$db", "x"}}))
}

// OverloadFailPoint answers as an overloaded MongoDB 8.2 does, on demand.
func TestFailPointOverloaded(t *testing.T) {
	s := Start(t, Options{})
	a := dialRaw(t, s)
	s.SetFailPoint(OverloadFailPoint(1, "ping"))
	r := a.roundTrip(d{{"ping", 1}, {"$db", "x"}})
	if codeOf(r) != 462 {
		t.Fatalf("expected code 462, got %v", r)
	}
	if n, _ := r.Lookup("codeName").StringValueOK(); n != "IngressRequestRateLimitExceeded" {
		t.Errorf("codeName %q", n)
	}
	if l, _ := r.Lookup("errorLabels").ArrayOK(); l.String() != `["SystemOverloadedError","RetryableError"]` {
		t.Errorf("labels %v", l)
	}
	mustOK(t, a.roundTrip(d{{"ping", 1}, {"$db", "x"}})) // once only
	s.SetFailPoint(OverloadFailPoint(0, "ping"))
	for range 3 {
		if r := a.roundTrip(d{{"ping", 1}, {"$db", "x"}}); codeOf(r) != 462 {
			t.Fatalf("always-on overload: %v", r)
		}
	}
	s.ClearFailPoint()
	mustOK(t, a.roundTrip(d{{"ping", 1}, {"$db", "x"}}))
}

func TestFailPointOverWire(t *testing.T) {
	s := Start(t, Options{})
	admin := dialRaw(t, s)
	mustOK(t, admin.roundTrip(d{
		{"configureFailPoint", "failCommand"}, {"mode", d{{"times", 1}}},
		{"data", d{{"failCommands", bson.A{"isMaster", "hello"}}, {"errorCode", 91}, {"appName", "poolApp"}}},
		{"$db", "admin"},
	}))
	// hello from another app is not failed, and the fail point matches on
	// the appName the hello itself carries.
	mustOK(t, dialRaw(t, s).roundTrip(d{{"hello", 1}, {"$db", "admin"}}))
	victim := dialRaw(t, s)
	r := victim.roundTrip(d{{"hello", 1}, {"client", d{{"application", d{{"name", "poolApp"}}}}}, {"$db", "admin"}})
	if codeOf(r) != 91 {
		t.Fatalf("hello not failed: %v", r)
	}
	mustOK(t, victim.roundTrip(d{{"hello", 1}, {"$db", "admin"}}))

	mustOK(t, admin.roundTrip(d{
		{"configureFailPoint", "failCommand"}, {"mode", "alwaysOn"},
		{"data", d{{"failCommands", bson.A{"ping"}}, {"blockConnection", true}, {"blockTimeMS", 50}, {"closeConnection", false}}},
		{"$db", "admin"},
	}))
	if st := s.FailPointState(); !st.BlockConnection || st.BlockTime != 50*time.Millisecond || st.Mode != FailAlwaysOn {
		t.Fatalf("state %+v", st)
	}
	mustOK(t, admin.roundTrip(d{{"configureFailPoint", "failCommand"}, {"mode", "off"}, {"$db", "admin"}}))
	if s.FailPointState().Mode != FailOff {
		t.Fatal("not off")
	}
	for _, bad := range []d{
		{{"configureFailPoint", "otherFailPoint"}, {"mode", "alwaysOn"}},
		{{"configureFailPoint", "failCommand"}, {"mode", "sometimes"}, {"data", d{{"failCommands", bson.A{"ping"}}}}},
		{{"configureFailPoint", "failCommand"}, {"mode", "alwaysOn"}, {"data", d{{"failCommands", bson.A{"ping"}}, {"writeConcernError", d{}}}}},
		{{"configureFailPoint", "failCommand"}, {"mode", "alwaysOn"}, {"data", d{{"errorCode", 1}}}},
		{{"configureFailPoint", "failCommand"}, {"mode", d{{"times", -1}}}, {"data", d{{"failCommands", bson.A{"ping"}}}}},
	} {
		r := admin.roundTrip(append(bad, e{"$db", "admin"}))
		if codeOf(r) != codeBadValue {
			t.Errorf("%v accepted: %v", bad, r)
		}
	}
	if _, err := ParseFailPoint(Doc(d{{"configureFailPoint", "x"}})); !errors.Is(err, ErrBadFailPoint) {
		t.Errorf("error %v does not wrap ErrBadFailPoint", err)
	}
}

// The CMAP integration tests block hello for 10 s and close the socket
// meanwhile; the fake must free the connection at once.
func TestBlockedHelloFreedWhenClientLeaves(t *testing.T) {
	s := Start(t, Options{})
	s.SetFailPoint(FailPoint{Mode: FailAlwaysOn, FailCommands: []string{"hello"}, BlockConnection: true, BlockTime: 10 * time.Second})
	c := dialRaw(t, s)
	c.send(0, d{{"hello", 1}, {"$db", "admin"}})
	waitFor(t, "hello to block", func() bool { return s.FailPointHits() == 1 })
	_ = c.nc.Close()
	start := time.Now()
	waitFor(t, "connection to close", func() bool { return s.Open() == 0 })
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("freed after %v", el)
	}
}

func TestCursorsArePerServer(t *testing.T) {
	a := Start(t, Options{InMemory: true})
	b := Start(t, Options{InMemory: true})
	ca, cb := dialRaw(t, a), dialRaw(t, b)
	docs := bson.A{}
	for i := range 5 {
		docs = append(docs, d{{"_id", i}, {"k", i % 2}})
	}
	r := ca.roundTrip(d{{"insert", "c"}, {"documents", docs}, {"$db", "db"}})
	if n, _ := r.Lookup("n").AsInt64OK(); n != 5 {
		t.Fatalf("insert %v", r)
	}
	r = ca.roundTrip(d{{"find", "c"}, {"batchSize", 2}, {"$db", "db"}})
	id, _ := r.Lookup("cursor", "id").Int64OK()
	if id == 0 || batchLen(r, "firstBatch") != 2 {
		t.Fatalf("find %v", r)
	}
	if ns, _ := r.Lookup("cursor", "ns").StringValueOK(); ns != "db.c" {
		t.Errorf("ns %q", ns)
	}
	if !slices.Equal(a.OpenCursors(), []int64{id}) {
		t.Errorf("open cursors %v", a.OpenCursors())
	}
	// The wrong server does not know the cursor.
	if r := cb.roundTrip(d{{"getMore", id}, {"collection", "c"}, {"$db", "db"}}); codeOf(r) != codeCursorNotFound {
		t.Fatalf("getMore on other server: %v", r)
	}
	// Wrong namespace.
	if r := ca.roundTrip(d{{"getMore", id}, {"collection", "other"}, {"$db", "db"}}); okOf(t, r) != 0 {
		t.Fatalf("getMore on other collection: %v", r)
	}
	r = ca.roundTrip(d{{"getMore", id}, {"collection", "c"}, {"batchSize", 2}, {"$db", "db"}})
	if got, _ := r.Lookup("cursor", "id").Int64OK(); got != id || batchLen(r, "nextBatch") != 2 {
		t.Fatalf("getMore %v", r)
	}
	r = ca.roundTrip(d{{"getMore", id}, {"collection", "c"}, {"$db", "db"}})
	if got, _ := r.Lookup("cursor", "id").Int64OK(); got != 0 || batchLen(r, "nextBatch") != 1 {
		t.Fatalf("last getMore %v", r)
	}
	if r := ca.roundTrip(d{{"getMore", id}, {"collection", "c"}, {"$db", "db"}}); codeOf(r) != codeCursorNotFound {
		t.Fatalf("getMore after exhaustion: %v", r)
	}

	// Filter, limit, skip, singleBatch.
	r = ca.roundTrip(d{{"find", "c"}, {"filter", d{{"k", int64(1)}}}, {"$db", "db"}})
	if batchLen(r, "firstBatch") != 2 {
		t.Fatalf("filtered find %v", r)
	}
	r = ca.roundTrip(d{{"find", "c"}, {"skip", 1}, {"limit", 3}, {"batchSize", 1}, {"$db", "db"}})
	id2, _ := r.Lookup("cursor", "id").Int64OK()
	if first, _ := r.Lookup("cursor", "firstBatch", "0", "_id").AsInt64OK(); first != 1 || id2 == 0 {
		t.Fatalf("skip/limit find %v", r)
	}
	r = ca.roundTrip(d{{"find", "c"}, {"limit", 1}, {"singleBatch", true}, {"$db", "db"}})
	if got, _ := r.Lookup("cursor", "id").Int64OK(); got != 0 || batchLen(r, "firstBatch") != 1 {
		t.Fatalf("findOne %v", r)
	}
	if r := ca.roundTrip(d{{"find", "c"}, {"filter", d{{"k", d{{"$gt", 0}}}}}, {"$db", "db"}}); codeOf(r) != codeBadValue {
		t.Fatalf("operators must be refused: %v", r)
	}

	// killCursors.
	r = ca.roundTrip(d{{"killCursors", "c"}, {"cursors", bson.A{id2, int64(12345)}}, {"$db", "db"}})
	if k := int64s(r, "cursorsKilled"); !slices.Equal(k, []int64{id2}) {
		t.Errorf("killed %v", r)
	}
	if k := int64s(r, "cursorsNotFound"); !slices.Equal(k, []int64{12345}) {
		t.Errorf("not found %v", r)
	}
	if len(a.OpenCursors()) != 0 {
		t.Errorf("cursors left %v", a.OpenCursors())
	}
	mustOK(t, ca.roundTrip(d{{"drop", "c"}, {"$db", "db"}}))
	if len(a.Collection("db", "c")) != 0 {
		t.Error("drop left documents")
	}
}

func TestGetMoreExhaust(t *testing.T) {
	s := Start(t, Options{InMemory: true})
	c := dialRaw(t, s)
	docs := bson.A{}
	for i := range 7 {
		docs = append(docs, d{{"_id", i}})
	}
	mustOK(t, c.roundTrip(d{{"insert", "c"}, {"documents", docs}, {"$db", "db"}}))
	r := c.roundTrip(d{{"find", "c"}, {"batchSize", 2}, {"$db", "db"}})
	id, _ := r.Lookup("cursor", "id").Int64OK()
	prev := c.send(wire.FlagExhaustAllowed, d{{"getMore", id}, {"collection", "c"}, {"batchSize", 2}, {"$db", "db"}})
	total := 0
	for i := 0; ; i++ {
		m := c.recv()
		if m.Header.ResponseTo != prev {
			t.Fatalf("responseTo %d want %d", m.Header.ResponseTo, prev)
		}
		prev = m.Header.RequestID
		total += batchLen(m.Body, "nextBatch")
		cid, _ := m.Body.Lookup("cursor", "id").Int64OK()
		if more := m.Flags.Has(wire.FlagMoreToCome); more != (cid != 0) {
			t.Fatalf("reply %d: moreToCome %v with cursor id %d", i, more, cid)
		}
		if cid == 0 {
			break
		}
	}
	if total != 5 {
		t.Fatalf("streamed %d docs, want 5", total)
	}
}

func batchLen(r bsoncore.Document, key string) int {
	a, ok := r.Lookup("cursor", key).ArrayOK()
	if !ok {
		return -1
	}
	v, _ := a.Values()
	return len(v)
}

func int64s(r bsoncore.Document, key string) []int64 {
	a, _ := r.Lookup(key).ArrayOK()
	vals, _ := a.Values()
	out := []int64{}
	for _, v := range vals {
		n, _ := v.AsInt64OK()
		out = append(out, n)
	}
	return out
}

func TestTransactionsBookkeeping(t *testing.T) {
	s := Start(t, Options{Kind: Mongos, InMemory: true})
	c1, c2 := dialRaw(t, s), dialRaw(t, s)
	lsid := d{{"id", bson.Binary{Subtype: 4, Data: []byte("session-0000001")}}}
	txn := func(n int64, extra ...e) d {
		return append(d{{"lsid", lsid}, {"txnNumber", n}, {"autocommit", false}}, extra...)
	}
	cmd := func(head d, tail d) d { return append(head, tail...) }

	// Transaction 1: insert on c1, find on c2 (same server, other conn), commit.
	r := c1.roundTrip(cmd(d{{"insert", "c"}, {"documents", bson.A{d{{"_id", 1}}}}, {"$db", "db"}}, txn(1, e{"startTransaction", true})))
	mustOK(t, r)
	if len(s.Collection("db", "c")) != 0 {
		t.Fatal("uncommitted insert visible outside the transaction")
	}
	r = c2.roundTrip(cmd(d{{"find", "c"}, {"$db", "db"}}, txn(1)))
	if batchLen(r, "firstBatch") != 1 {
		t.Fatalf("find in txn %v", r)
	}
	r = c2.roundTrip(cmd(d{{"commitTransaction", 1}, {"$db", "admin"}}, txn(1)))
	mustOK(t, r)
	if _, err := r.LookupErr("recoveryToken"); err != nil {
		t.Errorf("mongos commit without recoveryToken: %v", r)
	}
	mustOK(t, c2.roundTrip(cmd(d{{"commitTransaction", 1}, {"$db", "admin"}}, txn(1)))) // retried commit
	if len(s.Collection("db", "c")) != 1 {
		t.Fatal("committed insert not visible")
	}

	// Transaction 2 aborted explicitly; 3 aborted by endSessions.
	mustOK(t, c1.roundTrip(cmd(d{{"insert", "c"}, {"documents", bson.A{d{{"_id", 2}}}}, {"$db", "db"}}, txn(2, e{"startTransaction", true}))))
	mustOK(t, c1.roundTrip(cmd(d{{"abortTransaction", 1}, {"$db", "admin"}}, txn(2))))
	if r := c1.roundTrip(cmd(d{{"find", "c"}, {"$db", "db"}}, txn(2))); codeOf(r) != codeNoSuchTransaction {
		t.Fatalf("command after abort: %v", r)
	}
	if r := c1.roundTrip(cmd(d{{"commitTransaction", 1}, {"$db", "admin"}}, txn(2))); codeOf(r) != codeNoSuchTransaction {
		t.Fatalf("commit after abort: %v", r)
	}
	mustOK(t, c1.roundTrip(cmd(d{{"find", "c"}, {"$db", "db"}}, txn(3, e{"startTransaction", true}))))
	if r := c1.roundTrip(cmd(d{{"find", "c"}, {"$db", "db"}}, txn(1, e{"startTransaction", true}))); codeOf(r) != codeTransactionTooOld {
		t.Fatalf("old txnNumber: %v", r)
	}
	mustOK(t, c1.roundTrip(d{{"endSessions", bson.A{lsid}}, {"$db", "admin"}}))
	if len(s.Collection("db", "c")) != 1 {
		t.Fatal("aborted insert visible")
	}
	if r := c1.roundTrip(cmd(d{{"abortTransaction", 1}, {"$db", "admin"}}, txn(9))); codeOf(r) != codeNoSuchTransaction {
		t.Fatalf("abort unknown: %v", r)
	}

	got := s.Transactions()
	if len(got) != 3 {
		t.Fatalf("transactions %+v", got)
	}
	want := []struct {
		state TxnState
		by    string
		cmds  []string
	}{
		{TxnCommitted, "", []string{"insert", "find", "commitTransaction", "commitTransaction"}},
		{TxnAborted, "abortTransaction", []string{"insert", "abortTransaction", "commitTransaction"}},
		{TxnAborted, "endSessions", []string{"find"}},
	}
	for i, w := range want {
		g := got[i]
		if g.TxnNumber != int64(i+1) || g.State != w.state || g.AbortedBy != w.by || !slices.Equal(g.Commands, w.cmds) || string(g.LSID) != "session-0000001" {
			t.Errorf("txn %d = %+v (%v), want %+v", i, g, g.State, w)
		}
	}
	if ids := got[0].ConnIDs; len(ids) != 4 || ids[0] == ids[1] {
		t.Errorf("conn ids %v: first two commands ran on different connections", ids)
	}
}

func TestAwaitableHello(t *testing.T) {
	s := Start(t, Options{TopologyVersion: true})
	c := dialRaw(t, s)
	r := c.roundTrip(d{{"hello", 1}, {"$db", "admin"}})
	tv, _ := r.Lookup("topologyVersion").DocumentOK()
	tvD := bson.Raw(tv)

	// Non-exhaust: answered after maxAwaitTimeMS.
	start := time.Now()
	r = c.roundTrip(d{{"hello", 1}, {"topologyVersion", tvD}, {"maxAwaitTimeMS", 100}, {"$db", "admin"}})
	mustOK(t, r)
	if el := time.Since(start); el < 100*time.Millisecond {
		t.Errorf("awaitable hello answered after %v", el)
	}

	// Exhaust: each bump yields a reply with moreToCome chained by ids.
	prev := c.send(wire.FlagExhaustAllowed, d{{"hello", 1}, {"topologyVersion", tvD}, {"maxAwaitTimeMS", 60_000}, {"$db", "admin"}})
	c.expectNothing(100 * time.Millisecond)
	for i := int64(1); i <= 2; i++ {
		s.BumpTopologyVersion()
		m := c.recv()
		if m.Header.ResponseTo != prev || !m.Flags.Has(wire.FlagMoreToCome) {
			t.Fatalf("streamed hello %d: responseTo %d (want %d) flags %v", i, m.Header.ResponseTo, prev, m.Flags)
		}
		if got, _ := m.Body.Lookup("topologyVersion", "counter").Int64OK(); got != i {
			t.Fatalf("counter %d, want %d", got, i)
		}
		prev = m.Header.RequestID
	}
	_ = c.nc.Close()
	waitFor(t, "streaming connection to close", func() bool { return s.Open() == 0 })

	// A stale topologyVersion is answered at once.
	c2 := dialRaw(t, s)
	start = time.Now()
	mustOK(t, c2.roundTrip(d{{"hello", 1}, {"topologyVersion", tvD}, {"maxAwaitTimeMS", 60_000}, {"$db", "admin"}}))
	if el := time.Since(start); el > 30*time.Second {
		t.Errorf("stale hello took %v", el)
	}
}

func TestCompressionRaw(t *testing.T) {
	s := Start(t, Options{Compressors: []string{"zstd", "zlib"}})
	c := dialRaw(t, s)
	r := c.roundTrip(d{{"hello", 1}, {"compression", bson.A{"snappy", "zlib", "zstd"}}, {"$db", "admin"}})
	if a, _ := r.Lookup("compression").ArrayOK(); a.String() != `["zlib","zstd"]` {
		t.Fatalf("compression %v", a)
	}
	if got := s.Conns()[0].Compressors; !slices.Equal(got, []string{"zlib", "zstd"}) {
		t.Fatalf("conn compressors %v", got)
	}
	c.useC, c.comp = true, wire.CompressorZstd
	c.send(0, d{{"ping", 1}, {"$db", "admin"}})
	h, msg, err := c.readRaw(ioTimeout)
	if err != nil || h.OpCode != wire.OpCompressed {
		t.Fatalf("reply opcode %v err %v", h.OpCode, err)
	}
	m, err := wire.ParseMsg(msg)
	if err != nil {
		t.Fatal(err)
	}
	mustOK(t, m.Body)
	// snappy was not agreed: the server drops the connection.
	c.comp = wire.CompressorSnappy
	c.send(0, d{{"ping", 1}, {"$db", "admin"}})
	c.expectClosed(ioTimeout)
}

func TestMalformedInputClosesConnection(t *testing.T) {
	s := Start(t, Options{MaxMessageSizeBytes: 1 << 20})
	for name, msg := range map[string][]byte{
		"tooLarge":     wire.AppendHeader(nil, wire.Header{MessageLength: 2 << 20, RequestID: 1, OpCode: wire.OpMsg}),
		"tooSmall":     wire.AppendHeader(nil, wire.Header{MessageLength: 3, RequestID: 1, OpCode: wire.OpMsg}),
		"removedOp":    append(wire.AppendHeader(nil, wire.Header{MessageLength: 20, RequestID: 1, OpCode: wire.OpInsert}), 0, 0, 0, 0),
		"badBSON":      append(wire.AppendHeader(nil, wire.Header{MessageLength: 26, RequestID: 1, OpCode: wire.OpMsg}), 0, 0, 0, 0, 0, 5, 0, 0, 0, 1),
		"requiredFlag": wire.AppendMsg(nil, 1, 0, 1<<5, Doc(d{{"ping", 1}})),
	} {
		t.Run(name, func(t *testing.T) {
			c := dialRaw(t, s)
			c.write(msg)
			c.expectClosed(ioTimeout)
		})
	}
	mustOK(t, dialRaw(t, s).roundTrip(d{{"ping", 1}, {"$db", "x"}}))
}

func TestBuiltinFromHandler(t *testing.T) {
	s := Start(t, Options{Kind: Mongos})
	var hellos int
	var mu sync.Mutex
	s.Handle("hello", func(req *Request) Reply {
		mu.Lock()
		hellos++
		mu.Unlock()
		r := s.Builtin(req)
		r.Delay = 10 * time.Millisecond
		return r
	})
	c := dialRaw(t, s)
	r := c.roundTrip(d{{"hello", 1}, {"$db", "admin"}})
	if m, _ := r.Lookup("msg").StringValueOK(); m != "isdbgrid" {
		t.Fatalf("wrapped builtin %v", r)
	}
	mu.Lock()
	defer mu.Unlock()
	if hellos != 1 {
		t.Fatalf("handler ran %d times", hellos)
	}
}

func TestManyConnectionsCounters(t *testing.T) {
	s := Start(t, Options{})
	const n = 20
	var wg sync.WaitGroup
	clients := make([]*rawClient, n)
	for i := range clients {
		clients[i] = dialRaw(t, s)
	}
	for _, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				id := c.send(0, d{{"ping", 1}, {"$db", "x"}})
				_, msg, err := c.readRaw(ioTimeout)
				if err != nil {
					t.Error(err)
					return
				}
				if h, _ := wire.ParseHeader(msg); h.ResponseTo != id {
					t.Errorf("responseTo %d want %d", h.ResponseTo, id)
					return
				}
			}
		}()
	}
	wg.Wait()
	if s.Requests("ping") != n*10 || s.MaxOpen() != n || s.Accepted() != n || len(s.Conns()) != n {
		t.Fatalf("pings %d max %d accepted %d conns %d", s.Requests("ping"), s.MaxOpen(), s.Accepted(), len(s.Conns()))
	}
}

func TestPipelinedRequestDuringDelay(t *testing.T) {
	s := Start(t, Options{})
	s.Handle("slow", func(*Request) Reply { return Reply{Delay: 100 * time.Millisecond, Docs: okDocs} })
	c := dialRaw(t, s)
	start := time.Now()
	first := c.send(0, d{{"slow", 1}, {"$db", "x"}})
	second := c.send(0, d{{"ping", 1}, {"$db", "x"}})
	// The delay still runs its full course although bytes arrived, and
	// replies come back in request order.
	if m := c.recv(); m.Header.ResponseTo != first {
		t.Fatalf("first reply answers %d, want %d", m.Header.ResponseTo, first)
	}
	if el := time.Since(start); el < 100*time.Millisecond {
		t.Errorf("delay cut short: %v", el)
	}
	if m := c.recv(); m.Header.ResponseTo != second {
		t.Fatalf("second reply answers %d, want %d", m.Header.ResponseTo, second)
	}
}

func TestInsertAddsMissingID(t *testing.T) {
	s := Start(t, Options{InMemory: true})
	c := dialRaw(t, s)
	mustOK(t, c.roundTrip(d{{"insert", "c"}, {"documents", bson.A{d{{"a", 1}}, d{{"_id", "mine"}}}}, {"$db", "db"}}))
	docs := s.Collection("db", "c")
	if len(docs) != 2 {
		t.Fatalf("%d docs", len(docs))
	}
	if _, ok := docs[0].Lookup("_id").ObjectIDOK(); !ok {
		t.Errorf("no generated _id: %v", docs[0])
	}
	if a, _ := docs[0].Lookup("a").AsInt64OK(); a != 1 {
		t.Errorf("field lost: %v", docs[0])
	}
	if id, _ := docs[1].Lookup("_id").StringValueOK(); id != "mine" {
		t.Errorf("_id replaced: %v", docs[1])
	}
}
