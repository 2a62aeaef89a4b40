// Unit tests of selection beyond the official suites: errors, writes,
// deprioritized servers, staleness with missing dates, the latency window
// without RTTs, and PickInWindow's edge cases.

package sdam_test

import (
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/sdam"
)

func selAddrList(servers []sdam.ServerDescription) []string {
	var out []string
	for _, s := range servers {
		out = append(out, s.Address)
	}
	slices.Sort(out)
	return out
}

func selRS(servers ...sdam.ServerDescription) *sdam.TopologyDescription {
	td := &sdam.TopologyDescription{Type: sdam.ReplicaSetNoPrimary, Servers: servers}
	for _, s := range servers {
		if s.Type == sdam.RSPrimary {
			td.Type = sdam.ReplicaSetWithPrimary
		}
	}
	return td
}

func TestSuitableServersErrors(t *testing.T) {
	now := time.Unix(1000, 0)
	rs := selRS(sdam.ServerDescription{Address: "a:1", Type: sdam.RSPrimary}, sdam.ServerDescription{Address: "b:1", Type: sdam.RSSecondary})

	if got, err := sdam.SuitableServers(nil, false, sdam.ReadPref{}, time.Second, now); got != nil || err != nil {
		t.Errorf("nil topology: %v, %v", got, err)
	}

	incompatible := errors.New("server b:1 requires wire version 99")
	bad := *rs
	bad.CompatibilityError = incompatible
	if _, err := sdam.SuitableServers(&bad, true, sdam.ReadPref{}, time.Second, now); !errors.Is(err, incompatible) {
		t.Errorf("incompatible topology: error %v", err)
	}

	primaryWithTags := sdam.ReadPref{TagSets: []sdam.TagSet{{"dc": "ny"}}}
	if _, err := sdam.SuitableServers(rs, false, primaryWithTags, time.Second, now); !errors.Is(err, sdam.ErrPrimaryWithOptions) {
		t.Errorf("read, primary with tags: error %v", err)
	}
	got, err := sdam.SuitableServers(rs, true, primaryWithTags, time.Second, now)
	if err != nil || !slices.Equal(selAddrList(got), []string{"a:1"}) {
		t.Errorf("a write ignores the read preference: %v, %v", selAddrList(got), err)
	}

	small := sdam.ReadPref{Mode: sdam.Nearest, MaxStaleness: time.Second}
	if _, err := sdam.SuitableServers(rs, false, small, time.Second, now); !errors.Is(err, sdam.ErrMaxStalenessTooSmall) {
		t.Errorf("replica set, max staleness 1s: error %v", err)
	}
	sharded := &sdam.TopologyDescription{Type: sdam.Sharded, Servers: []sdam.ServerDescription{{Address: "m:1", Type: sdam.Mongos}, {Address: "u:1", Type: sdam.Unknown}}}
	got, err = sdam.SuitableServers(sharded, false, small, time.Second, now)
	if err != nil || !slices.Equal(selAddrList(got), []string{"m:1"}) {
		t.Errorf("sharded passes max staleness on to mongos: %v, %v", selAddrList(got), err)
	}
}

func TestSuitableServersSingleAndLoadBalanced(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, c := range []struct {
		topo sdam.TopologyType
		typ  sdam.ServerType
		want bool
	}{
		{sdam.Single, sdam.Standalone, true},
		{sdam.Single, sdam.RSGhost, true},
		{sdam.Single, sdam.RSArbiter, true},
		{sdam.Single, sdam.Unknown, false},
		{sdam.Single, sdam.PossiblePrimary, false},
		{sdam.LoadBalanced, sdam.LoadBalancer, true},
		{sdam.LoadBalanced, sdam.Unknown, false},
		{sdam.TopologyUnknown, sdam.Standalone, false},
		{sdam.TopologyType(77), sdam.Standalone, false},
	} {
		td := &sdam.TopologyDescription{Type: c.topo, Servers: []sdam.ServerDescription{{Address: "x:1", Type: c.typ}}}
		for _, write := range []bool{false, true} {
			got, err := sdam.SuitableServers(td, write, sdam.ReadPref{Mode: sdam.Secondary, TagSets: []sdam.TagSet{{"no": "match"}}}, time.Second, now)
			if err != nil || (len(got) == 1) != c.want {
				t.Errorf("%v with a %v server, write %v: %v, %v", c.topo, c.typ, write, selAddrList(got), err)
			}
		}
	}
}

func TestSuitableServersDeprioritizedFallsBack(t *testing.T) {
	now := time.Unix(1000, 0)
	rs := selRS(
		sdam.ServerDescription{Address: "a:1", Type: sdam.RSPrimary},
		sdam.ServerDescription{Address: "b:1", Type: sdam.RSSecondary},
		sdam.ServerDescription{Address: "c:1", Type: sdam.RSSecondary},
	)
	cases := []struct {
		mode sdam.Mode
		dep  []string
		want []string
	}{
		{sdam.Secondary, []string{"b:1"}, []string{"c:1"}},
		{sdam.Secondary, []string{"b:1", "c:1"}, []string{"b:1", "c:1"}},
		{sdam.PrimaryPreferred, []string{"a:1"}, []string{"b:1", "c:1"}},
		{sdam.SecondaryPreferred, []string{"b:1", "c:1"}, []string{"a:1"}},
		{sdam.Nearest, []string{"a:1", "b:1", "c:1"}, []string{"a:1", "b:1", "c:1"}},
		{sdam.Nearest, []string{"zz:1"}, []string{"a:1", "b:1", "c:1"}},
	}
	for _, c := range cases {
		got, err := sdam.SuitableServersDeprioritized(rs, false, sdam.ReadPref{Mode: c.mode}, 10*time.Second, now, c.dep)
		if err != nil || !slices.Equal(selAddrList(got), c.want) {
			t.Errorf("%v avoiding %v: %v, %v; want %v", c.mode, c.dep, selAddrList(got), err, c.want)
		}
	}
}

func TestStalenessEdges(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	hb := 10 * time.Second
	rp := sdam.ReadPref{Mode: sdam.Secondary, MaxStaleness: 90 * time.Second}

	// A secondary that reported no lastWriteDate is never fresh under a
	// max staleness, and is a candidate without one.
	rs := selRS(
		sdam.ServerDescription{Address: "a:1", Type: sdam.RSPrimary, LastUpdateTime: t0, LastWriteDate: t0},
		sdam.ServerDescription{Address: "b:1", Type: sdam.RSSecondary, LastUpdateTime: t0},
		sdam.ServerDescription{Address: "c:1", Type: sdam.RSSecondary, LastUpdateTime: t0, LastWriteDate: t0.Add(-30 * time.Second)},
	)
	got, _ := sdam.SuitableServers(rs, false, rp, hb, t0)
	if !slices.Equal(selAddrList(got), []string{"c:1"}) {
		t.Errorf("with max staleness: %v, want [c:1]", selAddrList(got))
	}
	got, _ = sdam.SuitableServers(rs, false, sdam.ReadPref{Mode: sdam.Secondary}, hb, t0)
	if !slices.Equal(selAddrList(got), []string{"b:1", "c:1"}) {
		t.Errorf("without max staleness: %v, want [b:1 c:1]", selAddrList(got))
	}

	// A primary without a lastWriteDate cannot anchor the estimate: the
	// freshest secondary does. c lags d by 85 s + 10 s heartbeat > 90 s.
	rs = selRS(
		sdam.ServerDescription{Address: "a:1", Type: sdam.RSPrimary, LastUpdateTime: t0},
		sdam.ServerDescription{Address: "c:1", Type: sdam.RSSecondary, LastUpdateTime: t0, LastWriteDate: t0.Add(-85 * time.Second)},
		sdam.ServerDescription{Address: "d:1", Type: sdam.RSSecondary, LastUpdateTime: t0, LastWriteDate: t0},
	)
	got, _ = sdam.SuitableServers(rs, false, rp, hb, t0)
	if !slices.Equal(selAddrList(got), []string{"d:1"}) {
		t.Errorf("primary without lastWriteDate: %v, want [d:1]", selAddrList(got))
	}

	// now stands in for a missing lastUpdateTime: checked at t0 the
	// secondary lags 50 s (+10 s), at t0+100 s it would lag 150 s.
	rs = selRS(
		sdam.ServerDescription{Address: "a:1", Type: sdam.RSPrimary, LastUpdateTime: t0, LastWriteDate: t0},
		sdam.ServerDescription{Address: "b:1", Type: sdam.RSSecondary, LastWriteDate: t0.Add(-50 * time.Second)},
	)
	if got, _ = sdam.SuitableServers(rs, false, rp, hb, t0); len(got) != 1 {
		t.Errorf("unstamped secondary at t0: %v, want [b:1]", selAddrList(got))
	}
	if got, _ = sdam.SuitableServers(rs, false, rp, hb, t0.Add(100*time.Second)); len(got) != 0 {
		t.Errorf("unstamped secondary at t0+100s: %v, want none", selAddrList(got))
	}

	// The zero time and far dates must not overflow into "fresh".
	rs = selRS(
		sdam.ServerDescription{Address: "a:1", Type: sdam.RSPrimary, LastUpdateTime: time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), LastWriteDate: time.Date(1, 1, 2, 0, 0, 0, 0, time.UTC)},
		sdam.ServerDescription{Address: "b:1", Type: sdam.RSSecondary, LastUpdateTime: time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), LastWriteDate: time.Date(1, 1, 2, 0, 0, 0, 0, time.UTC)},
		sdam.ServerDescription{Address: "c:1", Type: sdam.RSSecondary, LastUpdateTime: time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), LastWriteDate: time.Date(1, 1, 1, 0, 0, 1, 0, time.UTC)},
	)
	if got, _ = sdam.SuitableServers(rs, false, rp, hb, t0); !slices.Equal(selAddrList(got), []string{"b:1"}) {
		t.Errorf("extreme dates: %v, want [b:1]", selAddrList(got))
	}
}

func TestResultsDoNotAlias(t *testing.T) {
	rs := selRS(sdam.ServerDescription{Address: "a:1", Type: sdam.RSPrimary, HasRTT: true})
	got, _ := sdam.SuitableServers(rs, true, sdam.ReadPref{}, time.Second, time.Unix(1, 0))
	win := sdam.InLatencyWindow(got, 0)
	got[0].Address = "changed"
	win[0].Address = "changed too"
	if rs.Servers[0].Address != "a:1" {
		t.Errorf("the topology changed through a result: %q", rs.Servers[0].Address)
	}
	noRTT := []sdam.ServerDescription{{Address: "x:1"}}
	sdam.InLatencyWindow(noRTT, 0)[0].Address = "changed"
	if noRTT[0].Address != "x:1" {
		t.Error("InLatencyWindow without RTTs returned its input")
	}
}

func TestInLatencyWindow(t *testing.T) {
	ms := time.Millisecond
	srv := func(addr string, rtt time.Duration, has bool) sdam.ServerDescription {
		return sdam.ServerDescription{Address: addr, AvgRTT: rtt, HasRTT: has}
	}
	huge := time.Duration(math.MaxInt64 - 1)
	cases := []struct {
		name      string
		servers   []sdam.ServerDescription
		threshold time.Duration
		want      []string
	}{
		{"none", nil, 15 * ms, nil},
		{"edge of the window is in", []sdam.ServerDescription{srv("a", 5*ms, true), srv("b", 20*ms, true), srv("c", 21*ms, true)}, 15 * ms, []string{"a", "b"}},
		{"zero threshold keeps ties", []sdam.ServerDescription{srv("a", 5*ms, true), srv("b", 5*ms, true), srv("c", 6*ms, true)}, 0, []string{"a", "b"}},
		{"negative threshold is zero", []sdam.ServerDescription{srv("a", 5*ms, true), srv("b", 6*ms, true)}, -time.Hour, []string{"a"}},
		{"unmeasured servers lose to measured ones", []sdam.ServerDescription{srv("a", 0, false), srv("b", 30*ms, true)}, 15 * ms, []string{"b"}},
		{"all unmeasured: all in", []sdam.ServerDescription{srv("a", 0, false), srv("b", 0, false)}, 15 * ms, []string{"a", "b"}},
		{"no overflow", []sdam.ServerDescription{srv("a", huge, true), srv("b", huge, true)}, time.Hour, []string{"a", "b"}},
	}
	for _, c := range cases {
		if got := selAddrList(sdam.InLatencyWindow(c.servers, c.threshold)); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

func TestPickInWindow(t *testing.T) {
	a := sdam.ServerDescription{Address: "a"}
	b := sdam.ServerDescription{Address: "b"}
	c := sdam.ServerDescription{Address: "c"}
	counts := map[string]int{"a": 5, "b": 0, "c": 5}
	inUse := func(addr string) int { return counts[addr] }

	if got := sdam.PickInWindow(nil, inUse, nil); got.Address != "" {
		t.Errorf("no candidates: %q", got.Address)
	}
	calls := 0
	one := sdam.PickInWindow([]sdam.ServerDescription{a}, inUse, func(int) int { calls++; return 0 })
	if one.Address != "a" || calls != 0 {
		t.Errorf("one candidate: %q after %d random draws", one.Address, calls)
	}

	// Every draw the RNG can make: the two picks are distinct, and b (least
	// in use) wins whenever it is drawn.
	cands := []sdam.ServerDescription{a, b, c}
	for i := range 3 {
		for j := range 2 {
			draws := []int{i, j}
			var asked []int
			got := sdam.PickInWindow(cands, inUse, func(n int) int { asked = append(asked, n); d := draws[0]; draws = draws[1:]; return d })
			first, second := i, j
			if second >= first {
				second++
			}
			if first == second {
				t.Fatalf("draws %d,%d picked one server twice", i, j)
			}
			want := cands[first].Address
			if cands[second].Address == "b" {
				want = "b"
			}
			if got.Address != want || !slices.Equal(asked, []int{3, 2}) {
				t.Errorf("draws %d,%d: got %q asking %v, want %q asking [3 2]", i, j, got.Address, asked, want)
			}
		}
	}

	// An RNG out of range is folded into range, not trusted.
	for _, r := range []int{-7, 3, 1000, math.MinInt} {
		got := sdam.PickInWindow(cands, inUse, func(int) int { return r })
		if !slices.ContainsFunc(cands, func(s sdam.ServerDescription) bool { return s.Address == got.Address }) {
			t.Errorf("rnd returning %d: picked %q", r, got.Address)
		}
	}

	// nil RNG and nil counts still pick among the candidates.
	seen := map[string]bool{}
	for range 200 {
		seen[sdam.PickInWindow(cands, nil, nil).Address] = true
	}
	if len(seen) != 3 {
		t.Errorf("with nil inUse and rnd, 200 picks reached only %v", seen)
	}
}
