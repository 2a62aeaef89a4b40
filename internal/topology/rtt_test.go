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
