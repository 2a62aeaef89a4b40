// Members that join and leave a replica set: a member removed from the
// configuration loses its pool and monitor, and a seed list whose first
// seed is down still finds the set through the other.
package topology

import (
	"errors"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/sdam"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// A member a reconfiguration removes leaves the topology (the primary no
// longer lists it): its pool is closed, and from then on nothing reaches
// it: no check, no RTT probe, no pooled connection, whatever reads the
// topology serves.
func TestRemovedMemberPoolClosed(t *testing.T) {
	rs := fakemongo.StartReplicaSet(t, fakemongo.ReplicaSetOptions{})
	rec := &recorder{}
	o := rsOptions(rec, rs, 0)
	// A monitor left running would probe it every 100ms, and a pool left
	// open would keep a connection to it.
	o.HeartbeatInterval = 100 * time.Millisecond
	o.Pool.MinPoolSize = 1
	topo := newTopology(t, o)
	gone := rs.Member(2).Addr()
	within(t, "three members usable", func() bool {
		r := roles(topo)
		return r[rs.Member(0).Addr()] == KindRSPrimary && r[rs.Member(1).Addr()] == KindRSSecondary && r[gone] == KindRSSecondary
	})
	srv := topo.ServerByAddress(gone)
	c := checkOut(t, srv)
	if err := srv.Pool().CheckIn(c); err != nil {
		t.Fatal(err)
	}

	if _, err := rs.RemoveMember(2); err != nil {
		t.Fatal(err)
	}
	within(t, "the removed member gone from the topology", func() bool { return topo.ServerByAddress(gone) == nil })
	within(t, "its pool closed", func() bool { return len(rec.poolEvents(pool.PoolClosed, gone)) > 0 })
	if n := len(rec.poolEvents(pool.PoolClosed, gone)); n != 1 {
		t.Errorf("%d PoolClosed events for the removed member, want 1", n)
	}
	if n := len(rec.poolEvents(pool.PoolClosed, "")); n != 1 {
		t.Errorf("%d PoolClosed events in all, want 1: the other members' pools must stay open", n)
	}
	if st := srv.Pool().Stats().State; st != pool.StateClosed {
		t.Fatalf("the removed member's pool is %v, want closed", st)
	}
	var closed *pool.PoolClosedError
	if c, err := srv.Pool().CheckOut(ctxTimeout(t, time.Second)); !errors.As(err, &closed) {
		if c != nil {
			_ = srv.Pool().CheckIn(c)
		}
		t.Fatalf("checkout from the removed member's pool: %v, want a PoolClosedError", err)
	}
	if d := topo.Description(); d.Type != sdam.ReplicaSetWithPrimary || len(d.Servers) != 2 {
		t.Fatalf("topology %v with %d servers, want ReplicaSetWithPrimary with 2", d.Type, len(d.Servers))
	}

	// Its monitor was stopped before its pool closed, but a request that
	// monitor or the RTT monitor had sent may still be on the way: give
	// it two heartbeats to land, then count. A monitor still running
	// would send ten more below.
	time.Sleep(2 * o.HeartbeatInterval)
	m := rs.Member(2)
	m.ResetCounters()
	accepted := m.Server().Accepted()
	nearest := &sdam.ReadPref{Mode: sdam.Nearest}
	deadline := time.Now().Add(time.Second) // ten heartbeats
	for n := 0; time.Now().Before(deadline) && n < 1000; n++ {
		s, err := topo.SelectServer(ctxTimeout(t, 5*time.Second), Criteria{ReadPref: nearest})
		if err != nil {
			t.Fatal(err)
		}
		if s.Address() == gone {
			t.Fatal("a read selected the removed member")
		}
		if err := s.Pool().CheckIn(checkOut(t, s)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := m.RequestCounts(); len(got) != 0 {
		t.Errorf("the removed member received %v after its pool closed", got)
	}
	if got := m.Server().Accepted(); got != accepted {
		t.Errorf("the removed member accepted %d connections after its pool closed", got-accepted)
	}
	// Sanity: the loop did reach the others.
	if len(rs.Member(1).RequestCounts()) == 0 {
		t.Error("member 1 received nothing either: the loop proves nothing")
	}
}

// mongodb://dead,member1/?replicaSet=rs0 with the first seed down: the set
// is discovered from the live seed (a secondary), the primary is selected,
// and the dead seed, which the primary does not list, is removed as SDAM
// says (updateRSFromPrimary), its pool closed with it.
func TestReplicaSetDiscoveredFromTheLiveSeed(t *testing.T) {
	rs := fakemongo.StartReplicaSet(t, fakemongo.ReplicaSetOptions{})
	dead := deadAddr(t)
	rec := &recorder{}
	o := streamOptions(rec, dead, rs.Member(1).Addr())
	o.ReplicaSet = rs.Name()
	o.ServerSelectionTimeout = 10 * time.Second
	topo := newTopology(t, o)
	m0, m1, m2 := rs.Member(0).Addr(), rs.Member(1).Addr(), rs.Member(2).Addr()
	if s := mustSelect(t, topo); s.Address() != m0 {
		t.Fatalf("a write selected %s, want the primary %s", s.Address(), m0)
	}
	within(t, "the members known and the dead seed removed", func() bool {
		r := roles(topo)
		return len(r) == 3 && r[m0] == KindRSPrimary && r[m1] == KindRSSecondary && r[m2] == KindRSSecondary
	})
	if topo.ServerByAddress(dead) != nil {
		t.Fatal("the dead seed is still a server")
	}
	d := topo.Description()
	if d.Type != sdam.ReplicaSetWithPrimary || d.SetName != rs.Name() || len(d.Servers) != 3 {
		t.Fatalf("topology %v %q with %d servers", d.Type, d.SetName, len(d.Servers))
	}
	for _, sd := range d.Servers {
		if sd.Address == dead {
			t.Fatal("the description still lists the dead seed")
		}
	}
	within(t, "the dead seed's pool closed", func() bool { return len(rec.poolEvents(pool.PoolClosed, dead)) == 1 })
}
