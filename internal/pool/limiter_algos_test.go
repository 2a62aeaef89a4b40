package pool

// Deterministic tests of Vegas and AIMD (limiter_algos.go), and of all three
// algorithms against a scripted capacity model: a fake clock (the now
// argument) and latencies computed from the limit.

import (
	"fmt"
	"testing"
	"time"
)

func TestVegasRisesWhileNoQueue(t *testing.T) {
	l := NewVegasLimiter(LimiterOptions{Floor: 2, Ceiling: 64, Initial: 4})
	var now time.Duration
	feed(l, &now, 30, 2*time.Millisecond, false)
	if got := l.Limit(); got != 64 {
		t.Fatalf("limit after 30 windows at the no-load RTT = %d, want the ceiling 64", got)
	}
	if st := l.Stats(); st.MinRTT != 2*time.Millisecond {
		t.Fatalf("stats = %+v, want the no-load RTT 2ms", st)
	}
}

func TestVegasFallsWhenLatencyClimbs(t *testing.T) {
	l := NewVegasLimiter(LimiterOptions{Floor: 2, Ceiling: 64, Initial: 32})
	var now time.Duration
	feed(l, &now, 5, 2*time.Millisecond, false)
	before := l.Limit()
	// 4x latency: queue = limit × 0.75, above beta (6) until the limit
	// is 8; one step of log10 (1) per window.
	seen := feed(l, &now, 60, 8*time.Millisecond, false)
	if got := l.Limit(); got > 8 || got < 6 {
		t.Fatalf("limit %d -> %d after 4x latency, want 6..8 (%v)", before, got, seen)
	}
	feed(l, &now, 20, 2*time.Millisecond, false)
	if got := l.Limit(); got < before {
		t.Fatalf("limit %d after recovery, want at least %d", got, before)
	}
}

func TestVegasDropTakesLog10Off(t *testing.T) {
	l := NewVegasLimiter(LimiterOptions{Floor: 1, Ceiling: 1000, Initial: 500})
	if !l.Sample(time.Millisecond, time.Millisecond, 500, true) {
		t.Fatal("a drop did not update the limit")
	}
	if got := l.Limit(); got != 498 {
		t.Fatalf("limit after a drop at 500 = %d, want 498 (500 - log10)", got)
	}
	if st := l.Stats(); st.Drops != 1 {
		t.Fatalf("drops = %d, want 1", st.Drops)
	}
}

func TestAIMDAddsOneAndBacksOff(t *testing.T) {
	l := NewAIMDLimiter(LimiterOptions{Floor: 2, Ceiling: 64, Initial: 10})
	var now time.Duration
	// Latency alone never lowers AIMD: 10 windows of a 50x climb add 10.
	n := len(feed(l, &now, 5, time.Millisecond, false))
	n += len(feed(l, &now, 5, 50*time.Millisecond, false))
	if got := l.Limit(); n < 9 || got != 10+n {
		t.Fatalf("limit after %d updates = %d, want 10 + %d", n, got, n)
	}
	l.SetBounds(2, 20)
	feed(l, &now, 3, time.Millisecond, false) // to the ceiling: a round number for the back-off
	now += time.Millisecond
	if !l.Sample(now, time.Millisecond, 20, true) {
		t.Fatal("a drop did not update the limit")
	}
	if got := l.Limit(); got != 18 {
		t.Fatalf("limit after a drop = %d, want 18 (20 x 0.9)", got)
	}
	// A sample past the timeout is a drop.
	now += time.Millisecond
	l.Sample(now, aimdTimeout+time.Millisecond, 18, false)
	if got, st := l.Limit(), l.Stats(); got != 16 || st.Drops != 2 || st.Gradient != aimdBackoff {
		t.Fatalf("after a timeout: limit %d stats %+v, want 16, 2 drops, gradient 0.9", got, st)
	}
}

func TestAlgorithmsRespectBoundsAndAppLimit(t *testing.T) {
	for name, mk := range map[string]func(LimiterOptions) limiter{
		AlgorithmVegas: func(o LimiterOptions) limiter { return NewVegasLimiter(o) },
		AlgorithmAIMD:  func(o LimiterOptions) limiter { return NewAIMDLimiter(o) },
	} {
		t.Run(name, func(t *testing.T) {
			l := mk(LimiterOptions{Floor: 5, Ceiling: 12, Initial: 100})
			if got := l.Limit(); got != 12 {
				t.Fatalf("initial 100, ceiling 12: limit %d", got)
			}
			var now time.Duration
			feed(l, &now, 200, time.Millisecond, true)
			if got := l.Limit(); got != 5 {
				t.Fatalf("after drops: limit %d, want the floor 5", got)
			}
			l.SetBounds(7, 9)
			if got := l.Limit(); got != 7 {
				t.Fatalf("after SetBounds(7, 9): limit %d, want 7", got)
			}
			a := mk(LimiterOptions{Floor: 1, Ceiling: 100, Initial: 20})
			for range 1000 {
				now += 10 * time.Millisecond
				a.Sample(now, time.Millisecond, 3, false)
			}
			if got := a.Limit(); got != 20 {
				t.Fatalf("limit moved to %d with 3 in flight, want 20", got)
			}
		})
	}
}

func TestNewAdaptiveLimiterFollowsAlgorithm(t *testing.T) {
	defer func(old string) { limiterAlgorithm = old }(limiterAlgorithm)
	for name, want := range map[string]string{
		AlgorithmGradient2: "*pool.Limiter", AlgorithmVegas: "*pool.VegasLimiter",
		AlgorithmAIMD: "*pool.AIMDLimiter", AlgorithmProbe: "*pool.ProbeLimiter", "unknown": "*pool.ProbeLimiter",
	} {
		limiterAlgorithm = name
		if got := typeName(newAdaptiveLimiter(LimiterOptions{})); got != want {
			t.Errorf("limiterAlgorithm %q: %s, want %s", name, got, want)
		}
	}
}

// capacityRTT is a closed-loop model of an upstream with k workers of
// service time s and every connection busy: limit connections wait
// limit/k service times, and above k each one is slower by contention
// per extra connection relative to k (a database thrashing).
func capacityRTT(limit, k int, s time.Duration, contention float64) time.Duration {
	if limit <= k {
		return s
	}
	extra := float64(limit-k) / float64(k)
	return time.Duration(float64(s) * float64(limit) / float64(k) * (1 + contention*extra))
}

// settle runs l against the model for windows windows and returns the
// range of limits seen in the last half, outside probes.
func settle(l limiter, k int, s time.Duration, contention float64, windows int) (lo, hi int) {
	var now time.Duration
	lo, hi = 1<<30, 0
	for w := range windows {
		for range DefaultLimiterMinSamples {
			now += DefaultLimiterWindow / DefaultLimiterMinSamples
			l.Sample(now, capacityRTT(l.Limit(), k, s, contention), l.Limit(), false)
		}
		if w >= windows/2 && !l.Stats().Probing {
			lo, hi = min(lo, l.Limit()), max(hi, l.Limit())
		}
	}
	return lo, hi
}

// TestAlgorithmsOnCapacityModel is the model behind the choice in
// docs/pool.md: with 8 workers, Vegas holds the limit a few above 8 (its
// probe, which forgets the no-load RTT, lifts it for a while), and
// AIMD, which only drops would stop, runs to the ceiling.
func TestAlgorithmsOnCapacityModel(t *testing.T) {
	const k = 8
	o := LimiterOptions{Floor: 1, Ceiling: 100, Initial: 8}
	if lo, hi := settle(NewVegasLimiter(o), k, 2*time.Millisecond, 0.5, 600); lo < k || hi > 5*k/2 {
		t.Errorf("Vegas settled in %d..%d, want within %d..%d", lo, hi, k, 5*k/2)
	}
	if lo, _ := settle(NewAIMDLimiter(o), k, 2*time.Millisecond, 0.5, 600); lo != 100 {
		t.Errorf("AIMD settled at %d, want the ceiling (nothing lowers it without drops)", lo)
	}
	lo, hi := settle(NewLimiter(o), k, 2*time.Millisecond, 0.5, 600)
	t.Logf("Gradient2 settled in %d..%d with %d workers", lo, hi, k)

}

func typeName(v any) string { return fmt.Sprintf("%T", v) }
