package e2e

// Overload (issue 30 item 4): an upstream's 462 / SystemOverloadedError
// reply reaches the client exactly as the server sent it, and an adaptive
// pool (max_pool_size = "auto") counts it as a drop and lowers its limit.

import (
	"bytes"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

func TestOverloadPassesThroughAndLowersTheLimit(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		a, addr := bouncer(t, up.URI(), func(c *config.Config) {
			c.Global.MaxPoolSize = config.PoolSizeAuto
			c.Global.MinPoolSize = 1
		})
		find := bson.D{{Key: "find", Value: "orders"}, {Key: "$db", Value: "shop"}}

		// What the server itself sends, read directly.
		direct := dialRaw(t, up.Addr())
		direct.hello()
		up.SetFailPoint(fakemongo.OverloadFailPoint(1, "find"))
		want := direct.cmd(find)
		if codeOf(want) != fakemongo.CodeOverloaded {
			t.Fatalf("the fake did not refuse: %v", want)
		}

		r := dialRaw(t, addr)
		r.hello()
		if rep := r.cmd(find); okOf(rep) != 1 {
			t.Fatalf("find before the overload: %v", rep)
		}
		pl := a.Topologies()[0].Servers()[0].Pool()
		if pl.Stats().Limiter == nil {
			t.Fatal(`max_pool_size = "auto" gave the pool no limiter`)
		}
		// The limiter's first probe holds the limit at min_pool_size
		// until operations have run there; what a drop does is seen on
		// the limit after it.
		for i := 0; pl.Stats().Limiter.Probing; i++ {
			if i == 100 {
				t.Fatalf("the limiter still probes after %d finds: %+v", i, pl.Stats().Limiter)
			}
			if rep := r.cmd(find); okOf(rep) != 1 {
				t.Fatalf("find during the probe: %v", rep)
			}
		}
		before := pl.Stats().Limiter

		const refusals = 3
		up.SetFailPoint(fakemongo.OverloadFailPoint(refusals, "find"))
		for range refusals {
			got := r.cmd(find)
			if !bytes.Equal(got, want) {
				t.Fatalf("client got\n%v\nthe server sent\n%v", got, want)
			}
		}
		if rep := r.cmd(find); okOf(rep) != 1 {
			t.Fatalf("find after the overload: %v", rep)
		}

		var after *pool.LimiterStats
		deadline := time.Now().Add(5 * time.Second)
		for {
			// The check-in that reports the drop may trail the reply.
			after = pl.Stats().Limiter
			if after.Drops >= refusals || time.Now().After(deadline) {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		if after.Drops != refusals {
			t.Fatalf("limiter drops = %d, want %d", after.Drops, refusals)
		}
		if after.Limit >= before.Limit {
			t.Fatalf("limit %d -> %d after %d overload refusals, want lower", before.Limit, after.Limit, refusals)
		}
		if st := pl.Stats(); st.Total > before.Limit {
			t.Fatalf("pool holds %d connections, more than the limit %d ever was", st.Total, before.Limit)
		}
	})
}
