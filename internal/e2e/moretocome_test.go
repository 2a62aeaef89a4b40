package e2e

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// A request with moreToCome set asks for no reply (OP_MSG spec: "the
// receiver MUST NOT send a reply"). A hello with moreToCome answered anyway
// leaves a stray reply on the connection that the client reads as the
// answer to its next request.
func TestHelloWithMoreToComeGetsNoReply(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{})
		_, addr := bouncer(t, up.URI(), nil)
		c := dialRaw(t, addr)
		c.hello()
		c.send(wire.FlagMoreToCome, bson.D{{Key: "hello", Value: 1}, {Key: "$db", Value: "admin"}})
		id := c.send(0, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "test"}})
		rep := c.recv()
		if rep.header.ResponseTo != id {
			t.Fatalf("first reply after a moreToCome hello answers request %d, want the ping %d: %v", rep.header.ResponseTo, id, rep.body)
		}
	})
}

// The same for endSessions that mongobouncer answers itself because no
// route serves admin: an unacknowledged endSessions must get no reply.
func TestEndSessionsWithMoreToComeGetsNoReply(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		orders := fakemongo.Start(t, fakemongo.Options{})
		_, addr := bouncer(t, orders.URI(), func(c *config.Config) {
			c.Databases = map[string]config.Route{"orders": {ConnectionString: config.URI(orders.URI())}}
		})
		c := dialRaw(t, addr)
		c.hello()
		c.send(wire.FlagMoreToCome, bson.D{{Key: "endSessions", Value: bson.A{}}, {Key: "$db", Value: "admin"}})
		id := c.send(0, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "orders"}})
		rep, err := c.tryRecv(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if rep.header.ResponseTo != id {
			t.Fatalf("first reply after a moreToCome endSessions answers request %d, want the ping %d: %v", rep.header.ResponseTo, id, rep.body)
		}
	})
}

// The very first hello, before the monitor has heard from the upstream,
// waits for it (HandshakeWait) and then advertises the upstream's figures.
func TestFirstHelloWaitsForUpstreamLimits(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{MaxWireVersion: 17, MaxMessageSizeBytes: 30_000_000})
		_, addr := bouncer(t, up.URI(), nil)
		c := dialRaw(t, addr)
		r := c.hello()
		if v, _ := r.Lookup("maxWireVersion").AsInt64OK(); v != 17 {
			t.Fatalf("maxWireVersion %d, want the upstream's 17: %v", v, r)
		}
		if v, _ := r.Lookup("maxMessageSizeBytes").AsInt64OK(); v != 30_000_000 {
			t.Fatalf("maxMessageSizeBytes %d: %v", v, r)
		}
	})
}

// moreThenPing sends req with moreToCome on c, then a ping to pingDB, and
// returns the first reply c reads, failing t unless it answers the ping: a
// reply to the moreToCome request, which the client does not read for,
// would be taken for the ping's.
func moreThenPing(t *testing.T, c *rawClient, req bson.D, pingDB string) bson.Raw {
	t.Helper()
	more := c.send(wire.FlagMoreToCome, req)
	ping := c.send(0, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: pingDB}})
	rep, err := c.tryRecv(10 * time.Second)
	if err != nil {
		t.Fatalf("no reply to the ping that followed a failing moreToCome request: %v", err)
	}
	if rep.header.ResponseTo != ping {
		t.Fatalf("first reply after a failing moreToCome request (id %d) answers request %d, want the ping %d: %v",
			more, rep.header.ResponseTo, ping, rep.body)
	}
	return rep.body
}

// A moreToCome request that mongobouncer cannot forward gets no reply
// either, whatever the failure: the error reply a request without the flag
// would get must not reach the client.
func TestFailedMoreToComeGetsNoReply(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		orders := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		dead := fakemongo.Start(t, fakemongo.Options{})
		deadAddr := dead.Addr()
		dead.Close()
		small := 16 << 10
		a, addr := bouncer(t, orders.URI(), func(c *config.Config) {
			c.Global.ServerSelectionTimeout = 300 * time.Millisecond
			// No "*" route: other databases have no route.
			c.Databases = map[string]config.Route{
				"orders": {ConnectionString: config.URI(orders.URI())},
				"dead":   {ConnectionString: config.URI("mongodb://" + deadAddr + "/?directConnection=true")},
				"small":  {ConnectionString: config.URI(orders.URI()), Overrides: config.Overrides{MaxMessageSize: &small}},
			}
		})
		insert := func(db string, extra ...bson.E) bson.D {
			d := bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{bson.D{{Key: "x", Value: 1}}}}}
			d = append(d, extra...)
			if db != "" {
				d = append(d, bson.E{Key: "$db", Value: db})
			}
			return d
		}
		for _, tc := range []struct {
			name string
			req  bson.D
		}{
			{"noRoute", insert("nowhere")},
			{"noDollarDB", insert("")},
			{"upstreamUnreachable", insert("dead")},
			{"overRouteMaxMessageSize", insert("small", bson.E{Key: "pad", Value: strings.Repeat("p", 2*small)})},
			{"auth", bson.D{{Key: "saslStart", Value: 1}, {Key: "mechanism", Value: "SCRAM-SHA-256"}, {Key: "payload", Value: []byte("x")}, {Key: "$db", Value: "admin"}}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				c := dialRaw(t, addr)
				c.hello()
				if r := moreThenPing(t, c, tc.req, "orders"); okOf(r) != 1 {
					t.Fatalf("ping: %v", r)
				}
			})
		}
		if n := len(orders.Collection("test", "c")) + len(orders.Collection("small", "c")); n != 0 {
			t.Fatalf("%d refused inserts reached the upstream", n)
		}

		// Draining: requests outside a transaction are refused with
		// ShutdownInProgress, a moreToCome one silently.
		t.Run("draining", func(t *testing.T) {
			hold := make(chan struct{})
			release := sync.OnceFunc(func() { close(hold) })
			t.Cleanup(release)
			orders.Handle("hold", func(*fakemongo.Request) fakemongo.Reply {
				select {
				case <-hold:
				case <-time.After(10 * time.Second):
				}
				return fakemongo.OK()
			})
			holder, c := dialRaw(t, addr), dialRaw(t, addr)
			holder.hello()
			c.hello()
			// The held request keeps the drain going while c is tested.
			hid := holder.send(0, bson.D{{Key: "hold", Value: 1}, {Key: "$db", Value: "orders"}})
			waitFor(t, "the held request to reach the upstream", func() bool { return orders.Requests("hold") == 1 })
			done := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				done <- a.GracefulClose(ctx)
			}()
			waitFor(t, "the drain to start", a.Server().Draining)
			r := moreThenPing(t, c, insert("orders"), "orders")
			release()
			if codeOf(r) != 91 {
				t.Errorf("ping while draining: %v, want ShutdownInProgress (91)", r)
			}
			if rep := holder.recv(); rep.header.ResponseTo != hid || okOf(rep.body) != 1 {
				t.Errorf("held request: %v", rep.body)
			}
			if err := <-done; err != nil {
				t.Errorf("shutdown: %v", err)
			}
			if n := len(orders.Collection("orders", "c")); n != 0 {
				t.Fatalf("the refused insert reached the upstream")
			}
		})
	})
}
