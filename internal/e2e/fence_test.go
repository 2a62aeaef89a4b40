package e2e

import (
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// The fence after a moreToCome request is bounded by
// upstream_command_timeout: an upstream that never answers it costs the
// connection (closed, not pooled), never a wait without end, and the
// client's next command runs on a fresh connection.
func TestFenceBoundedByUpstreamCommandTimeout(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		var stall atomic.Bool
		up := fakemongo.Start(t, fakemongo.Options{})
		up.Handle("ping", func(req *fakemongo.Request) fakemongo.Reply {
			if stall.Load() && req.DB == "admin" {
				return fakemongo.Reply{Delay: time.Minute}
			}
			return fakemongo.OK()
		})
		a, addr := bouncer(t, up.URI(), func(c *config.Config) {
			c.Global.MaxPoolSize = 1
			c.Global.UpstreamCommandTimeout = 300 * time.Millisecond
		})
		waitUsable(t, a, 1)
		c := dialRaw(t, addr)
		c.hello()
		ping := bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "test"}}
		if r := c.cmd(ping); okOf(r) != 1 {
			t.Fatalf("ping: %v", r)
		}
		stall.Store(true)
		c.send(wire.FlagMoreToCome, bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{bson.D{{Key: "x", Value: 1}}}}, {Key: "$db", Value: "test"}})
		start := time.Now()
		id := c.send(0, ping)
		rep, err := c.tryRecv(5 * time.Second)
		if err != nil {
			t.Fatalf("no reply after the unanswered fence: %v", err)
		}
		if rep.header.ResponseTo != id || okOf(rep.body) != 1 {
			t.Fatalf("reply to %d (want %d): %v", rep.header.ResponseTo, id, rep.body)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Fatalf("the next command waited %v: the fence is not bounded by upstream_command_timeout (300ms)", d)
		}
	})
}
