// Regression test from the review of the replica-set work: cursor affinity
// across a server that leaves the topology and comes back.
package proxy

import (
	"errors"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/testutil/wait"
	"github.com/mongobouncer/mongobouncer/internal/topology"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// A server that leaves the topology and comes back (an SRV record dropped
// for a poll, a member missing from one primary's host list) is a new
// *topology.Server with a new pool; the cursors it still holds must be
// followed to it, not to the closed pool of the Server that left.
func TestCursorAffinityFollowsServerReadded(t *testing.T) {
	for _, loop := range []bool{false, true} {
		name := "goroutines"
		if loop {
			name = "eventloop"
		}
		t.Run(name, func(t *testing.T) {
			route, cl, ups := affProxy(t, loop)
			topo := route.Topology
			// Open a cursor on ups[0]: pin its documents there.
			var id int64
			for i := 0; i < 200 && id == 0; i++ {
				affOK(t, cl.cmd(bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{bson.D{{Key: "i", Value: 1}}, bson.D{{Key: "i", Value: 2}}}}, {Key: "$db", Value: "test"}}))
				// Selection rotates: two finds per insert reach both servers.
				for range 2 {
					cid := affCursorID(t, cl.cmd(bson.D{{Key: "find", Value: "c"}, {Key: "batchSize", Value: 1}, {Key: "$db", Value: "test"}}))
					if srv := route.CursorServer(cid); srv != nil && srv.Address() == ups[0].Addr() && id == 0 {
						id = cid
					}
				}
			}
			if id == 0 {
				t.Fatal("no cursor opened on the first server")
			}
			old := topo.ServerByAddress(ups[0].Addr())
			if !topo.SetHosts([]string{ups[1].Addr()}) || topo.ServerByAddress(ups[0].Addr()) != nil {
				t.Fatal("SetHosts did not remove the first server")
			}
			if !topo.SetHosts([]string{ups[0].Addr(), ups[1].Addr()}) {
				t.Fatal("SetHosts did not add the first server back")
			}
			wait.Until(t, "first server usable again", 10*time.Second, 5*time.Millisecond, func() bool {
				s := topo.ServerByAddress(ups[0].Addr())
				return s != nil && s != old && s.State() == topology.Usable
			})
			r := cl.cmd(bson.D{{Key: "getMore", Value: id}, {Key: "collection", Value: "c"}, {Key: "batchSize", Value: 1}, {Key: "$db", Value: "test"}})
			if v, err := r.LookupErr("ok"); err != nil || v.AsFloat64() != 1 {
				t.Fatalf("getMore on a cursor alive on %s failed after the server was re-added: %v", ups[0].Addr(), r)
			}
		})
	}
}

// The proxy hands the topology a state-change reply's topologyVersion, so
// that the topology can ignore a stale one.
func TestStateChangeErrorCarriesTopologyVersion(t *testing.T) {
	pid := bson.NewObjectID()
	body := mustDoc(t, bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: int32(10107)}, {Key: "errmsg", Value: "not primary"},
		{Key: "topologyVersion", Value: bson.D{{Key: "processId", Value: pid}, {Key: "counter", Value: int64(7)}}}})
	var ce *upstream.CommandError
	if err := stateChangeError(10107, body); !errors.As(err, &ce) || ce.Code != 10107 || ce.TopologyVersion == nil ||
		ce.TopologyVersion.ProcessID != pid || ce.TopologyVersion.Counter != 7 {
		t.Fatalf("stateChangeError = %#v", err)
	}
}
