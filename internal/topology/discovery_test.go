package topology

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/sdam"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// rsOptions are options for a topology seeded with one member of rs.
func rsOptions(rec *recorder, rs *fakemongo.ReplicaSet, seed int) Options {
	o := streamOptions(rec, rs.Member(seed).Addr())
	o.ReplicaSet = rs.Name()
	o.ServerSelectionTimeout = 10 * time.Second
	return o
}

// roles gives each server's kind as selection sees it: Unknown unless the
// server is usable and the published snapshot agrees with its own
// description. A server's description is stored before the snapshot that
// carries it, so waiting on the server alone races selection.
func roles(topo *Topology) map[string]Kind {
	published := map[string]Kind{}
	if sel := topo.sel.Load(); sel.td != nil {
		for _, sd := range sel.td.Servers {
			published[sd.Address] = sd.Type
		}
	}
	m := map[string]Kind{}
	for _, s := range topo.Servers() {
		if k := s.Kind(); s.State() == Usable && published[s.Address()] == k {
			m[s.Address()] = k
		} else {
			m[s.Address()] = KindUnknown
		}
	}
	return m
}

// One seed is enough: the other members are discovered from its hello, each
// with its own pool and monitor, and writes select the primary.
func TestReplicaSetDiscovery(t *testing.T) {
	rs := fakemongo.StartReplicaSet(t, fakemongo.ReplicaSetOptions{})
	topo := newTopology(t, rsOptions(&recorder{}, rs, 1))
	within(t, "three members known", func() bool {
		r := roles(topo)
		return len(r) == 3 && r[rs.Member(0).Addr()] == KindRSPrimary &&
			r[rs.Member(1).Addr()] == KindRSSecondary && r[rs.Member(2).Addr()] == KindRSSecondary
	})
	if d := topo.Description(); d.Type != sdam.ReplicaSetWithPrimary || d.SetName != rs.Name() {
		t.Fatalf("topology %v %q", d.Type, d.SetName)
	}
	if s := mustSelect(t, topo); s.Address() != rs.Member(0).Addr() {
		t.Errorf("a write selected %s, want the primary %s", s.Address(), rs.Member(0).Addr())
	}
	if !topo.Multi() {
		t.Error("a replica set is not Multi")
	}
}

// Reads follow their read preference; writes and primary reads never leave
// the primary.
func TestReplicaSetReadPreference(t *testing.T) {
	rs := fakemongo.StartReplicaSet(t, fakemongo.ReplicaSetOptions{Tags: map[int]map[string]string{
		1: {"dc": "east"}, 2: {"dc": "west"},
	}})
	topo := newTopology(t, rsOptions(&recorder{}, rs, 0))
	within(t, "three members known", func() bool { return len(topo.sel.Load().td.Servers) == 3 && topo.TrySelectServer(Criteria{}) != nil })
	within(t, "secondaries usable", func() bool {
		r := roles(topo)
		return r[rs.Member(1).Addr()] == KindRSSecondary && r[rs.Member(2).Addr()] == KindRSSecondary
	})
	count := func(rp sdam.ReadPref) map[string]int {
		got := map[string]int{}
		for range 200 {
			s, err := topo.SelectServer(ctxTimeout(t, 5*time.Second), Criteria{ReadPref: &rp})
			if err != nil {
				t.Fatalf("%v: %v", rp, err)
			}
			got[s.Address()]++
		}
		return got
	}
	p, s1, s2 := rs.Member(0).Addr(), rs.Member(1).Addr(), rs.Member(2).Addr()
	for _, c := range []struct {
		rp   sdam.ReadPref
		want []string
	}{
		{sdam.ReadPref{Mode: sdam.Primary}, []string{p}},
		{sdam.ReadPref{Mode: sdam.PrimaryPreferred}, []string{p}},
		{sdam.ReadPref{Mode: sdam.Secondary}, []string{s1, s2}},
		{sdam.ReadPref{Mode: sdam.SecondaryPreferred}, []string{s1, s2}},
		{sdam.ReadPref{Mode: sdam.Nearest}, []string{p, s1, s2}},
		{sdam.ReadPref{Mode: sdam.Secondary, TagSets: []sdam.TagSet{{"dc": "west"}}}, []string{s2}},
		{sdam.ReadPref{Mode: sdam.SecondaryPreferred, TagSets: []sdam.TagSet{{"dc": "north"}}}, []string{p}},
	} {
		got := count(c.rp)
		var addrs []string
		for a := range got {
			addrs = append(addrs, a)
		}
		slices.Sort(addrs)
		want := slices.Clone(c.want)
		slices.Sort(want)
		if !slices.Equal(addrs, want) {
			t.Errorf("%v: served by %v, want %v", c.rp, got, want)
		}
	}
	if s, err := topo.SelectServer(ctxTimeout(t, 5*time.Second), Criteria{}); err != nil || s.Address() != p {
		t.Errorf("write: %v, %v", s, err)
	}
}

// After a stepdown, selection for a write waits for the election and gets
// the new primary; no write selection fails.
func TestReplicaSetFailoverSelection(t *testing.T) {
	rs := fakemongo.StartReplicaSet(t, fakemongo.ReplicaSetOptions{ElectionDelay: 300 * time.Millisecond})
	topo := newTopology(t, rsOptions(&recorder{}, rs, 0))
	old := mustSelect(t, topo)
	within(t, "three members", func() bool { return len(topo.Servers()) == 3 })
	done := make(chan struct{})
	type pick struct {
		addr string
		err  error
	}
	picks := make(chan pick, 1000)
	go func() {
		defer close(done)
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			s, err := topo.SelectServer(ctx, Criteria{})
			cancel()
			p := pick{err: err}
			if s != nil {
				p.addr = s.Address()
			}
			select {
			case picks <- p:
			default:
			}
			if err == nil && s != old {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	start := time.Now()
	idx, err := rs.Failover()
	if err != nil {
		t.Fatal(err)
	}
	<-done
	close(picks)
	var last pick
	for p := range picks {
		if p.err != nil {
			t.Errorf("selection failed during the failover: %v", p.err)
		}
		last = p
	}
	if last.addr != rs.Member(idx).Addr() {
		t.Errorf("last pick %s, want the new primary %s", last.addr, rs.Member(idx).Addr())
	}
	t.Logf("new primary selected %v after the stepdown (election delay 300ms)", time.Since(start))
}

// A member that dies is Unknown and not selected; revived, it is back.
func TestReplicaSetMemberDiesAndReturns(t *testing.T) {
	rs := fakemongo.StartReplicaSet(t, fakemongo.ReplicaSetOptions{})
	topo := newTopology(t, rsOptions(&recorder{}, rs, 0))
	s1, s2 := rs.Member(1).Addr(), rs.Member(2).Addr()
	// Both secondaries must be usable first: the reads below must find
	// member 1 whatever the order the monitors reported in.
	within(t, "both secondaries usable", func() bool {
		r := roles(topo)
		return r[s1] == KindRSSecondary && r[s2] == KindRSSecondary
	})
	if err := rs.Kill(2); err != nil {
		t.Fatal(err)
	}
	within(t, "member 2 unknown", func() bool { return roles(topo)[s2] == KindUnknown })
	rp := sdam.ReadPref{Mode: sdam.Secondary}
	for range 50 {
		if s := topo.TrySelectServer(Criteria{ReadPref: &rp}); s == nil || s.Address() == s2 {
			t.Fatalf("secondary read selected %v with member 2 down", s)
		}
	}
	if err := rs.Revive(2); err != nil {
		t.Fatal(err)
	}
	topo.Servers()[0].RequestCheck()
	for _, s := range topo.Servers() {
		s.RequestCheck()
	}
	eventually(t, "member 2 secondary again", func() bool { return roles(topo)[s2] == KindRSSecondary })
}
