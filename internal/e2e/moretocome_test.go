package e2e

import (
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
