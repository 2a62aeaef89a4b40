package proxy

// Cursor affinity forgets cursors that ended.

import (
	"context"
	"log/slog"
	"net"
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/routing"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/wait"
	"github.com/mongobouncer/mongobouncer/internal/topology"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// affConn is a minimal wire client for the tests of this package.
type affConn struct {
	t  testing.TB
	c  net.Conn
	id int32
}

func (a *affConn) cmd(body bson.D) bson.Raw {
	a.t.Helper()
	a.id++
	msg := wire.AppendMsg(nil, a.id, 0, 0, mustDoc(a.t, body))
	_ = a.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := a.c.Write(msg); err != nil {
		a.t.Fatalf("write: %v", err)
	}
	rep, err := wire.ReadMessage(a.c, nil, wire.DefaultMaxMessageSize)
	if err != nil {
		a.t.Fatalf("read: %v", err)
	}
	h, err := wire.ParseHeader(rep)
	if err != nil || h.ResponseTo != a.id || h.OpCode != wire.OpMsg {
		a.t.Fatalf("reply header %+v (%v), want OP_MSG to %d", h, err, a.id)
	}
	m, err := wire.ParseMsg(rep)
	if err != nil {
		a.t.Fatal(err)
	}
	return bson.Raw(append([]byte(nil), m.Body...))
}

func affOK(t testing.TB, r bson.Raw) {
	t.Helper()
	if v, err := r.LookupErr("ok"); err != nil || v.AsFloat64() != 1 {
		t.Fatalf("command failed: %v", r)
	}
}

func affCursorID(t testing.TB, r bson.Raw) int64 {
	t.Helper()
	affOK(t, r)
	id, ok := r.Lookup("cursor", "id").AsInt64OK()
	if !ok {
		t.Fatalf("no cursor id: %v", r)
	}
	return id
}

// affProxy runs a proxy Server whose "*" route spans two fake mongos in
// statement mode, and returns the route and a connected client that has
// done its hello.
func affProxy(t *testing.T, loop bool) (*routing.Route, *affConn, [2]*fakemongo.Server) {
	t.Helper()
	ups := [2]*fakemongo.Server{
		fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos, InMemory: true}),
		fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos, InMemory: true}),
	}
	log := slog.New(slog.DiscardHandler)
	po := pool.DefaultOptions()
	po.MaxPoolSize = 4
	topo, err := topology.New("affinity-test", topology.Options{
		Hosts: []string{ups[0].Addr(), ups[1].Addr()},
		Pool:  po,
		// As the app does: the loop polls the sockets of its routes' pooled
		// connections itself.
		Dialer:                 upstream.NewDialer(upstream.Options{ConnectTimeout: 2 * time.Second, Detach: loop, Logger: log}),
		MonitorDialer:          upstream.NewDialer(upstream.Options{ConnectTimeout: 2 * time.Second, Logger: log}),
		HeartbeatInterval:      500 * time.Millisecond,
		ServerSelectionTimeout: 5 * time.Second,
		LocalThreshold:         -1, // loopback RTTs jitter: keep both servers candidates
		Logger:                 log,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(topo.Close)
	route := &routing.Route{Name: "*", Mode: ModeStatement, Topology: topo}
	s, err := New(Options{Routes: []*routing.Route{route}, EventLoop: loop, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(ln, "") }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	wait.Until(t, "both mongos usable", 10*time.Second, 5*time.Millisecond, func() bool {
		for _, srv := range topo.Servers() {
			if srv.State() != topology.Usable {
				return false
			}
		}
		return true
	})
	if !route.Multi() {
		t.Fatal("a route over two mongos is not multi-server: affinity is off")
	}
	nc, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	cl := &affConn{t: t, c: nc}
	affOK(t, cl.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "$db", Value: "admin"}}))
	return route, cl, ups
}

// The cursor-id -> server map holds a cursor while it is open and forgets it
// when the cursor ends: exhausted by getMore (cursor id 0 in the reply) or
// killed by killCursors. Without that, the map would only shrink by TTL and
// eviction.
func TestCursorAffinityForgetsEndedCursors(t *testing.T) {
	for _, loop := range []bool{false, true} {
		name := "goroutines"
		if loop {
			name = "eventloop"
		}
		t.Run(name, func(t *testing.T) {
			route, cl, ups := affProxy(t, loop)
			// Statement mode spreads the inserts over both mongos, so finds
			// open cursors on each.
			for i := 0; len(ups[0].Collection("test", "c")) < 3 || len(ups[1].Collection("test", "c")) < 3; i++ {
				if i == 200 {
					t.Fatalf("load was not spread: %d / %d", len(ups[0].Collection("test", "c")), len(ups[1].Collection("test", "c")))
				}
				affOK(t, cl.cmd(bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{bson.D{{Key: "i", Value: i}}}}, {Key: "$db", Value: "test"}}))
			}
			if n := route.Cursors().Len(); n != 0 {
				t.Fatalf("%d cursors tracked before any find", n)
			}
			owner := func(id int64) *topology.Server {
				t.Helper()
				srv := route.CursorServer(id)
				if srv == nil {
					t.Fatalf("cursor %d is not in the affinity map while open (%d entries)", id, route.Cursors().Len())
				}
				for _, up := range ups {
					if slices.Contains(up.OpenCursors(), id) && srv.Address() != up.Addr() {
						t.Fatalf("cursor %d of %s is mapped to %s", id, up.Addr(), srv.Address())
					}
				}
				return srv
			}
			find := bson.D{{Key: "find", Value: "c"}, {Key: "batchSize", Value: 1}, {Key: "$db", Value: "test"}}

			// Exhausted by getMore: tracked until the reply with cursor id 0.
			for range 4 {
				id := affCursorID(t, cl.cmd(find))
				if id == 0 {
					t.Fatal("find with batchSize 1 returned no cursor")
				}
				for {
					owner(id)
					if n := route.Cursors().Len(); n != 1 {
						t.Fatalf("%d cursors tracked with one open", n)
					}
					next := affCursorID(t, cl.cmd(bson.D{{Key: "getMore", Value: id}, {Key: "collection", Value: "c"}, {Key: "batchSize", Value: 1}, {Key: "$db", Value: "test"}}))
					if next == 0 {
						break
					}
					if next != id {
						t.Fatalf("getMore changed the cursor id %d -> %d", id, next)
					}
				}
				if n := route.Cursors().Len(); n != 0 {
					t.Fatalf("%d cursors still tracked after getMore exhausted the only one", n)
				}
			}

			// Killed: open several, kill them one by one.
			var ids []int64
			for range 4 {
				id := affCursorID(t, cl.cmd(find))
				if id == 0 {
					t.Fatal("find with batchSize 1 returned no cursor")
				}
				owner(id)
				ids = append(ids, id)
			}
			if n := route.Cursors().Len(); n != len(ids) {
				t.Fatalf("%d cursors tracked, want %d", n, len(ids))
			}
			for i, id := range ids {
				r := cl.cmd(bson.D{{Key: "killCursors", Value: "c"}, {Key: "cursors", Value: bson.A{id}}, {Key: "$db", Value: "test"}})
				affOK(t, r)
				if killed, _ := r.Lookup("cursorsKilled").ArrayOK(); len(killed) <= 5 { // an empty BSON array is 5 bytes
					t.Fatalf("killCursors reached the wrong server: %v", r)
				}
				if n := route.Cursors().Len(); n != len(ids)-i-1 {
					t.Fatalf("%d cursors tracked after killing %d of %d", n, i+1, len(ids))
				}
				if route.CursorServer(id) != nil {
					t.Fatalf("killed cursor %d still tracked", id)
				}
			}
			if n := len(ups[0].OpenCursors()) + len(ups[1].OpenCursors()); n != 0 {
				t.Fatalf("%d cursors left open upstream", n)
			}
		})
	}
}
