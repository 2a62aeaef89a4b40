// Regression tests from the review of the replica-set work: selection
// waiters woken by every change a read preference depends on, the
// stale-topologyVersion rule on the application error path, a nil
// connection behind a load balancer, and log volume (repeated check
// failures, state-change errors, members that flap).
package topology

import (
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/sdam"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/logbuf"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// craftedReplicaSet returns a topology of two members at dead addresses
// whose monitors have run their first (failed) check and will not check
// again during the test, so the test applies the descriptions itself.
func craftedReplicaSet(t *testing.T) (*Topology, *Server, *Server) {
	t.Helper()
	a, b := deadAddr(t), deadAddr(t)
	o := testOptions(&recorder{}, a, b)
	o.ReplicaSet = "rs0"
	o.MonitoringMode = MonitoringPoll
	o.HeartbeatInterval = time.Minute
	o.MinHeartbeatInterval = time.Minute
	topo := newTopology(t, o)
	eventually(t, "first checks", func() bool {
		for _, s := range topo.Servers() {
			if !s.Checked() {
				return false
			}
		}
		return len(topo.Servers()) == 2
	})
	sa, sb := topo.ServerByAddress(a), topo.ServerByAddress(b)
	hosts := []string{a, b}
	topo.update(sa, sdam.ServerDescription{Address: a, Type: sdam.RSPrimary, SetName: "rs0", Hosts: hosts, Me: a,
		MinWireVersion: 8, MaxWireVersion: 25, LastUpdateTime: time.Now(), HasRTT: true, AvgRTT: time.Millisecond}, nil, false, false)
	return topo, sa, sb
}

func secondaryDesc(addr string, tags map[string]string, hosts []string) sdam.ServerDescription {
	return sdam.ServerDescription{Address: addr, Type: sdam.RSSecondary, SetName: "rs0", Hosts: hosts, Me: addr,
		MinWireVersion: 8, MaxWireVersion: 25, LastUpdateTime: time.Now(), HasRTT: true, AvgRTT: time.Millisecond,
		Tags: tags}
}

// selectWokenBy starts a selection for rp, lets it wait, makes change and
// checks that the selection then picks want well before its 4s timeout:
// change must wake it.
func selectWokenBy(t *testing.T, topo *Topology, rp *sdam.ReadPref, want *Server, what string, change func()) {
	t.Helper()
	type res struct {
		s   *Server
		err error
		d   time.Duration
	}
	done := make(chan res, 1)
	start := time.Now()
	go func() {
		s, err := topo.SelectServer(ctxTimeout(t, 4*time.Second), Criteria{ReadPref: rp})
		done <- res{s, err, time.Since(start)}
	}()
	time.Sleep(100 * time.Millisecond)
	change()
	r := <-done
	if r.err != nil || r.s != want {
		t.Fatalf("select: %v, %v after %v", r.s, r.err, r.d)
	}
	if r.d > 2*time.Second {
		t.Fatalf("selected only after %v: the waiter was not woken by %s", r.d, what)
	}
}

// A read waiting for a secondary with tag dc=east must be served once a
// secondary reports that tag, not at the end of server_selection_timeout:
// the member's type does not change, only its tags.
func TestSelectionWakesOnTagChange(t *testing.T) {
	topo, sa, sb := craftedReplicaSet(t)
	hosts := []string{sa.Address(), sb.Address()}
	topo.update(sb, secondaryDesc(sb.Address(), nil, hosts), nil, false, false)

	rp := &sdam.ReadPref{Mode: sdam.Secondary, TagSets: []sdam.TagSet{{"dc": "east"}}}
	selectWokenBy(t, topo, rp, sb, "the tag change", func() {
		topo.update(sb, secondaryDesc(sb.Address(), map[string]string{"dc": "east"}, hosts), nil, false, false)
	})
}

// The same for max staleness: a secondary that catches up (its
// lastWriteDate moves, its type does not) must become selectable for a
// waiting read with maxStalenessSeconds.
func TestSelectionWakesWhenSecondaryCatchesUp(t *testing.T) {
	topo, sa, sb := craftedReplicaSet(t)
	hosts := []string{sa.Address(), sb.Address()}
	now := time.Now()
	pd := sdam.ServerDescription{Address: sa.Address(), Type: sdam.RSPrimary, SetName: "rs0", Hosts: hosts, Me: sa.Address(),
		MinWireVersion: 8, MaxWireVersion: 25, LastUpdateTime: now, LastWriteDate: now, HasRTT: true, AvgRTT: time.Millisecond}
	topo.update(sa, pd, nil, false, false)
	stale := secondaryDesc(sb.Address(), nil, hosts)
	stale.LastWriteDate = now.Add(-10 * time.Minute)
	topo.update(sb, stale, nil, false, false)

	rp := &sdam.ReadPref{Mode: sdam.Secondary, MaxStaleness: 120 * time.Second}
	selectWokenBy(t, topo, rp, sb, "the secondary catching up", func() {
		fresh := secondaryDesc(sb.Address(), nil, hosts)
		fresh.LastWriteDate = now
		topo.update(sb, fresh, nil, false, false)
	})
}

// SDAM: a state-change error whose topologyVersion is not newer than the
// server's is stale and ignored; a newer one marks the server Unknown.
// This is the proxy's path (exchange.onReply passes the reply's
// topologyVersion in the *upstream.CommandError).
func TestHandleErrorStaleTopologyVersion(t *testing.T) {
	fake := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos, TopologyVersion: true})
	o := testOptions(&recorder{}, fake.Addr())
	o.MonitoringMode = MonitoringPoll
	o.HeartbeatInterval = time.Minute
	o.MinHeartbeatInterval = time.Minute
	topo := newTopology(t, o)
	s := mustSelect(t, topo)
	tv := s.Description().SDAM.TopologyVersion
	if tv == nil {
		t.Fatal("no topologyVersion in the server's description")
	}
	c := checkOut(t, s)
	defer func() { _ = s.Pool().CheckIn(c) }()
	stale := &upstream.CommandError{Code: 10107, CodeName: "NotWritablePrimary",
		TopologyVersion: &upstream.TopologyVersion{ProcessID: tv.ProcessID, Counter: tv.Counter}}
	s.HandleError(stale, c)
	if st := s.State(); st != Usable {
		t.Fatalf("a state-change error with the server's own topologyVersion made it %v", st)
	}
	newer := &upstream.CommandError{Code: 10107, CodeName: "NotWritablePrimary",
		TopologyVersion: &upstream.TopologyVersion{ProcessID: tv.ProcessID, Counter: tv.Counter + 1}}
	s.HandleError(newer, c)
	if st := s.State(); st != Unknown {
		t.Fatalf("a newer topologyVersion left the server %v", st)
	}
	// Again with the same (now recorded) version: stale, and nothing is
	// logged or checked again.
	s.HandleError(newer, c)
}

// A server that accepts connections and never answers fails every check
// with a timeout whose text names the monitoring connection's local port,
// new at every dial. The failure must be logged once (at Warn) while the
// server stays down, not once per heartbeat.
func TestHungServerCheckLoggedOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	acceptDone := make(chan struct{})
	go func() {
		defer close(acceptDone)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-acceptDone
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
	})
	var buf logbuf.Buffer
	rec := &recorder{}
	o := testOptions(rec, ln.Addr().String())
	o.MonitoringMode = MonitoringPoll
	o.HeartbeatInterval = 50 * time.Millisecond
	o.MinHeartbeatInterval = 10 * time.Millisecond
	o.HeartbeatTimeout = 50 * time.Millisecond
	o.Logger = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	o.MonitorDialer = upstream.NewDialer(upstream.Options{AppName: monitorApp, ConnectTimeout: 50 * time.Millisecond, Logger: testLogger()})
	newTopology(t, o)
	eventually(t, "six failed checks", func() bool { return len(rec.topoEvents(HeartbeatFailed, "")) >= 6 })
	if n := strings.Count(buf.String(), "server check failed"); n > 1 {
		t.Fatalf("%d 'server check failed' lines for one server that stayed down:\n%s", n, buf.String())
	}
}

// A member of another replica set that the primary lists is removed, and
// added back by the primary's next hello, as SDAM says. The bad input must
// still be logged once, not at every heartbeat of the primary.
func TestMisconfiguredMemberLoggedOnce(t *testing.T) {
	bad := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.ReplicaSetMember, SetName: "rs1"})
	pAddr := deadAddr(t)
	primary, err := fakemongo.Listen(pAddr, fakemongo.Options{Kind: fakemongo.ReplicaSetMember, SetName: "rs0",
		Hosts: []string{pAddr, bad.Addr()}, Primary: pAddr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(primary.Close)
	var buf logbuf.Buffer
	rec := &recorder{}
	o := testOptions(rec, pAddr)
	o.ReplicaSet = "rs0"
	o.Logger = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	topo := newTopology(t, o)
	mustSelect(t, topo)
	eventually(t, "ten checks of the primary", func() bool { return len(rec.topoEvents(HeartbeatSucceeded, pAddr)) >= 10 })
	log := buf.String()
	if n := strings.Count(log, "server removed from the topology"); n != 1 {
		t.Fatalf("%d 'server removed' lines for one misconfigured member:\n%s", n, log)
	}
	if n := strings.Count(log, "server discovered") + strings.Count(log, "topology changed"); n > 3 {
		t.Fatalf("%d 'server discovered' and 'topology changed' lines for one primary and one misconfigured member:\n%s", n, log)
	}
}

// HandleError documents that c may be nil. Behind a load balancer a
// shutdown error (91) says to clear the pool; without a connection there
// is no serviceId to clear, and nothing may panic.
func TestLoadBalancedShutdownErrorWithoutConn(t *testing.T) {
	fake := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos, LoadBalanced: true})
	o := testOptions(&recorder{}, fake.Addr())
	o.Pool.LoadBalanced = true
	o.Dialer = upstream.NewDialer(upstream.Options{AppName: poolApp, LoadBalanced: true, Logger: testLogger()})
	o.MonitorDialer = upstream.NewDialer(upstream.Options{AppName: monitorApp, LoadBalanced: true, Logger: testLogger()})
	topo := newTopology(t, o)
	s := mustSelect(t, topo)
	s.HandleError(&upstream.CommandError{Code: 91, CodeName: "ShutdownInProgress"}, nil)
	if s.State() != Usable {
		t.Fatal("a load-balanced server was marked Unknown")
	}
}

// A server without topologyVersion (FerretDB, MongoDB 4.2) answers every
// request in flight at a stepdown with NotWritablePrimary; none of those
// errors is stale, but only the first one changes the server: one log line
// at Info, not one per request.
func TestStateChangeErrorsLoggedOncePerChange(t *testing.T) {
	fake := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos})
	var buf logbuf.Buffer
	o := testOptions(&recorder{}, fake.Addr())
	o.MonitoringMode = MonitoringPoll
	o.HeartbeatInterval = time.Minute
	o.MinHeartbeatInterval = time.Minute
	o.Logger = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	topo := newTopology(t, o)
	s := mustSelect(t, topo)
	c := checkOut(t, s)
	defer func() { _ = s.Pool().CheckIn(c) }()
	for range 5 {
		s.HandleError(&upstream.CommandError{Code: 10107, CodeName: "NotWritablePrimary"}, c)
	}
	if s.State() != Unknown {
		t.Fatal("NotWritablePrimary left the server usable")
	}
	if n := strings.Count(buf.String(), "marked server Unknown after an operation error"); n != 1 {
		t.Fatalf("%d lines for one change:\n%s", n, buf.String())
	}
}

// directConnection=true to a secondary of a replica set: one server, a
// Single topology, nothing discovered from its host list, and the server is
// selectable for writes (SDAM: a Single topology's server is used as is).
func TestDirectConnectionToMemberDiscoversNothing(t *testing.T) {
	rs := fakemongo.StartReplicaSet(t, fakemongo.ReplicaSetOptions{})
	o := testOptions(&recorder{}, rs.Member(1).Addr())
	o.DirectConnection = true
	topo := newTopology(t, o)
	s := mustSelect(t, topo)
	if s.Address() != rs.Member(1).Addr() || s.Kind() != KindRSSecondary {
		t.Fatalf("selected %s (%v)", s.Address(), s.Kind())
	}
	time.Sleep(300 * time.Millisecond) // three heartbeats
	if d := topo.Description(); d.Type != sdam.Single || len(d.Servers) != 1 || len(topo.Servers()) != 1 {
		t.Fatalf("topology %v with %d servers (%d Servers)", d.Type, len(d.Servers), len(topo.Servers()))
	}
}
