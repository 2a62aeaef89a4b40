package sdam

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

func TestNewTopology(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want TopologyType
	}{
		{Config{Seeds: []string{"a:1"}}, TopologyUnknown},
		{Config{Seeds: []string{"a:1", "b:1"}}, TopologyUnknown},
		{Config{Seeds: []string{"a:1"}, DirectConnection: true}, Single},
		{Config{Seeds: []string{"a:1"}, DirectConnection: true, SetName: "rs"}, Single},
		{Config{Seeds: []string{"a:1"}, SetName: "rs"}, ReplicaSetNoPrimary},
		{Config{Seeds: []string{"a:1"}, LoadBalanced: true}, LoadBalanced},
	} {
		td := NewTopology(tc.cfg)
		if td.Type != tc.want || td.SetName != tc.cfg.SetName || td.CompatibilityError != nil {
			t.Errorf("%+v: %s %q %v", tc.cfg, td.Type, td.SetName, td.CompatibilityError)
		}
	}
	td := NewTopology(Config{Seeds: []string{"c:1", "a:1", "c:1", "b:1"}})
	var addrs []string
	for _, s := range td.Servers {
		addrs = append(addrs, s.Address)
		if s.Type != Unknown {
			t.Errorf("seed %s is %s", s.Address, s.Type)
		}
	}
	if !slices.Equal(addrs, []string{"a:1", "b:1", "c:1"}) {
		t.Errorf("servers %v", addrs)
	}
}

func primaryDesc(addr string, hosts ...string) ServerDescription {
	return ServerDescription{Address: addr, Type: RSPrimary, SetName: "rs", Hosts: hosts, MaxWireVersion: 21, HasRTT: true, AvgRTT: time.Millisecond}
}

func TestApplyLeavesInputAlone(t *testing.T) {
	cfg := Config{Seeds: []string{"a:1", "b:1"}, SetName: "rs"}
	td := NewTopology(cfg)
	before := slices.Clone(td.Servers)
	next := Apply(td, cfg, primaryDesc("b:1", "b:1", "c:1"))
	if !slices.EqualFunc(td.Servers, before, ServerDescription.Equal) || td.Type != ReplicaSetNoPrimary {
		t.Fatalf("input changed: %+v", td)
	}
	d := Diff(td, next)
	if !slices.Equal(d.Added, []string{"c:1"}) || !slices.Equal(d.Removed, []string{"a:1"}) || !slices.Equal(d.Changed, []string{"b:1"}) {
		t.Errorf("diff %+v", d)
	}
	// A reply from a server no longer in the topology is ignored.
	again := Apply(next, cfg, primaryDesc("a:1", "a:1"))
	if !again.Equal(next) {
		t.Errorf("reply from a removed server applied: %+v", again)
	}
}

func TestApplyUnknownDropsRTT(t *testing.T) {
	cfg := Config{Seeds: []string{"a:1"}, SetName: "rs"}
	td := Apply(NewTopology(cfg), cfg, primaryDesc("a:1", "a:1"))
	if s, _ := td.Server("a:1"); !s.HasRTT {
		t.Fatal("primary has no RTT")
	}
	u := UnknownServer("a:1", errors.New("x"), nil)
	u.HasRTT, u.AvgRTT = true, time.Second
	td = Apply(td, cfg, u)
	if s, _ := td.Server("a:1"); s.HasRTT || s.AvgRTT != 0 || td.Type != ReplicaSetNoPrimary {
		t.Errorf("unknown server keeps RTT: %+v (%s)", s, td.Type)
	}
}

func TestSingleSetNameMismatch(t *testing.T) {
	cfg := Config{Seeds: []string{"a:1"}, DirectConnection: true, SetName: "rs"}
	for _, sd := range []ServerDescription{
		{Address: "a:1", Type: Standalone, MaxWireVersion: 21},
		{Address: "a:1", Type: RSSecondary, SetName: "other", MaxWireVersion: 21},
	} {
		td := Apply(NewTopology(cfg), cfg, sd)
		s, _ := td.Server("a:1")
		var me *SetNameMismatchError
		if s.Type != Unknown || !errors.As(s.Error, &me) || me.Want != "rs" || me.Got != sd.SetName || td.Type != Single {
			t.Errorf("%s %q: got %s %v in %s", sd.Type, sd.SetName, s.Type, s.Error, td.Type)
		}
	}
}

func TestCompatibilityError(t *testing.T) {
	cfg := Config{Seeds: []string{"a:1"}, DirectConnection: true}
	for _, tc := range []struct {
		min, max int32
		want     string
	}{
		{MaxSupportedWireVersion + 1, MaxSupportedWireVersion + 5, "requires wire version 26, but this version of mongobouncer only supports up to 25"},
		{0, MinSupportedWireVersion - 1, "reports wire version 7, but this version of mongobouncer requires at least 8 (MongoDB 4.2)"},
		{0, MaxSupportedWireVersion + 10, ""},
		{MinSupportedWireVersion, MinSupportedWireVersion, ""},
	} {
		td := Apply(NewTopology(cfg), cfg, ServerDescription{Address: "a:1", Type: Standalone, MinWireVersion: tc.min, MaxWireVersion: tc.max})
		var ie *IncompatibleServerError
		switch {
		case tc.want == "" && td.CompatibilityError != nil:
			t.Errorf("%d..%d: %v", tc.min, tc.max, td.CompatibilityError)
		case tc.want != "" && (!errors.As(td.CompatibilityError, &ie) || !strings.Contains(ie.Error(), "Server at a:1 "+tc.want)):
			t.Errorf("%d..%d: %v, want %q", tc.min, tc.max, td.CompatibilityError, tc.want)
		}
	}
}

func TestStalePrimaryMessage(t *testing.T) {
	cfg := Config{Seeds: []string{"a:1", "b:1"}, SetName: "rs"}
	e1, e2 := bson.ObjectID{11: 1}, bson.ObjectID{11: 2}
	v1 := int64(1)
	a := primaryDesc("a:1", "a:1", "b:1")
	a.ElectionID, a.SetVersion = &e2, &v1
	b := primaryDesc("b:1", "a:1", "b:1")
	b.ElectionID, b.SetVersion = &e1, &v1
	td := Apply(NewTopology(cfg), cfg, a)
	td = Apply(td, cfg, b)
	s, _ := td.Server("b:1")
	var se *StalePrimaryError
	want := "primary marked stale due to electionId/setVersion mismatch, {electionId: 000000000000000000000001, setVersion: 1} is stale compared to {electionId: 000000000000000000000002, setVersion: 1}"
	if s.Type != Unknown || !errors.As(s.Error, &se) || s.Error.Error() != want {
		t.Errorf("stale primary: %s %v", s.Type, s.Error)
	}
}

func TestLogicalSessionTimeout(t *testing.T) {
	cfg := Config{Seeds: []string{"a:1", "b:1"}}
	ten, five := int64(10), int64(5)
	td := NewTopology(cfg)
	td = Apply(td, cfg, ServerDescription{Address: "a:1", Type: Mongos, MaxWireVersion: 21, LogicalSessionTimeoutMinutes: &ten})
	if td.LogicalSessionTimeoutMinutes == nil || *td.LogicalSessionTimeoutMinutes != 10 {
		t.Fatalf("one mongos: %v", td.LogicalSessionTimeoutMinutes)
	}
	td = Apply(td, cfg, ServerDescription{Address: "b:1", Type: Mongos, MaxWireVersion: 21, LogicalSessionTimeoutMinutes: &five})
	if td.LogicalSessionTimeoutMinutes == nil || *td.LogicalSessionTimeoutMinutes != 5 {
		t.Fatalf("two mongoses: %v", td.LogicalSessionTimeoutMinutes)
	}
	td = Apply(td, cfg, ServerDescription{Address: "a:1", Type: Mongos, MaxWireVersion: 21})
	if td.LogicalSessionTimeoutMinutes != nil {
		t.Fatalf("one without: %v", *td.LogicalSessionTimeoutMinutes)
	}
}

func TestCompareTopologyVersion(t *testing.T) {
	p1, p2 := bson.ObjectID{1}, bson.ObjectID{2}
	tv := func(p bson.ObjectID, c int64) *TopologyVersion { return &TopologyVersion{ProcessID: p, Counter: c} }
	for _, tc := range []struct {
		a, b *TopologyVersion
		want int
	}{
		{nil, nil, -1}, {tv(p1, 1), nil, -1}, {nil, tv(p1, 1), -1},
		{tv(p1, 1), tv(p2, 0), -1}, {tv(p1, 1), tv(p1, 2), -1}, {tv(p1, 2), tv(p1, 2), 0}, {tv(p1, 3), tv(p1, 2), 1},
	} {
		if got := CompareTopologyVersion(tc.a, tc.b); got != tc.want {
			t.Errorf("Compare(%v, %v) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestLoadBalancedKeepsItsServer(t *testing.T) {
	cfg := Config{Seeds: []string{"a:1"}, LoadBalanced: true}
	td := Apply(NewTopology(cfg), cfg, LoadBalancerServer("a:1"))
	for _, sd := range []ServerDescription{
		UnknownServer("a:1", errors.New("x"), nil),
		{Address: "a:1", Type: Mongos, MaxWireVersion: 21},
	} {
		if next := Apply(td, cfg, sd); !next.Equal(td) {
			t.Errorf("%s applied to a load balancer: %+v", sd.Type, next.Servers)
		}
	}
	if s, _ := td.Server("a:1"); s.Type != LoadBalancer || td.CompatibilityError != nil || td.LogicalSessionTimeoutMinutes != nil {
		t.Errorf("%+v", td)
	}
}

func TestStandaloneWithDuplicateSeed(t *testing.T) {
	cfg := Config{Seeds: []string{"a:1", "a:1"}}
	td := Apply(NewTopology(cfg), cfg, ServerDescription{Address: "a:1", Type: Standalone, MaxWireVersion: 21})
	if td.Type != Single || len(td.Servers) != 1 {
		t.Errorf("one seed given twice: %s with %d servers", td.Type, len(td.Servers))
	}
}

func TestLoadBalancerOnlyInLoadBalanced(t *testing.T) {
	for _, cfg := range []Config{
		{Seeds: []string{"a:1"}},
		{Seeds: []string{"a:1"}, DirectConnection: true},
		{Seeds: []string{"a:1"}, SetName: "rs"},
	} {
		td := NewTopology(cfg)
		if next := Apply(td, cfg, LoadBalancerServer("a:1")); !next.Equal(td) {
			t.Errorf("%+v: a load balancer applied to %s: %+v", cfg, td.Type, next)
		}
	}
}
