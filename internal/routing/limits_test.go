package routing

// The hello limits agreed over every route's servers, and the bounded
// wait for their first checks.

import (
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/hello"
	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/topology"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// upRoute is a route named name over the single upstream at addr.
func upRoute(t *testing.T, name, addr string) *Route {
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
	return &Route{Name: name, Mode: "statement", Topology: topo}
}

func table(t *testing.T, routes ...*Route) func() *Table {
	t.Helper()
	tb, err := NewTable(routes, 10, 10)
	if err != nil {
		t.Fatal(err)
	}
	return func() *Table { return tb }
}

// The smallest figure of every answering server wins, a server that failed
// its check settles without counting, and maxMessageSizeBytes is capped.
func TestLimitsAgreedOverRoutes(t *testing.T) {
	a := fakemongo.Start(t, fakemongo.Options{MaxWireVersion: 25, LogicalSessionTimeoutMinutes: 30})
	b := fakemongo.Start(t, fakemongo.Options{MaxWireVersion: 21, MaxBSONObjectSize: 8 << 20, LogicalSessionTimeoutMinutes: 10})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := l.Addr().String()
	l.Close()
	cur := table(t, upRoute(t, "*", a.Addr()), upRoute(t, "orders", b.Addr()), upRoute(t, "gone", refused))
	lim := WaitLimits(cur, 1<<20, 20*time.Second, nil)
	want := hello.Limits{MinWire: lim.MinWire, MaxWire: 21, MaxBSON: 8 << 20, MaxMsg: 1 << 20,
		MaxBatch: hello.DefaultLimits.MaxBatch, SessionTimeoutMin: 10}
	if lim != want {
		t.Fatalf("limits %+v, want %+v", lim, want)
	}
	if _, settled := cur().Limits(1 << 20); !settled {
		t.Fatal("not settled after WaitLimits returned early")
	}
}

// A server that has not answered keeps the limits unsettled; WaitLimits
// gives up after its wait, or at stop, with the defaults when none has
// answered.
func TestWaitLimitsBounded(t *testing.T) {
	stuck := fakemongo.Start(t, fakemongo.Options{MaxWireVersion: 21})
	stuck.Handle("hello", func(req *fakemongo.Request) fakemongo.Reply {
		r := stuck.Builtin(req)
		r.Delay = time.Hour // until the check's 10s timeout
		return r
	})
	cur := table(t, upRoute(t, "*", stuck.Addr()))
	if _, settled := cur().Limits(1 << 30); settled {
		t.Fatal("settled with a server unchecked")
	}
	start := time.Now()
	lim := WaitLimits(cur, 1<<30, 200*time.Millisecond, nil)
	if d := time.Since(start); d < 200*time.Millisecond || d > 3*time.Second {
		t.Fatalf("waited %v, want about 200ms", d)
	}
	if lim != hello.DefaultLimits {
		t.Fatalf("limits %+v, want the defaults", lim)
	}
	stop := make(chan struct{})
	close(stop)
	start = time.Now()
	WaitLimits(cur, 1<<30, time.Minute, stop)
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("stop did not end the wait: %v", d)
	}
}
