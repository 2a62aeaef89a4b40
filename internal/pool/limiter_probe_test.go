package pool

// Deterministic tests of ProbeLimiter (limiter_probe.go): a fake clock (the
// now argument) and latencies computed from the limit, as in
// limiter_algos_test.go.

import (
	"math"
	"slices"
	"testing"
	"time"
)

func newTestProbe(o LimiterOptions) *ProbeLimiter {
	l := NewProbeLimiter(o)
	l.rnd = func() float64 { return 0.5 } // no jitter
	return l
}

func TestProbeMeasuresAtTheFloorThenStartsFromInitial(t *testing.T) {
	l := newTestProbe(LimiterOptions{Floor: 2, Ceiling: 64, Initial: 10})
	if st := l.Stats(); st.Limit != 2 || !st.Probing {
		t.Fatalf("new limiter %+v, want a probe at the floor 2", st)
	}
	var now time.Duration
	// Operations started before the probe ran at 10: not the no-load RTT.
	for range 50 {
		now += time.Millisecond
		if l.Sample(now, 40*time.Millisecond, 10, false) {
			t.Fatal("a sample above the floor ended the probe")
		}
	}
	for i := range probeSamples {
		now += time.Millisecond
		rtt := 2 * time.Millisecond
		if i%2 == 1 {
			rtt = 4 * time.Millisecond
		}
		ended := l.Sample(now, rtt, 1+i%2, false)
		if ended != (i == probeSamples-1) {
			t.Fatalf("sample %d: ended %v", i, ended)
		}
	}
	if st := l.Stats(); st.Probing || st.Probes != 1 || st.Limit != 10 || st.MinRTT != 3*time.Millisecond {
		t.Fatalf("after the probe %+v, want limit 10 and the mean 3ms", st)
	}
}

func TestProbeTickEndsAProbeWithoutSamples(t *testing.T) {
	l := newTestProbe(LimiterOptions{Floor: 1, Ceiling: 64, Initial: 8})
	if _, ok := l.ProbeDeadline(); ok {
		t.Fatal("a deadline before the probe has seen the time")
	}
	if l.Tick(5 * time.Second) {
		t.Fatal("the first Tick ended the probe")
	}
	if d, ok := l.ProbeDeadline(); !ok || d != 5*time.Second+probeMaxTime {
		t.Fatalf("deadline %v %v, want 6s", d, ok)
	}
	if l.Tick(5*time.Second+probeMaxTime-1) || !l.Tick(5*time.Second+probeMaxTime) {
		t.Fatal("Tick did not end the probe exactly at its deadline")
	}
	if st := l.Stats(); st.Probing || st.Limit != 8 || st.MinRTT != 0 {
		t.Fatalf("after the deadline %+v, want limit 8 and no minimum RTT", st)
	}
	// Without a measured minimum the lowest window mean stands in: at a
	// steady RTT the gradient is 1.25, and the limit rises.
	now := 6 * time.Second
	for range 3 * DefaultLimiterMinSamples {
		now += 10 * time.Millisecond
		l.Sample(now, 5*time.Millisecond, 8, false)
	}
	if st := l.Stats(); st.MinRTT != 5*time.Millisecond || st.Limit <= 8 {
		t.Fatalf("after windows at 5ms %+v, want minimum 5ms and a higher limit", st)
	}
}

// The upstream of the FerretDB: one writer, so the RTT grows with
// every connection in use and the throughput does not. Vegas, whose
// no-load RTT is the lowest window it saw at its own limit, stays above
// its starting point; the probe, which measures at the floor, comes down
// to 2.
func TestProbeFindsASingleWritersKnee(t *testing.T) {
	o := LimiterOptions{Floor: 1, Ceiling: 100, Initial: 8}
	if lo, hi := settle(newTestProbe(o), 1, 5*time.Millisecond, 0, 600); lo < 2 || hi > 3 {
		t.Errorf("probe settled in %d..%d on a single writer, want 2..3", lo, hi)
	}
	if lo, _ := settle(NewVegasLimiter(o), 1, 5*time.Millisecond, 0, 600); lo < 4 {
		t.Errorf("Vegas settled from %d on a single writer; this test's contrast expects 4 or more", lo)
	}
}

// With 8 workers the probe settles a few above 8, as Vegas does.
func TestProbeOnCapacityModel(t *testing.T) {
	const k = 8
	o := LimiterOptions{Floor: 1, Ceiling: 100, Initial: 8}
	for _, c := range []float64{0, 0.5} {
		if lo, hi := settle(newTestProbe(o), k, 2*time.Millisecond, c, 600); lo < k || hi > 2*k {
			t.Errorf("contention %v: probe settled in %d..%d with %d workers, want within %d..%d", c, lo, hi, k, k, 2*k)
		}
	}
}

// Every interval the probe measures again: when every operation became
// ten times slower for good (a slower path, not a queue), the limit comes
// down at first and goes back up after the next probe.
func TestProbeRemeasuresAfterItsInterval(t *testing.T) {
	o := LimiterOptions{Floor: 1, Ceiling: 100, Initial: 8, ProbeInterval: 5 * time.Second}
	l := newTestProbe(o)
	var now time.Duration
	rtt := func(limit int) time.Duration { return capacityRTT(limit, 8, 2*time.Millisecond, 0.5) }
	run := func(d time.Duration, slower time.Duration) (lo, hi int) {
		lo, hi = 1<<30, 0
		for end := now + d; now < end; {
			now += time.Millisecond
			l.Sample(now, rtt(l.Limit())+slower, l.Limit(), false)
			if !l.Stats().Probing {
				lo, hi = min(lo, l.Limit()), max(hi, l.Limit())
			}
		}
		return lo, hi
	}
	if _, hi := run(4*time.Second, 0); hi < 8 {
		t.Fatalf("limit at most %d before the change, want 8 or more", hi)
	}
	probes := l.Stats().Probes
	lo, _ := run(time.Second, 18*time.Millisecond) // still before the next probe
	if lo > 3 {
		t.Fatalf("limit at least %d with every operation 10x slower, want it down (the latency reads as a queue)", lo)
	}
	_, hi := run(10*time.Second, 18*time.Millisecond)
	if st := l.Stats(); st.Probes <= probes || st.MinRTT < 18*time.Millisecond || hi < 8 {
		t.Fatalf("after the next probe %+v (limit up to %d), want a new minimum of 20ms and the limit back to 8 or more", st, hi)
	}
}

func TestProbeDropsAndBounds(t *testing.T) {
	l := newTestProbe(LimiterOptions{Floor: 2, Ceiling: 64, Initial: 20})
	var now time.Duration
	// A drop during the probe backs off the limit it returns to.
	now += time.Millisecond
	l.Sample(now, time.Millisecond, 2, true)
	l.SetBounds(3, 10) // the probe moves to the new floor; 18 to the ceiling
	if st := l.Stats(); st.Limit != 3 || !st.Probing || st.Drops != 1 {
		t.Fatalf("during the probe after a drop and SetBounds(3, 10): %+v", st)
	}
	for range probeSamples {
		now += time.Millisecond
		l.Sample(now, time.Millisecond, 3, false)
	}
	if got := l.Limit(); got != 10 {
		t.Fatalf("after the probe: limit %d, want the ceiling 10", got)
	}
	// Outside a probe a drop takes a tenth off at once.
	now += time.Millisecond
	if !l.Sample(now, time.Millisecond, 10, true) || l.Limit() != 9 {
		t.Fatalf("after a drop at 10: limit %d, want 9", l.Limit())
	}
	for range 200 {
		now += time.Millisecond
		l.Sample(now, time.Millisecond, 9, true)
	}
	if got := l.Limit(); got != 3 {
		t.Fatalf("after drops: limit %d, want the floor 3", got)
	}
	// Application-limited: with 1 in flight at a limit of 20 and no
	// queue, the limit holds.
	a := newTestProbe(LimiterOptions{Floor: 1, Ceiling: 100, Initial: 20})
	for range 1000 {
		now += 10 * time.Millisecond
		a.Sample(now, time.Millisecond, 1, false)
	}
	if st := a.Stats(); st.Limit != 20 || st.Probes == 0 {
		t.Fatalf("limit moved to %d with 1 in flight, want 20 (%+v)", st.Limit, st)
	}
	// Nor at a gradient a little under 1, where the headroom alone would
	// raise it: 10 in flight at 1.4x the no-load RTT.
	c := newTestProbe(LimiterOptions{Floor: 1, Ceiling: 100, Initial: 20})
	for range probeSamples {
		now += time.Millisecond
		c.Sample(now, 10*time.Millisecond, 1, false)
	}
	for range 1000 {
		now += 10 * time.Millisecond
		c.Sample(now, 14*time.Millisecond, 10, false)
	}
	if st := c.Stats(); st.Limit > 20 {
		t.Fatalf("limit rose to %d with 10 in flight, want at most 20 (%+v)", st.Limit, st)
	}
}

// FerretDB's shape with its mix: one writer, four fast reads to one slow
// insert, drawn at random. A window of ten samples with no insert reads as
// a gradient of 2; smoothed increases keep such windows from doubling the
// limit, and it stays near the single writer's knee.
func TestProbeSettlesOnANoisyMix(t *testing.T) {
	l := newTestProbe(LimiterOptions{Floor: 1, Ceiling: 100, Initial: 8})
	seed := uint64(1)
	service := func() time.Duration {
		seed = seed*6364136223846793005 + 1442695040888963407
		if (seed>>33)%5 == 0 {
			return 20 * time.Millisecond
		}
		return time.Millisecond
	}
	var now time.Duration
	var seen []int
	for range 6000 {
		now += 10 * time.Millisecond
		lim := l.Limit()
		l.Sample(now, time.Duration(lim)*service(), lim, false)
		if now > 10*time.Second && !l.Stats().Probing {
			seen = append(seen, l.Limit())
		}
	}
	slices.Sort(seen)
	med, p90 := seen[len(seen)/2], seen[len(seen)*9/10]
	if med > 3 || p90 > 5 {
		t.Errorf("limit median %d, 90th percentile %d on a single writer's noisy mix, want at most 3 and 5", med, p90)
	}
	// A window of only fast reads is noise, not a faster path: no early
	// probes, only the first and one every 30 s.
	if n := l.Stats().Probes; n > 3 {
		t.Errorf("%d probes in 60 s of a steady noisy mix, want at most 3", n)
	}
}

// A no-load RTT that changed shows as windows far from it, and a probe
// comes early (here the interval is an hour): a path 10x slower for good
// brings the limit down at first and back up after the early probe; when
// it is fast again, another early probe stops the limit climbing on the
// stale minimum.
func TestProbeComesEarlyWhenTheMinimumIsFarOff(t *testing.T) {
	l := newTestProbe(LimiterOptions{Floor: 1, Ceiling: 100, Initial: 8, ProbeInterval: time.Hour})
	var now time.Duration
	var extra time.Duration
	run := func(d time.Duration) (lo, hi int) {
		lo, hi = 1<<30, 0
		for end := now + d; now < end; {
			now += time.Millisecond
			l.Sample(now, capacityRTT(l.Limit(), 8, 2*time.Millisecond, 0.5)+extra, l.Limit(), false)
			if !l.Stats().Probing {
				lo, hi = min(lo, l.Limit()), max(hi, l.Limit())
			}
		}
		return lo, hi
	}
	run(6 * time.Second)
	before := l.Stats()
	if before.Probes != 1 || before.Limit < 8 {
		t.Fatalf("before the change %+v, want one probe and the limit at 8 or more", before)
	}
	extra = 18 * time.Millisecond
	lo, _ := run(time.Second)
	if lo > 3 {
		t.Fatalf("limit at least %d in the first second of a 10x slower path, want it down", lo)
	}
	_, hi := run(5 * time.Second)
	if st := l.Stats(); st.Probes != 2 || st.MinRTT < 18*time.Millisecond || hi < 8 {
		t.Fatalf("5 s later %+v (limit up to %d), want an early probe with the slower minimum and the limit back to 8 or more", st, hi)
	}
	// Back to fast 1 s after that probe: the probes still find it
	// slow, so the first fast window holds the limit until the next.
	run(time.Second)
	extra = 0
	_, hiBack := run(3 * time.Second)
	if hiBack > 2*hi {
		t.Fatalf("limit climbed to %d on the slow minimum once the path was fast again (%d before)", hiBack, hi)
	}
	run(5 * time.Second)
	_, hi = run(4 * time.Second)
	if st := l.Stats(); st.Probes < 3 || st.MinRTT > 4*time.Millisecond || hi > 16 {
		t.Fatalf("with the path fast again %+v (limit up to %d), want another probe, the fast minimum and the limit at 16 or less", st, hi)
	}
}

// closedLoop is FerretDB's shape under many waiting clients: one writer of
// service time s behind a path that adds delay, with clients clients that
// each send again as soon as they have a reply. At a limit of n in flight
// the upstream completes min(1/s, n/(delay+s)) operations a second and each
// takes n over that (Little's law); Sample gets one completion at a time.
type closedLoop struct {
	l       *ProbeLimiter
	now     time.Duration
	clients int
	s       time.Duration
	delay   time.Duration
	done    int // completions
}

// run feeds d of completions; each is reported to at(now, limit).
func (c *closedLoop) run(d time.Duration, at func(now time.Duration, limit int)) {
	for end := c.now + d; c.now < end; {
		n := float64(min(c.l.Limit(), c.clients))
		x := math.Min(1/c.s.Seconds(), n/(c.delay+c.s).Seconds())
		c.now += time.Duration(float64(time.Second) / x)
		c.l.Sample(c.now, time.Duration(n/x*float64(time.Second)), int(n), false)
		c.done++
		if at != nil {
			at(c.now, c.l.Limit())
		}
	}
}

// When every reply comes 300 ms later (the relay of the FerretDB slowdown
// run), the gradient brings the limit down to the floor, and a gradient
// alone climbs back from there by a fifth of the gap per window, a window
// taking seconds at 300 ms an operation: 100 clients waited past their
// timeouts. The early probe measures the slower path, and the limit comes
// back at once to the bandwidth-delay product, what the upstream delivered
// over the slower no-load RTT; once the path is fast again it comes down.
func TestProbeKeepsTheThroughputOfASlowerPath(t *testing.T) {
	c := &closedLoop{l: newTestProbe(LimiterOptions{Floor: 1, Ceiling: 100, Initial: 8, ProbeInterval: time.Hour}),
		clients: 100, s: 10 * time.Millisecond}
	c.run(20*time.Second, nil)
	if st := c.l.Stats(); st.Limit > 4 || st.Probes != 1 {
		t.Fatalf("on the single writer %+v, want the limit at 4 or less after one probe", st)
	}
	c.delay = 300 * time.Millisecond
	start, back := c.now, time.Duration(-1)
	done := c.done
	c.run(15*time.Second, func(now time.Duration, limit int) {
		if back < 0 && limit >= 30 { // 100 a second over 310 ms
			back = now - start
		}
	})
	// A window of ten at 2 in flight lasts 1.55 s, a second of evidence
	// by itself; then the probe's second.
	if back < 0 || back > 3500*time.Millisecond {
		t.Fatalf("the limit reached 30 %v into the slower path (-1: never; %+v), want within 3.5s", back, c.l.Stats())
	}
	t.Logf("limit at 30 or more %v into the slower path; %d operations in its 15 s", back, c.done-done)
	if n := c.done - done; n < 1000 { // the writer's 1,500 in 15 s
		t.Errorf("%d operations in 15 s of the slower path, want 1,000 or more", n)
	}
	c.delay = 0
	hi := 0
	c.run(20*time.Second, func(now time.Duration, limit int) {
		if now-start > 25*time.Second && !c.l.Stats().Probing {
			hi = max(hi, limit)
		}
	})
	if hi > 4 {
		t.Errorf("limit up to %d 10 s after the path was fast again, want 4 or less", hi)
	}
}
