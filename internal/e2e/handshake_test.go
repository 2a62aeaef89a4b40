package e2e

import (
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

func TestHelloAnsweredAsMongos(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{MaxWireVersion: 21, MaxMessageSizeBytes: 40_000_000, LogicalSessionTimeoutMinutes: 20})
		a, addr := bouncer(t, up.URI(), nil)
		waitUsable(t, a, 1)
		c := dialRaw(t, addr)
		before := up.Requests("hello")
		r := c.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "helloOk", Value: true},
			{Key: "compression", Value: bson.A{"lz4", "zstd", "snappy"}},
			{Key: "client", Value: bson.D{{Key: "application", Value: bson.D{{Key: "name", Value: "shop"}}}}},
			{Key: "$db", Value: "admin"}})
		if up.Requests("hello") != before {
			t.Fatal("the client's hello reached the upstream")
		}
		want := map[string]any{"isWritablePrimary": true, "msg": "isdbgrid", "helloOk": true, "readOnly": false}
		for k, v := range want {
			if got := r.Lookup(k); got.IsZero() || got.String() != bson.RawValue(mustRV(t, v)).String() {
				t.Fatalf("%s = %v, want %v in %v", k, got, v, r)
			}
		}
		ints := map[string]int64{"maxWireVersion": 21, "maxMessageSizeBytes": 40_000_000, "logicalSessionTimeoutMinutes": 20,
			"maxBsonObjectSize": 16 * 1024 * 1024, "maxWriteBatchSize": 100_000}
		for k, v := range ints {
			if got, ok := r.Lookup(k).AsInt64OK(); !ok || got != v {
				t.Fatalf("%s = %v, want %d", k, r.Lookup(k), v)
			}
		}
		if _, ok := r.Lookup("connectionId").AsInt64OK(); !ok {
			t.Fatal("no connectionId")
		}
		if _, ok := r.Lookup("localTime").TimeOK(); !ok {
			t.Fatal("no localTime")
		}
		if comp, _ := r.Lookup("compression").ArrayOK(); first(comp) != "zstd" {
			t.Fatalf("compression = %v, want the first we support: zstd", r.Lookup("compression"))
		}
		// Awaitable hello: drivers stream their monitoring.
		if pid, _ := a.Server().TopologyVersion(); r.Lookup("topologyVersion", "processId").ObjectID() != pid {
			t.Fatalf("topologyVersion = %v, want mongobouncer's (processId %v)", r.Lookup("topologyVersion"), pid)
		}
		if !r.Lookup("serviceId").IsZero() {
			t.Fatal("serviceId given to a client that is not load-balanced")
		}
		// Each client has its own connectionId.
		c2 := dialRaw(t, addr)
		r2 := c2.hello()
		id1, _ := r.Lookup("connectionId").AsInt64OK()
		id2, _ := r2.Lookup("connectionId").AsInt64OK()
		if id1 == id2 {
			t.Fatal("two clients share a connectionId")
		}
	})
}

func mustRV(t *testing.T, v any) bson.RawValue {
	typ, data, err := bson.MarshalValue(v)
	if err != nil {
		t.Fatal(err)
	}
	return bson.RawValue{Type: typ, Value: data}
}

func TestLegacyIsMasterAndLoadBalancedAndStableAPI(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{})
		_, addr := bouncer(t, up.URI(), nil)
		c := dialRaw(t, addr)
		q := wire.AppendQuery(nil, 7, 0, "admin.$cmd", 0, -1, docOf(t, bson.D{{Key: "isMaster", Value: 1}, {Key: "helloOk", Value: true}}))
		c.sendRaw(q)
		rep := c.recv()
		if rep.header.OpCode != wire.OpReply || rep.header.ResponseTo != 7 {
			t.Fatalf("legacy hello answered with %v responseTo %d", rep.header.OpCode, rep.header.ResponseTo)
		}
		if v, _ := rep.body.Lookup("ismaster").BooleanOK(); !v {
			t.Fatalf("no ismaster:true in %v", rep.body)
		}
		// The connection continues with OP_MSG.
		if r := c.cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}}); okOf(r) != 1 {
			t.Fatal(r)
		}

		lb := dialRaw(t, addr)
		r := lb.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "loadBalanced", Value: true}, {Key: "$db", Value: "admin"}})
		if _, ok := r.Lookup("serviceId").ObjectIDOK(); !ok {
			t.Fatalf("no serviceId for a load-balanced client: %v", r)
		}

		api := dialRaw(t, addr)
		r = api.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "apiVersion", Value: "1"}, {Key: "apiStrict", Value: true}, {Key: "$db", Value: "admin"}})
		if okOf(r) != 1 {
			t.Fatalf("stable API hello: %v", r)
		}
		r = api.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "apiVersion", Value: "2"}, {Key: "$db", Value: "admin"}})
		if okOf(r) != 0 || codeOf(r) != 322 {
			t.Fatalf("unknown API version: %v", r)
		}
	})
}

func TestAuthCommandsRefusedClearly(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{})
		_, addr := bouncer(t, up.URI(), nil)
		c := dialRaw(t, addr)
		c.hello()
		r := c.cmd(bson.D{{Key: "saslStart", Value: 1}, {Key: "mechanism", Value: "SCRAM-SHA-256"}, {Key: "payload", Value: []byte("x")}, {Key: "$db", Value: "admin"}})
		if okOf(r) != 0 {
			t.Fatal(r)
		}
		if msg, _ := r.Lookup("errmsg").StringValueOK(); msg != "mongobouncer: authentication is not enabled on mongobouncer" {
			t.Fatalf("errmsg %q", msg)
		}
		if up.Requests("saslStart") != 0 {
			t.Fatal("saslStart reached the upstream")
		}
	})
}

func TestRoutingByDatabase(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		orders := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		rest := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		_, addr := bouncer(t, rest.URI(), func(c *config.Config) {
			c.Databases["orders"] = config.Route{ConnectionString: config.URI(orders.URI())}
		})
		c := dialRaw(t, addr)
		c.hello()
		ins := func(db string) {
			if r := c.cmd(bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{bson.D{{Key: "db", Value: db}}}}, {Key: "$db", Value: db}}); okOf(r) != 1 {
				t.Fatal(r)
			}
		}
		ins("orders")
		ins("other")
		ins("admin")
		if len(orders.Collection("orders", "c")) != 1 || len(orders.Collection("other", "c")) != 0 {
			t.Fatal("orders route did not get exactly the orders database")
		}
		if len(rest.Collection("other", "c")) != 1 || len(rest.Collection("admin", "c")) != 1 {
			t.Fatal("catch-all route did not get other and admin")
		}
	})
}

func TestNoRouteAndDedicatedListener(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		orders := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		other := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		a, addr := bouncer(t, orders.URI(), func(c *config.Config) {
			c.Databases = map[string]config.Route{
				"orders":  {ConnectionString: config.URI(orders.URI())},
				"reports": {ConnectionString: config.URI(other.URI()), Listen: "127.0.0.1:0"},
			}
		})
		c := dialRaw(t, addr)
		c.hello()
		r := c.cmd(bson.D{{Key: "find", Value: "c"}, {Key: "$db", Value: "nowhere"}})
		if okOf(r) != 0 {
			t.Fatal(r)
		}
		if msg, _ := r.Lookup("errmsg").StringValueOK(); msg == "" || !contains(msg, `no route for database "nowhere"`) {
			t.Fatalf("errmsg %q", msg)
		}
		// endSessions with no route for admin is answered locally.
		if r := c.cmd(bson.D{{Key: "endSessions", Value: bson.A{}}, {Key: "$db", Value: "admin"}}); okOf(r) != 1 {
			t.Fatal(r)
		}
		// The client is still usable.
		if r := c.cmd(bson.D{{Key: "find", Value: "c"}, {Key: "$db", Value: "orders"}}); okOf(r) != 1 {
			t.Fatal(r)
		}
		// The dedicated listener sends everything to its route, whatever $db.
		if len(a.Addrs()) != 2 {
			t.Fatalf("listeners: %v", a.Addrs())
		}
		d := dialRaw(t, a.Addrs()[1].String())
		d.hello()
		if r := d.cmd(bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{bson.D{{Key: "x", Value: 1}}}}, {Key: "$db", Value: "orders"}}); okOf(r) != 1 {
			t.Fatal(r)
		}
		if len(other.Collection("orders", "c")) != 1 || len(orders.Collection("orders", "c")) != 0 {
			t.Fatal("dedicated listener did not route to its own route")
		}
	})
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

func TestCompressionNegotiatedSeparatelyOnEachSide(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true, Compressors: []string{"zstd", "zlib"}})
		// Upstream: zlib only (the connection string's compressors).
		_, addr := bouncer(t, up.URI()+"&compressors=zlib", mode("statement", 2))
		for _, comp := range []string{"snappy", "zlib", "zstd"} {
			t.Run(comp, func(t *testing.T) {
				c := driver(t, addr, "&compressors="+comp)
				ctx := ctxT(t, 20*time.Second)
				coll := c.Database("test").Collection(comp)
				if _, err := coll.InsertOne(ctx, bson.D{{Key: "blob", Value: string(make([]byte, 4096))}}); err != nil {
					t.Fatal(err)
				}
				var got []bson.M
				cur, err := coll.Find(ctx, bson.D{})
				if err == nil {
					err = cur.All(ctx, &got)
				}
				if err != nil || len(got) != 1 {
					t.Fatalf("find: %d docs, %v", len(got), err)
				}
			})
		}
		raw := dialRaw(t, addr)
		r := raw.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "compression", Value: bson.A{"snappy"}}, {Key: "$db", Value: "admin"}})
		if comp, _ := r.Lookup("compression").ArrayOK(); first(comp) != "snappy" {
			t.Fatalf("client side: %v", r)
		}
		pooled := 0
		for _, ci := range up.Conns() {
			if len(ci.Compressors) == 1 && ci.Compressors[0] == "zlib" {
				pooled++
			}
		}
		if pooled == 0 {
			t.Fatalf("no upstream connection agreed zlib: %+v", up.Conns())
		}
	})
}

func TestUpstreamUnreachableGivesRetryableErrorAndKeepsClient(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{})
		addrDead := up.Addr()
		up.Close()
		_, addr := bouncer(t, "mongodb://"+addrDead+"/", func(c *config.Config) {
			c.Global.ServerSelectionTimeout = 300 * time.Millisecond
		})
		c := dialRaw(t, addr)
		c.hello()
		start := time.Now()
		r := c.cmd(bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{bson.D{}}}, {Key: "$db", Value: "test"}})
		if okOf(r) != 0 || codeOf(r) != 6 {
			t.Fatalf("want HostUnreachable, got %v", r)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("error took %v", d)
		}
		if labels, _ := r.Lookup("errorLabels").ArrayOK(); first(labels) != "RetryableWriteError" {
			t.Fatalf("labels: %v", r)
		}
		if msg, _ := r.Lookup("errmsg").StringValueOK(); !contains(msg, "mongobouncer") || !contains(msg, addrDead) {
			t.Fatalf("errmsg does not name mongobouncer and the upstream: %q", msg)
		}
		if r := c.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "$db", Value: "admin"}}); okOf(r) != 1 {
			t.Fatal("client dropped after an upstream failure")
		}
	})
}

// first returns the first string of a BSON array, or "".
func first(a bson.RawArray) string {
	vals, err := a.Values()
	if err != nil || len(vals) == 0 {
		return ""
	}
	s, _ := vals[0].StringValueOK()
	return s
}

// In front of a replica set in the middle of a rolling upgrade, the
// handshake advertises the lowest maxWireVersion of the members, so a
// client never sends what one of them cannot take. The lowest is member
// 2's, which mongobouncer knows only by discovery (the route names member
// 1), and which is neither the seed nor the primary whose hello describes
// the upstream. The handshake stays a mongos's: no member list.
func TestReplicaSetHelloWireVersionIsTheMembersMinimum(t *testing.T) {
	oneIO(t)
	rs := fakemongo.StartReplicaSet(t, fakemongo.ReplicaSetOptions{MaxWireVersions: map[int]int32{0: 21, 1: 25, 2: 17}})
	_, addr := rsBouncer(t, rs, nil)
	r := dialRaw(t, addr).hello()
	if got, ok := r.Lookup("maxWireVersion").Int32OK(); !ok || got != 17 {
		t.Fatalf("maxWireVersion %v, want 17, member 2's: %v", r.Lookup("maxWireVersion"), r)
	}
	if msg, _ := r.Lookup("msg").StringValueOK(); msg != "isdbgrid" {
		t.Fatalf("msg %q, want isdbgrid: %v", msg, r)
	}
	for _, k := range []string{"hosts", "setName", "primary", "me", "arbiters", "passives"} {
		if !r.Lookup(k).IsZero() {
			t.Errorf("the handshake leaks %s: %v", k, r)
		}
	}
}
