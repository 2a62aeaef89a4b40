package proxy

// The first hello waits for every route's first monitor check, bounded.

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/routing"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/topology"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// limitsRoute is a route named name over the single upstream at addr.
func limitsRoute(t testing.TB, name, addr string) *routing.Route {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	topo, err := topology.New("limits-"+name, topology.Options{
		Hosts:                  []string{addr},
		Pool:                   pool.DefaultOptions(),
		Dialer:                 upstream.NewDialer(upstream.Options{ConnectTimeout: 10 * time.Second, Logger: log}),
		MonitorDialer:          upstream.NewDialer(upstream.Options{ConnectTimeout: 10 * time.Second, Logger: log}),
		HeartbeatInterval:      500 * time.Millisecond,
		HeartbeatTimeout:       10 * time.Second,
		ServerSelectionTimeout: 5 * time.Second,
		Logger:                 log,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(topo.Close)
	return &routing.Route{Name: name, Mode: ModeStatement, Topology: topo}
}

// limitsProxy serves routes with the given HandshakeWait and returns a
// client connected to it. Nothing waits for the upstreams first: the
// client's hello is the first thing the proxy answers.
func limitsProxy(t *testing.T, handshakeWait time.Duration, routes ...*routing.Route) *affConn {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	s, err := New(Options{Routes: routes, HandshakeWait: handshakeWait, Logger: log})
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
	nc, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return &affConn{t: t, c: nc}
}

func helloLimits(t *testing.T, cl *affConn) (maxWire, maxBSON int32, took time.Duration) {
	t.Helper()
	start := time.Now()
	r := cl.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "$db", Value: "admin"}})
	took = time.Since(start)
	affOK(t, r)
	return r.Lookup("maxWireVersion").Int32(), r.Lookup("maxBsonObjectSize").Int32(), took
}

// slowHello makes up answer every hello after d.
func slowHello(up *fakemongo.Server, d time.Duration) {
	up.Handle("hello", func(req *fakemongo.Request) fakemongo.Reply {
		r := up.Builtin(req)
		r.Delay = d
		return r
	})
}

// A client's first hello, while one route's upstream has answered and
// another's has not yet, waits for the second and advertises the minimum
// of both, not the first one's (higher) maxWireVersion.
func TestFirstHelloWaitsForEveryRoute(t *testing.T) {
	fast := fakemongo.Start(t, fakemongo.Options{MaxWireVersion: 25})
	slow := fakemongo.Start(t, fakemongo.Options{MaxWireVersion: 21, MaxBSONObjectSize: 8 << 20})
	slowHello(slow, time.Second)
	cl := limitsProxy(t, 20*time.Second, limitsRoute(t, "*", fast.Addr()), limitsRoute(t, "orders", slow.Addr()))
	maxWire, maxBSON, took := helloLimits(t, cl)
	if maxWire != 21 || maxBSON != 8<<20 {
		t.Fatalf("first hello (after %v) advertised maxWireVersion %d, maxBsonObjectSize %d; want 21 and %d, the slower route's",
			took, maxWire, maxBSON, 8<<20)
	}
}

// A route whose upstream cannot be reached does not hold hellos: its
// failed check settles it.
func TestFirstHelloDoesNotWaitForAFailedRoute(t *testing.T) {
	fast := fakemongo.Start(t, fakemongo.Options{MaxWireVersion: 24})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := l.Addr().String()
	l.Close()
	cl := limitsProxy(t, 20*time.Second, limitsRoute(t, "*", fast.Addr()), limitsRoute(t, "orders", refused))
	maxWire, _, took := helloLimits(t, cl)
	if maxWire != 24 {
		t.Errorf("maxWireVersion %d, want 24 (the reachable route's)", maxWire)
	}
	if took > 10*time.Second {
		t.Errorf("hello took %v: it waited for the unreachable route", took)
	}
}

// An upstream that does not answer holds a hello for HandshakeWait at
// most; the reply then has the limits of those that answered.
func TestFirstHelloBoundedByHandshakeWait(t *testing.T) {
	fast := fakemongo.Start(t, fakemongo.Options{MaxWireVersion: 23})
	stuck := fakemongo.Start(t, fakemongo.Options{MaxWireVersion: 21})
	slowHello(stuck, time.Hour) // until the check's 10s timeout
	cl := limitsProxy(t, 300*time.Millisecond, limitsRoute(t, "*", fast.Addr()), limitsRoute(t, "orders", stuck.Addr()))
	maxWire, _, took := helloLimits(t, cl)
	if took < 300*time.Millisecond || took > 5*time.Second {
		t.Errorf("hello took %v, want HandshakeWait (300ms)", took)
	}
	if maxWire != 23 {
		t.Errorf("maxWireVersion %d, want 23 (the answering route's)", maxWire)
	}
}
