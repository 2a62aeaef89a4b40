package topology

import (
	"io"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/sdam"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// TestAddRTTSampleIsTheSpecsAverage: the monitor's average is
// sdam.NextAvgRTT's, the one the rtt suite checks (rounded to the
// nanosecond, a negative sample counted as zero), not an approximation.
func TestAddRTTSampleIsTheSpecsAverage(t *testing.T) {
	s := newServer(&Topology{}, "a:1")
	if rtt, ok := s.avgRTT(); ok || rtt != 0 || s.RTT() != 0 {
		t.Fatalf("new server: average %v %v", rtt, ok)
	}
	var want time.Duration
	has := false
	for i, sample := range []time.Duration{-3 * time.Millisecond, 7, 3, 1001, 5 * time.Millisecond, -1, 9} {
		s.addRTTSample(sample)
		want, has = sdam.NextAvgRTT(want, has, sample), true
		if got, ok := s.avgRTT(); !ok || got != want || s.RTT() != want {
			t.Fatalf("after sample %d (%v): average %v (%v), want %v", i, sample, got, ok, want)
		}
	}
}

// TestRTTResetWhenUnknown: a server that changes from a known type to
// Unknown loses its average (SDAM: its round-trip time becomes null), by an
// application error or a failed check, so its first sample once back is
// not weighed against the old average.
func TestRTTResetWhenUnknown(t *testing.T) {
	const stale = time.Second
	t.Run("application error", func(t *testing.T) {
		fake := fakemongo.Start(t, fakemongo.Options{})
		o := testOptions(&recorder{}, fake.Addr())
		o.HeartbeatInterval = time.Minute
		topo := newTopology(t, o)
		s := selectAfterFirstCheck(t, topo)
		c := checkOut(t, s)
		s.rtt.Store(int64(stale))
		s.HandleError(&upstream.NetworkError{Addr: fake.Addr(), Op: "read", Err: io.EOF}, c)
		// The requested check may already have found the server again:
		// then its average is that check's sample alone.
		if rtt, ok := s.avgRTT(); ok && (s.State() != Usable || rtt >= stale*8/10) {
			t.Fatalf("after the server became Unknown: average %v, state %v; want none, or a fresh sample", rtt, s.State())
		}
		eventually(t, "server Usable again", func() bool { return s.State() == Usable })
		if rtt := s.RTT(); rtt <= 0 || rtt >= stale*8/10 {
			t.Errorf("RTT once back %v: want the new sample alone, not 0.2 of it plus 0.8 of %v", rtt, stale)
		}
		c.MarkErrored(io.EOF)
		_ = s.Pool().CheckIn(c)
	})
	t.Run("failed check", func(t *testing.T) {
		fake := fakemongo.Start(t, fakemongo.Options{})
		o := testOptions(&recorder{}, fake.Addr())
		o.HeartbeatInterval = time.Minute
		topo := newTopology(t, o)
		s := selectAfterFirstCheck(t, topo)
		s.rtt.Store(int64(stale))
		// The check and its immediate retry fail; the next is a minute
		// away.
		fake.SetFailPoint(fakemongo.FailPoint{Mode: fakemongo.FailAlwaysOn, FailCommands: []string{"hello"},
			AppName: monitorApp, CloseConnection: true})
		s.RequestCheck()
		eventually(t, "server Unknown", func() bool { return s.State() == Unknown })
		if rtt, ok := s.avgRTT(); ok {
			t.Errorf("after a failed check: average %v, want none", rtt)
		}
	})
}

// TestReadWindowUsesLiveRTT: a replica-set read's latency window compares
// each member's current average, which the RTT monitor moves between the
// descriptions a streaming monitor publishes, not the average the member's
// last published description was parsed with.
func TestReadWindowUsesLiveRTT(t *testing.T) {
	topo, sa, sb := craftedReplicaSet(t)
	topo.opts.LocalThreshold = 15 * time.Millisecond
	topo.update(sb, secondaryDesc(sb.Address(), nil, []string{sa.Address(), sb.Address()}), nil, false, false)
	// Both descriptions say 1ms; since then the secondary slowed down.
	sa.rtt.Store(int64(time.Millisecond))
	sb.rtt.Store(int64(200 * time.Millisecond))
	rp := &sdam.ReadPref{Mode: sdam.Nearest}
	for i := range 50 {
		if s := topo.TrySelectServer(Criteria{ReadPref: rp}); s != sa {
			t.Fatalf("selection %d: %v, want the primary, the only member in the window", i, s.Description().SDAM.Type)
		}
	}
	// And back: once the primary is the slow one, only the secondary.
	sa.rtt.Store(int64(300 * time.Millisecond))
	for i := range 50 {
		if s := topo.TrySelectServer(Criteria{ReadPref: rp}); s != sb {
			t.Fatalf("selection %d after the change: %v, want the secondary", i, s.Description().SDAM.Type)
		}
	}
}
