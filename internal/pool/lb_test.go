package pool_test

import (
	"errors"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/pool"
)

// lbUpstream is a mock load-balanced upstream.
type lbUpstream struct {
	*mockUpstream
	sid bson.ObjectID
}

func (u lbUpstream) ServiceID() (bson.ObjectID, bool) { return u.sid, true }

var (
	svcA = bson.NewObjectID()
	svcB = bson.NewObjectID()
)

// lbConnector puts odd connection IDs on service A and even ones on service B.
func lbConnector() *mockConnector {
	return &mockConnector{wrap: func(u *mockUpstream) pool.Upstream {
		if u.id%2 == 1 {
			return lbUpstream{u, svcA}
		}
		return lbUpstream{u, svcB}
	}}
}

func TestLoadBalancedServiceGenerations(t *testing.T) {
	o := pool.DefaultOptions()
	o.LoadBalanced = true
	o.MaxPoolSize = 3
	p, rec := newTestPool(t, lbConnector(), o)
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	var cs []*pool.Conn
	for i := range 3 {
		c, err := p.CheckOut(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		want := svcA
		if i%2 == 1 {
			want = svcB
		}
		if sid, ok := c.ServiceID(); !ok || sid != want || c.Generation() != 0 {
			t.Fatalf("connection %d: service %v %v gen %d", c.ID(), sid, ok, c.Generation())
		}
		cs = append(cs, c)
	}
	a1, b2, a3 := cs[0], cs[1], cs[2]

	// A waiter is queued (pool full); clearing a service leaves it alone.
	got := make(chan *pool.Conn, 1)
	go func() {
		c, err := p.CheckOut(ctxT(t))
		if err != nil {
			t.Error(err)
		}
		got <- c
	}()
	waitUntil(t, func() bool { return p.Stats().Waiters == 1 }, "waiter queued")
	p.ClearService(svcA)
	cleared := onlyTypes(rec.snapshot(), pool.PoolCleared)
	if len(cleared) != 1 || !cleared[0].HasServiceID || cleared[0].ServiceID != svcA || cleared[0].Generation != 1 {
		t.Fatalf("PoolCleared %+v", cleared)
	}
	if s := p.Stats(); s.State != pool.StateReady || s.Waiters != 1 || s.Generation != 0 {
		t.Fatalf("ClearService paused the pool or touched the wait queue: %+v", s)
	}
	if rec.count(pool.ConnectionCheckOutFailed) != 0 {
		t.Fatal("ClearService failed a waiter")
	}
	// The non-LB clear does not apply to a load-balanced pool.
	p.Clear(false)
	if s := p.Stats(); s.State != pool.StateReady || rec.count(pool.PoolCleared) != 1 {
		t.Fatalf("Clear acted on a load-balanced pool: %+v", s)
	}

	// B's connection is not stale: it goes to the waiter as it is.
	if err := p.CheckIn(b2); err != nil {
		t.Fatal(err)
	}
	w := <-got
	if w.ID() != b2.ID() {
		t.Fatalf("waiter got %d, want B's connection %d", w.ID(), b2.ID())
	}
	// A's connections are stale: closed at check-in.
	for _, c := range []*pool.Conn{a1, a3} {
		if err := p.CheckIn(c); err != nil {
			t.Fatal(err)
		}
	}
	closed := onlyTypes(rec.snapshot(), pool.ConnectionClosed)
	if len(closed) != 2 || closed[0].Reason != pool.ReasonStale || closed[1].Reason != pool.ReasonStale {
		t.Fatalf("closed %v", types(closed))
	}
	// A's count dropped to zero, so its entry (and generation) is gone: a new A
	// connection starts again at generation 0.
	c4, err := p.CheckOut(ctxT(t)) // id 4: B, generation 0 (B was never cleared)
	if err != nil {
		t.Fatal(err)
	}
	c5, err := p.CheckOut(ctxT(t)) // id 5: A
	if err != nil {
		t.Fatal(err)
	}
	if sid, _ := c5.ServiceID(); sid != svcA || c5.Generation() != 0 {
		t.Fatalf("new A connection %d: gen %d", c5.ID(), c5.Generation())
	}
	// While B has connections, its entry lives on: clearing it makes both stale.
	p.ClearService(svcB)
	for _, c := range []*pool.Conn{w, c4, c5} {
		if err := p.CheckIn(c); err != nil {
			t.Fatal(err)
		}
	}
	if s := p.Stats(); s.Total != 1 || s.Available != 1 {
		t.Fatalf("after clearing B only A's connection must remain: %+v", s.Counts)
	}
}

func TestLoadBalancedRequiresServiceID(t *testing.T) {
	mc := &mockConnector{}
	o := pool.DefaultOptions()
	o.LoadBalanced = true
	p, _ := newTestPool(t, mc, o)
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	_, err := p.CheckOut(ctxT(t))
	if !errors.Is(err, pool.ErrNoServiceID) || !errors.As(err, new(*pool.ConnectionError)) {
		t.Fatalf("checkout: %v", err)
	}
	waitUntil(t, func() bool { return mc.upstream(1).closed.Load() == 1 }, "upstream without serviceId closed")
	p.ClearService(svcA) // no entry: still emits, no panic
}
