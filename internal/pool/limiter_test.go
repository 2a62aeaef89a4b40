package pool

// Deterministic tests of the adaptive limit: a fake clock (the now argument)
// and scripted latencies.

import (
	"testing"
	"time"
)

// feed gives l n windows of samples of latency rtt, with inflight at the
// limit (demand saturates it), starting at *now; it returns the limits seen
// after each window.
func feed(l limiter, now *time.Duration, windows int, rtt time.Duration, drop bool) []int {
	var seen []int
	for range windows {
		for range DefaultLimiterMinSamples {
			*now += DefaultLimiterWindow / DefaultLimiterMinSamples
			if l.Sample(*now, rtt, l.Limit(), drop) {
				seen = append(seen, l.Limit())
			}
		}
	}
	return seen
}

func TestLimiterRisesUnderSteadyLatency(t *testing.T) {
	l := NewLimiter(LimiterOptions{Floor: 2, Ceiling: 64, Initial: 4})
	var now time.Duration
	seen := feed(l, &now, 100, 2*time.Millisecond, false)
	if len(seen) < 90 {
		t.Fatalf("only %d updates from 100 windows", len(seen))
	}
	for i := 1; i < len(seen); i++ {
		if seen[i] < seen[i-1] {
			t.Fatalf("limit fell under steady latency: %v", seen)
		}
	}
	if got := l.Limit(); got != 64 {
		t.Fatalf("limit after 100 steady windows = %d, want the ceiling 64 (%v)", got, seen)
	}
	if st := l.Stats(); st.MinRTT != 2*time.Millisecond || st.Gradient != 1 {
		t.Fatalf("stats = %+v, want MinRTT 2ms, gradient 1", st)
	}
}

func TestLimiterFallsWhenLatencyClimbs(t *testing.T) {
	l := NewLimiter(LimiterOptions{Floor: 2, Ceiling: 64, Initial: 32})
	var now time.Duration
	feed(l, &now, 20, 2*time.Millisecond, false)
	before := l.Limit()
	// The server slows down fourfold: within half a second (5 windows)
	// the limit must have halved, and within 3 s come well down.
	seen := feed(l, &now, 5, 8*time.Millisecond, false)
	if got := l.Limit(); got > before/2 {
		t.Fatalf("limit %d -> %d after 5 windows of 4x latency, want at most half (%v)", before, got, seen)
	}
	seen = feed(l, &now, 25, 8*time.Millisecond, false)
	after := l.Limit()
	if after > before/3 {
		t.Fatalf("limit %d -> %d after 4x latency, want at most a third (%v)", before, after, seen)
	}
	if g := l.Stats().Gradient; g != 0.5 {
		t.Fatalf("gradient = %v, want 0.5 (clamped) while latency is 4x", g)
	}
	// It recovers once latency returns.
	feed(l, &now, 100, 2*time.Millisecond, false)
	if got := l.Limit(); got < before {
		t.Fatalf("limit %d after recovery, want back to at least %d", got, before)
	}
}

func TestLimiterBacksOffOnDrops(t *testing.T) {
	l := NewLimiter(LimiterOptions{Floor: 1, Ceiling: 100, Initial: 50})
	var now time.Duration
	now += time.Millisecond
	// A drop updates at once, without waiting for a full window.
	if !l.Sample(now, time.Millisecond, 50, true) {
		t.Fatal("a drop did not update the limit")
	}
	if got := l.Limit(); got != 45 {
		t.Fatalf("limit after one drop = %d, want 45 (x0.9)", got)
	}
	for range 100 {
		now += time.Millisecond
		l.Sample(now, time.Millisecond, 50, true)
	}
	if got := l.Limit(); got != 1 {
		t.Fatalf("limit after 100 drops = %d, want the floor 1", got)
	}
	if st := l.Stats(); st.Drops != 101 || st.Gradient != limBackoff {
		t.Fatalf("stats = %+v, want 101 drops and gradient %v", st, limBackoff)
	}
}

func TestLimiterRespectsFloorAndCeiling(t *testing.T) {
	l := NewLimiter(LimiterOptions{Floor: 5, Ceiling: 12, Initial: 100})
	if got := l.Limit(); got != 12 {
		t.Fatalf("initial 100 with ceiling 12: limit %d", got)
	}
	var now time.Duration
	feed(l, &now, 30, time.Millisecond, true)
	if got := l.Limit(); got != 5 {
		t.Fatalf("after drops: limit %d, want the floor 5", got)
	}
	feed(l, &now, 100, time.Millisecond, false)
	if got := l.Limit(); got != 12 {
		t.Fatalf("after steady windows: limit %d, want the ceiling 12", got)
	}
	l.SetBounds(3, 6)
	if got := l.Limit(); got != 6 {
		t.Fatalf("after SetBounds(3, 6): limit %d, want 6", got)
	}
	// Floor 0 means 1: a pool must be able to serve someone.
	if got := NewLimiter(LimiterOptions{Initial: -1, Floor: 0, Ceiling: 1}).Limit(); got != 1 {
		t.Fatalf("floor 0 ceiling 1: limit %d", got)
	}
}

func TestLimiterAppLimitedDoesNotGrow(t *testing.T) {
	l := NewLimiter(LimiterOptions{Floor: 1, Ceiling: 100, Initial: 20})
	var now time.Duration
	for range 1000 {
		now += 10 * time.Millisecond
		l.Sample(now, time.Millisecond, 3, false) // 3 in flight, far below 20/2
	}
	if got := l.Limit(); got != 20 {
		t.Fatalf("limit moved to %d with demand far below it, want 20", got)
	}
}

func TestLimiterWaitsForAFullWindow(t *testing.T) {
	l := NewLimiter(LimiterOptions{Initial: 10})
	var now time.Duration
	for i := range DefaultLimiterMinSamples - 1 {
		now += time.Second
		if l.Sample(now, time.Millisecond, 10, false) {
			t.Fatalf("updated after %d samples, fewer than MinSamples", i+1)
		}
	}
	l2 := NewLimiter(LimiterOptions{Initial: 10})
	for i := range 100 {
		if l2.Sample(time.Duration(i), time.Millisecond, 10, false) {
			t.Fatalf("updated after %d ns, shorter than the window", i)
		}
	}
}
